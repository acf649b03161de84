"""A checkpoint write that meets a full disk (a real tmpfs, mounted here: needs root) on the real
pipeline (tiny model, toy env, torch learner, CPU): the run stops with one line naming the full disk,
the checkpoint before it stays whole and loadable (torch's zip writer used to overwrite
torch_state.pt in place, so a failed save left a truncated file that learner.json still named), and
`resume=RUN_DIR` from it trains on."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.conftest import local_ray
from tests.integration.test_pipeline import make_pipeline, run

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs (root only)")


@pytest.fixture(scope="module", autouse=True)
def ray_session():
    with local_ray(num_cpus=8, object_store_bytes=2 * 2**30):
        yield


@pytest.fixture
def small_disk(tmp_path):
    mount = tmp_path / f"disk-{uuid.uuid4().hex[:6]}"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=128m", "seal-test", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def free_mb(mount: Path) -> float:
    stat = os.statvfs(mount)
    return stat.f_bavail * stat.f_frsize / 2**20


def opened(mount: Path) -> list[str]:
    """Files under ``mount`` some process holds open, deleted ones included: pid and target."""
    out = []
    for fd in Path("/proc").glob("[0-9]*/fd/*"):
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith(str(mount)):
            out.append(f"{fd.parts[2]} {target}")
    return out


def fill(mount: Path, leave_bytes: int) -> Path:
    """Take all but ``leave_bytes`` of the filesystem (a checkpoint of the tiny model is ~36 MB)."""
    stat = os.statvfs(mount)
    filler = mount / "filler"
    with open(filler, "wb") as fh:
        os.posix_fallocate(fh.fileno(), 0, stat.f_bavail * stat.f_frsize - leave_bytes)
    return filler


def test_a_full_disk_mid_checkpoint_stops_the_run_in_one_line_and_resume_trains_on(tmp_path, small_disk):
    import torch

    from seal.runtime.learner_group import LearnerGroupError

    run_dir = tmp_path / "run"
    args = ("trainer.mode=async", "trainer.checkpoint_every=2", f"trainer.storage={small_disk}")
    p = make_pipeline(run_dir, *args)
    latest = small_disk / run_dir.name / "checkpoints" / "latest"
    try:
        assert [r["step"] for r in p.run(2)] == [1, 2]
        assert (latest / "learner.json").is_file()
        filler = fill(small_disk, 4 << 20)
        with pytest.raises(LearnerGroupError) as failed:
            p.run(2)
    finally:
        p.close()
    line = str(failed.value)
    assert "\n" not in line and "failed during checkpoint at step 4" in line, line
    assert "no space left on device writing the learner checkpoint of step 4" in line, line
    # The checkpoint of step 2, whole: no partial file left, every file loads.
    assert sorted(f.name for f in latest.iterdir()) == ["learner.json", "rng.pt", "torch_state.pt"]
    state = torch.load(latest / "torch_state.pt", weights_only=False)
    assert {"model", "optimizer"} <= set(state)
    filler.unlink()
    # The room the failed write took is back: nothing holds the partial (torch's writer, given a path,
    # kept its own handle open while the error lived, and the disk stayed full).
    files = {str(f.relative_to(small_disk)): f.stat().st_size for f in small_disk.rglob("*") if f.is_file()}
    (tmp_path / "disk.json").write_text(
        json.dumps({"free_mb": free_mb(small_disk), "files": files, "open": opened(small_disk)})
    )
    # On the disk: the checkpoint (~36 MB: the tiny model and its Adam state) and snapshot A_1 (~16 MB).
    assert free_mb(small_disk) > 128 - 60, (free_mb(small_disk), sum(files.values()) >> 20, opened(small_disk))
    p = make_pipeline(run_dir, *args, resume=run_dir)
    assert (p.state.step, p.state.version) == (2, 2)
    assert p.actors.learners.step == 2  # a learner error after the resume names the run's step (was 0 + k)
    rows = run(p, 2)
    assert [r["step"] for r in rows] == [3, 4] and rows[-1]["trained_groups"] == 1
    assert json.loads((latest / "learner.json").read_text())["extra"]["step"] == 4  # written whole this time
