"""How the JAX engine runs fast on the device it finds: precision and steps per execution (XLA is not a choice).

perf.py makes these choices for TensorFlow; JAX shares its tables (choices.py) and the CPU's description (cpu.py),
and decides its CPU's own precision, because the same lever pulls differently:

  * XLA: JAX compiles every step function with XLA, on every device (Keras 3 resolves jit_compile "auto" to True
    on JAX; False would run each op eagerly). Nothing to choose; a restored model gets it back on (a TensorFlow
    checkpoint from a CPU run says jit_compile False).
  * Precision and steps per execution on CPU: see the constants below, measured on the 2-core AMD EPYC Zen 4 with
    AVX512-BF16 (Keras 3.15.1, JAX 0.10.2) with `scripts/bench_jax_choices.py` (docs/bench.md has the numbers).
    Unlike TensorFlow's oneDNN kernels, XLA's CPU backend gained nothing from bfloat16 there, so there is no
    start-up calibration on JAX: float32 on every CPU.
  * Compiling: each run's step functions are compiled by XLA before the first step (seconds on a CPU). JAX's
    persistent compilation cache keeps them in the start-up cache (startcache.py), keyed by JAX itself by the
    program, the device and the JAX build, so a later run on this machine loads them instead (compile_cache).
  * TPU and GPU: the tables both engines share (choices.py): bfloat16 on TPU, float16 on GPUs of compute
    capability 7.0+, many steps per call on TPU; unmeasured here.

No JAX import here: the device comes in as an argument.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from runner.train import choices, cpu, startcache

# mnist_cnn at batch 1024 through the engine's feed and fit, the variants taking turns, 6 rounds of 4 steps
# (`scripts/bench_jax_choices.py`, 2026-12-03; a shared machine, float32 steps took 1.8-3.5 s):
CPU_BF16_RATIO = "0.87x"  # mixed_bfloat16 over float32, examples/s: XLA's CPU backend does not gain from bf16
CPU_STEPS_RATIO = "1.03x"  # steps_per_execution 4 over 1: noise; a CPU step is long next to Python's overhead
# Every program gets a file, however fast it compiles (JAX's default keeps those of 1 s or more, which left the eval
# step out): examples/flax_mnist compiles about 30 small ones besides its steps (sharding, optimizer state,
# metrics), which a minimum of 0.2 s left to compile again at every start. 100 steps warm, 4 runs each (2026-12-07):
# 7.7 CPU s with 0.2, 6.9 with 0 (35 files against 6).
CACHE_MIN_COMPILE_S = 0.0


@dataclass(frozen=True)
class JaxPerfPlan:
    """What the JAX engine chose for this run and why; written to summary.json as "perf" (the keys of
    perf.PerfPlan that apply)."""

    kind: str
    precision: str
    steps_per_execution: int
    cpu: str = ""
    native_bf16: bool = False
    precision_reason: str = ""
    precision_source: str = ""  # requested | table
    jit_compile: bool = True  # always, on JAX

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        precision = f"{self.precision} ({self.precision_reason})" if self.precision_reason else self.precision
        return f"{precision}, XLA always (JAX), {self.steps_per_execution} steps/execution"


def gpu_capability(device: Any) -> tuple[int, int] | None:
    """A JAX CUDA device's compute capability ("8.0" -> (8, 0)), or None when it does not say."""
    text = str(getattr(device, "compute_capability", "") or "")
    major, _, minor = text.partition(".")
    return (int(major), int(minor or 0)) if major.isdigit() and (minor or "0").isdigit() else None


def precision(
    kind: str, flags: frozenset[str], capability: tuple[int, int] | None, requested: str
) -> tuple[str, str, str]:
    """(policy, reason, source): the shared table's on a TPU or GPU, or when one is requested; float32 on a CPU."""
    table = choices.device_precision(kind, capability, requested)
    if table is not None:
        return table.policy, table.reason, table.source
    native = "native bfloat16" if cpu.has_native_bf16(flags) else "no native bfloat16"
    return "float32", f"CPU ({native}): mixed_bfloat16 measured {CPU_BF16_RATIO} on the Zen 4 under XLA", "table"


def plan_for(
    kind: str,
    steps_per_epoch: int,
    *,
    device: Any = None,
    requested_precision: str = "auto",
    requested_steps: int | None = None,
    cpuinfo: str | None = None,
) -> JaxPerfPlan:
    machine = cpu.detect(cpuinfo)
    capability = gpu_capability(device) if kind == "gpu" and device is not None else None
    policy, reason, source = precision(kind, machine.flags, capability, requested_precision)
    return JaxPerfPlan(
        kind=kind,
        precision=policy,
        steps_per_execution=requested_steps or choices.steps_per_execution(kind, steps_per_epoch),
        cpu=machine.model,
        native_bf16=machine.native_bf16,
        precision_reason=reason,
        precision_source=source,
    )


CACHE_DIR_ENV = "JAX_COMPILATION_CACHE_DIR"
MIN_COMPILE_ENV = "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"


def _cache_dir(environ: Mapping[str, str], root: Path | None) -> Path:
    return (root or startcache.cache_dir(environ)) / "jax"


def compile_cache_env(environ: Mapping[str, str], root: Path | None = None) -> dict[str, str]:
    """JAX's persistent compilation cache in the start-up cache (`root`, else startcache.cache_dir(environ)), as the
    variables JAX reads when it is imported: what the supervisor adds to every job's environment, so a user's own
    JAX code loads the programs an earlier run on this machine compiled, as the built-in engine does. Nothing when
    the environment already names a cache directory (the user's choice) or this one cannot be written."""
    if environ.get(CACHE_DIR_ENV):
        return {}
    directory = _cache_dir(environ, root)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError:
        return {}
    if not os.access(directory, os.W_OK):
        return {}
    return {CACHE_DIR_ENV: str(directory), MIN_COMPILE_ENV: str(CACHE_MIN_COMPILE_S)}


def compile_cache(root: Path | None = None) -> Path | None:
    """The start-up cache's compilation cache for this process (the built-in engine), the directory whose hits it
    says: set before JAX is imported (JAX decides at its first compile whether a process uses the cache, and Keras
    compiles small programs as it starts), in JAX's configuration when it already is. Usually the supervisor has
    set it already (compile_cache_env). None when the user chose another directory or this one cannot be written."""
    ours = _cache_dir(os.environ, root)
    chosen = os.environ.get(CACHE_DIR_ENV)
    if chosen:
        return ours if Path(chosen) == ours else None
    settings = compile_cache_env(os.environ, root)
    if not settings:
        return None
    for name, value in settings.items():
        os.environ.setdefault(name, value)
    if "jax" in sys.modules:
        import jax

        jax.config.update("jax_compilation_cache_dir", os.environ[CACHE_DIR_ENV])
        jax.config.update("jax_persistent_cache_min_compile_time_secs", float(os.environ[MIN_COMPILE_ENV]))
    return ours


def say_cache_hits(jax: Any, directory: Path) -> None:
    """Say in the log, once, when a compiled program is loaded from the start-up cache instead of compiled."""
    said = False

    def on_event(event: str, **_: Any) -> None:
        nonlocal said
        if event == "/jax/compilation_cache/cache_hits" and not said:
            said = True
            print(f"[trainer] compiled programs are loaded from the start-up cache ({directory})", flush=True)

    jax.monitoring.register_event_listener(on_event)
