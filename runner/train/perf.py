"""How the TensorFlow engine runs fast on the device it finds: oneDNN, threads, precision, XLA, steps per execution.

The CPU choices were measured with epochs interleaved in lock-step between processes, on the AVX2 EPYC and the
Zen 4 (calibration.py says which); each comment gives the median ratio and the CPU it comes from; docs/bench.md has
the commands. GPU and TPU choices could not be measured here: they follow the vendors' guides (choices.py, the
tables both engines share), say so, and `runner bench` on such a machine measures them. The CPU as the choices see
it is cpu.py's ($RUNNER_CPU_FLAGS changes its flags for tests).

Two phases, because TensorFlow reads some settings only once:

    process_environment()       before `import tensorflow`: oneDNN
    tf = import_tensorflow()    the import itself, without the JAX import TensorFlow does on its way
    configure_threads(tf)       after the import, before the first op: thread pools when a CPU quota is set
    plan = plan_for(kind, ...)  after strategy resolution, before the run's model is built: precision policy
                                and dropout kernel (calibrated on CPUs, kept in the start-up cache; or deferred,
                                for the trainer to calibrate after its first epoch), XLA, steps per execution

Nothing here imports TensorFlow at module level; the functions that need it take it as an argument.
"""

from __future__ import annotations

import functools
import os
import platform
import sys
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from runner.train import calibration, choices, cpu
from runner.train.calibration import Calibrator, PrecisionChoice
from runner.train.models import DROPOUT_MODELS

ONEDNN_ENV = "TF_ENABLE_ONEDNN_OPTS"


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


def import_tensorflow() -> Any:
    """`import tensorflow`, without the JAX import it makes on its way where JAX is installed beside it.

    TensorFlow's eager import of tf.lite tries `from jax import jit` (for a converter this runner never calls) and
    keeps None if that fails: where JAX is installed too (a local install with both engines, as `make install` makes
    it; the TensorFlow images leave JAX out), importing TensorFlow imported JAX as well, 0.44 CPU s of its 3.3 (the
    mean of six imports of each kind on the 2-core Xeon). JAX is hidden for the length of the import only: a later
    `import jax` in the process (a user's model module) imports it as usual. A process that imported JAX already
    keeps it; nothing else in the process imports while the engine starts."""
    hide = "tensorflow" not in sys.modules and "jax" not in sys.modules
    if hide:
        sys.modules["jax"] = None  # type: ignore[assignment]  # `import jax` raises ImportError while this stands
    try:
        import tensorflow as tf
    finally:
        if hide and sys.modules.get("jax", False) is None:
            del sys.modules["jax"]
    return tf


def configure_threads(tf: Any, quota: float | None = None) -> dict[str, int]:
    """Thread pools sized to the CPUs a quota grants; TensorFlow's defaults otherwise.

    TensorFlow sizes both pools from the host's core count, which a container limited with --cpus exceeds: more
    threads than CPUs, each step waiting on descheduled ones. Without a quota the defaults stay: on the 2-core
    machine, inter_op=1/intra_op=2 measured 0.93x of the defaults (14 interleaved epoch pairs, within noise)."""
    quota = cpu.cpu_quota() if quota is None else quota
    if not quota or cpu.usable_cpus(quota) >= (os.cpu_count() or 1):
        return {}
    cpus = cpu.usable_cpus(quota)
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
    return tuple(cc) if cc else None


def jit_compile(kind: str) -> bool | None:
    """XLA for Keras' compile: None leaves Keras' own default.

    CPU: off. Measured on the AVX2 EPYC 0.24x the examples/s without oneDNN and 0.57x with it (interleaved epochs,
    batch 1024): XLA's CPU convolutions are slower than TensorFlow's kernels. GPU: Keras 3 compiles with XLA by
    default (jit_compile="auto"), tf_keras does not; kept as they are, unmeasured here. TPU: always compiled by XLA."""
    return False if kind == "cpu" else None


def choose_precision(
    kind: str,
    flags: frozenset[str],
    capability: tuple[int, int] | None = None,
    requested: str = "auto",
    *,
    fusable: bool = False,
    calibrate: Calibrator | None = None,
    key: Mapping[str, Any] | None = None,
    cache_root: Path | None = None,
    defer: bool = False,
) -> PrecisionChoice:
    """The policy, the dropout kernel and why. A TPU or GPU takes the table's (choices.py); only a CPU has a real
    choice to make (bfloat16 where it is native, the fused dropout where the model has dropout: `fusable`), and
    there it is measured (calibrate, kept in the start-up cache under `key`) instead of assumed: the plain variant
    stays unless another wins. `defer`: without a cached pick, the plain variant until the caller calibrates."""
    table = choices.device_precision(kind, capability, requested)
    if table is not None and kind != "cpu":
        return PrecisionChoice(table.policy, table.reason, table.source)
    candidates = calibration.cpu_candidates(flags, requested, fusable)
    policy = calibration.split_variant(candidates[0])[0]
    if len(candidates) == 1:
        if requested != "auto":
            return PrecisionChoice(policy, "requested", "requested")
        return PrecisionChoice(policy, "no native bfloat16; emulated measured 0.21x on the AVX2 EPYC", "table")
    if calibrate is None:
        native = "native bfloat16, " if requested == "auto" and cpu.has_native_bf16(flags) else ""
        return PrecisionChoice(policy, f"{native}not calibrated (no model and batch given)", "uncalibrated")
    return calibration.calibrated_choice(candidates, calibrate, key or {}, root=cache_root, defer=defer)


def calibration_key(
    tf: Any, machine: cpu.Cpu, model: str, batch_size: int, jit: bool | None, input_shape: Sequence[int], classes: int
) -> dict[str, Any]:
    """What a calibration depends on: the CPU (its model, its flags, how much of it we get), the TensorFlow and
    Keras builds and the oneDNN setting, XLA, the model (what it is, not only its name: calibration.model_digest),
    its input and the batch. calibrated_choice adds the candidates and the method."""
    return {
        "cpu": machine.model,
        "cpu_flags": machine.flags_digest(),
        "cpus": cpu.usable_cpus(cpu.cpu_quota()),
        "tensorflow": tf.__version__,
        "keras": str(getattr(getattr(tf, "keras", None), "__version__", "?")),
        "onednn": os.environ.get(ONEDNN_ENV, "default"),
        "xla": jit,
        "model": model,
        "model_digest": calibration.model_digest(tf, model, input_shape, classes),
        "input_shape": list(input_shape),
        "classes": classes,
        "batch": batch_size,
    }


@dataclass(frozen=True)
class PerfPlan:
    """What the trainer chose for this run and why; written to summary.json as "perf"."""

    kind: str
    precision: str
    jit_compile: bool | None
    steps_per_execution: int
    cpu: str = ""
    native_bf16: bool = False
    env: dict[str, str] = field(default_factory=dict)
    threads: dict[str, int] = field(default_factory=dict)
    precision_reason: str = ""
    precision_source: str = ""  # see PrecisionChoice.source
    calibration: dict[str, Any] | None = None
    cpu_flags_override: str | None = None  # $RUNNER_CPU_FLAGS, when it changed what the choices saw
    dropout: str = "keras"  # keras | xla: the model's dropout layers draw their masks in one XLA kernel
    # A deferred calibration (plan_for's defer) ran after this many epochs; those trained the plain variant.
    calibrated_after_epoch: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        precision = f"{self.precision} ({self.precision_reason})" if self.precision_reason else self.precision
        parts = [precision, f"XLA {'default' if self.jit_compile is None else self.jit_compile}"]
        if self.dropout == "xla":
            parts.append("dropout fused by XLA")
        parts.append(f"{self.steps_per_execution} steps/execution")
        if self.env.get(ONEDNN_ENV) == "1" or os.environ.get(ONEDNN_ENV) == "1":
            parts.append("oneDNN")
        if self.threads:
            parts.append(f"threads {self.threads['intra_op']}/{self.threads['inter_op']}")
        if self.cpu_flags_override is not None:
            parts.append(f"CPU flags {cpu.CPU_FLAGS_ENV}={self.cpu_flags_override!r}")
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
    model: str | None = None,
    batch_size: int | None = None,
    calibrate: Calibrator | None = None,
    cache_root: Path | None = None,
    environ: Mapping[str, str] | None = None,
    input_shape: Sequence[int] = (28, 28, 1),
    classes: int = 10,
    defer: bool = False,
) -> PerfPlan:
    """The run's choices. With `model` and `batch_size` (and `tf`), a CPU times the variants it has a choice
    between for them (calibration.py), or takes the start-up cache's pick for the same key; call it before building
    the run's model, as both clear Keras' session. `defer`: no timing now; without a cached pick the plan is the
    plain variant, its precision_source "deferred", and the caller plans again (without `defer`) when it can spare
    the time. `calibrate` and `cache_root` replace those in tests."""
    machine = cpu.detect(cpuinfo, environ)
    capability = gpu_capability(tf) if tf is not None and kind == "gpu" else None
    jit = jit_compile(kind) if requested_jit is None else requested_jit
    # The fused kernel replaces Keras 3's Dropout.call; with XLA for the whole model, XLA fuses dropout anyway.
    keras3 = tf is None or str(getattr(getattr(tf, "keras", None), "__version__", "")).startswith("3")
    fusable = kind == "cpu" and jit is False and keras3 and model in DROPOUT_MODELS
    candidates = calibration.cpu_candidates(machine.flags, requested_precision, fusable) if kind == "cpu" else ()
    key: dict[str, Any] = {}
    if calibrate is None and tf is not None and model and batch_size and len(candidates) > 1:
        key = calibration_key(tf, machine, model, batch_size, jit, input_shape, classes)
        calibrate = functools.partial(
            calibration.time_variants,
            tf,
            model,
            batch_size,
            jit_compile=jit,
            input_shape=list(input_shape),
            classes=classes,
        )
    elif calibrate is not None:
        key = {"cpu": machine.model, "cpu_flags": machine.flags_digest(), "model": model, "batch": batch_size}
    choice = choose_precision(
        kind,
        machine.flags,
        capability,
        requested_precision,
        fusable=fusable,
        calibrate=calibrate,
        key=key,
        cache_root=cache_root,
        defer=defer,
    )
    return PerfPlan(
        kind=kind,
        precision=choice.policy,
        jit_compile=jit,
        steps_per_execution=requested_steps or choices.steps_per_execution(kind, steps_per_epoch),
        cpu=machine.model,
        native_bf16=machine.native_bf16,
        env=dict(env or {}),
        threads=dict(threads or {}),
        precision_reason=choice.reason,
        precision_source=choice.source,
        calibration=choice.calibration,
        cpu_flags_override=machine.forced,
        dropout=choice.dropout,
    )
