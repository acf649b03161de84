"""One generator setup for both vLLM engines (actors/generation/engine_settings.py): what vLLM
engine keywords and process environment each engine gets on CPU and CUDA, and the bad values
refused before a model is looked up or vLLM imported. Nothing here starts an engine."""

from __future__ import annotations

import dataclasses
import inspect
import os
import subprocess
import sys

import pytest

from actors.generation.engine_settings import (
    GLOO_TRANSFER_BACKEND,
    NCCL_TRANSFER_BACKEND,
    SET_BY_SETUP,
    WORKER_EXTENSION,
    EngineSettings,
    engine_setup,
)

ENV_VARS = (
    "VLLM_LOGGING_LEVEL",
    "HF_HUB_OFFLINE",
    "VLLM_ENABLE_V1_MULTIPROCESSING",
    "VLLM_CPU_OMP_THREADS_BIND",
    "VLLM_CPU_NUM_OF_RESERVED_CPU",
    SET_BY_SETUP,
)


@pytest.fixture
def model_dir(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    return str(tmp_path)


@pytest.fixture
def clean_env(monkeypatch):
    """The variables the setup sets, unset here and restored after (apply_env only sets missing ones)."""
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_blocking_on_cpu_runs_in_process_with_a_bounded_cache_and_whole_prefills(model_dir):
    setup = engine_setup(EngineSettings(model_dir, max_model_len=2048, cpu_kv_cache_gb=0.5, cpu_threads_bind=0))
    assert setup.kwargs == {
        "model": model_dir,
        "dtype": "float32",
        "max_model_len": 2048,
        "enable_prefix_caching": True,
        "enforce_eager": True,
        "seed": 0,
        "tensor_parallel_size": 1,
        "worker_extension_cls": WORKER_EXTENSION,
        "enable_chunked_prefill": False,
        "max_num_batched_tokens": 2048,
        "kv_cache_memory_bytes": 2**29,
    }
    assert setup.env == {
        "VLLM_LOGGING_LEVEL": "WARNING",
        "HF_HUB_OFFLINE": "1",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CPU_OMP_THREADS_BIND": "0",
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
    }


def test_blocking_on_cuda_gets_the_gpu_share_and_no_cpu_settings(model_dir):
    setup = engine_setup(
        EngineSettings(
            model_dir,
            device="cuda",
            dtype="auto",
            gpu_memory_utilization=0.3,
            tensor_parallel_size=2,
            cpu_kv_cache_gb=0,
            weight_sync="broadcast",
        )
    )
    assert setup.settings.dtype == "bfloat16"  # auto on CUDA
    assert setup.kwargs["gpu_memory_utilization"] == 0.3 and setup.kwargs["tensor_parallel_size"] == 2
    # CPU-only keys are absent, and the blocking engine's group is its workers' own, not vLLM's weight transfer
    assert not {
        "kv_cache_memory_bytes",
        "enable_chunked_prefill",
        "max_num_batched_tokens",
        "max_num_seqs",
        "weight_transfer_config",
    } & set(setup.kwargs)
    assert setup.env == {"VLLM_LOGGING_LEVEL": "WARNING", "HF_HUB_OFFLINE": "1"}


def test_async_on_cpu_keeps_its_engine_process_and_sends_broadcasts_through_seal_gloo(model_dir):
    setup = engine_setup(
        EngineSettings(model_dir, engine="async", cpu_threads_bind="nobind", max_num_seqs=64, weight_sync="broadcast")
    )
    assert setup.kwargs["weight_transfer_config"] == {"backend": GLOO_TRANSFER_BACKEND}
    assert setup.kwargs["max_num_seqs"] == 64 and setup.kwargs["kv_cache_memory_bytes"] == 2 * 2**30
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in setup.env
    assert setup.env["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"
    reload = engine_setup(EngineSettings(model_dir, engine="async", weight_sync="reload"))
    assert "weight_transfer_config" not in reload.kwargs


def test_async_on_cuda_broadcasts_over_nccl(model_dir):
    setup = engine_setup(EngineSettings(model_dir, engine="async", device="cuda", weight_sync="broadcast"))
    assert setup.kwargs["weight_transfer_config"] == {"backend": NCCL_TRANSFER_BACKEND}
    assert setup.kwargs["gpu_memory_utilization"] == 0.85


def test_a_model_directory_without_a_config_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        engine_setup(EngineSettings(str(tmp_path)))


@pytest.mark.parametrize(
    "field, bad, message",
    [
        ("device", "tpu", "device must be cpu or cuda, got 'tpu'"),
        ("weight_sync", "nccl", "weight_sync must be reload or broadcast, got 'nccl'"),
        ("engine", "sync", "engine must be blocking or async, got 'sync'"),
        ("dtype", "float16", "dtype must be one of auto, bfloat16, float32"),
        ("cpu_kv_cache_gb", 0, "generator.cpu_kv_cache_gb must be > 0"),
    ],
)
def test_a_bad_value_is_one_line_before_anything_is_looked_up(field, bad, message):
    with pytest.raises(ValueError, match=message):
        EngineSettings("no/such/model", **{field: bad})


def test_apply_env_leaves_a_variable_the_user_set(model_dir, clean_env):
    clean_env.setenv("VLLM_CPU_OMP_THREADS_BIND", "0-3")
    engine_setup(EngineSettings(model_dir)).apply_env()
    assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "0-3"
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0" and os.environ["VLLM_LOGGING_LEVEL"] == "WARNING"


def test_a_later_engine_sets_again_what_an_earlier_engine_set(model_dir, clean_env):
    """Found running test_weight_sync.py before test_generator_multiproc.py in one process: the
    first engine's bind 'all' stayed, and the second's multiprocess engine failed to parse it."""
    engine_setup(EngineSettings(model_dir, cpu_threads_bind="all")).apply_env()
    engine_setup(EngineSettings(model_dir, engine="async", cpu_threads_bind="nobind")).apply_env()
    assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"
    clean_env.setenv("VLLM_CPU_OMP_THREADS_BIND", "0-3")  # the user's own, set between two engines, stays
    engine_setup(EngineSettings(model_dir, cpu_threads_bind="all")).apply_env()
    assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "0-3"


def test_a_child_process_sets_again_what_its_parent_s_engine_set(model_dir, clean_env):
    """Found by CI: a blocking engine in the test process set bind 'all'; `seal rehearse`'s Ray
    workers inherited it, and their async engines (multiprocess, TP 2) refused 'all'. A child
    reads the record its parent left beside the variables."""
    engine_setup(EngineSettings(model_dir, cpu_threads_bind="all")).apply_env()
    child = dict(os.environ)  # what a subprocess inherits
    code = (
        "import os; from actors.generation.engine_settings import EngineSettings, engine_setup\n"
        f"engine_setup(EngineSettings({model_dir!r}, engine='async', cpu_threads_bind='nobind')).apply_env()\n"
        "print(os.environ['VLLM_CPU_OMP_THREADS_BIND'])"
    )
    out = subprocess.run([sys.executable, "-c", code], env=child, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "nobind"


def _defaults(fn) -> dict:
    return {
        n: p.default for n, p in inspect.signature(fn).parameters.items() if p.default is not inspect.Parameter.empty
    }


def test_both_constructors_default_as_the_settings_do():
    """The constructors keep their own keyword lists (hydra configs and overrides pass them); their
    defaults must not drift from the settings' (the async engine's own max_num_seqs aside)."""
    from actors.generation.async_vllm_engine import AsyncVllmGenerator
    from actors.generation.vllm_engine import VllmGenerator

    settings = {f.name: f.default for f in dataclasses.fields(EngineSettings)}
    for cls, own in ((VllmGenerator, set()), (AsyncVllmGenerator, {"max_num_seqs"})):
        shared = {k: v for k, v in _defaults(cls.__init__).items() if k in settings and k not in own}
        assert shared == {k: settings[k] for k in shared}, cls.__name__
    assert "engine" not in _defaults(VllmGenerator.__init__)  # each constructor names its own engine


def test_the_async_generator_is_a_generator_and_starts_no_engine_when_built(model_dir, clean_env):
    from actors.generation.async_vllm_engine import AsyncVllmGenerator
    from rollout.generator import Generator

    gen = AsyncVllmGenerator(
        model_dir,
        max_model_len="1024",
        cpu_kv_cache_gb=0.25,
        weight_sync="broadcast",
        initial_version=3,
        update_timeout_s=600.0,
    )
    assert isinstance(gen, Generator) and gen.policy_version() == 3 and gen.dtype() == "float32"
    assert gen.settings.engine == "async" and gen.settings.max_model_len == 1024
    assert gen._engine_kwargs["weight_transfer_config"] == {"backend": GLOO_TRANSFER_BACKEND}
    assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"  # its engine core follows this process's pinning
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in os.environ
    with pytest.raises(RuntimeError, match="has not started"):
        gen.tokenizer


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"update_mode": "later"}, "update_mode must be one of"),
        ({"drain_timeout_s": 600.0}, "drain_timeout_s must be > 0 and below update_timeout_s"),
        ({"device": "tpu"}, "device must be cpu or cuda"),
    ],
)
def test_the_async_generator_refuses_bad_values_before_resolving_the_model(kwargs, message):
    from actors.generation.async_vllm_engine import AsyncVllmGenerator

    with pytest.raises(ValueError, match=message):
        AsyncVllmGenerator("no/such/model", **{"update_timeout_s": 600.0, **kwargs})


def test_the_generator_modules_import_neither_vllm_nor_torch():
    """Config checks and the driver import them; vLLM and torch load when an engine is made."""
    code = (
        "import sys, actors.generation.vllm_engine, actors.generation.async_vllm_engine, actors.generation.server; "
        "print(sorted({'vllm', 'torch'} & set(sys.modules)))"
    )
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), *[os.pardir] * 4))  # the repository
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
