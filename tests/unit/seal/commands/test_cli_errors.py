"""Errors that point at the fix: one line on stderr (exit 2) before any side effect."""

from __future__ import annotations

import pytest

from seal.commands.cli import main
from seal.commands.preflight import check_cluster_running
from seal.config import compose


def error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err


@pytest.mark.parametrize(
    ("override", "line"),
    [
        ("trainer.stepz=2", "seal: error: trainer.stepz is not a config key; did you mean trainer.steps"),
        ("modle=tiny", "seal: error: modle is not a config key; did you mean model?"),
        (
            "model=tinny",
            "seal: error: model=tinny: no such option (the model options are deepseek-v3-twin embedded gemma3-twin "
            "gpt-oss-twin llama3.1-twin local qwen2.5-3b-twin qwen2.5-7b-twin qwen3-twin tiny); did you mean model=tiny?",
        ),
        ("job", "seal: error: 'job' is not an override: settings are KEY=VALUE"),
    ],
)
def test_a_misspelt_override_gets_the_close_matches_not_hydras_plus(capsys, override, line):
    assert main(["train", override]) == 2  # refused in preflight, before anything starts
    err = error_line(capsys)
    assert err.startswith(line) and "+" + override not in err, err


def test_cfg_takes_hydras_job_and_all_forms(capsys):
    assert main(["train", "--cfg", "job", "env=toy"]) == 0
    assert "ToyToolEnv" in capsys.readouterr().out
    assert main(["train", "env=toy", "--cfg", "all"]) == 0
    assert "ToyToolEnv" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["train", "--cfg", "hydra"])
    assert "no --cfg hydra" in capsys.readouterr().err


def test_evaluate_and_report_name_the_run_directory_they_need(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["evaluate"]) == 2
    assert "seal evaluate needs a run directory: `seal train` writes runs/<timestamp>" in error_line(capsys)
    (tmp_path / "runs" / "20261206-070000").mkdir(parents=True)
    (tmp_path / "runs" / "20261206-070000" / "config.yaml").write_text("{}")
    assert main(["evaluate", "--json"]) == 2
    assert "e.g. `seal evaluate runs/20261206-070000` (the latest run here)" in error_line(capsys)
    for rehearsal in ("rehearse-qwen7b_2x8-20261206-080000", "mine"):  # the first by name, the second by its report
        (tmp_path / "runs" / rehearsal).mkdir()
        (tmp_path / "runs" / rehearsal / "config.yaml").write_text("{}")
    (tmp_path / "runs" / "mine" / "rehearsal.json").write_text("{}")
    assert main(["evaluate"]) == 2
    assert "e.g. `seal evaluate runs/20261206-070000` (the latest run here)" in error_line(capsys)
    assert main(["report", "nowhere"]) == 2
    assert "nowhere: no such run directory" in error_line(capsys)
    assert main(["report", str(tmp_path)]) == 2
    assert "is not a run directory (no config.yaml" in error_line(capsys)


def test_joining_a_cluster_that_is_not_there_is_refused_before_the_run_directory(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")  # what `auto` finds: nothing listens on port 1
    with pytest.raises(ConnectionError, match="no Ray cluster answers there"):
        check_cluster_running("auto")
    run = tmp_path / "run"
    assert main(["train", "env=toy", "model=tiny", "cluster=multinode", f"run_dir={run}"]) == 2
    err = error_line(capsys)
    assert "no Ray cluster answers there" in err and "--address" not in err and not run.exists()


def test_overrides_are_optional_in_every_command_that_takes_them():
    from seal.commands.cli import build_parser

    assert build_parser().parse_args(["evaluate", "runs/x"]).overrides == []
    assert compose([]).trainer.steps >= 1


def test_seal_bench_help_names_every_part():
    from benchmarks.cli import PARTS
    from seal.commands.cli import build_parser

    bench = build_parser()._subparsers._group_actions[0].choices["bench"]
    part = next(a for a in bench._actions if a.dest == "part")
    assert all(name in part.help for name in PARTS), part.help


def test_a_key_with_nothing_close_gets_no_guess(capsys):
    assert main(["train", "trainer.nope=1"]) == 2
    assert error_line(capsys) == "seal: error: trainer.nope is not a config key (`seal train --cfg` prints them all)\n"
    assert main(["train", "tranier.steps=1"]) == 2
    assert "did you mean trainer.steps?" in error_line(capsys)
