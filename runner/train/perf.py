"""How the trainer runs fast on the device it finds: oneDNN, threads, precision, XLA, steps per execution.

Every CPU choice below was measured on the 2-core AMD EPYC (AVX2/FMA, no AVX512/AMX) the project is developed on,
with epochs interleaved in lock-step between processes (the machine is shared, so only ratios measured side by side
mean anything); each comment gives the median ratio and docs/bench.md the commands. GPU and TPU choices could not be
measured here: they follow the vendors' guides, say so, and `runner bench` on such a machine measures them.

Two phases, because TensorFlow reads some settings only once:

    process_environment()       before `import tensorflow`: oneDNN
    configure_threads(tf)       after the import, before the first op: thread pools when a CPU quota is set
    plan = plan_for(kind, ...)  after strategy resolution: precision policy, XLA, steps per execution

Nothing here imports TensorFlow; the functions that need it take it as an argument.
"""

from __future__ import annotations

import math
import os
import platform
from collections.abc import MutableMapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")
ONEDNN_ENV = "TF_ENABLE_ONEDNN_OPTS"
# CPU flags that mean bfloat16 arithmetic in hardware: AVX512-BF16 (Cooper Lake, Zen 4+), AMX (Sapphire Rapids+),
# and FEAT_BF16 on Arm (Neoverse V1/N2, Graviton 3+), which /proc/cpuinfo lists as "bf16".
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})


def read_cpuinfo(path: str = "/proc/cpuinfo") -> str:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return ""  # not Linux: no flags, so nothing is assumed


def cpu_flags(cpuinfo: str) -> frozenset[str]:
    """The feature flags of the first CPU in a /proc/cpuinfo text ("flags" on x86, "Features" on Arm)."""
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip().lower() in ("flags", "features"):
            return frozenset(value.split())
    return frozenset()


def cpu_model(cpuinfo: str) -> str:
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip().lower() in ("model name", "cpu model", "hardware"):
            return value.strip()
    return platform.processor() or platform.machine()


def has_native_bf16(flags: frozenset[str]) -> bool:
    return bool(flags & NATIVE_BF16_FLAGS)


def cpu_quota(root: str = "/sys/fs/cgroup") -> float | None:
    """CPUs granted by a cgroup quota (docker --cpus), or None when unlimited or unknown."""
    base = Path(root)
    try:
        quota, period = (base / "cpu.max").read_text().split()[:2]  # cgroup v2: "max 100000" or "150000 100000"
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota_us = int((base / "cpu" / "cpu.cfs_quota_us").read_text())  # cgroup v1: -1 when unlimited
        period_us = int((base / "cpu" / "cpu.cfs_period_us").read_text())
        return quota_us / period_us if quota_us > 0 else None
    except (OSError, ValueError):
        return None


def usable_cpus(quota: float | None = None, affinity: int | None = None) -> int:
    if affinity is None:
        affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(affinity, math.ceil(quota))) if quota else affinity


def process_environment(environ: MutableMapping[str, str] | None = None, machine: str | None = None) -> dict[str, str]:
    """Set what TensorFlow reads at import; call before `import tensorflow`. A value the user set is kept.

    oneDNN on x86: TensorFlow enables it by default only on CPUs with AVX512-VNNI/BF16 or AMX, not on this AVX2 EPYC.
    Measured with it on vs off (same pipeline, batch 1024, 14 interleaved epoch pairs): 1.9x the examples/s
    (per layer: MaxPool's gradient 4.4x faster, the convolutions 1.8x). Only the host's CPU kernels change, so it
    is harmless on GPU and TPU hosts, where it speeds up the CPU side of the input pipeline if anything."""
    env = os.environ if environ is None else environ
    machine = (machine or platform.machine()).lower()
    applied: dict[str, str] = {}
    if machine in ("x86_64", "amd64") and ONEDNN_ENV not in env:
        env[ONEDNN_ENV] = applied[ONEDNN_ENV] = "1"
    return applied


def configure_threads(tf: Any, quota: float | None = None) -> dict[str, int]:
    """Thread pools sized to the CPUs a quota grants; TensorFlow's defaults otherwise.

    TensorFlow sizes both pools from the host's core count, which a container limited with --cpus exceeds: more
    threads than CPUs, each step waiting on descheduled ones. Without a quota the defaults stay: on the 2-core
    machine, inter_op=1/intra_op=2 measured 0.93x of the defaults (14 interleaved epoch pairs, within noise)."""
    quota = cpu_quota() if quota is None else quota
    if not quota or usable_cpus(quota) >= (os.cpu_count() or 1):
        return {}
    cpus = usable_cpus(quota)
    threads = {"intra_op": cpus, "inter_op": min(2, cpus)}
    try:
        tf.config.threading.set_intra_op_parallelism_threads(threads["intra_op"])
        tf.config.threading.set_inter_op_parallelism_threads(threads["inter_op"])
    except RuntimeError:
        return {}  # the runtime is already initialised (user code ran ops first): the defaults stay
    return threads


def gpu_capability(tf: Any) -> tuple[int, int] | None:
    """Compute capability of the first GPU, or None without one."""
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return None
    cc = tf.config.experimental.get_device_details(gpus[0]).get("compute_capability")
    return tuple(cc) if cc else None  # type: ignore[return-value]


def precision_policy(
    kind: str,
    flags: frozenset[str] = frozenset(),
    capability: tuple[int, int] | None = None,
    requested: str = "auto",
) -> str:
    """The Keras dtype policy for this device.

    TPU: bfloat16 is the MXU's native input type (Cloud TPU docs, "bfloat16 numerical format"); not measured here.
    GPU: float16 with loss scaling on compute capability 7.0+ (tensor cores; Keras mixed-precision guide), float32
    on older GPUs such as the notebook's K80 (3.7), which gain nothing; not measured here.
    CPU: bfloat16 only with native support. Without it (this AVX2 EPYC) mixed_bfloat16 measured 0.21x the
    examples/s of float32 (14 interleaved epoch pairs): the conversions cost more than the narrower math saves."""
    if requested != "auto":
        if requested not in PRECISIONS:
            raise ValueError(f"precision {requested!r}: use auto or one of {', '.join(PRECISIONS)}")
        return requested
    if kind == "tpu":
        return "mixed_bfloat16"
    if kind == "gpu":
        return "mixed_float16" if capability and capability >= (7, 0) else "float32"
    return "mixed_bfloat16" if has_native_bf16(flags) else "float32"


def jit_compile(kind: str) -> bool | None:
    """XLA for Keras' compile: None leaves Keras' own default.

    CPU: off. Measured 0.24x the examples/s without oneDNN and 0.57x with it (interleaved epochs, batch 1024):
    XLA's CPU convolutions are slower than TensorFlow's kernels. GPU: Keras 3 compiles with XLA by default
    (jit_compile="auto"), tf_keras does not; kept as they are, unmeasured here. TPU: always compiled by XLA."""
    return False if kind == "cpu" else None


def steps_per_execution(kind: str, steps_per_epoch: int) -> int:
    """TPU: each host->device round trip costs far more than an MNIST step, so run many steps per call (Cloud TPU
    performance guide). CPU: 1; 4 measured 0.92x and 8 0.98x of 1 (interleaved epochs, within noise), as Keras'
    per-step overhead is small next to a CPU step. GPU: 1, unmeasured here; `runner bench --steps-per-execution`
    measures it on one."""
    return max(1, min(steps_per_epoch, 50)) if kind == "tpu" else 1


@dataclass(frozen=True)
class PerfPlan:
    """What the trainer chose for this run; written to summary.json as "perf"."""

    kind: str
    precision: str
    jit_compile: bool | None
    steps_per_execution: int
    cpu: str = ""
    native_bf16: bool = False
    env: dict[str, str] = field(default_factory=dict)
    threads: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        parts = [self.precision, f"XLA {'default' if self.jit_compile is None else self.jit_compile}"]
        parts.append(f"{self.steps_per_execution} steps/execution")
        if self.env.get(ONEDNN_ENV) == "1" or os.environ.get(ONEDNN_ENV) == "1":
            parts.append("oneDNN")
        if self.threads:
            parts.append(f"threads {self.threads['intra_op']}/{self.threads['inter_op']}")
        return ", ".join(parts)


def plan_for(
    kind: str,
    steps_per_epoch: int,
    *,
    tf: Any = None,
    requested_precision: str = "auto",
    requested_steps: int | None = None,
    requested_jit: bool | None = None,
    env: dict[str, str] | None = None,
    threads: dict[str, int] | None = None,
    cpuinfo: str | None = None,
) -> PerfPlan:
    text = read_cpuinfo() if cpuinfo is None else cpuinfo
    flags = cpu_flags(text)
    capability = gpu_capability(tf) if tf is not None and kind == "gpu" else None
    return PerfPlan(
        kind=kind,
        precision=precision_policy(kind, flags, capability, requested_precision),
        jit_compile=jit_compile(kind) if requested_jit is None else requested_jit,
        steps_per_execution=requested_steps or steps_per_execution(kind, steps_per_epoch),
        cpu=cpu_model(text),
        native_bf16=has_native_bf16(flags),
        env=dict(env or {}),
        threads=dict(threads or {}),
    )
