"""The weight group's watchdog on gloo (weights/broadcast_group.py WeightGroup, learner/weight_broadcast.py).

The learner's rank 0 (here: this process) broadcasts to receivers in processes
of their own; one of them dies or stalls mid-round. Rank 0's round must end
with a WeightGroupError naming the members, within the per-operation bound, not
the group's timeout; the group then refuses rounds until re-formed. NCCL runs the
same checks through a CUDA event and NCCL's async error (GPU only).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import socket

import pytest

HOST = "127.0.0.1"
GROUP_TIMEOUT_S = 300.0  # what the old code would wait out (the test's own timeout is 900 s)
OP_TIMEOUT_S = 3.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def receiver(port: int, rank: int, world: int, tensors: int, fate: str, after: int, report: str = "") -> None:
    """A member that receives ``after`` tensors, then dies (``exit``), stalls (``stall``) or goes on (``ok``);
    ``silent`` never begins a round. ``report``: a file the round's error goes to."""
    import time

    import torch

    from weights.broadcast_group import WeightGroup, WeightGroupError

    group = WeightGroup(
        HOST,
        port,
        rank,
        world,
        "gloo",
        "cpu",
        timeout_s=GROUP_TIMEOUT_S,
        op_timeout_s=GROUP_TIMEOUT_S,
        label=f"test receiver {rank} ({fate})",
    )
    if fate == "silent":
        time.sleep(60)  # joined, alive, never begins a round (a replica stuck before its receive)
        os._exit(0)
    group.begin_round()
    for i in range(tensors):
        if i == after and fate == "exit":
            os._exit(0)
        if i == after and fate == "stall":
            time.sleep(60)  # alive, holding its connections, reading nothing
            os._exit(0)
        try:
            group.broadcast(torch.empty(1 << 14), f"t{i}")
        except WeightGroupError as exc:
            if report:
                with open(report, "w") as f:
                    f.write(str(exc))
            os._exit(1)
    os._exit(0)


def start_receivers(port: int, fates: list[str], tensors: int, after: int, report: str = "") -> list:
    ctx = mp.get_context("spawn")
    procs = [
        ctx.Process(target=receiver, args=(port, r + 1, len(fates) + 1, tensors, fate, after, report), daemon=True)
        for r, fate in enumerate(fates)
    ]
    for p in procs:
        p.start()
    return procs


def walk(n: int, seen: list[int]):
    """What the learner sends: under ZeRO-3 each step of this walk is a gather the other ranks join."""
    import torch

    for i in range(n):
        seen.append(i)
        yield f"t{i}", torch.full((1 << 14,), float(i))


@pytest.mark.parametrize("fate", ["exit", "stall"])
def test_a_receiver_gone_mid_round_fails_the_round_naming_the_members(fate):
    from learner.weight_broadcast import WeightBroadcaster
    from weights.broadcast_group import WeightGroupError

    port, tensors = free_port(), 40
    procs = start_receivers(port, ["ok", fate], tensors, after=5)
    sender = WeightBroadcaster(
        HOST, port, world_size=3, backend="gloo", timeout_s=GROUP_TIMEOUT_S, op_timeout_s=OP_TIMEOUT_S
    )
    seen: list[int] = []
    try:
        with pytest.raises(WeightGroupError) as err:
            sender.broadcast(walk(tensors, seen))
        message = str(err.value)
        assert "test receiver 1 (ok)" in message and f"test receiver 2 ({fate})" in message, message
        assert "A member is gone or stalled" in message
        # The walk was finished though nothing more was sent: the other ZeRO-3 ranks' gathers complete.
        assert seen == list(range(tensors))
        with pytest.raises(WeightGroupError, match="re-form it"):
            sender.broadcast(walk(1, []))
    finally:
        sender.close()
        for p in procs:
            p.kill()
            p.join(10)


def test_a_round_with_every_member_alive_completes_and_the_group_closes():
    from learner.weight_broadcast import WeightBroadcaster

    port, tensors = free_port(), 12
    procs = start_receivers(port, ["ok", "ok"], tensors, after=-1)
    sender = WeightBroadcaster(HOST, port, world_size=3, backend="gloo", timeout_s=120, op_timeout_s=OP_TIMEOUT_S)
    try:
        sender.broadcast(walk(tensors, []))
        for p in procs:
            p.join(60)
            assert p.exitcode == 0
        assert sender.group.members() == {1: "test receiver 1 (ok)", 2: "test receiver 2 (ok)"}
    finally:
        sender.close()
    assert sender.group.closed


def test_a_receiver_that_never_begins_the_round_fails_it_before_anything_is_sent(tmp_path):
    """Issue 38 item 1: rank 0 waits for every receiver's "ready" at most half the group timeout, then
    fails the round without sending and still walks every gather (the other ZeRO-3 ranks', bounded by
    the full timeout): without the handshake it waited the full timeout on its first tensor. Issue 46
    item 7: the receiver that was ready ends its round with rank 0's reason, read from the store."""
    from learner.weight_broadcast import WeightBroadcaster
    from weights.broadcast_group import WeightGroupError

    port, tensors, timeout_s, report = free_port(), 8, 20.0, tmp_path / "ready-receiver.txt"
    procs = start_receivers(port, ["ok", "silent"], tensors, after=-1, report=str(report))
    sender = WeightBroadcaster(HOST, port, world_size=3, backend="gloo", timeout_s=timeout_s, op_timeout_s=OP_TIMEOUT_S)
    seen: list[int] = []
    try:
        with pytest.raises(WeightGroupError) as err:
            sender.broadcast(walk(tensors, seen))
        assert "receiver rank(s) [2] never said they were ready; nothing was sent" in str(err.value)
        assert "test receiver 2 (silent)" in str(err.value)
        assert seen == list(range(tensors))
        procs[0].join(60)
        assert procs[0].exitcode is not None  # the ready receiver (300 s bound) saw the round aborted
        assert "rank 0 gave round 1 up" in report.read_text() and "never said they were ready" in report.read_text()
        assert sender.group._store.check(["seal-weight-abort/1"])  # rank 0's word, in its store
    finally:
        sender.close()
        for p in procs:
            p.kill()
            p.join(10)


def test_rank_0s_word_ends_a_receivers_wait_where_the_transport_says_nothing():
    """Issue 46 item 7. Over NVLink or shared memory NCCL reports no peer's abort: a receiver that said
    ready waited out its first-op bound (the group's timeout: 600 s by default, here 300), paused, and
    was restarted as hung. Here rank 0 stays silent on the transport (its group open, nothing sent, as
    NVLink would look) and only writes the round's abort key, as its _fail does: the receiver's
    watchdog reads it and ends the round within a poll or two, with rank 0's reason."""
    import threading
    import time

    import torch

    from weights.broadcast_group import ABORT_POLL_S, WeightGroup, WeightGroupError

    port, box = free_port(), {}
    opener = threading.Thread(target=lambda: box.update(g0=WeightGroup(HOST, port, 0, 2, "gloo", "cpu", timeout_s=300)))
    opener.start()
    g1 = WeightGroup(HOST, port, 1, 2, "gloo", "cpu", timeout_s=GROUP_TIMEOUT_S, label="test receiver 1 (ready)")
    opener.join(60)

    def receive():
        t0 = time.monotonic()
        try:
            g1.begin_round()
            g1.broadcast(torch.empty(4), "t0")
        except WeightGroupError as exc:
            box["error"], box["seconds"] = str(exc), time.monotonic() - t0

    waiting = threading.Thread(target=receive, daemon=True)
    try:
        waiting.start()
        time.sleep(1.0)  # the receiver is in its first receive of round 1
        assert waiting.is_alive()
        box["g0"]._store.set("seal-weight-abort/1", "round 1's start: receiver rank(s) [2] never said they were ready")
        waiting.join(30)
        assert not waiting.is_alive(), "the receiver waits out its bound"
        assert "rank 0 gave round 1 up: round 1's start: receiver rank(s) [2]" in box["error"], box["error"]
        assert box["seconds"] < 1.0 + 10 * ABORT_POLL_S
    finally:
        g1.close()
        box["g0"].close()


def test_forming_the_group_is_bounded_when_a_member_stops_after_the_rendezvous():
    """Issue 46 item 8, as far as gloo shows it: a member that joins the store and never forms its part
    (a replica failing in between) ends rank 0's join within the group's timeout, as a WeightGroupError
    naming the group. gloo's waits were already bounded (a bare store error came out); NCCL's blocking
    init had no bound at all: weights/nccl_comm.py forms it non-blocking (tests/unit/weights)."""
    import threading
    import time
    from datetime import timedelta

    from torch.distributed import TCPStore

    from weights.broadcast_group import WeightGroup, WeightGroupError

    port, box = free_port(), {}

    def join():
        t0 = time.monotonic()
        try:
            WeightGroup(HOST, port, 0, 2, "gloo", "cpu", timeout_s=3.0)
        except WeightGroupError as exc:
            box["error"], box["seconds"] = str(exc), time.monotonic() - t0

    joining = threading.Thread(target=join, daemon=True)
    joining.start()
    time.sleep(0.5)
    member = TCPStore(HOST, port, 2, is_master=False, timeout=timedelta(seconds=30))  # the rendezvous, then nothing
    joining.join(30)
    del member
    assert not joining.is_alive()
    assert "forming the weight group (gloo, rank 0 of 2, bound 3 s) failed" in box["error"], box["error"]
    assert box["seconds"] < 15
