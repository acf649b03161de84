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
# The control key files runs leave for `seal scale` (seal/runtime/control.py) go to a temp dir, not
# the user's ~/.seal; child processes (`seal train`, `seal scale`) inherit it.
os.environ.setdefault("SEAL_KEY_DIR", tempfile.mkdtemp(prefix="seal-keys-"))

SLOW_TEST_TIMEOUT_S = 3600


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
    # The folder is the mark: everything under tests/integration/ runs real parts together.
    for item in items:
        if "integration" in item.path.relative_to(REPO / "tests").parts[:1]:
            item.add_marker(pytest.mark.integration)
    # pytest.ini's `timeout` bounds every default test (a hang fails that test with its stacks
    # instead of eating CI's 90 minutes); slow tests run whole training jobs: an hour each.
    for item in items:
        if "slow" in item.keywords and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(SLOW_TEST_TIMEOUT_S))


@pytest.fixture(scope="session")
def seal_bin() -> list[str]:
    """The installed `seal` entry point of this interpreter's environment."""
    return [sys.executable, "-m", "seal.commands.cli"]


@contextlib.contextmanager
def local_ray(num_cpus: int, object_store_bytes: int):
    """A Ray session of this process alone for one test module (address="local": never
    join a cluster another process left on this machine)."""
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(
        address="local",
        num_cpus=num_cpus,
        include_dashboard=False,
        log_to_driver=False,
        object_store_memory=object_store_bytes,
    )
    try:
        yield
    finally:
        ray.shutdown()


def assert_manifest_loads_like_one_mapping(handle, manifest, version: int, timeout_s: float = 300.0) -> list[float]:
    """A generator actor (blocking server or async replica) loading ``manifest`` bucket by bucket scores
    a fixed prompt exactly as when the same weights come as one name -> array mapping (the old wire
    form); a perturbed load in between shows each load takes effect. Returns the logprobs."""
    import warnings

    import ray

    from weights.precision import from_wire_arrays, to_wire_arrays

    whole: dict = {}
    for ref in manifest.buckets:
        whole.update(ray.get(ref, timeout=timeout_s))
    with warnings.catch_warnings():  # the store's arrays are read-only; only read here
        warnings.filterwarnings("ignore", message=".*non-writable.*")
        perturbed = to_wire_arrays((k, t * 1.05) for k, t in from_wire_arrays(whole).items())
    prompt = list(range(1000, 1032))

    def load(v: int, source) -> list[float]:
        ray.get(handle.update_weights.remote(v, source), timeout=timeout_s)
        return ray.get(handle.prompt_logprobs.remote(prompt), timeout=timeout_s)

    other = load(version, perturbed)
    by_manifest = load(version + 1, manifest)
    load(version + 2, perturbed)
    by_mapping = load(version + 3, whole)
    assert by_manifest == by_mapping, max(abs(a - b) for a, b in zip(by_manifest, by_mapping))
    assert max(abs(a - b) for a, b in zip(by_manifest, other)) > 1e-3  # the loads changed the weights
    return by_manifest
