"""CURVE on the replay stream (real sockets): the run's env-actor key gets its
frames through; a sender with a key pair of its own, one with the wrong server
key and one without CURVE get nothing through, are counted (unauthorized),
and the good sender's stream goes on."""

from __future__ import annotations

import time

import pytest
from test_replay import traj  # the sibling module (pytest puts tests/unit on sys.path)
from test_transport import wait_for

from replay.auth import ClientKeys, KeyPair, RunKeys
from replay.queue import ReplayQueue
from replay.transport import ReplayServer, TrajectorySender, TransportConfig, TransportTimeout


@pytest.fixture
def server():
    s = ReplayServer(
        ReplayQueue(group_size=2, groups_per_batch=1, reissue_after_s=900.0), TransportConfig(max_ready_groups=100)
    )
    yield s
    s.close()


def _send_group(sender, group):
    for i in range(2):
        sender.send(traj(group=group, index=i))


def bad_senders(server):
    keys = server.client_keys
    stranger = ClientKeys(keys.server_public, KeyPair.generate())  # knows the server, not admitted
    wrong_server = ClientKeys(KeyPair.generate().public, keys.client)  # the run's client key, another server's key
    return {"stranger": stranger, "wrong_server": wrong_server, "plain": None}


def test_only_the_runs_env_actor_key_gets_frames_through(server):
    good = TrajectorySender(server.address, keys=server.client_keys, send_timeout_s=600.0, hwm=64)
    bad = {
        name: TrajectorySender(server.address, send_timeout_s=0.2, linger_s=0, keys=k, hwm=64)
        for name, k in bad_senders(server).items()
    }
    try:
        for name, sender in bad.items():
            try:
                _send_group(sender, f"bad-{name}")  # queued on the sender side: the handshake never completes
            except TransportTimeout:
                pass  # the handshake already failed and dropped the pipe: send has nowhere to queue
        _send_group(good, "good-0")
        assert wait_for(lambda: server.ready() == 1)
        assert wait_for(lambda: server.counters().server.unauthorized >= len(bad)), server.counters()
        _send_group(good, "good-1")  # the server goes on serving good senders
        assert wait_for(lambda: server.ready() == 2)
        time.sleep(0.3)  # time for a bad frame to arrive, were it let through
        assert [g.group_id for g in server.take_batch() + server.take_batch()] == ["good-0", "good-1"]
        counters = server.counters()
        assert counters.server.frames == 4 and counters.queue.accepted == 4 and counters.server.rejected == 0
        assert server.ready() == 0
    finally:
        good.close()
        for sender in bad.values():
            sender.close()


def test_a_refused_sender_times_out_naming_curve(server):
    sender = TrajectorySender(server.address, hwm=1, send_timeout_s=0.2, linger_s=0)
    with pytest.raises(TransportTimeout, match="wants CURVE keys"):
        for g in range(50):  # the first frames fill the sender's buffers, then send blocks and times out
            sender.send(traj(group=f"g{g}", index=0, n_tokens=20_000))
    sender.close()
    assert server.counters().server.frames == 0


def test_the_driver_gives_its_keys_and_curve_can_be_turned_off():
    keys = RunKeys.generate()
    server = ReplayServer(ReplayQueue(group_size=2, groups_per_batch=1, reissue_after_s=900.0), TransportConfig(), keys)
    assert server.client_keys == keys.client("actors") and server.client_keys.server_public == keys.server.public
    server.close()
    server.close()  # idempotent
    plain = ReplayServer(
        ReplayQueue(group_size=2, groups_per_batch=1, reissue_after_s=900.0), TransportConfig(curve=False)
    )
    try:
        assert plain.keys is None and plain.client_keys is None
        sender = TrajectorySender(plain.address, send_timeout_s=600.0, hwm=64)
        _send_group(sender, "g")
        assert wait_for(lambda: plain.ready() == 1) and plain.counters().server.unauthorized == 0
        sender.close()
    finally:
        plain.close()
    with pytest.raises(ValueError, match="curve=false"):
        ReplayServer(
            ReplayQueue(group_size=2, groups_per_batch=1, reissue_after_s=900.0), TransportConfig(curve=False), keys
        )


def test_keys_are_checked_and_secrets_stay_out_of_reprs():
    pair = KeyPair.generate()
    assert pair.secret.decode() not in repr(pair) and pair.secret.decode() not in repr(RunKeys(pair, pair, pair))
    assert KeyPair(pair.public.decode(), pair.secret.decode()) == pair  # str keys (JSON) are accepted
    with pytest.raises(ValueError, match="40-character Z85"):
        KeyPair(b"short", pair.secret)
    with pytest.raises(ValueError, match="no client role"):
        RunKeys.generate().client("anyone")


def test_a_curve_server_with_a_receive_hwm_of_1_still_delivers():
    # libzmq 4.3.5 with ZAP and RCVHWM=1 left a frame that poll reported and recv never returned.
    server = ReplayServer(
        ReplayQueue(group_size=2, groups_per_batch=1, reissue_after_s=900.0),
        TransportConfig(hwm=1, max_ready_groups=100),
    )
    sender = TrajectorySender(server.address, hwm=1, keys=server.client_keys, send_timeout_s=600.0)
    try:
        for g in range(3):
            _send_group(sender, f"g{g}")
        assert wait_for(lambda: server.ready() == 3), server.counters()
    finally:
        sender.close()
        server.close()


def test_a_port_in_use_fails_cleanly(server):
    import threading

    port = int(server.address.rsplit(":", 1)[1])
    before = threading.active_count()
    with pytest.raises(Exception, match="[Aa]ddress already in use"):
        ReplayServer(ReplayQueue(group_size=2, groups_per_batch=1, reissue_after_s=900.0), TransportConfig(port=port))
    assert threading.active_count() == before  # no ZAP or monitor thread left behind
