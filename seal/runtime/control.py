"""The running pipeline's control socket (ZeroMQ REP), and its client.

The driver binds it next to the replay stream and writes the address to
RUN_DIR/control.json; `seal scale RUN_DIR env=N` sends a Control message
(replay/wire.py framing) and prints the reply. The driver answers between
loop iterations, so a command takes effect within about 0.1 s.

With the run's keys (transport.curve, the default) the socket is a CURVE
server that admits only the run's control key (replay/auth.py); a peer
without it is refused and counted (``unauthorized``) and the driver goes on.
`seal scale` is a process of its own, so it cannot get the key through Ray:
the driver writes the control client's key pair to a file only its user can
read, in a per-user key directory outside the run dir (``key_dir``), and
control.json names that file next to the server's public key. Why not the
run dir: run dirs are shared (NFS, copied off for analysis, published with
results) and their files are world-readable by default; a 0600 file in a
0700 per-user directory is the trust model of ~/.ssh and of Ray's own
~/.ray/auth_token. Encrypting the key inside the run dir would only move
the problem to where the decryption key lives. `seal scale` already has to
run on the driver's machine (control.json's address is the loopback when the
socket binds to 0.0.0.0), as the same user. The file goes when the driver
closes; one left by a killed driver holds a key no server accepts any more.
"""

from __future__ import annotations

import json
import os
import stat
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import zmq

from replay.auth import ClientKeys, CurveGuard, KeyPair, RunKeys
from replay.control_messages import Control
from replay.wire import WireError, decode, encode

CONTROL_FILE = "control.json"
KEY_DIR_ENV = "SEAL_KEY_DIR"


def key_dir() -> Path:
    """$SEAL_KEY_DIR, else $XDG_RUNTIME_DIR/seal (a per-user tmpfs, gone at logout), else ~/.seal/keys;
    made 0700 and refused unless it is this user's."""
    if os.environ.get(KEY_DIR_ENV):
        path = Path(os.environ[KEY_DIR_ENV])
    elif os.environ.get("XDG_RUNTIME_DIR"):
        path = Path(os.environ["XDG_RUNTIME_DIR"]) / "seal"
    else:
        path = Path.home() / ".seal" / "keys"
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.stat()
    if info.st_uid != os.getuid():
        raise PermissionError(
            f"the key directory {path} belongs to uid {info.st_uid}, not this user ({os.getuid()}): set {KEY_DIR_ENV}"
        )
    if stat.S_IMODE(info.st_mode) & 0o077:
        os.chmod(path, 0o700)
    return path


def write_key_file(pair: KeyPair) -> Path:
    path = key_dir() / f"control-{uuid.uuid4().hex}.key"
    # O_EXCL with mode 0600: the file is never readable by others, not even between create and chmod.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"public": pair.public.decode(), "secret": pair.secret.decode()}, f)
    return path


def read_key_file(path: Path) -> KeyPair:
    try:
        info = path.stat()
    except FileNotFoundError:
        raise FileNotFoundError(
            f"the control key {path} is gone (the driver closed, or another user or machine runs it): "
            "run `seal scale` as the driver's user on its machine"
        ) from None
    if info.st_uid != os.getuid() or stat.S_IMODE(info.st_mode) & 0o077:
        raise PermissionError(
            f"the control key {path} must belong to this user and be readable by nobody else (mode 0600)"
        )
    record = json.loads(path.read_text())
    return KeyPair(record["public"], record["secret"])


class ControlServer:
    def __init__(
        self, run_dir: Path, host: str = "127.0.0.1", keys: RunKeys | None = None, replay: str | None = None
    ) -> None:
        """``keys``: the run's keys (CURVE, only their control key admitted); None: a plain socket.
        ``replay``: the trajectory stream's address, recorded beside the control socket's."""
        self._guard = CurveGuard(keys.server, [keys.control.public], "control") if keys else None
        self._context = self._guard.context if self._guard else zmq.Context()
        self._socket = self._context.socket(zmq.REP)
        if self._guard:
            self._guard.secure(self._socket)
        self._socket.setsockopt(zmq.LINGER, 0)
        try:
            port = self._socket.bind_to_random_port(f"tcp://{host}")
        except zmq.ZMQError:  # no ZAP or monitor thread outlives the failed start
            self._socket.close()
            if self._guard:
                self._guard.close()
            self._context.term()
            raise
        connect_host = "127.0.0.1" if host in ("0.0.0.0", "*") else host
        self.address = f"tcp://{connect_host}:{port}"
        self.key_file = write_key_file(keys.control) if keys else None
        curve = {"server_key": keys.server.public.decode(), "key_file": str(self.key_file)} if keys else None
        self.path = run_dir / CONTROL_FILE
        self.path.write_text(
            json.dumps({"address": self.address, "replay": replay, "pid": os.getpid(), "curve": curve})
        )

    @property
    def unauthorized(self) -> int:
        """Refused CURVE handshakes (peers without the run's control key)."""
        return self._guard.unauthorized if self._guard else 0

    def poll(self, handler: Callable[[str, dict[str, Any]], dict[str, Any]]) -> None:
        """Answer every waiting request; a bad one gets {"ok": false, "error": ...}."""
        while self._socket.poll(0, zmq.POLLIN):
            try:
                frame = self._socket.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                message = decode(frame)
                if not isinstance(message, Control):
                    raise WireError(f"expected a control message, got {type(message).__name__}")
                reply = {"ok": True, **handler(message.command, dict(message.args))}
            except (WireError, ValueError) as exc:
                reply = {"ok": False, "error": str(exc)}
            self._socket.send(msgpack.packb(reply, use_bin_type=True))

    def close(self) -> None:
        """Idempotent."""
        if self._context.closed:
            return
        self._socket.close()
        if self._guard:
            self._guard.close()
        self._context.term()
        self.path.unlink(missing_ok=True)
        if self.key_file is not None:
            self.key_file.unlink(missing_ok=True)


def send_control(run_dir: Path, command: str, args: dict[str, Any], timeout_s: float = 30.0) -> dict[str, Any]:
    path = Path(run_dir) / CONTROL_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"no running pipeline for {run_dir} (no {CONTROL_FILE}; is `seal train run_dir={run_dir}` running?)"
        )
    record = json.loads(path.read_text())
    address, curve = record["address"], record.get("curve")
    keys = ClientKeys(curve["server_key"], read_key_file(Path(curve["key_file"]))) if curve else None
    reply = request(address, keys, command, args, timeout_s)
    if reply is None:
        why = " (or refused this client's CURVE key)" if keys else ""
        raise RuntimeError(f"the pipeline at {address} did not answer within {timeout_s:.0f} s{why}")
    return reply


def request(
    address: str, keys: ClientKeys | None, command: str, args: dict[str, Any], timeout_s: float
) -> dict[str, Any] | None:
    """One command to a control socket; its reply, or None when none came within ``timeout_s``."""
    context = zmq.Context()  # own context: term() below leaves nothing behind in the caller's
    sock = context.socket(zmq.REQ)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, int(timeout_s * 1000))
    if keys is not None:
        keys.apply(sock)
    sock.connect(address)
    try:
        sock.send(encode(Control(command, args)))
        return msgpack.unpackb(sock.recv(), raw=False)
    except zmq.Again:
        return None
    finally:
        sock.close()
        context.term()
