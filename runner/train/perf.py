"""How the trainer runs fast on the device it finds: oneDNN, threads, precision, XLA, steps per execution.

The CPU choices were measured with epochs interleaved in lock-step between processes (the machines are shared, so
only ratios measured side by side mean anything), on two CPU families: a 2-core AMD EPYC with AVX2/FMA and no
AVX512 ("AVX2 EPYC"), and a 2-core AMD EPYC Zen 4 with AVX512-BF16 and no AMX ("Zen 4"). Each comment gives the
median ratio and the CPU it comes from; docs/bench.md has the commands. GPU and TPU choices could not be measured
here: they follow the vendors' guides, say so, and `runner bench` on such a machine measures them.

Two phases, because TensorFlow reads some settings only once:

    process_environment()       before `import tensorflow`: oneDNN
    configure_threads(tf)       after the import, before the first op: thread pools when a CPU quota is set
    plan = plan_for(kind, ...)  after strategy resolution, before the run's model is built: precision policy
                                and dropout kernel (calibrated on CPUs), XLA, steps per execution

$RUNNER_CPU_FLAGS changes the CPU features the choices see (/proc/cpuinfo's flags), so that every path can be
tested on any machine: "+avx512_bf16,-amx_bf16" adds and removes flags; a list without signs ("avx2,fma")
replaces the detected flags, "none" empties them. It changes what is decided, not what the hardware does: a
calibration still times the real CPU.

Nothing here imports TensorFlow at module level; the functions that need it take it as an argument.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import json
import math
import os
import platform
import statistics
import time
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from runner.train.models import DROPOUT_MODELS

PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")
ONEDNN_ENV = "TF_ENABLE_ONEDNN_OPTS"
CPU_FLAGS_ENV = "RUNNER_CPU_FLAGS"
# CPU flags that mean bfloat16 arithmetic in hardware: AVX512-BF16 (Cooper Lake, Zen 4+), AMX (Sapphire Rapids+),
# and FEAT_BF16 on Arm (Neoverse V1/N2, Graviton 3+), which /proc/cpuinfo lists as "bf16".
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})
CALIBRATION_FILE = "perf-calibration.json"  # in the data cache directory (runner.datasets.cache_dir)
# How much faster per step bfloat16 must be before auto picks it over float32. Repeated calibrations of one model
# and batch on the shared 2-core Zen 4 differed by up to 0.15x (1.12x and 1.27x at batch 256; 1.30x, 1.30x, 1.31x
# and once 1.79x at 1024); float32 is the numerically safer policy, so a gain inside that noise buys no switch.
BF16_MUST_WIN = 1.10
# A variant's name: its precision policy, with this suffix when its dropout layers draw their masks in one XLA kernel
# (fused_dropout.py) instead of Keras' own dropout.
FUSED = "+xla_dropout"


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


def override_flags(detected: frozenset[str], spec: str | None) -> frozenset[str]:
    """The flags after $RUNNER_CPU_FLAGS: "+f" adds f, "-f" removes it, bare names replace the detected set
    ("none": no flags); commas or spaces separate them. Unset or empty: the detected flags."""
    tokens = (spec or "").replace(",", " ").split()
    if not tokens:
        return detected
    bare = [t for t in tokens if t[0] not in "+-"]
    if any(len(t) < 2 for t in tokens if t[0] in "+-"):
        raise ValueError(f"{CPU_FLAGS_ENV}={spec!r}: give flags as +name, -name or name, e.g. +avx512_bf16,-amx_bf16")
    flags = set() if bare else set(detected)
    flags.update(t for t in bare if t != "none")
    flags.update(t[1:] for t in tokens if t[0] == "+")
    flags.difference_update(t[1:] for t in tokens if t[0] == "-")
    return frozenset(flags)


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
    return tuple(cc) if cc else None


def cpu_candidates(flags: frozenset[str], requested: str = "auto", fusable: bool = False) -> tuple[str, ...]:
    """The variants worth timing on a CPU with these flags, the plain one first (the one kept unless another wins).

    Precision: float32 and, with native bfloat16, mixed_bfloat16. Without native bfloat16 only float32:
    mixed_bfloat16 measured 0.21x its examples/s on the AVX2 EPYC (14 interleaved epoch pairs; the conversions cost
    more than the narrower math saves), so that table entry stands. A requested precision is the only one.
    Dropout (`fusable`: the model has dropout layers, Keras 3 on TensorFlow, no XLA for the whole model): each
    precision with the fused kernel too. On the Zen 4 (mnist_cnn, batch 1024, training steps taking turns, four
    runs) float32 with it measured 1.01x-1.14x float32 with Keras' dropout, and mixed_bfloat16 with it 1.75x-1.86x
    (with Keras' dropout 1.24x-1.30x), so where it pays is the calibration's to find, on every CPU."""
    if requested != "auto":
        precisions: tuple[str, ...] = (requested,)
    else:
        precisions = ("float32", "mixed_bfloat16") if has_native_bf16(flags) else ("float32",)
    return precisions + tuple(p + FUSED for p in precisions) if fusable else precisions


def split_variant(variant: str) -> tuple[str, str]:
    """(precision policy, dropout kernel: "keras" or "xla") of a variant's name."""
    return (variant.removesuffix(FUSED), "xla") if variant.endswith(FUSED) else (variant, "keras")


def precision_policy(
    kind: str,
    flags: frozenset[str] = frozenset(),
    capability: tuple[int, int] | None = None,
    requested: str = "auto",
) -> str:
    """The Keras dtype policy for this device without a calibration (see choose_precision for the reasons).

    TPU: bfloat16 is the MXU's native input type (Cloud TPU docs, "bfloat16 numerical format"); not measured here.
    GPU: float16 with loss scaling on compute capability 7.0+ (tensor cores; Keras mixed-precision guide), float32
    on older GPUs such as the notebook's K80 (3.7), which gain nothing; not measured here.
    CPU: float32. Native bfloat16 is no proof of a gain, and the gain depends on model and batch: on the Zen 4
    (AVX512-BF16, no AMX; TensorFlow 2.20 with oneDNN) our trainer with mixed_bfloat16 measured 1.21x the
    examples/s of float32 at batch 1024 (8 interleaved epoch pairs, 1.03x-1.84x), while the calibration's steps
    measured 1.30x at batch 1024, 1.12x-1.27x at 256 and 1.02x at 64. So only a calibration picks it."""
    if requested != "auto":
        if requested not in PRECISIONS:
            raise ValueError(f"precision {requested!r}: use auto or one of {', '.join(PRECISIONS)}")
        return requested
    if kind == "tpu":
        return "mixed_bfloat16"
    if kind == "gpu":
        return "mixed_float16" if capability and capability >= (7, 0) else "float32"
    return "float32"


Timings = Mapping[str, "float | Sequence[float]"]  # ms per step of each variant: one figure, or every round's


def _rounds(value: float | Sequence[float]) -> list[float]:
    return [float(value)] if isinstance(value, int | float) else [float(v) for v in value]


def _median(value: float | Sequence[float]) -> float:
    return statistics.median(_rounds(value))


def clear_of(rounds: float | Sequence[float], plain: float | Sequence[float]) -> bool:
    """Whether every round of a variant was faster than every round of the plain one: a gain the timing can tell
    from its own noise. A single figure (no rounds to compare) counts as clear."""
    mine, theirs = _rounds(rounds), _rounds(plain)
    return len(mine) < 2 or len(theirs) < 2 or max(mine) < min(theirs)


def pick_from_timings(ms_per_step: Timings) -> str:
    """The first variant (the plain one: float32, or the requested precision, with Keras' dropout), unless another's
    step is at least BF16_MUST_WIN times faster and every one of its rounds beat every round of the plain one (a
    gain inside the rounds' spread is noise: on a busy machine two workers timing at once measured 1.44x and 0.32x
    for the same variants); then the fastest of those."""
    plain, base = next(iter(ms_per_step.items()))
    faster = {
        v: _median(t)
        for v, t in ms_per_step.items()
        if v != plain and _median(t) > 0 and _median(base) / _median(t) >= BF16_MUST_WIN and clear_of(t, base)
    }
    return min(faster, key=faster.__getitem__) if faster else plain


def _timings_text(ms_per_step: Timings) -> str:
    plain, base = next(iter(ms_per_step.items()))
    parts = []
    for v, t in ms_per_step.items():
        text = f"{v} {_median(t):.1f} ms/step"
        if v != plain:
            ratio = _median(base) / _median(t)
            noise = ratio >= BF16_MUST_WIN and not clear_of(t, base)
            text += f" ({ratio:.2f}x" + (", inside the noise)" if noise else ")")
        parts.append(text)
    rule = f"another variant must be {BF16_MUST_WIN:.2f}x {plain}, clear of the noise, to be picked"
    return ", ".join(parts) + "; " + rule


@dataclass(frozen=True)
class PrecisionChoice:
    policy: str
    reason: str  # said on the perf line and kept in summary.json
    source: str  # requested | table | calibrated | cached | uncalibrated | calibration failed
    calibration: dict[str, Any] | None = None  # the cache entry behind a calibrated or cached choice
    dropout: str = "keras"  # keras | xla (fused_dropout.py)


# -- calibration: time the candidate policies on this CPU, for this model and batch -------------------------------


def time_variants(
    tf: Any,
    model: str,
    batch_size: int,
    variants: Sequence[str],
    *,
    jit_compile: bool | None = None,
    rounds: int = 5,
    round_s: float = 0.25,
    input_shape: Sequence[int] = (28, 28, 1),
    classes: int = 10,
) -> dict[str, list[float]]:
    """Milliseconds per training step of each variant, one figure per round: the run's model at the run's batch on
    random data, each compiled and warmed up first, then `rounds` rounds taking turns (ABBA), each about `round_s`
    long; every round's figure is returned, so that a choice can tell a gain from the noise between rounds.
    On the Zen 4 this costs 4-6 s for two variants and 7-12 s for four (mnist_cnn, batch 64 to 1024), once per
    cache key. Keras' state is cleared afterwards, so the run's own model gets the layer names it would have had
    without the calibration."""
    from runner.train.fused_dropout import fuse_dropout
    from runner.train.models import build_model

    keras = tf.keras
    before = keras.mixed_precision.global_policy().name
    x = tf.random.stateless_uniform((batch_size, *input_shape), seed=[0, 0])
    y = tf.random.stateless_uniform((batch_size,), seed=[0, 1], minval=0, maxval=classes, dtype=tf.int32)
    models: dict[str, Any] = {}
    try:
        step_s = 0.0
        for variant in variants:
            policy, dropout = split_variant(variant)
            keras.mixed_precision.set_global_policy(policy)
            models[variant] = build_model(model, keras, tuple(input_shape), classes)
            if dropout == "xla":
                fuse_dropout(models[variant], tf)
            xla = {} if jit_compile is None else {"jit_compile": jit_compile}
            models[variant].compile(optimizer=keras.optimizers.Adam(), loss="sparse_categorical_crossentropy", **xla)
            models[variant].train_on_batch(x, y)  # traces and compiles
            t0 = time.perf_counter()
            models[variant].train_on_batch(x, y)  # oneDNN creates its primitives on the first real call
            step_s = max(step_s, time.perf_counter() - t0)
        steps = max(1, min(50, round(round_s / max(step_s, 1e-4))))
        samples: dict[str, list[float]] = {v: [] for v in variants}
        for r in range(rounds):
            for variant in variants if r % 2 == 0 else reversed(variants):
                t0 = time.perf_counter()
                for _ in range(steps):
                    models[variant].train_on_batch(x, y)  # returns numpy values: the step has finished
                samples[variant].append((time.perf_counter() - t0) / steps * 1e3)
        return {v: [round(t, 2) for t in samples[v]] for v in variants}
    finally:
        models.clear()
        keras.backend.clear_session()
        keras.mixed_precision.set_global_policy(before)


def calibration_key(
    tf: Any, model: str, batch_size: int, cpu: str, jit_compile: bool | None, input_shape: Sequence[int] = (28, 28, 1)
) -> str:
    """What a calibration depends on: the CPU and how much of it we get, the TensorFlow/Keras build and its oneDNN
    setting, the model, its input and the batch."""
    keras = getattr(getattr(tf, "keras", None), "__version__", "?")
    onednn = os.environ.get(ONEDNN_ENV, "default")
    shape = "" if tuple(input_shape) == (28, 28, 1) else f" {tuple(input_shape)}"
    return (
        f"{cpu} | {usable_cpus(cpu_quota())} CPUs | TensorFlow {tf.__version__} | Keras {keras} | "
        f"oneDNN {onednn} | XLA {jit_compile} | {model}{shape} | batch {batch_size}"
    )


def default_cache_file() -> Path:
    from runner import datasets

    return datasets.cache_dir() / CALIBRATION_FILE


def read_cache(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}  # none yet, or unreadable: calibrate again rather than fail the run
    return data if isinstance(data, dict) else {}


def write_cache(path: Path, key: str, entry: dict[str, Any]) -> bool:
    """Add one entry; False when the directory is not writable (a read-only data mount): the run goes on."""
    data = read_cache(path)
    data[key] = entry
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        os.replace(tmp, path)  # atomic: two runs starting at once lose an entry at worst, never the file
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        return False
    return True


Calibrator = Callable[[Sequence[str]], Timings]


def choose_precision(
    kind: str,
    flags: frozenset[str],
    capability: tuple[int, int] | None = None,
    requested: str = "auto",
    *,
    fusable: bool = False,
    calibrate: Calibrator | None = None,
    cache_file: Path | None = None,
    key: str = "",
    now: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.timezone.utc),
) -> PrecisionChoice:
    """The policy, the dropout kernel and why. Only a CPU has a real choice to make (bfloat16 where it is native,
    the fused dropout where the model has dropout: `fusable`); there it is measured (calibrate, cached under key in
    cache_file) instead of assumed, and the plain variant stays unless another wins."""
    policy = precision_policy(kind, flags, capability, requested)
    if kind == "tpu" and requested == "auto":
        return PrecisionChoice(policy, "TPU: bfloat16 is the MXU's type", "table")
    if kind == "gpu" and requested == "auto":
        why = f"compute capability {capability[0]}.{capability[1]}" if capability else "compute capability unknown"
        return PrecisionChoice(policy, f"GPU, {why}", "table")
    candidates = cpu_candidates(flags, requested, fusable) if kind == "cpu" else (policy,)
    if len(candidates) == 1:
        if requested != "auto":
            return PrecisionChoice(policy, "requested", "requested")
        return PrecisionChoice(policy, "no native bfloat16; emulated measured 0.21x on the AVX2 EPYC", "table")
    if calibrate is None:
        native = "native bfloat16, " if requested == "auto" and has_native_bf16(flags) else ""
        return PrecisionChoice(policy, f"{native}not calibrated (no model and batch given)", "uncalibrated")
    cached = read_cache(cache_file).get(key) if cache_file else None
    rounds = _cached_timings(cached, candidates)
    if rounds is not None and isinstance(cached, dict):
        when = str(cached.get("measured", "?"))[:10]
        return _choice(cached["variant"], f"cached from {when}: {_timings_text(rounds)}", "cached", cached)
    try:
        timings: dict[str, list[float]] = {v: _rounds(t) for v, t in calibrate(candidates).items()}
        chosen = pick_from_timings(timings)
    except Exception as exc:  # a calibration must never stop a run: the safe variant instead
        return PrecisionChoice(policy, f"calibration failed ({type(exc).__name__}: {exc})", "calibration failed")
    entry = {
        "variant": chosen,
        "precision": split_variant(chosen)[0],
        "candidates": list(candidates),
        "ms_per_step": {v: round(_median(t), 2) for v, t in timings.items()},
        "rounds_ms": timings,
        "measured": now().isoformat(timespec="seconds"),
        "key": key,
    }
    saved = write_cache(cache_file, key, entry) if cache_file else False
    reason = f"calibrated: {_timings_text(timings)}" + ("" if saved else " (not cached)")
    return _choice(chosen, reason, "calibrated", entry)


def _cached_timings(entry: Any, candidates: Sequence[str]) -> dict[str, list[float]] | None:
    """A cache entry's rounds, the plain variant first again (the file's keys are sorted); None when the entry was
    timed among other candidates (another requested precision, or before a variant existed), keeps no rounds (an
    older entry, chosen without the noise rule) or is damaged."""
    if not isinstance(entry, dict) or entry.get("candidates") != list(candidates):
        return None
    if entry.get("variant") not in candidates:
        return None
    try:
        timings = {v: _rounds(entry["rounds_ms"][v]) for v in candidates}
    except (KeyError, TypeError, ValueError):
        return None
    return timings if all(timings.values()) else None


def _choice(variant: str, reason: str, source: str, entry: dict[str, Any]) -> PrecisionChoice:
    policy, dropout = split_variant(variant)
    return PrecisionChoice(policy, reason, source, entry, dropout)


def jit_compile(kind: str) -> bool | None:
    """XLA for Keras' compile: None leaves Keras' own default.

    CPU: off. Measured on the AVX2 EPYC 0.24x the examples/s without oneDNN and 0.57x with it (interleaved epochs,
    batch 1024): XLA's CPU convolutions are slower than TensorFlow's kernels. GPU: Keras 3 compiles with XLA by
    default (jit_compile="auto"), tf_keras does not; kept as they are, unmeasured here. TPU: always compiled by XLA."""
    return False if kind == "cpu" else None


def steps_per_execution(kind: str, steps_per_epoch: int) -> int:
    """TPU: each host->device round trip costs far more than an MNIST step, so run many steps per call (Cloud TPU
    performance guide). CPU: 1; on the AVX2 EPYC 4 measured 0.92x and 8 0.98x of 1 (interleaved epochs, within
    noise), as Keras' per-step overhead is small next to a CPU step. GPU: 1, unmeasured here; `runner bench
    --steps-per-execution` measures it on one."""
    return max(1, min(steps_per_epoch, 50)) if kind == "tpu" else 1


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
            parts.append(f"CPU flags {CPU_FLAGS_ENV}={self.cpu_flags_override!r}")
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
    cache_file: Path | None = None,
    environ: Mapping[str, str] | None = None,
    input_shape: Sequence[int] = (28, 28, 1),
    classes: int = 10,
) -> PerfPlan:
    """The run's choices. With `model` and `batch_size` (and `tf`), a CPU times the variants it has a choice
    between for them (cpu_candidates, time_variants; cached in the data cache); call it before building the run's
    model, as the calibration clears Keras' session. `calibrate` and `cache_file` replace those in tests."""
    environ = os.environ if environ is None else environ
    text = read_cpuinfo() if cpuinfo is None else cpuinfo
    forced = environ.get(CPU_FLAGS_ENV) or None
    flags = override_flags(cpu_flags(text), forced)
    capability = gpu_capability(tf) if tf is not None and kind == "gpu" else None
    jit = jit_compile(kind) if requested_jit is None else requested_jit
    cpu = cpu_model(text)
    # The fused kernel replaces Keras 3's Dropout.call; with XLA for the whole model, XLA fuses dropout anyway.
    keras3 = tf is None or str(getattr(getattr(tf, "keras", None), "__version__", "")).startswith("3")
    fusable = kind == "cpu" and jit is False and keras3 and model in DROPOUT_MODELS
    key = ""
    if calibrate is None and tf is not None and model and batch_size:
        key = calibration_key(tf, model, batch_size, cpu, jit, input_shape)
        calibrate = functools.partial(
            time_variants, tf, model, batch_size, jit_compile=jit, input_shape=input_shape, classes=classes
        )
        cache_file = cache_file or default_cache_file()
    elif calibrate is not None:
        key = f"{cpu} | {model} | batch {batch_size}"
    choice = choose_precision(
        kind,
        flags,
        capability,
        requested_precision,
        fusable=fusable,
        calibrate=calibrate,
        cache_file=cache_file,
        key=key,
    )
    return PerfPlan(
        kind=kind,
        precision=choice.policy,
        jit_compile=jit,
        steps_per_execution=requested_steps or steps_per_execution(kind, steps_per_epoch),
        cpu=cpu,
        native_bf16=has_native_bf16(flags),
        env=dict(env or {}),
        threads=dict(threads or {}),
        precision_reason=choice.reason,
        precision_source=choice.source,
        calibration=choice.calibration,
        cpu_flags_override=forced,
        dropout=choice.dropout,
    )


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
