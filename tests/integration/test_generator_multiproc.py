"""The blocking generator with vLLM's engine core in a process of its own, as on GPU.

On CUDA, vLLM runs its engine core in another process (VLLM_ENABLE_V1_MULTIPROCESSING,
on by default) and every collective_rpc argument crosses it by msgpack; on CPU the
generator turns that off (actors/generation/vllm_engine.py), so a CPU run never shows what
cannot cross. Here it is on: weights from a mapping and from the learner's
WeightManifest (the object-store path, ``weight_sync: reload``) must load and act
like an HF forward of the same weights. In a subprocess: vLLM reads the setting
when it is imported, and the other tests run it in-process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent("""
    import glob, json, sys
    import ray, torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from weights.model_assets import prepare_tiny_model
    from actors.generation.vllm_engine import VllmGenerator
    from weights.buckets import put_buckets

    PROMPT = [1, 17, 4021, 88, 913, 2049, 31, 7, 605, 12]
    path = str(prepare_tiny_model())
    base = {}
    for f in sorted(glob.glob(f"{path}/*.safetensors")):
        base.update(load_file(f))

    def hf(weights):
        model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32)
        model.load_state_dict(weights, strict=False)
        model.tie_weights()
        with torch.no_grad():
            logits = model(torch.tensor([PROMPT])).logits[0].float()
        return torch.log_softmax(logits[:-1], -1).gather(-1, torch.tensor(PROMPT[1:])[:, None])[:, 0].tolist()

    def diff(gen, weights):
        got, want = gen.prompt_logprobs(PROMPT), hf(weights)
        return max(abs(a - b) for a, b in zip(got, want))

    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)  # never another session's cluster
    # nobind: vLLM 0.32 multiprocess engine cannot parse the CPU config's "all" (in-process ignores it)
    gen = VllmGenerator(path, max_model_len=512, cpu_kv_cache_gb=1, dtype="float32", cpu_threads_bind="nobind")
    result = {}
    try:
        mapping = {k: v * 1.03 for k, v in base.items()}
        gen.update_weights(1, mapping)
        result["mapping"] = diff(gen, mapping)
        published = {k: v * 0.97 for k, v in base.items()}
        items = list(published.items())
        buckets = [items[i:i + 5] for i in range(0, len(items), 5)]  # several buckets: one reload across them
        manifest = put_buckets(iter(buckets), "float32", 0.01)
        gen.update_weights(2, manifest)
        result["manifest"] = diff(gen, published)
        result["buckets"] = len(manifest.buckets)
        result["version"] = gen.policy_version
    finally:
        gen.close()
        ray.shutdown()
    print("RESULT " + json.dumps(result), flush=True)
""")


def test_reload_updates_cross_vllms_process_boundary():
    root = Path(__file__).resolve().parents[2]
    # An engine an earlier test started in this process left its thread binding in os.environ
    # (say 'all', which vLLM's multiprocess engine cannot parse): the child gets the generator's own.
    env = {k: v for k, v in os.environ.items() if k != "VLLM_CPU_OMP_THREADS_BIND"}
    env.update({"VLLM_ENABLE_V1_MULTIPROCESSING": "1", "PYTHONPATH": str(root)})
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, cwd=root, capture_output=True, text=True, timeout=800
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    import json

    result = json.loads(lines[-1].removeprefix("RESULT "))
    assert result["buckets"] > 1 and result["version"] == 2
    assert result["mapping"] < 1e-3 and result["manifest"] < 1e-3, result
