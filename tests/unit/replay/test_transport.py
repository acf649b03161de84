"""ZeroMQ trajectory stream (real sockets): frames arrive whole, bad frames are
rejected and counted, a lagging learner blocks senders, a producer that closes
and exits has delivered everything it sent."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_replay import traj  # the sibling module (pytest puts tests/unit on sys.path)

from replay.control_messages import Control
from replay.queue import ReplayQueue
from replay.transport import ReplayServer, TrajectorySender, TransportConfig, TransportTimeout
from replay.wire import encode


def wait_for(predicate, timeout=5.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return False


@pytest.fixture
def server():
    s = ReplayServer(
        ReplayQueue(group_size=2, groups_per_batch=1, reissue_after_s=900.0), TransportConfig(max_ready_groups=4)
    )
    yield s
    s.close()


def test_trajectories_stream_into_complete_groups(server):
    sender = TrajectorySender(server.address, keys=server.client_keys, send_timeout_s=600.0, hwm=64)
    for g in range(3):
        for i in range(2):
            sender.send(traj(group=f"g{g}", index=i, n_tokens=5000))
    assert wait_for(lambda: server.ready() == 3)
    batch = server.take_batch()
    assert [t.rollout_index for t in batch[0].trajectories] == [0, 1] and len(
        batch[0].trajectories[0].token_ids
    ) == 5000
    assert server.counters().server.frames == 6 and server.counters().server.rejected == 0
    sender.close()


def test_bad_frames_are_rejected_and_the_stream_goes_on(server):
    sender = TrajectorySender(server.address, keys=server.client_keys, send_timeout_s=600.0, hwm=64)
    sender.send_frame(b"\xc1 not msgpack")
    sender.send_frame(encode(Control("scale", {"env": 2})))  # a message of the wrong kind
    sender.send(traj(group="g", index=5))  # rollout index outside the group
    sender.send(traj(group="g", index=0))
    sender.send(traj(group="g", index=1))
    assert wait_for(lambda: server.ready() == 1)
    assert server.counters().server.rejected == 3
    sender.close()


def test_a_lagging_learner_blocks_senders_instead_of_filling_memory():
    server = ReplayServer(
        ReplayQueue(group_size=1, groups_per_batch=1, reissue_after_s=900.0), TransportConfig(hwm=1, max_ready_groups=1)
    )
    sender = TrajectorySender(
        server.address, hwm=1, send_timeout_s=0.5, linger_s=0.5, keys=server.client_keys
    )  # close() gives up on the undeliverable rest
    with pytest.raises(TransportTimeout, match="took no frame"):
        for g in range(200):  # nobody takes batches: the receiver stops reading, buffers fill, send times out
            sender.send(traj(group=f"g{g}", index=0, n_tokens=20_000))
    assert server.ready() == 1 and server.counters().server.backpressure_s > 0
    assert g < 200
    server.close()
    sender.close()


def test_abandoned_groups_ignore_late_rollouts(server):
    sender = TrajectorySender(server.address, keys=server.client_keys, send_timeout_s=600.0, hwm=64)
    sender.send(traj(group="dead", index=0))
    assert wait_for(lambda: server.counters().queue.accepted == 1)
    assert server.abandon("dead") is True
    sender.send(traj(group="dead", index=1))
    assert wait_for(lambda: server.counters().queue.duplicates == 1) and server.ready() == 0
    sender.close()


PRODUCER = """
import sys
sys.path[:0] = [{unit!r}]
from replay.auth import ClientKeys, KeyPair
from replay.transport import TrajectorySender
from test_replay import traj
keys = ClientKeys({server_public!r}, KeyPair({public!r}, {secret!r}))  # as an env actor gets them through Ray
sender = TrajectorySender({address!r}, hwm=8, keys=keys, send_timeout_s=600.0)
for g in range({groups}):
    for i in range(2):
        sender.send(traj(group=f"g{{g}}", index=i, n_tokens=8192))
sender.close()
"""


def test_a_producer_that_closes_and_exits_has_delivered_every_frame():
    # send() only queues; before close() flushed, a process exiting right after its last
    # send lost the frames still queued (up to the high-water marks) or crashed in teardown.
    server = ReplayServer(
        ReplayQueue(group_size=2, groups_per_batch=1, reissue_after_s=900.0),
        TransportConfig(hwm=8, max_ready_groups=1000),
    )
    try:
        keys = server.client_keys
        code = PRODUCER.format(
            unit=str(Path(__file__).parent),
            address=server.address,
            groups=150,
            server_public=keys.server_public,
            public=keys.client.public,
            secret=keys.client.secret,
        )
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert wait_for(lambda: server.ready() == 150, timeout=30), server.counters()
        assert server.counters().server.rejected == 0
    finally:
        server.close()


def test_a_closed_sender_refuses_to_send():
    server = ReplayServer(ReplayQueue(group_size=2, groups_per_batch=1, reissue_after_s=900.0))
    sender = TrajectorySender(server.address, keys=server.client_keys, send_timeout_s=600.0, hwm=64)
    sender.close()
    sender.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        sender.send(traj(group="g", index=0))
    server.close()


def test_frames_are_counted_by_the_address_they_came_from(server):
    sender = TrajectorySender(server.address, keys=server.client_keys, send_timeout_s=600.0, hwm=64)
    for i in range(2):
        sender.send(traj(group="g0", index=i))
    assert wait_for(lambda: server.counters().server.frames_by_peer.get("127.0.0.1") == 2)
    sender.close()


def test_a_wildcard_bind_advertises_a_routable_address_not_the_hostnames():
    """On many hosts the hostname resolves to 127.0.0.1, which no other node reaches."""
    from replay.transport import routable_ip

    s = ReplayServer(
        ReplayQueue(group_size=1, groups_per_batch=1, reissue_after_s=900.0), TransportConfig(host="0.0.0.0")
    )
    try:
        assert s.address.startswith(f"tcp://{routable_ip()}:")
        assert TransportConfig(host="0.0.0.0", advertise_host="10.1.2.3").advertise_host == "10.1.2.3"
    finally:
        s.close()
