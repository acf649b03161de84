"""Checkpoint files are replaced only once every new one is whole (learner/checkpoints.py
write_whole), on a real full filesystem (a small tmpfs: root only)."""

from __future__ import annotations

import errno
import os
import subprocess
import uuid

import pytest
import torch

from learner.checkpoints import CheckpointWriteError, write_whole

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs (root only)")


@pytest.fixture
def disk(tmp_path):
    mount = tmp_path / f"disk-{uuid.uuid4().hex[:6]}"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "seal-test", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def files(disk, state, meta):
    return {
        disk / "torch_state.pt": lambda fh: torch.save(state, fh),
        disk / "learner.json": lambda fh: fh.write(meta.encode()),
    }


def free_mb(disk) -> float:
    stat = os.statvfs(disk)
    return stat.f_bavail * stat.f_frsize / 2**20


def test_a_full_disk_keeps_the_previous_files_and_says_so_in_one_line(disk):
    write_whole(files(disk, {"w": torch.ones(1000)}, '{"step": 1}'), "step 1")
    with pytest.raises(CheckpointWriteError) as failed:  # 8 MB of floats on a 4 MB disk
        write_whole(files(disk, {"w": torch.zeros(2_000_000)}, '{"step": 2}'), "the checkpoint of step 2")
    # The room comes back while the error (and its traceback, torch's writer in it) lives: given a path,
    # torch kept its own handle open on the unlinked partial and the disk stayed full (a resumed run's
    # next checkpoint failed again while the learner process lived).
    assert free_mb(disk) > 3.5
    assert failed.value.errno == errno.ENOSPC and "\n" not in str(failed.value)
    assert str(failed.value).startswith(
        f"[Errno 28] no space left on device writing the checkpoint of step 2 to {disk}"
    )
    assert sorted(p.name for p in disk.iterdir()) == ["learner.json", "torch_state.pt"]  # no partial left
    assert torch.equal(torch.load(disk / "torch_state.pt")["w"], torch.ones(1000))
    assert (disk / "learner.json").read_text() == '{"step": 1}'


def test_a_whole_write_replaces_every_file(disk):
    write_whole(files(disk, {"w": torch.ones(3)}, '{"step": 1}'), "step 1")
    write_whole(files(disk, {"w": torch.zeros(3)}, '{"step": 2}'), "step 2")
    assert torch.equal(torch.load(disk / "torch_state.pt")["w"], torch.zeros(3))
    assert (disk / "learner.json").read_text() == '{"step": 2}' and len(list(disk.iterdir())) == 2


def test_another_failure_names_its_cause_and_keeps_the_previous_files(disk):
    write_whole(files(disk, {"w": torch.ones(3)}, '{"step": 1}'), "step 1")

    def broken(fh):
        fh.write(b"half")
        raise ValueError("the writer broke")

    with pytest.raises(CheckpointWriteError, match=r"step 2 to .* failed \(ValueError: the writer broke\)"):
        write_whole({disk / "torch_state.pt": lambda fh: torch.save({}, fh), disk / "learner.json": broken}, "step 2")
    assert (disk / "learner.json").read_text() == '{"step": 1}' and len(list(disk.iterdir())) == 2
