"""Faults of the system on the real pipeline (tiny model, toy env, CPU): a generator that fails
chosen requests and an env whose own code raises for one task, both chosen through _target_
(tests/integration/faults.py). The run finishes, the learner never sees a faulted episode, the
counts match what was injected, short groups are re-issued once, nothing is duplicated, and every
generated token is in one bucket of the ledger."""

from __future__ import annotations

import pytest

from seal.config import compose
from seal.run.task_fit import select_tasks
from tests.conftest import local_ray
from tests.integration.test_pipeline import assert_tokens_accounted, make_pipeline


@pytest.fixture(scope="module", autouse=True)
def ray_session():
    with local_ray(num_cpus=8, object_store_bytes=2 * 2**30):
        yield


def test_faults_of_the_system_never_reach_the_learner_and_every_token_is_accounted_for(tmp_path, caplog):
    task_ids, _ = select_tasks(compose(["env=toy", "model=tiny"]))
    bad_task = task_ids[2]  # slot 2's task (no generator fault there): every episode of it raises
    p = make_pipeline(  # test_pipeline's toy setup, in sync mode with the default oversample (1)
        tmp_path,
        "trainer.mode=sync",
        "trainer.groups_per_step=2",
        "cluster.env_actors=2",
        "trainer.checkpoint_every=0",
        "trainer.oversample=1",
        "trainer.min_group_size=3",
        "generator._target_=tests.integration.faults.FaultyAsyncGenerator",
        "env._target_=tests.integration.faults.FaultyToyEnv",
        f"+env.fail_task={bad_task}",
    )
    received = []
    train = p.actors.learners.train

    def spy(trajs, *args, **kwargs):
        received.extend(trajs)
        return train(trajs, *args, **kwargs)

    p.actors.learners.train = spy
    try:
        rows = p.run(2)
        import ray

        injected = sum(ray.get(h.injected.remote()) for h in p.actors.generators.handles.values())
    finally:
        p.close()
    # The learner got 4 whole groups, no faulted episode; stand-ins only in the faulted places.
    assert len({t.group_id for t in received}) == 4 and len(received) == 16
    assert not [t for t in received if t.infra_fault is not None]
    assert all(t.num_generated_tokens == 0 for t in received if t.padding)
    # Slot 0 (1 fault) trained on 3; slot 1 (2 faults < 3) was re-issued once and trained whole;
    # slot 2 failed 5 times (env errors) and was given up; slots 3 and 4 (1 fault) trained.
    by_slot = {int(t.group_id[1:8]): t.group_id for t in received}
    assert sorted(by_slot) == [0, 1, 3, 4] and by_slot[1].endswith("a1") and by_slot[0].endswith("a0")
    assert sum(t.padding for t in received) == 2  # slots 0 and 4
    ledger = p.ledger.counters
    assert (ledger.consumed, ledger.given_up, ledger.reissued) == (4, 1, 1 + 4)
    kinds = {k: sum(r["infra_failures"][k] for r in rows) for k in rows[0]["infra_failures"]}
    assert kinds["generation_error"] == injected == 1 + 2 + 1 and kinds["env_error"] == 4 * 5
    assert sum(r["fault_reissued_groups"] for r in rows) == 1 + 5 and rows[-1]["given_up"] == 1
    # The run log: the task given up in one line with its first error; the first error of each kind.
    said = [r.getMessage() for r in caplog.records]
    (gave_up,) = [m for m in said if "given up" in m]
    assert gave_up.startswith(f"task {bad_task} (slot 2) given up after 5 attempts") and gave_up.endswith(
        "first error: env_error: RuntimeError: toy tool server unreachable (injected)"
    )
    firsts = [m for m in said if "first of its kind" in m]
    assert len(firsts) == 2 and {m.split()[2].rstrip(",") for m in firsts} == {"generation_error", "env_error"}
    assert any("): RuntimeError: injected engine error on request g0000" in m for m in firsts)  # the cause, not Ray's
    books = assert_tokens_accounted(rows)
    assert books["infra_failed"] > 0 and books["in_flight_end"] == 0  # sync mode: nothing left playing
    assert all(r["trained_groups"] == 2 for r in rows)
    # Sync mode with the default oversample (1): no slot beyond the 4 trained and the 1 given up.
    assert p.ledger.next_slot == 5 and ledger.dropped == 0 and books["stale_dropped"] == 0
