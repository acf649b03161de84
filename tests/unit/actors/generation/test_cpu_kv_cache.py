"""The CPU engines' KV cache size goes to vLLM as bytes (kv_cache_memory_bytes), so a fraction of a
GiB works: VLLM_CPU_KVCACHE_SPACE takes whole GiB, and 8 TP workers of a rehearsal held 8 GiB at 1."""

from __future__ import annotations

import pytest

from actors.generation.engine_settings import cpu_kv_cache_args


def test_a_fraction_of_a_gib_becomes_exact_bytes():
    assert cpu_kv_cache_args(0.0625) == {"kv_cache_memory_bytes": 64 * 2**20}
    assert cpu_kv_cache_args(2) == {"kv_cache_memory_bytes": 2 * 2**30}


@pytest.mark.parametrize("bad", [0, -1, float("nan")])
def test_a_size_that_holds_nothing_is_refused_before_vllm_starts(bad):
    with pytest.raises(ValueError, match="generator.cpu_kv_cache_gb must be > 0"):
        cpu_kv_cache_args(bad)


def test_vllm_reads_the_argument_on_cpu_and_the_users_variable_over_it():
    """The contract this relies on, read from the installed vLLM: its CPU platform sets
    kv_cache_memory_bytes from VLLM_CPU_KVCACHE_SPACE only when that variable is set."""
    import inspect

    from vllm.platforms import cpu

    source = inspect.getsource(cpu)
    assert "kv_cache_memory_bytes = kv_cache_space * GiB_bytes" in source
    assert 'if env_key in os.environ and os.environ[env_key] != ""' in source
