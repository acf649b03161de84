"""Where a run's heavy state goes (checkpoints, snapshot weights): ``trainer.storage``, a path
every node that hosts a learner rank or a generator replica must see (a shared filesystem,
as prime-rl and verl require). Default: the run dir.

With ``trainer.storage=/shared/seal`` a run's state goes to /shared/seal/<run dir name>; the
path is recorded in RUN_DIR/run.json, so `resume=RUN_DIR` finds it again. At start each such
node writes a probe there and the driver reads it back: a node that writes to a disk of its
own (a node-local /tmp, a missing mount) stops the start with one line naming it.
"""

from __future__ import annotations

import json
import socket
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

PROBE_DIR = ".seal-probe"


class StorageError(ValueError):
    """A node cannot see the run's storage (one line: node and path)."""


def recorded_storage(run_dir: Path) -> Path | None:
    run_file = Path(run_dir) / "run.json"
    if not run_file.is_file():
        return None
    value = json.loads(run_file.read_text()).get("storage")
    return Path(value) if value else None


def run_storage(run_dir: Path, configured: str | None) -> Path:
    """This run's storage directory: what run.json recorded (a resumed run), else
    ``configured``/<run dir name>, else the run dir itself."""
    run_dir = Path(run_dir)
    want = Path(configured).expanduser().absolute() / run_dir.name if configured else run_dir
    recorded = recorded_storage(run_dir)
    if recorded is not None and configured and recorded != want:
        raise StorageError(
            f"{run_dir} keeps its state in {recorded} (run.json), not {want}: "
            "resume it without trainer.storage, or with the storage it started with"
        )
    return recorded if recorded is not None else want


def record_storage(run_dir: Path, storage: Path) -> None:
    run_file = Path(run_dir) / "run.json"
    record = json.loads(run_file.read_text()) if run_file.is_file() else {}
    if record.get("storage") != str(storage):
        record["storage"] = str(storage)
        run_file.write_text(json.dumps(record, indent=2))


def checkpoint_dir(storage: Path) -> Path:
    return Path(storage) / "checkpoints" / "latest"


def resume_checkpoint(run_dir: Path) -> Path:
    """The checkpoint `resume=RUN_DIR` continues from."""
    return checkpoint_dir(recorded_storage(run_dir) or Path(run_dir))


def _write_probe(directory: str, token: str) -> dict[str, str]:
    """Runs on the node being checked: a file under the storage path, named for the node."""
    import ray

    ip = ray.util.get_node_ip_address()
    # Named for the node id too: nodes can share an IP (several raylets on one host, as a rehearsal's
    # logical nodes do), and the driver removes each probe as it reads it.
    node_id = ray.get_runtime_context().get_node_id()
    path = Path(directory) / PROBE_DIR / f"{ip}-{node_id[:12]}-{token}"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{ip} {token}\n")
    return {"ip": ip, "host": socket.gethostname(), "path": str(path)}


def check_nodes_see(storage: Path, nodes: Mapping[str, str], timeout_s: float = 120.0) -> None:
    """Every node in ``nodes`` (Ray node id -> what runs there, for the message) writes a probe
    under ``storage``; the driver must read each back. Raises StorageError naming the first
    node whose probe the driver cannot see, or that cannot write there at all."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    storage = Path(storage)
    storage.mkdir(parents=True, exist_ok=True)
    token = uuid.uuid4().hex[:8]
    probe = ray.remote(num_cpus=0, max_retries=0)(_write_probe)
    refs = {
        node: probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(
            str(storage), token
        )
        for node in nodes
    }
    try:
        for node, ref in refs.items():
            try:
                got: dict[str, Any] = ray.get(ref, timeout=timeout_s)
            except ray.exceptions.GetTimeoutError:
                raise StorageError(
                    f"node {node[:12]} ({nodes[node]}) did not write its storage probe under {storage} "
                    f"within {timeout_s:g}s"
                ) from None
            except ray.exceptions.RayTaskError as exc:
                raise StorageError(
                    f"node {node[:12]} ({nodes[node]}) cannot write to the run's storage {storage}: "
                    f"{str(exc.cause).strip().splitlines()[-1]}"
                ) from None
            seen = Path(got["path"])
            if not seen.is_file() or seen.read_text().split()[-1:] != [token]:
                raise StorageError(
                    f"node {got['ip']} ({got['host']}; {nodes[node]}) wrote its probe to {seen} but the driver "
                    f"cannot read it: the run's storage {storage} (trainer.storage) must be a path every node "
                    "sees, a shared filesystem"
                )
            seen.unlink()
    finally:
        try:
            (storage / PROBE_DIR).rmdir()
        except OSError:
            pass
