"""Where a run's checkpoints and snapshot weights go (seal/runtime/storage.py), and the interface gloo
is pointed at (weights/netif.py)."""

from __future__ import annotations

import json
import os

import pytest

from seal.runtime.storage import StorageError, checkpoint_dir, record_storage, resume_checkpoint, run_storage
from weights.netif import interface_with, use_interface_of


def test_the_default_storage_is_the_run_dir(tmp_path):
    run = tmp_path / "runs" / "r1"
    run.mkdir(parents=True)
    assert run_storage(run, None) == run
    assert resume_checkpoint(run) == run / "checkpoints" / "latest"


def test_a_configured_storage_holds_one_dir_per_run_and_resume_finds_it(tmp_path):
    run = tmp_path / "runs" / "r1"
    run.mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"seed": 0}))
    storage = run_storage(run, str(tmp_path / "shared"))
    assert storage == tmp_path / "shared" / "r1"
    record_storage(run, storage)
    assert json.loads((run / "run.json").read_text()) == {"seed": 0, "storage": str(storage)}
    assert run_storage(run, None) == storage  # a resume without the override keeps it
    assert resume_checkpoint(run) == checkpoint_dir(storage) == storage / "checkpoints" / "latest"


def test_resuming_with_another_storage_is_refused(tmp_path):
    run = tmp_path / "r1"
    run.mkdir()
    record_storage(run, tmp_path / "a" / "r1")
    with pytest.raises(StorageError, match="keeps its state in"):
        run_storage(run, str(tmp_path / "b"))


def test_gloo_is_pointed_at_the_interface_holding_the_node_ip(monkeypatch):
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    assert interface_with("127.0.0.1") == "lo"
    assert interface_with("203.0.113.77") is None  # TEST-NET-3: no interface here holds it
    assert use_interface_of("127.0.0.1") is None and "GLOO_SOCKET_IFNAME" not in os.environ  # one machine: as is
    assert use_interface_of("203.0.113.77") is None and "GLOO_SOCKET_IFNAME" not in os.environ
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth9")
    assert (
        use_interface_of("127.0.0.2") is None and os.environ["GLOO_SOCKET_IFNAME"] == "eth9"
    )  # the user's choice stands


def test_an_interface_chosen_earlier_is_chosen_again_not_taken_for_the_users(monkeypatch):
    import weights.netif as netif

    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    monkeypatch.setattr(netif, "_CHOSEN", {"GLOO_SOCKET_IFNAME": "eth0"})
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth0")  # set by an earlier call in this process
    monkeypatch.setattr(netif, "interface_with", lambda ip: "veth1" if ip == "10.0.0.2" else None)
    assert use_interface_of("10.0.0.2") == "veth1" and os.environ["GLOO_SOCKET_IFNAME"] == "veth1"
