"""The CPU calibration: the variants a CPU has a choice between (precision policy, dropout kernel) timed on the run's
model at the run's batch, the rule that picks one, and the start-up cache that keeps the pick for the next run.

The choices were measured with epochs interleaved in lock-step between processes (the machines are shared, so
only ratios measured side by side mean anything), on two CPU families: a 2-core AMD EPYC with AVX2/FMA and no
AVX512 ("AVX2 EPYC"), and a 2-core AMD EPYC Zen 4 with AVX512-BF16 and no AMX ("Zen 4"). docs/bench.md has the
commands. The TensorFlow plan (perf.py) calls this; nothing here imports TensorFlow at module level.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner.train import startcache
from runner.train.cpu import has_native_bf16

# How much faster per step bfloat16 must be before auto picks it over float32. Repeated calibrations of one model
# and batch on the shared 2-core Zen 4 differed by up to 0.15x (1.12x and 1.27x at batch 256; 1.30x, 1.30x, 1.31x
# and once 1.79x at 1024); float32 is the numerically safer policy, so a gain inside that noise buys no switch.
BF16_MUST_WIN = 1.10
ROUNDS = 5
# Part of every cache key: a change to how variants are timed or picked makes every entry again.
METHOD = f"rounds {ROUNDS}, ABBA, a variant dropped once it cannot clear the plain one; must win {BF16_MUST_WIN}x"
CACHE_KIND = "calibration"
# A variant's name: its precision policy, with this suffix when its dropout layers draw their masks in one XLA kernel
# (fused_dropout.py) instead of Keras' own dropout.
FUSED = "+xla_dropout"

Timings = Mapping[str, "float | Sequence[float]"]  # ms per step of each variant: one figure, or every round's
Calibrator = Callable[[Sequence[str]], Timings]


def cpu_candidates(flags: frozenset[str], requested: str = "auto", fusable: bool = False) -> tuple[str, ...]:
    """The variants worth timing on a CPU with these flags, the plain one first (the one kept unless another wins).

    Precision: float32 and, with native bfloat16, mixed_bfloat16. Without native bfloat16 only float32:
    mixed_bfloat16 measured 0.21x its examples/s on the AVX2 EPYC (14 interleaved epoch pairs; the conversions cost
    more than the narrower math saves), so that table entry stands. A requested precision is the only one.
    Native bfloat16 is no proof of a gain either, and the gain depends on model and batch: on the Zen 4
    (TensorFlow 2.20 with oneDNN) our trainer with mixed_bfloat16 measured 1.21x the examples/s of float32 at batch
    1024 (8 interleaved epoch pairs, 1.03x-1.84x), while the calibration's steps measured 1.30x at batch 1024,
    1.12x-1.27x at 256 and 1.02x at 64. So only a calibration picks it.
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


def _rounds(value: float | Sequence[float]) -> list[float]:
    return [float(value)] if isinstance(value, int | float) else [float(v) for v in value]


def _median(value: float | Sequence[float]) -> float:
    return statistics.median(_rounds(value))


def clear_of(rounds: float | Sequence[float], plain: float | Sequence[float]) -> bool:
    """Whether every round of a variant was faster than every round of the plain one: a gain the timing can tell
    from its own noise. A single figure (no rounds to compare) counts as clear. Once a variant is not clear, more
    rounds of either side cannot make it clear again (the calibration stops timing it then)."""
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


def timings_text(ms_per_step: Timings) -> str:
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
    source: str  # requested | table | calibrated | cached | deferred | uncalibrated | calibration failed
    calibration: dict[str, Any] | None = None  # the cache entry behind a calibrated or cached choice
    dropout: str = "keras"  # keras | xla (fused_dropout.py)


def time_variants(
    tf: Any,
    model: str,
    batch_size: int,
    variants: Sequence[str],
    *,
    jit_compile: bool | None = None,
    rounds: int = ROUNDS,
    round_s: float = 0.25,
    input_shape: Sequence[int] = (28, 28, 1),
    classes: int = 10,
) -> dict[str, list[float]]:
    """Milliseconds per training step of each variant, one figure per round: the run's model at the run's batch on
    random data, each compiled and warmed up first, then up to `rounds` rounds taking turns (ABBA), each about
    `round_s` long; every round's figure is returned, so that a choice can tell a gain from the noise between
    rounds. A variant whose rounds already overlap the plain one's can no longer be picked (clear_of): it is not
    timed again, and the rounds end when only the plain one is left. On the Zen 4 this costs 4-6 s for two variants
    and 7-12 s for four (mnist_cnn, batch 64 to 1024), once per cache key. Keras' state is cleared afterwards, so
    the run's own model gets the layer names it would have had without the calibration."""
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

        def one_round(variant: str) -> float:
            t0 = time.perf_counter()
            for _ in range(steps):
                models[variant].train_on_batch(x, y)  # returns numpy values: the step has finished
            return (time.perf_counter() - t0) / steps * 1e3

        return take_turns(variants, one_round, rounds)
    finally:
        models.clear()
        keras.backend.clear_session()
        keras.mixed_precision.set_global_policy(before)


def take_turns(
    variants: Sequence[str], one_round: Callable[[str], float], rounds: int = ROUNDS
) -> dict[str, list[float]]:
    """Each variant's ms per step, a figure per round, the variants taking turns (ABBA) for up to `rounds` rounds.
    A variant that can no longer be picked (not clear_of the plain one, the first) is not timed again, and the
    rounds end when only the plain one is left: what pick_from_timings would pick from all the rounds, for less."""
    samples: dict[str, list[float]] = {v: [] for v in variants}
    plain, timed = variants[0], list(variants)
    for r in range(rounds):
        for variant in timed if r % 2 == 0 else reversed(timed):
            samples[variant].append(one_round(variant))
        timed = [v for v in timed if v == plain or clear_of(samples[v], samples[plain])]
        if timed == [plain]:
            break
    return {v: [round(t, 2) for t in samples[v]] for v in variants}


def model_digest(tf: Any, model: str, input_shape: Sequence[int], classes: int) -> str:
    """What the model is, in a few characters: its layers' configuration without their names (which count up with
    every model a process builds), or where a layer cannot say, its layers' types and parameter counts. A built-in
    model changed by a new runner, or a model of yours changed by its code, is another cache key."""
    from runner.train.models import build_model

    keras = tf.keras
    try:
        built = build_model(model, keras, tuple(input_shape), classes)
        try:
            described: Any = _nameless(built.get_config())
        except Exception:  # a layer of user code without get_config
            described = [[type(layer).__qualname__, layer.count_params()] for layer in built.layers]
        text = json.dumps(described, sort_keys=True, default=str)
    finally:
        keras.backend.clear_session()
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _nameless(config: Any) -> Any:
    if isinstance(config, dict):
        return {k: _nameless(v) for k, v in config.items() if k != "name"}
    if isinstance(config, list | tuple):
        return [_nameless(v) for v in config]
    return config


def calibrated_choice(
    candidates: Sequence[str],
    calibrate: Calibrator,
    key: startcache.Key,
    *,
    root: Path | None = None,
    now: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.timezone.utc),
    defer: bool = False,
) -> PrecisionChoice:
    """The variant a calibration picks among `candidates` (the plain one first): from the start-up cache when an
    entry for `key` (what the timing depends on) and these candidates is there, else timed now and stored. A failed
    timing keeps the plain variant; an entry that cannot be stored is said in the reason. `defer`: without a cache
    entry, the plain variant for now (source "deferred"), for a trainer that starts at once and calibrates later."""
    full = {**key, "candidates": list(candidates), "method": METHOD}
    cached = startcache.read(CACHE_KIND, full, root)
    rounds = _cached_timings(cached, candidates)
    if rounds is not None and cached is not None:
        when = str(cached.get("measured", "?"))[:10]
        return _choice(cached["variant"], f"cached from {when}: {timings_text(rounds)}", "cached", cached)
    if defer:
        policy, dropout = split_variant(candidates[0])
        reason = f"not calibrated yet: {len(candidates)} variants to time"
        return PrecisionChoice(policy, reason, "deferred", None, dropout)
    try:
        timings: dict[str, list[float]] = {v: _rounds(t) for v, t in calibrate(candidates).items()}
        chosen = pick_from_timings(timings)
    except Exception as exc:  # a calibration must never stop a run: the safe variant instead
        policy = split_variant(candidates[0])[0]
        return PrecisionChoice(policy, f"calibration failed ({type(exc).__name__}: {exc})", "calibration failed")
    entry = {
        "variant": chosen,
        "precision": split_variant(chosen)[0],
        "candidates": list(candidates),
        "ms_per_step": {v: round(_median(t), 2) for v, t in timings.items()},
        "rounds_ms": timings,
        "measured": now().isoformat(timespec="seconds"),
    }
    saved = startcache.write(CACHE_KIND, full, entry, root)
    reason = f"calibrated: {timings_text(timings)}" + ("" if saved else " (not cached)")
    return _choice(chosen, reason, "calibrated", entry)


def _cached_timings(entry: dict[str, Any] | None, candidates: Sequence[str]) -> dict[str, list[float]] | None:
    """A cache entry's rounds, the plain variant first again (the file's keys are sorted); None when the entry is
    damaged or keeps no rounds."""
    if entry is None or entry.get("candidates") != list(candidates) or entry.get("variant") not in candidates:
        return None
    try:
        timings = {v: _rounds(entry["rounds_ms"][v]) for v in candidates}
    except (KeyError, TypeError, ValueError):
        return None
    return timings if all(timings.values()) else None


def _choice(variant: str, reason: str, source: str, entry: dict[str, Any]) -> PrecisionChoice:
    policy, dropout = split_variant(variant)
    return PrecisionChoice(policy, reason, source, entry, dropout)
