import pytest

from seal.runtime.router import ReplicaRouter


def test_a_group_stays_on_its_replica_and_new_groups_balance():
    r = ReplicaRouter(["g0", "g1"])
    assert r.route("a", 100) == "g0"
    assert r.route("b", 100) == "g1"
    assert r.route("a", 100) == "g0"  # later turns / rollouts of a: same replica, load not counted twice
    assert r.load["g0"].outstanding_tokens == 100
    assert r.route("c", 50) == "g0"  # 100 tokens and 1 group routed each: the order breaks the tie
    assert r.load["g0"].outstanding_tokens == 150
    assert r.route("d", 10) == "g1"  # g1 has 100 < 150
    r.release("a")
    assert r.load["g0"].outstanding_tokens == 50
    assert r.route("e", 10) == "g0"  # 50 < 110


def test_least_loaded_by_tokens_not_by_group_count():
    r = ReplicaRouter(["g0", "g1"])
    r.route("long", 1000)
    for i in range(10):  # g1 holds fewer tokens until the tenth short group
        assert r.route(f"short{i}", 100) == "g1"
    assert r.load["g1"].outstanding_tokens == 1000
    assert r.route("next", 100) == "g0"  # 1000 each: g0 has had fewer groups routed


def test_release_is_idempotent_and_unknown_groups_are_ignored():
    r = ReplicaRouter(["g0"])
    r.route("a", 10)
    r.release("a")
    r.release("a")
    r.release("never")
    assert r.load["g0"].outstanding_tokens == 0 and r.load["g0"].groups == 0


def test_a_removed_replica_gets_no_new_group_and_reports_its_groups():
    r = ReplicaRouter(["g0", "g1"])
    r.route("a", 10)
    r.route("b", 10)
    assert r.remove("g0") == ["a"]
    assert r.route("c", 10) == "g1"
    assert r.route("a", 10) == "g0"  # still sticky until the driver releases it (it re-issues the group)
    r.release("a")
    r.add("g0")
    assert "g0" in r.replicas


def test_no_replica_left_is_a_clear_error():
    r = ReplicaRouter(["g0"])
    r.remove("g0")
    with pytest.raises(RuntimeError, match="no generator replica"):
        r.route("a", 1)


def test_bad_replica_lists_are_refused():
    with pytest.raises(ValueError, match="at least one"):
        ReplicaRouter([])
    with pytest.raises(ValueError, match="repeat"):
        ReplicaRouter(["a", "a"])
