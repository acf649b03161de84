"""ZeroMQ trajectory stream (real sockets, one process): frames arrive whole,
bad frames are rejected and counted, a lagging learner blocks senders."""
from __future__ import annotations

import time

import pytest

from replay.messages import TagSummary
from replay.queue import ReplayQueue
from replay.transport import ReplayServer, TrajectorySender, TransportConfig, TransportTimeout
from replay.wire import encode
from test_replay import traj  # noqa: E402 - the sibling module (pytest puts tests/unit on sys.path)


def wait_for(predicate, timeout=5.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return False


@pytest.fixture
def server():
    s = ReplayServer(ReplayQueue(group_size=2, groups_per_batch=1), TransportConfig(max_ready_groups=4))
    yield s
    s.close()


def test_trajectories_stream_into_complete_groups(server):
    sender = TrajectorySender(server.address)
    for g in range(3):
        for i in range(2):
            sender.send(traj(group=f"g{g}", index=i, n_tokens=5000))
    assert wait_for(lambda: server.ready() == 3)
    batch = server.take_batch()
    assert [t.rollout_index for t in batch[0].trajectories] == [0, 1] and len(batch[0].trajectories[0].token_ids) == 5000
    assert server.counters()["frames"] == 6 and server.counters()["rejected"] == 0
    sender.close()


def test_bad_frames_are_rejected_and_the_stream_goes_on(server):
    sender = TrajectorySender(server.address)
    sender.send_frame(b"\xc1 not msgpack")
    sender.send_frame(encode(TagSummary("t", "c", [], [], 0.0, False, 0.0, 0)))  # a message of the wrong kind
    sender.send(traj(group="g", index=5))  # rollout index outside the group
    sender.send(traj(group="g", index=0))
    sender.send(traj(group="g", index=1))
    assert wait_for(lambda: server.ready() == 1)
    assert server.counters()["rejected"] == 3
    sender.close()


def test_a_lagging_learner_blocks_senders_instead_of_filling_memory():
    server = ReplayServer(ReplayQueue(group_size=1, groups_per_batch=1), TransportConfig(hwm=1, max_ready_groups=1))
    sender = TrajectorySender(server.address, hwm=1, send_timeout_s=0.5)
    with pytest.raises(TransportTimeout, match="took no frame"):
        for g in range(200):  # nobody takes batches: the receiver stops reading, buffers fill, send times out
            sender.send(traj(group=f"g{g}", index=0, n_tokens=20_000))
    assert server.ready() == 1 and server.counters()["backpressure_s"] > 0
    assert g < 200
    server.close()
    sender.close()


def test_abandoned_groups_ignore_late_rollouts(server):
    sender = TrajectorySender(server.address)
    sender.send(traj(group="dead", index=0))
    assert wait_for(lambda: server.counters()["accepted"] == 1)
    assert server.abandon("dead") is True
    sender.send(traj(group="dead", index=1))
    assert wait_for(lambda: server.counters()["duplicates"] == 1) and server.ready() == 0
    sender.close()
