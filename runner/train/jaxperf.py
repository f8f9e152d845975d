"""How the JAX engine runs fast on the device it finds: precision and steps per execution (XLA is not a choice).

perf.py makes these choices for TensorFlow; JAX needs its own, because the same lever pulls differently:

  * XLA: JAX compiles every step function with XLA, on every device (Keras 3 resolves jit_compile "auto" to True
    on JAX; False would run each op eagerly). Nothing to choose; a restored model gets it back on (a TensorFlow
    checkpoint from a CPU run says jit_compile False).
  * Precision and steps per execution on CPU: see the constants below, measured on the 2-core AMD EPYC Zen 4 with
    AVX512-BF16 (Keras 3.15.1, JAX 0.10.2) with `scripts/bench_jax_choices.py` (docs/bench.md has the numbers).
    Unlike TensorFlow's oneDNN kernels, XLA's CPU backend gained nothing from bfloat16 there, so there is no
    start-up calibration on JAX: float32 on every CPU.
  * TPU and GPU: the same table as TensorFlow's, unmeasured here: bfloat16 on TPU (the MXU's native input type,
    Cloud TPU docs), float16 on GPUs of compute capability 7.0+ (tensor cores, Keras mixed-precision guide), and
    many steps per call on TPU (Cloud TPU performance guide: a host round trip costs more than an MNIST step).

No JAX import here: the device comes in as an argument.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from runner.train import perf

# mnist_cnn at batch 1024 through the engine's feed and fit, the variants taking turns, 6 rounds of 4 steps
# (`scripts/bench_jax_choices.py`, 2026-12-03; a shared machine, float32 steps took 1.8-3.5 s):
CPU_BF16_RATIO = "0.87x"  # mixed_bfloat16 over float32, examples/s: XLA's CPU backend does not gain from bf16
CPU_STEPS_RATIO = "1.03x"  # steps_per_execution 4 over 1: noise; a CPU step is long next to Python's overhead
TPU_STEPS = 50


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
    """(policy, reason, source)."""
    if requested != "auto":
        if requested not in perf.PRECISIONS:
            raise ValueError(f"precision {requested!r}: use auto or one of {', '.join(perf.PRECISIONS)}")
        return requested, "requested", "requested"
    if kind == "tpu":
        return "mixed_bfloat16", "TPU: bfloat16 is the MXU's type", "table"
    if kind == "gpu":
        why = f"compute capability {capability[0]}.{capability[1]}" if capability else "compute capability unknown"
        return ("mixed_float16" if capability and capability >= (7, 0) else "float32"), f"GPU, {why}", "table"
    native = "native bfloat16" if perf.has_native_bf16(flags) else "no native bfloat16"
    return "float32", f"CPU ({native}): mixed_bfloat16 measured {CPU_BF16_RATIO} on the Zen 4 under XLA", "table"


def steps_per_execution(kind: str, steps_per_epoch: int) -> int:
    return max(1, min(steps_per_epoch, TPU_STEPS)) if kind == "tpu" else 1


def plan_for(
    kind: str,
    steps_per_epoch: int,
    *,
    device: Any = None,
    requested_precision: str = "auto",
    requested_steps: int | None = None,
    cpuinfo: str | None = None,
) -> JaxPerfPlan:
    text = perf.read_cpuinfo() if cpuinfo is None else cpuinfo
    flags = perf.cpu_flags(text)
    capability = gpu_capability(device) if kind == "gpu" and device is not None else None
    policy, reason, source = precision(kind, flags, capability, requested_precision)
    return JaxPerfPlan(
        kind=kind,
        precision=policy,
        steps_per_execution=requested_steps or steps_per_execution(kind, steps_per_epoch),
        cpu=perf.cpu_model(text),
        native_bf16=perf.has_native_bf16(flags),
        precision_reason=reason,
        precision_source=source,
    )
