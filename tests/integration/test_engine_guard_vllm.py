"""actors/generation/engine_guard.py with real vLLM CPU (tiny model): the case the chaos soak met.
The raylet is gone (the driver SIGKILLed takes it along) and the replica's worker dies without
killing its children (plasma's QuickExit): here both are SIGKILLed at once. The replica's engine
core and its worker must end; without the guard they were still alive 20 s later."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# The driver: a local Ray, one async replica with its engine up; then the raylet and the replica's
# worker SIGKILLed, and the engine's processes watched. Prints one line: ENGINE <pids> ALIVE <pids>.
DRIVER = """
import os, signal, sys, time
import ray
from actors.generation.engine_guard import _cmdline, _stat, children, tree
from actors.generation.async_vllm_engine import AsyncVllmGenerator
from weights.model_assets import prepare_tiny_model

ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
         object_store_memory=int(0.2 * 2**30))
replica = ray.remote(num_cpus=0)(AsyncVllmGenerator).remote(
    str(prepare_tiny_model()), max_model_len=2048, cpu_kv_cache_gb=1, dtype="float32",
    weight_sync="broadcast", update_timeout_s=600.0)
ray.get(replica.max_model_len.remote(), timeout=600)
pid = ray.get(replica.__ray_call__.remote(lambda self: os.getpid()))
time.sleep(6)  # past the guard's first look at the engine's tree
engine = tree({c: _stat(c)[1] for c in children(pid) if _cmdline(c).startswith("VLLM::")})
raylets = [c for c in children(os.getpid()) if "raylet" in _cmdline(c).split(chr(0))[0]]
for p in raylets + [pid]:
    os.kill(p, signal.SIGKILL)
deadline = time.monotonic() + 30
alive = list(engine)
while alive and time.monotonic() < deadline:
    time.sleep(0.5)
    alive = [p for p, s in engine.items() if (_stat(p) or (0, -1))[1] == s]
print("ENGINE", *engine, "ALIVE", *alive, flush=True)
for p in alive:
    os.kill(p, signal.SIGKILL)
os._exit(0)
"""


@pytest.mark.slow  # a vLLM engine's start: 1-2 minutes on 2 cores under load (2026-12-07)
def test_a_replicas_engine_ends_with_it_when_the_raylet_is_gone_too():
    ray_root = Path(tempfile.mkdtemp(prefix="eg", dir="/tmp"))  # short: Ray's socket paths
    env = {**os.environ, "RAY_TMPDIR": str(ray_root), "RAY_AUTH_MODE": "disabled"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    try:
        out = subprocess.run(
            [sys.executable, "-c", DRIVER], capture_output=True, text=True, env=env, cwd=REPO, timeout=900
        )
    finally:
        shutil.rmtree(ray_root, ignore_errors=True)
    line = next((x for x in out.stdout.splitlines() if x.startswith("ENGINE")), None)
    assert line is not None, out.stderr[-3000:]
    engine, alive = line.split("ALIVE")
    assert len(engine.split()) >= 3, line  # ENGINE, the core and its worker
    assert alive.split() == [], line
