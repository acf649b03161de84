from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# Keep bfcl-eval from writing into site-packages, and keep our caches in a
# temp area when the tests run in a fresh clone.
os.environ.setdefault("BFCL_PROJECT_ROOT", str(Path.home() / ".cache" / "seal" / "bfcl_root"))
Path(os.environ["BFCL_PROJECT_ROOT"]).mkdir(parents=True, exist_ok=True)
# The control key files runs leave for `seal scale` (seal/control.py) go to a temp dir, not
# the user's ~/.seal; child processes (`seal train`, `seal scale`) inherit it.
os.environ.setdefault("SEAL_KEY_DIR", tempfile.mkdtemp(prefix="seal-keys-"))


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except Exception:
        has_cuda = False
    if not has_cuda:
        skip = pytest.mark.skip(reason="needs a CUDA GPU")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def seal_bin() -> list[str]:
    """The installed `seal` entry point of this interpreter's environment."""
    return [sys.executable, "-m", "seal.cli"]


@contextlib.contextmanager
def local_ray(num_cpus: int, object_store_bytes: int):
    """A Ray session of this process alone for one test module (address="local": never
    join a cluster another process left on this machine)."""
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False,
             object_store_memory=object_store_bytes)
    try:
        yield
    finally:
        ray.shutdown()
