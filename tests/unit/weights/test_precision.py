"""weights/precision.py: dtype auto from CPU flags, the early one-line error, bf16 across numpy."""

import pytest
import torch

from weights.precision import WIRE_DTYPE_KEY, check_dtype, cpu_flags, from_wire_arrays, resolve_dtype, to_wire_arrays

EPYC = (
    "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu avx2 avx512f avx512_bf16 avx512_vnni\n\nprocessor\t: 1\n"
)
NO_BF16 = "flags\t\t: fpu avx2 avx512f\n"


def test_flags_parse_from_cpuinfo_text():
    assert "avx512_bf16" in cpu_flags(EPYC)
    assert cpu_flags("nothing here") == set()


def test_auto_follows_the_flags():
    assert resolve_dtype("auto", "cpu", cpu_flags(EPYC))[0] == "bfloat16"
    assert "avx512_bf16" in resolve_dtype("auto", "cpu", cpu_flags(EPYC))[1]
    assert resolve_dtype("auto", "cpu", {"amx_bf16"})[0] == "bfloat16"
    dtype, why = resolve_dtype("auto", "cpu", cpu_flags(NO_BF16))
    assert dtype == "float32" and "none of" in why
    assert resolve_dtype("auto", "cuda", set())[0] == "bfloat16"


def test_explicit_choices_win_over_the_flags():
    assert resolve_dtype("float32", "cpu", cpu_flags(EPYC))[0] == "float32"
    assert resolve_dtype("bfloat16", "cpu", set())[0] == "bfloat16"


def test_a_bad_value_is_one_line():
    with pytest.raises(ValueError, match="auto, bfloat16, float32; got 'fp16'") as err:
        check_dtype("fp16")
    assert "\n" not in str(err.value)


def test_learner_config_refuses_a_bad_dtype():
    from learner.engine import LearnerConfig

    with pytest.raises(ValueError, match="dtype must be one of"):
        LearnerConfig(dtype="half")
    assert LearnerConfig(dtype="auto").dtype == "auto"


def test_bf16_crosses_numpy_bit_for_bit_and_fp32_unmarked():
    w = {"a": torch.randn(3, 4).to(torch.bfloat16), "b": torch.randn(5).to(torch.bfloat16)}
    wire = to_wire_arrays(w.items())
    assert wire[WIRE_DTYPE_KEY] == "bfloat16"
    back = from_wire_arrays(wire)
    assert set(back) == {"a", "b"}
    for k in w:
        assert back[k].dtype == torch.bfloat16 and torch.equal(back[k], w[k])
    f = to_wire_arrays([("a", torch.randn(2))])
    assert WIRE_DTYPE_KEY not in f and from_wire_arrays(f)["a"].dtype == torch.float32
