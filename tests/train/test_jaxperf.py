"""The JAX engine's speed choices per device (runner.train.jaxperf): a table, no JAX needed to read it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
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


def test_the_compile_cache_is_the_start_up_caches_unless_the_user_chose_one(tmp_path: Path) -> None:
    """Set before JAX is imported (JAX settles at its first compile whether a process uses a cache), in a process
    of its own: the start-up cache's jax/ folder; a folder the user gave JAX is kept; one that cannot be made, none."""
    code = (
        "import json, os, sys\n"
        "from pathlib import Path\n"
        "from runner.train import jaxperf\n"
        "found = jaxperf.compile_cache(Path(sys.argv[1]))\n"
        "print(json.dumps([str(found) if found else None, 'jax' in sys.modules,\n"
        "                  {k: v for k, v in os.environ.items() if k.startswith('JAX_')}]))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_")}

    def run(root: Path, **extra: str) -> list[object]:
        done = subprocess.run(
            [sys.executable, "-c", code, str(root)], env={**env, **extra}, capture_output=True, text=True, check=True
        )
        return list(json.loads(done.stdout))

    found, imported, variables = run(tmp_path / "startup")
    assert found == str(tmp_path / "startup" / "jax") and (tmp_path / "startup" / "jax").is_dir() and not imported
    assert variables == {
        "JAX_COMPILATION_CACHE_DIR": found,
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": str(jaxperf.CACHE_MIN_COMPILE_S),
    }
    assert run(tmp_path / "other", JAX_COMPILATION_CACHE_DIR="/mine")[::2] == [
        None,
        {"JAX_COMPILATION_CACHE_DIR": "/mine"},
    ]
    ours = str(tmp_path / "startup" / "jax")  # set by the supervisor (jaxperf.compile_cache_env): still ours
    assert run(tmp_path / "startup", JAX_COMPILATION_CACHE_DIR=ours)[::2] == [ours, {"JAX_COMPILATION_CACHE_DIR": ours}]
    (tmp_path / "file").write_text("")
    assert run(tmp_path / "file")[::2] == [None, {}]  # a file where the folder would be: no cache, the run goes on
