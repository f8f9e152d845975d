"""The speed choices both engines share: the precision table per device, steps per execution, and the one choice
per run that every worker takes from the chief.

Each engine's plan (perf.py for TensorFlow, jaxperf.py for JAX) reads these tables and decides its CPU's own
precision: TensorFlow's oneDNN kernels may gain from bfloat16, so perf.py calibrates; XLA's CPU backend measured
no gain, so jaxperf.py keeps float32.

  * TPU: bfloat16 is the MXU's native input type (Cloud TPU docs, "bfloat16 numerical format"); not measured here.
  * GPU: float16 with loss scaling on compute capability 7.0+ (tensor cores; Keras mixed-precision guide), float32
    on older GPUs such as the notebook's K80 (3.7), which gain nothing; not measured here.
  * Steps per execution: on a TPU each host->device round trip costs far more than an MNIST step, so many steps
    run per call (Cloud TPU performance guide). CPU: 1; on the AVX2 EPYC 4 measured 0.92x and 8 0.98x of 1 with
    TensorFlow (interleaved epochs, within noise), and 4 1.03x with JAX on the Zen 4, as Keras' per-step overhead
    is small next to a CPU step. GPU: 1, unmeasured here; `runner bench --steps-per-execution` measures it on one.

Standard library only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")
TPU_STEPS = 50  # steps per execution on a TPU (never more than an epoch)


@dataclass(frozen=True)
class TableChoice:
    policy: str
    reason: str  # said on the perf line and kept in summary.json
    source: str  # requested | table


def checked(requested: str) -> str:
    if requested != "auto" and requested not in PRECISIONS:
        raise ValueError(f"precision {requested!r}: use auto or one of {', '.join(PRECISIONS)}")
    return requested


def device_precision(kind: str, capability: tuple[int, int] | None, requested: str = "auto") -> TableChoice | None:
    """The precision the table gives a TPU or GPU, or the one requested; None for a CPU on auto, which each engine
    decides for itself (see the module docstring)."""
    if checked(requested) != "auto":
        return TableChoice(requested, "requested", "requested")
    if kind == "tpu":
        return TableChoice("mixed_bfloat16", "TPU: bfloat16 is the MXU's type", "table")
    if kind == "gpu":
        why = f"compute capability {capability[0]}.{capability[1]}" if capability else "compute capability unknown"
        return TableChoice(
            "mixed_float16" if capability and capability >= (7, 0) else "float32", f"GPU, {why}", "table"
        )
    return None


def steps_per_execution(kind: str, steps_per_epoch: int) -> int:
    return max(1, min(steps_per_epoch, TPU_STEPS)) if kind == "tpu" else 1


# -- one choice per run ------------------------------------------------------------------------------------------

_DROPOUT = ("keras", "xla")
_JIT = (None, False, True)


def run_choices(plan: Any) -> list[int]:
    """What changes the numerics or the collectives of a perf plan (PerfPlan, or the JAX engine's), as the small
    non-negative integers agreement.broadcast carries: precision, dropout kernel, steps per execution, XLA."""
    return [
        PRECISIONS.index(plan.precision),
        _DROPOUT.index(getattr(plan, "dropout", "keras")),
        int(plan.steps_per_execution),
        _JIT.index(getattr(plan, "jit_compile", None)),
    ]


def adopt_choices(plan: Any, chosen: Sequence[int]) -> Any:
    """`plan` with the chief's run_choices: every worker of a run computes in the same precision with the same
    kernels (two workers that chose apart aborted the first all-reduce: "expected data_type 1 but got data_type 9"),
    however differently its own machine or its own timing would have chosen."""
    precision, dropout, steps, jit = chosen
    values = {"precision": PRECISIONS[precision], "dropout": _DROPOUT[dropout], "steps_per_execution": steps}
    values |= {"jit_compile": _JIT[jit], "precision_reason": "worker 0's choice for the run"}
    values |= {"precision_source": "worker 0", "calibration": None}
    own = {f.name for f in fields(plan)}
    return replace(plan, **{k: v for k, v in values.items() if k in own})
