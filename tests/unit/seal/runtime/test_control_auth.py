"""CURVE on the control socket (real sockets): `seal scale`'s client, with the
key the driver left in a 0600 file outside the run dir, gets answers; a
client with a key pair of its own or without CURVE gets none, is counted
(unauthorized), and the driver goes on answering."""

from __future__ import annotations

import json
import os
import stat
import threading

import pytest

from replay.auth import ClientKeys, KeyPair, RunKeys
from seal.runtime.control import CONTROL_FILE, ControlServer, read_key_file, send_control


@pytest.fixture(autouse=True)
def keys_dir(tmp_path, monkeypatch):
    path = tmp_path / "keys"
    monkeypatch.setenv("SEAL_KEY_DIR", str(path))
    return path


class Serving:
    """The driver's loop: poll the control socket until stopped."""

    def __init__(self, server: ControlServer) -> None:
        self.server, self.stop = server, threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self.stop.is_set():
            self.server.poll(lambda command, args: {"command": command, **args})
            self.stop.wait(0.01)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        self.server.close()


def raw_request(address: str, keys: ClientKeys | None, timeout_s: float = 0.5):
    from seal.runtime.control import request

    return request(address, keys, "scale", {"env": 99}, timeout_s)


def test_only_the_runs_control_key_is_answered(tmp_path, keys_dir):
    keys = RunKeys.generate()
    serving = Serving(ControlServer(tmp_path, keys=keys))
    server = serving.server
    try:
        assert send_control(tmp_path, "status", {"x": 1}, timeout_s=5) == {"ok": True, "command": "status", "x": 1}
        stranger = ClientKeys(keys.server.public, KeyPair.generate())
        assert raw_request(server.address, stranger) is None
        assert raw_request(server.address, None) is None
        assert raw_request(server.address, keys.client("actors")) is None  # an env actor cannot rescale the run
        assert send_control(tmp_path, "status", {}, timeout_s=5)["ok"]  # the driver goes on answering
        assert server.unauthorized >= 3
    finally:
        serving.close()


def test_the_client_secret_lives_in_a_0600_file_outside_the_run_dir(tmp_path, keys_dir):
    keys = RunKeys.generate()
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    server = ControlServer(run_dir, keys=keys)
    record = json.loads((run_dir / CONTROL_FILE).read_text())
    key_file = server.key_file
    assert record["curve"] == {"server_key": keys.server.public.decode(), "key_file": str(key_file)}
    assert key_file.parent == keys_dir and stat.S_IMODE(keys_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600 and read_key_file(key_file) == keys.control
    for path in run_dir.rglob("*"):  # no secret key in the run dir
        text = path.read_text()
        assert all(k.secret.decode() not in text for k in (keys.server, keys.actors, keys.control))
    os.chmod(key_file, 0o644)
    with pytest.raises(PermissionError, match="mode 0600"):
        send_control(run_dir, "status", {})
    server.close()
    server.close()  # idempotent
    assert not key_file.exists() and not (run_dir / CONTROL_FILE).exists()


def test_a_refused_client_is_told_why_and_a_plain_server_still_works(tmp_path):
    keys = RunKeys.generate()
    serving = Serving(ControlServer(tmp_path, keys=keys))
    try:
        # Another run's key in the file control.json names: refused, and the timeout says CURVE.
        serving.server.key_file.write_text(
            json.dumps({"public": (p := KeyPair.generate()).public.decode(), "secret": p.secret.decode()})
        )
        with pytest.raises(RuntimeError, match="CURVE key"):
            send_control(tmp_path, "status", {}, timeout_s=0.5)
    finally:
        serving.close()
    with pytest.raises(FileNotFoundError, match="no running pipeline"):
        send_control(tmp_path, "status", {})
    serving = Serving(ControlServer(tmp_path))  # transport.curve=false
    try:
        assert json.loads((tmp_path / CONTROL_FILE).read_text())["curve"] is None
        assert send_control(tmp_path, "scale", {"env": 2}, timeout_s=5) == {"ok": True, "command": "scale", "env": 2}
        assert serving.server.unauthorized == 0
    finally:
        serving.close()
