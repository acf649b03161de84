"""WeightPublisher (seal/runtime/publisher.py) with fakes at its edges: a fleet that confirms or fails
each replica's update as told, a learner group that hands out numbered weights. The version admission
counts from (``acked``) moves only when every serving replica confirmed it; a failed update leaves it
where it was; the object store holds one version's weights at a time and is what a restored replica
loads; broadcast rounds go over the weight group unless a replica is being restored."""

from __future__ import annotations

import sys

import pytest

from seal.runtime.publisher import WeightPublisher
from tests.conftest import local_ray

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module", autouse=True)
def ray_session():
    import ray

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    with local_ray(num_cpus=1, object_store_bytes=80 * 2**20):
        yield


class Replica:
    def dtype(self) -> str:
        return "float32"


class FakeFleet:
    """Two replicas; each update ref is confirmed (the replica now serves that version) unless the
    version is in ``fails``, in which case the fleet takes the update as failed (and its replica out)."""

    update_timeout_s = 30.0

    def __init__(self, fails: set[int] = frozenset()) -> None:
        import ray

        self.first = ray.remote(Replica).remote()
        self.canary_ids: list[int] | None = None
        self.restoring: set[str] = set()
        self.versions = {"r0": 0, "r1": 0}
        self.pending: dict = {}
        self.fails = fails
        self.sent: list[tuple[int, str]] = []  # (version, how: manifest or group)

    def publish(self, version, manifest=None, metadata=None):
        import ray

        self.sent.append((version, "group" if metadata is not None else f"manifest {manifest}"))
        refs = [ray.put(name) for name in self.versions]
        self.pending.update({ref: (name, version) for ref, name in zip(refs, self.versions)})
        return refs

    def published(self, ref):
        name, version = self.pending.pop(ref)
        if version in self.fails:
            return None
        self.versions[name] = version
        return 0.1

    def acked(self) -> int:
        return min(self.versions.values())


class FakeLearners:
    def __init__(self) -> None:
        self.broadcasts = 0

    def weights(self, dtype: str) -> str:
        return f"weights@{dtype}"

    def broadcast_weights(self) -> None:
        self.broadcasts += 1


def publisher(fleet: FakeFleet, broadcast: bool = False) -> WeightPublisher:
    p = WeightPublisher(fleet, FakeLearners(), 0, broadcast, "gloo", None, 1.0)
    p.group_meta = ["layout"] if broadcast else None
    return p


def test_acked_moves_only_once_every_replica_confirmed_the_version():
    import ray

    fleet = FakeFleet()
    p = publisher(fleet)
    assert p.dtype == "float32"  # asked of the first replica
    first, second = p.publish(1)
    assert p.version == 1 and p.acked == 0 and set(p.in_flight) == {first, second}
    p.collect(ray.wait([first], timeout=10)[0])
    assert p.acked == 0  # one replica still serves v0
    p.collect([second])
    assert p.acked == 1 and not p.in_flight and p.publish_s == 0.1


def test_a_failed_update_leaves_acked_where_it_was():
    fleet = FakeFleet(fails={2})
    p = publisher(fleet)
    p.wait(p.publish(1))
    assert p.acked == 1
    p.wait(p.publish(2))
    assert p.acked == 1 and not p.in_flight


def test_the_object_store_holds_the_latest_version_which_a_restored_replica_loads():
    fleet = FakeFleet()
    p = publisher(fleet)
    p.wait(p.publish(1))
    p.wait(p.publish(2))
    assert p.latest() == ("weights@float32", 2) and p.manifest_version == 2
    assert [how for _, how in fleet.sent] == ["manifest weights@float32"] * 2


def test_broadcast_rounds_use_the_group_unless_a_replica_is_being_restored():
    fleet = FakeFleet()
    p = publisher(fleet, broadcast=True)
    p.wait(p.publish(1))
    assert fleet.sent[-1] == (1, "group") and p.learners.broadcasts == 1 and p.manifest is None
    fleet.restoring = {"r1"}
    p.wait(p.publish(2))
    assert fleet.sent[-1] == (2, "manifest weights@float32") and p.learners.broadcasts == 1
    assert p.latest() == ("weights@float32", 2)  # with broadcast: the learner's current weights
