"""`seal train` before it starts anything: config errors, --cfg and --help (real subprocesses, no engine)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from seal.config import compose, config_dir

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def sandbox(tmp_path):
    """An empty working directory (where runs/ would appear) and a Ray temp root of
    its own: Ray creates RAY_TMPDIR/ray/session_* the moment it starts. Short path:
    Ray's socket paths must stay under the AF_UNIX limit."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    ray_root = Path(tempfile.mkdtemp(prefix="sr", dir="/tmp"))
    yield cwd, ray_root
    shutil.rmtree(ray_root, ignore_errors=True)


def seal_train(sandbox, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    cwd, ray_root = sandbox
    environ = {**os.environ, "RAY_TMPDIR": str(ray_root), **(env or {})}
    # This checkout's code, whatever the working directory or an installed copy.
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "seal.commands.cli", "train", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=environ,
        timeout=120,
    )


def assert_nothing_started(sandbox, run_dir: Path | None = None) -> None:
    cwd, ray_root = sandbox
    assert list(cwd.iterdir()) == []  # no runs/<timestamp>
    assert not (ray_root / "ray").exists()  # no Ray session
    if run_dir is not None:
        assert not run_dir.exists()


MISSING_CPU = max(os.sched_getaffinity(0)) + 1000
CASES = [
    (["env=nope"], "env=nope: no such option (the env options are bfcl shopping ", {}),
    (["trainer.nope=1"], "trainer.nope is not a config key (`seal train --cfg` prints them all)", {}),
    (["+learner.cfg.nope=1"], "unexpected keyword argument 'nope'", {}),
    (["n=0"], "n (rollouts per group) must be >= 1, got 0", {}),
    (
        ["learner.cfg.micro_batch_size=5"],
        "mini-batch of 12 trajectories (learner.cfg.mini_batch_groups=2 x n=6) does not split into micro-batches of learner.cfg.micro_batch_size=5",
        {},
    ),
    (
        ["trainer.groups_per_step=3", "learner.cfg.mini_batch_groups=2"],
        "trainer.groups_per_step=3 is not a whole number of learner mini-batches of learner.cfg.mini_batch_groups=2",
        {},
    ),
    (["model=local"], "model.path must be set", {}),
    (["model=local", "model.path=/no/such/model"], "model.path=/no/such/model: no such directory", {}),
    ([f"cluster.learner.cpus={MISSING_CPU}"], f"cluster.learner.cpus='{MISSING_CPU}' names CPUs [{MISSING_CPU}]", {}),
    # Ray would keep the actors pending forever: no GPU is visible with CUDA_VISIBLE_DEVICES empty.
    (
        ["cluster.env_actor.num_gpus=0.5", "cluster.env_actors=3"],
        "the actors ask for 1.5 GPUs (cluster.env_actor.num_gpus=0.5 x 3 env actors) but a local Ray start here has 0",
        {"CUDA_VISIBLE_DEVICES": ""},
    ),
    (["+cluster.generator.resources={gpu_node:1}"], "cluster.generator.resources asks for gpu_node", {}),
    (["limit=0"], "limit must be a number of tasks >= 1", {}),
    (
        ["learner=torch", "learner.world_size=2"],
        "learner.world_size=2 needs a DeepSpeed learner (learner=zero2 or learner=zero3)",
        {},
    ),
    (["generator.dtype=fp16"], "generator.dtype must be one of auto, bfloat16, float32; got 'fp16'", {}),
    (["learner.cfg.dtype=half"], "dtype must be one of auto, bfloat16, float32; got 'half'", {}),
]


@pytest.mark.parametrize("overrides, fragment, env", CASES, ids=lambda c: " ".join(c) if isinstance(c, list) else None)
def test_config_errors_are_one_line_before_any_side_effect(sandbox, tmp_path, overrides, fragment, env):
    run_dir = tmp_path / "x"
    proc = seal_train(sandbox, *overrides, f"run_dir={run_dir}", env=env)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("seal: error: ") and fragment in proc.stderr, (
        proc.stderr
    )
    assert proc.stdout == ""
    assert_nothing_started(sandbox, run_dir)


def test_the_default_run_dir_is_not_made_either(sandbox):
    proc = seal_train(sandbox, "n=0")
    assert proc.returncode == 2 and "n (rollouts per group)" in proc.stderr
    assert_nothing_started(sandbox)


def test_a_fresh_run_into_an_old_runs_directory_is_refused(sandbox, tmp_path):
    old = tmp_path / "old"
    old.mkdir()
    (old / "run.json").write_text("{}")
    proc = seal_train(sandbox, f"run_dir={old}")
    assert (
        proc.returncode == 2
        and proc.stderr
        == f"seal: error: run_dir={old} already holds a run: resume={old} continues it, or choose another run_dir\n"
    )
    assert sorted(p.name for p in old.iterdir()) == ["run.json"]
    assert_nothing_started(sandbox)


def test_no_task_that_fits_is_one_line_before_any_side_effect(sandbox, tmp_path):
    # 8180 of the tiny model's 8192 tokens go to the answer: no toy prompt fits in the 12 left.
    # n=2 and one sequence a micro-batch: more such sequences at once would not fit this machine's memory
    # (`seal plan` says so first: the loss phase's full-vocabulary temporaries, seal/estimate/memory.py).
    run_dir = tmp_path / "x"
    proc = seal_train(
        sandbox,
        "env=toy",
        "model=tiny",
        "n=2",
        "learner.cfg.micro_batch_size=1",
        "sampling.max_new_tokens=8180",
        f"run_dir={run_dir}",
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr == (
        "seal: error: no task's opening prompt fits 12 tokens (model context 8192 minus sampling.max_new_tokens 8180)\n"
    ), proc.stderr
    assert [line.split()[1] for line in proc.stdout.splitlines()] == ["tasks"]  # only "checking which tasks ... fit"
    assert_nothing_started(sandbox, run_dir)


def test_a_refused_config_imports_neither_ray_nor_torch():
    code = (
        "import sys; from seal.commands.cli import main; rc = main(['train', 'n=0']); "
        "print(rc, sorted(m for m in ('ray', 'torch', 'vllm', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.stdout.strip() == "2 []", out.stderr[-2000:]


def test_cfg_prints_the_resolved_config_and_runs_nothing(sandbox, tmp_path):
    run_dir = tmp_path / "x"
    overrides = ["env=toy", "n=4", "trainer.groups_per_step=2", f"run_dir={run_dir}"]
    proc = seal_train(sandbox, "--cfg", *overrides)
    assert proc.returncode == 0, proc.stderr[-2000:]
    printed = yaml.safe_load(proc.stdout)
    assert printed == OmegaConf.to_container(compose(overrides), resolve=True)
    assert printed["learner"]["cfg"]["mini_batch_groups"] == 2 and printed["learner"]["group_size"] == 4  # resolved
    assert_nothing_started(sandbox, run_dir)
    proc = seal_train(sandbox, "--cfg", "n=0")  # --cfg shows a config that would start, else says why not
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and proc.stdout == ""


def test_help_lists_groups_options_defaults_and_main_settings(sandbox):
    proc = seal_train(sandbox, "--help")
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    root = config_dir()
    defaults = {
        k: v
        for e in yaml.safe_load((root / "config.yaml").read_text())["defaults"]
        if isinstance(e, dict)
        for k, v in e.items()
    }
    assert defaults["evaluation"] == "${env}"  # each env's evaluation settings: shown as the default env's
    defaults["evaluation"] = defaults["env"]
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and list(p.glob("*.yaml"))):
        (line,) = [ln for ln in lines if ln.split()[:1] == [folder.name]]
        listed = line.split()[1:]
        expected = [
            p.stem + ("*" if p.stem == defaults.get(folder.name) else "") for p in sorted(folder.glob("*.yaml"))
        ]
        assert listed[: len(expected)] == expected, line
        assert (defaults.get(folder.name) is None) == line.endswith("(default: none)")
        assert (folder.name == "evaluation") == line.endswith("(default: the env group's choice)"), line
    cfg = compose([])
    for key in (
        "n",
        "trainer.steps",
        "trainer.groups_per_step",
        "trainer.mode",
        "trainer.max_staleness",
        "trainer.filter_groups",
        "learner.cfg.lr",
        "learner.cfg.old_logprobs",
        "cluster.env_actors",
        "run_dir",
        "resume",
        "seed",
        "limit",
        "split",
    ):
        (line,) = [ln for ln in lines if ln.split()[:1] == [key]]
        value = OmegaConf.select(cfg, key)
        assert line.split()[1] == ("null" if value is None else str(value)), line
    assert "--cfg" in proc.stdout
    assert_nothing_started(sandbox)


def test_help_is_fast_it_loads_no_model_library():
    code = (
        "import sys; from seal.commands.cli import main\ntry: main(['train', '--help'])\nexcept SystemExit: pass\n"
        "print(sorted(m for m in ('ray', 'torch', 'vllm', 'transformers', 'deepspeed') if m in sys.modules), file=sys.stderr)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.stderr.strip() == "[]" and "config groups" in out.stdout
