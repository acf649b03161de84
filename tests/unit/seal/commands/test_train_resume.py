"""`seal train resume=RUN_DIR` continues the run's own recorded config: settings on top, refused
(one line, exit 2, nothing written) where they change what the checkpoint or the task stream fix."""

from __future__ import annotations

import json

import pytest

from seal.commands.cli import main
from seal.commands.preflight import preflight
from seal.config import compose
from seal.errors import CliError
from seal.run.run_dir import create_run_dir, forget_start, resumed_config

# A run that is not the default: another model, env, group size and mode.
RUN = ("env=toy", "model=tiny", "n=4", "trainer.mode=sync", "trainer.filter_groups=none", "trainer.oversample=0")


@pytest.fixture
def run(tmp_path):
    """A run directory as `seal train` leaves it (config.yaml, run.json) with a checkpoint to resume."""
    path = tmp_path / "run"
    cfg = compose([*RUN, f"run_dir={path}"])
    create_run_dir(str(path), cfg, [*RUN, f"run_dir={path}"])
    (path / "checkpoints" / "latest").mkdir(parents=True)
    return path


def listing(path):
    return {p.relative_to(path): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def test_resume_continues_the_runs_own_config_not_the_default(run):
    cfg, _ = preflight([f"resume={run}", "trainer.steps=3", "cluster.env_actors=1"])
    assert (cfg.model.path, cfg.env._target_.rsplit(".", 1)[-1], cfg.n) == ("tiny", "ToyToolEnv", 4)
    assert (cfg.trainer.mode, cfg.trainer.steps, cfg.cluster.env_actors) == ("sync", 3, 1)
    assert cfg.resume == cfg.run_dir == str(run)


def test_a_later_resume_starts_from_the_config_the_last_resume_ran_with(run):
    cfg = resumed_config(run, ["cluster.env_actors=1"])
    create_run_dir(str(run), cfg, [f"resume={run}", "cluster.env_actors=1"])
    assert (run / "config.resume1.yaml").is_file()
    assert resumed_config(run, []).cluster.env_actors == 1


@pytest.mark.parametrize(
    ("setting", "line"),
    [
        ("model=embedded", "cannot change model (the run's: tiny; asked: model=embedded): the checkpoint holds"),
        ("model.path=embedded", "cannot change model (tiny -> embedded): the checkpoint holds this model's weights"),
        ("n=2", "cannot change n (4 -> 2): a group in flight at the checkpoint has this many rollouts"),
        ("env.step_limit=9", "cannot change env ("),
        ("learner.cfg.zero_stage=3", "cannot change learner.cfg.zero_stage (2 -> 3)"),
        ("trainer.stepz=2", "trainer.stepz is not a key of the run's config; did you mean trainer.steps"),
        ("cluster=multinode", "a config group is already chosen: set its keys instead of 'cluster=multinode'"),
        ("run_dir=elsewhere", "leave out run_dir=elsewhere"),
    ],
)
def test_a_resume_that_changes_what_cannot_change_is_one_line_and_writes_nothing(run, capsys, setting, line):
    before = listing(run)
    assert main(["train", f"resume={run}", setting]) == 2
    err = capsys.readouterr().err
    assert err.startswith("seal: error: ") and line in err and err.count("\n") == 1, err
    assert listing(run) == before


def test_resume_of_a_directory_without_a_run_says_nothing_to_resume(tmp_path, capsys):
    assert main(["train", f"resume={tmp_path}"]) == 2
    assert "nothing to resume: " in capsys.readouterr().err and not any(tmp_path.iterdir())


def test_a_failed_start_leaves_no_run_to_block_the_next_try(tmp_path, run):
    fresh = tmp_path / "fresh"
    create_run_dir(str(fresh), compose(list(RUN)), list(RUN))
    forget_start(fresh, was_empty=True)
    assert not fresh.exists()
    with pytest.raises(CliError, match="already holds a run"):
        preflight([*RUN, f"run_dir={run}"])
    record = json.loads((run / "run.json").read_text())
    create_run_dir(str(run), resumed_config(run, []), [f"resume={run}"])
    forget_start(run, was_empty=False)  # a resume's failed start: its entry and config go, the run stays
    assert json.loads((run / "run.json").read_text()) == record and not (run / "config.resume1.yaml").exists()
