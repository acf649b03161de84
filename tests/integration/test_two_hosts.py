"""`seal train cluster=multinode` on a real two-host Ray cluster: two network namespaces with
their own addresses (tests/integration/two_hosts.py), a Ray head in one and a worker in the
other, Ray's token authentication on. The driver runs in the head's namespace as a user
would run it there; what it reports is read from its run dir.

The quick checks and one full run are in the default suite; the storage probe, losing the
worker host mid-run, the resume after it and `ray job submit` take minutes each and are `slow`.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.integration.two_hosts import TwoHosts, namespaces_unavailable

WHY_NOT = namespaces_unavailable()
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=f"two-host test: {WHY_NOT}")
SEAL = str(Path(sys.executable).parent / "seal")
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def hosts():
    # A short root: Ray's socket paths under it must stay within the 107 bytes of a unix socket name.
    root = Path(tempfile.mkdtemp(prefix="seal2h-", dir="/tmp"))
    c = TwoHosts(root)
    try:
        c.start()
        yield c
    finally:
        c.close()
        shutil.rmtree(root, ignore_errors=True)


def train_args(hosts: TwoHosts, run_dir: Path, *overrides: str) -> list[str]:
    return [
        SEAL,
        "train",
        "cluster=multinode",
        f"cluster.address={hosts.address}",
        "env=toy",
        "model=tiny",
        "generator=vllm_async_cpu",
        "generator.cpu_kv_cache_gb=1",
        "sampling.max_new_tokens=32",
        "n=2",
        "trainer.groups_per_step=2",
        "trainer.filter_groups=none",
        "trainer.oversample=0",
        "learner.timeout_s=120",
        "cluster.env_actor.num_cpus=0.5",
        "cluster.generator.num_cpus=1",
        "cluster.generator.num_gpus=0",
        "cluster.learner.num_cpus=1",
        "cluster.learner.num_gpus=0",
        "evaluation.final=false",
        f"run_dir={run_dir}",
        *overrides,
    ]


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]


def wait_for(path: Path, proc, timeout_s: float, rows: int = 0) -> None:
    """Until ``path`` exists (and, for metrics.jsonl, holds ``rows`` steps)."""
    deadline = time.monotonic() + timeout_s
    while not path.exists() or (rows and len(metrics(path.parent)) < rows):
        if proc.poll() is not None:
            raise AssertionError(f"the run ended (rc {proc.returncode}) before {path.name} appeared")
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} did not appear within {timeout_s:g}s")
        time.sleep(1)


INTRUDER = r"""
import json, sys, zmq
control = json.load(open(sys.argv[1]))
server_key, head_ip = control["curve"]["server_key"].encode(), sys.argv[2]
public, secret = zmq.curve_keypair()  # keys of its own: not the run's
ctx = zmq.Context()
def secured(kind):
    s = ctx.socket(kind)
    s.curve_serverkey, s.curve_publickey, s.curve_secretkey = server_key, public, secret
    s.setsockopt(zmq.LINGER, 0)
    return s
push = secured(zmq.PUSH)
push.connect(control["replay"])
push.send(b"\x00poisoned trajectory", flags=zmq.NOBLOCK) if push.poll(0, zmq.POLLOUT) else None
req = secured(zmq.REQ)
req.connect("tcp://%s:%s" % (head_ip, control["address"].rsplit(":", 1)[1]))
req.send(b"\x00scale", flags=zmq.NOBLOCK) if req.poll(3000, zmq.POLLOUT) else None
answered = bool(req.poll(3000, zmq.POLLIN))
print(json.dumps({"control_answered": answered}))
"""


def test_training_spans_both_hosts_over_their_addresses(hosts, tmp_path):
    """Env actors, a learner rank and a generator replica on each host; trajectories from the
    worker host arrive from its address; an intruder on the worker host with keys of its own
    gets nothing through the replay or the control socket; exactly-once accounting."""
    run_dir = tmp_path / "run"
    args = train_args(
        hosts,
        run_dir,
        "learner=zero3",
        "learner.world_size=2",
        "generator.replicas=2",
        "trainer.steps=2",
        "cluster.env_actors=4",
        "+cluster.learner.resources={learner_slot:1}",
    )
    proc = hosts.popen_on(hosts.head, args, tmp_path / "train.log", cwd=tmp_path)
    try:
        wait_for(run_dir / "control.json", proc, 600)
        intruder = tmp_path / "intruder.py"
        intruder.write_text(INTRUDER)
        got = hosts.run_on(
            hosts.worker, [sys.executable, str(intruder), str(run_dir / "control.json"), hosts.head.ip], timeout_s=60
        )
        assert got.returncode == 0, got.stderr[-2000:]
        assert json.loads(got.stdout.strip().splitlines()[-1]) == {"control_answered": False}
        assert proc.wait(timeout=600) == 0, (tmp_path / "train.log").read_text()[-4000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    rows = metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2]
    assert sum(r["trained_groups"] for r in rows) == 4 and sum(r["dropped"] for r in rows) == 0
    assert sum(r["duplicates"] for r in rows) == 0 and rows[-1]["learner_world_size"] == 2
    peers = rows[-1]["replay_frames_by_peer"]
    assert set(peers) == {hosts.head.ip, hosts.worker.ip} and min(peers.values()) > 0, peers  # no 127.0.0.1
    assert rows[-1]["unauthorized"] >= 2  # the replay and the control handshakes, refused and counted
    placed = json.loads((run_dir / "placement.json").read_text())
    for kind in ("learner", "generator", "env"):
        assert set(placed[kind].values()) == {hosts.head.ip, hosts.worker.ip}, placed
    shards = sorted(p.name for p in (run_dir / "checkpoints" / "latest").glob("*/zero_pp_rank_*_model_states.pt"))
    assert len(shards) >= 2 and {s.split("_")[3] for s in shards} == {"0", "1"}


def test_a_loopback_bind_is_refused_on_a_two_host_cluster(hosts, tmp_path):
    got = hosts.run_on(
        hosts.head,
        train_args(hosts, tmp_path / "run", "cluster.bind_host=127.0.0.1", "trainer.steps=1"),
        timeout_s=300,
        cwd=tmp_path,
    )
    assert got.returncode == 2, got.stdout[-2000:] + got.stderr[-2000:]
    assert f"nodes at {hosts.worker.ip} but the replay stream binds to 127.0.0.1" in got.stderr


def test_a_raylet_without_the_clusters_token_cannot_join(hosts):
    got = hosts.join_with_token("0" * 64)
    assert got.returncode != 0 and "InvalidAuthToken" in got.stdout + got.stderr, got.stderr[-2000:]
    assert hosts.alive_nodes() == sorted([hosts.head.ip, hosts.worker.ip])


@pytest.mark.slow  # about 2 minutes: both engines start before the probe
def test_storage_only_the_worker_sees_stops_the_start_naming_the_worker(hosts, tmp_path):
    """trainer.storage on a path that is a private tmpfs on the worker host: its learner rank's
    probe lands where the driver cannot read it, and the start stops with one line."""
    args = train_args(
        hosts,
        tmp_path / "run",
        "learner=torch",
        "trainer.steps=1",
        f"trainer.storage={hosts.private_dir}",
        "+cluster.learner.resources={host_worker:1}",
        "+cluster.generator.resources={host_head:1}",
    )
    got = hosts.run_on(hosts.head, args, timeout_s=600, cwd=tmp_path)
    assert got.returncode == 2, got.stdout[-2000:] + got.stderr[-2000:]
    line = [x for x in got.stderr.splitlines() if x.startswith("seal: error:")]
    assert (
        line
        and f"node {hosts.worker.ip}" in line[0]
        and "cannot read it" in line[0]
        and str(hosts.private_dir) in line[0]
    ), got.stderr[-3000:]


@pytest.mark.slow
def test_the_same_job_through_ray_job_submit(hosts, tmp_path):
    run_dir = tmp_path / "run"
    train = " ".join(
        train_args(hosts, run_dir, "learner=torch", "trainer.steps=1", "cluster.address=auto", "cluster.env_actors=2")
    )
    got = hosts.run_on(
        hosts.head,
        [
            str(Path(sys.executable).parent / "ray"),
            "job",
            "submit",
            f"--address={hosts.dashboard}",
            "--",
            "bash",
            "-c",
            f"cd {tmp_path} && {train}",
        ],
        timeout_s=900,
    )
    assert got.returncode == 0, got.stdout[-3000:] + got.stderr[-2000:]
    assert [r["step"] for r in metrics(run_dir)] == [1]


@pytest.mark.slow
def test_losing_the_worker_host_mid_run_the_run_goes_on_with_the_head(hosts, tmp_path):
    """The learner on the head; a replica and env actors on each host. Every Ray process of the
    worker host is killed after the first step: its actors are lost, the head's finish the run
    with exact accounting."""
    run_dir = tmp_path / "run"
    args = train_args(
        hosts,
        run_dir,
        "learner=torch",
        "generator.replicas=2",
        "trainer.steps=4",
        "trainer.mode=sync",
        "cluster.env_actors=2",
        "+cluster.learner.resources={host_head:1}",
        "+cluster.generator.resources={generator_slot:1}",
        "generator.update_timeout_s=60",
    )
    proc = hosts.popen_on(hosts.head, args, tmp_path / "train.log", cwd=tmp_path)
    try:
        wait_for(run_dir / "metrics.jsonl", proc, 900, rows=1)
        placed = json.loads((run_dir / "placement.json").read_text())
        assert hosts.worker.ip in placed["generator"].values() and hosts.worker.ip in placed["env"].values(), placed
        assert set(placed["coordinator"].values()) == {hosts.head.ip}  # the driver's node: the run's state stays
        assert hosts.worker.kill_all() > 0
        assert proc.wait(timeout=900) == 0, (tmp_path / "train.log").read_text()[-4000:]
    finally:
        if proc.poll() is None:
            proc.kill()
        hosts.start_worker()
    rows = metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert sum(r["trained_groups"] for r in rows) == 8 and sum(r["duplicates"] for r in rows) == 0
    assert rows[-1]["generator_replicas"] == 1 or rows[-1].get("weight_sync_failed_replicas"), rows[-1]


@pytest.mark.slow
def test_a_learner_rank_lost_with_its_host_stops_the_run_named_and_it_resumes(hosts, tmp_path):
    run_dir = tmp_path / "run"
    base = [
        "learner=zero2",
        "learner.world_size=2",
        "+cluster.learner.resources={learner_slot:1}",
        "+cluster.generator.resources={host_head:1}",
        "cluster.env_actors=2",
        "trainer.mode=sync",
        "trainer.checkpoint_every=1",
    ]  # the default (5) would leave nothing to resume from at step 2
    proc = hosts.popen_on(
        hosts.head, train_args(hosts, run_dir, *base, "trainer.steps=6"), tmp_path / "train.log", cwd=tmp_path
    )
    try:
        wait_for(run_dir / "metrics.jsonl", proc, 900, rows=2)  # step 2's row: step 1's checkpoint is complete
        killed_at = time.monotonic()
        hosts.worker.kill_all()
        rc = proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
        hosts.start_worker()
    log = (tmp_path / "train.log").read_text()
    assert rc == 2 and time.monotonic() - killed_at < 300, log[-3000:]
    assert f"on node {hosts.worker.ip}" in log and "at step" in log, log[-3000:]
    # The last complete checkpoint: step 1, or step 2 when its checkpoint finished before the kill
    # (learner.json is written after every rank's files).
    saved = json.loads((run_dir / "checkpoints" / "latest" / "learner.json").read_text())["step"]
    assert 1 <= saved <= len(metrics(run_dir)), saved
    got = hosts.run_on(
        hosts.head,
        # A resume reads the run's recorded config (its groups chosen): settings only.
        [SEAL, "train", f"cluster.address={hosts.address}", "trainer.steps=1", f"resume={run_dir}"],
        timeout_s=900,
        cwd=tmp_path,
    )
    assert got.returncode == 0, got.stdout[-2000:] + got.stderr[-3000:]
    assert metrics(run_dir)[-1]["step"] == saved + 1  # it goes on from the checkpoint, one step
    assert os.environ.get("RAY_ADDRESS") is None  # the test process itself never joined the cluster
