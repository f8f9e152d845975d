"""The JAX engine's speed choices per device (runner.train.jaxperf): a table, no JAX needed to read it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from runner.train import jaxperf

ZEN4 = "model name\t: AMD EPYC\nflags\t\t: fpu avx2 avx512f avx512_bf16\n"
AVX2 = "model name\t: AMD EPYC 7B12\nflags\t\t: fpu avx2 fma\n"


def test_cpu_float32_one_step_per_call_with_or_without_native_bfloat16() -> None:
    for cpuinfo, native in ((ZEN4, True), (AVX2, False)):
        plan = jaxperf.plan_for("cpu", 58, cpuinfo=cpuinfo)
        assert (plan.precision, plan.steps_per_execution, plan.jit_compile) == ("float32", 1, True)
        assert plan.native_bf16 is native and plan.precision_source == "table"
        assert jaxperf.CPU_BF16_RATIO in plan.precision_reason
    assert plan.as_dict()["precision"] == "float32" and "XLA always (JAX)" in plan.describe()


def test_accelerators_and_requests() -> None:
    tpu = jaxperf.plan_for("tpu", 58, cpuinfo=AVX2)
    assert (tpu.precision, tpu.steps_per_execution) == ("mixed_bfloat16", 50)
    assert jaxperf.plan_for("tpu", 7, cpuinfo=AVX2).steps_per_execution == 7  # never more than an epoch
    a100, p100 = SimpleNamespace(compute_capability="8.0"), SimpleNamespace(compute_capability="6.0")
    assert jaxperf.plan_for("gpu", 58, device=a100, cpuinfo=AVX2).precision == "mixed_float16"
    assert jaxperf.plan_for("gpu", 58, device=p100, cpuinfo=AVX2).precision == "float32"
    assert jaxperf.plan_for("gpu", 58, device=SimpleNamespace(), cpuinfo=AVX2).precision == "float32"
    asked = jaxperf.plan_for("cpu", 58, requested_precision="mixed_bfloat16", requested_steps=4, cpuinfo=ZEN4)
    assert (asked.precision, asked.precision_source, asked.steps_per_execution) == ("mixed_bfloat16", "requested", 4)
    with pytest.raises(ValueError, match="precision 'float8'"):
        jaxperf.plan_for("cpu", 58, requested_precision="float8", cpuinfo=ZEN4)
