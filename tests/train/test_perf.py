"""The trainers' speed choices (cpu.py, choices.py, calibration.py, perf.py): what each decides from the machine it
is shown, on every CPU family, with the CPU's text and its timings given: nothing here pins this machine's flags
or asserts on wall time.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path

import pytest

from runner.train import calibration, choices, cpu, perf, startcache
from tests.environ import child_env

EPYC_AVX2 = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7B13
flags\t\t: fpu vme de pse tsc msr sse sse2 ssse3 fma sse4_1 sse4_2 avx f16c avx2 bmi2 sha_ni

processor\t: 1
flags\t\t: fpu avx2
"""
SAPPHIRE_RAPIDS = """processor\t: 0
model name\t: Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz
flags\t\t: fpu sse2 avx2 avx512f avx512_vnni avx512_bf16 amx_bf16 amx_tile amx_int8
"""
COOPER_LAKE = "flags\t: avx2 avx512f avx512_bf16\n"
ZEN4 = "model name\t: AMD EPYC\nflags\t\t: avx2 avx512f avx512_vnni avx512_bf16\n"  # AVX512-BF16, no AMX
GRAVITON3 = "processor\t: 0\nBogoMIPS\t: 2100.00\nFeatures\t: fp asimd evtstrm aes sve bf16 i8mm\nCPU part\t: 0xd40\n"
GRAVITON2 = "processor\t: 0\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics\n"


# -- CPU features and the precision policy ---------------------------------------------------------------------------


def test_cpu_flags_come_from_the_first_cpu() -> None:
    flags = cpu.cpu_flags(EPYC_AVX2)
    assert {"avx2", "fma", "sha_ni"} <= flags and "avx512f" not in flags
    assert cpu.cpu_model(EPYC_AVX2) == "AMD EPYC 7B13"
    assert cpu.cpu_flags("") == frozenset()


@pytest.mark.parametrize(
    ("cpuinfo", "native"),
    [(EPYC_AVX2, False), (SAPPHIRE_RAPIDS, True), (COOPER_LAKE, True), (GRAVITON3, True), (GRAVITON2, False)],
)
def test_native_bf16_is_detected_from_cpuinfo(cpuinfo: str, native: bool) -> None:
    assert cpu.has_native_bf16(cpu.cpu_flags(cpuinfo)) is native


@pytest.mark.parametrize(
    ("kind", "cpuinfo", "capability", "policy"),
    [
        ("tpu", "", None, "mixed_bfloat16"),
        ("gpu", "", (3, 7), "float32"),  # the notebook's K80: no tensor cores
        ("gpu", "", (6, 0), "float32"),
        ("gpu", "", (7, 0), "mixed_float16"),
        ("gpu", "", (9, 0), "mixed_float16"),
        ("gpu", "", None, "float32"),
        ("cpu", EPYC_AVX2, None, "float32"),  # emulated bf16 measured 0.21x
        ("cpu", SAPPHIRE_RAPIDS, None, "float32"),  # native bf16 is no proof of a gain: only a calibration picks it
        ("cpu", GRAVITON3, None, "float32"),
    ],
)
def test_precision_policy_per_device(kind: str, cpuinfo: str, capability: tuple[int, int] | None, policy: str) -> None:
    assert perf.choose_precision(kind, cpu.cpu_flags(cpuinfo), capability).policy == policy


@pytest.mark.parametrize(
    ("spec", "flags"),
    [
        (None, {"avx2", "avx512_bf16", "amx_bf16"}),
        ("", {"avx2", "avx512_bf16", "amx_bf16"}),
        ("-avx512_bf16,-amx_bf16", {"avx2"}),
        ("+fma -amx_bf16", {"avx2", "avx512_bf16", "fma"}),
        ("avx2,fma", {"avx2", "fma"}),  # no signs: a replacement
        ("none", set()),
        ("none,+bf16", {"bf16"}),
    ],
)
def test_cpu_flags_can_be_forced(spec: str | None, flags: set[str]) -> None:
    assert cpu.override_flags(frozenset({"avx2", "avx512_bf16", "amx_bf16"}), spec) == flags


def test_a_malformed_flag_override_is_an_error() -> None:
    with pytest.raises(ValueError, match="RUNNER_CPU_FLAGS"):
        perf.plan_for("cpu", 58, cpuinfo=ZEN4, environ={cpu.CPU_FLAGS_ENV: "+avx2,-"})


NO_BF16 = "-avx512_bf16,-amx_bf16,-bf16"
BF16_WINS = {"float32": 100.0, "mixed_bfloat16": 40.0}  # what AMX might do: 2.5x
BF16_INSIDE_NOISE = {"float32": 100.0, "mixed_bfloat16": 95.0}  # 1.05x
BF16_EMULATED = {"float32": 100.0, "mixed_bfloat16": 476.0}  # 0.21x, as measured on the AVX2 EPYC


@pytest.mark.parametrize(
    ("cpuinfo", "forced", "timings", "policy", "source"),
    [
        (EPYC_AVX2, None, None, "float32", "table"),  # no real choice: nothing is timed
        (EPYC_AVX2, "+avx512_bf16", BF16_EMULATED, "float32", "calibrated"),
        (ZEN4, None, BF16_INSIDE_NOISE, "float32", "calibrated"),
        (ZEN4, None, BF16_WINS, "mixed_bfloat16", "calibrated"),
        (ZEN4, NO_BF16, None, "float32", "table"),
        (SAPPHIRE_RAPIDS, None, BF16_WINS, "mixed_bfloat16", "calibrated"),
        (SAPPHIRE_RAPIDS, "-amx_bf16", BF16_INSIDE_NOISE, "float32", "calibrated"),  # still AVX512-BF16
        (SAPPHIRE_RAPIDS, NO_BF16, None, "float32", "table"),
        (GRAVITON3, None, {"float32": 110.0, "mixed_bfloat16": 100.0}, "mixed_bfloat16", "calibrated"),  # 1.10x
        (GRAVITON2, "+bf16", BF16_WINS, "mixed_bfloat16", "calibrated"),
        ("", None, None, "float32", "table"),  # no /proc/cpuinfo: nothing assumed
        ("", "avx512_bf16", BF16_INSIDE_NOISE, "float32", "calibrated"),
    ],
)
def test_cpu_precision_is_measured_where_there_is_a_choice(
    cpuinfo: str,
    forced: str | None,
    timings: dict[str, float] | None,
    policy: str,
    source: str,
    tmp_path: Path,
) -> None:
    timed: list[tuple[str, ...]] = []

    def calibrate(policies: Sequence[str]) -> dict[str, float]:
        timed.append(tuple(policies))
        assert timings is not None, "timed a CPU without native bfloat16"
        return timings

    environ = {cpu.CPU_FLAGS_ENV: forced} if forced else {}
    plan = perf.plan_for("cpu", 58, cpuinfo=cpuinfo, environ=environ, calibrate=calibrate, cache_root=tmp_path)
    assert (plan.precision, plan.precision_source) == (policy, source)
    assert plan.native_bf16 is (timings is not None)
    assert timed == ([("float32", "mixed_bfloat16")] if timings else [])
    assert plan.cpu_flags_override == forced
    if timings:
        assert plan.calibration is not None and plan.calibration["ms_per_step"] == timings
        assert plan.precision == calibration.pick_from_timings(timings)


@pytest.mark.parametrize("forced", ["+avx512_bf16", NO_BF16])
def test_this_machine_with_bfloat16_forced_each_way(forced: str, tmp_path: Path) -> None:
    """The real /proc/cpuinfo of whatever machine runs the tests, its bfloat16 forced on and off."""
    plan = perf.plan_for(
        "cpu",
        58,
        environ={cpu.CPU_FLAGS_ENV: forced},
        calibrate=lambda policies: BF16_WINS,
        cache_root=tmp_path,
    )
    native = forced.startswith("+")
    assert plan.native_bf16 is native
    assert plan.precision == ("mixed_bfloat16" if native else "float32")
    assert f"{cpu.CPU_FLAGS_ENV}={forced!r}" in plan.describe()


def test_native_bfloat16_without_a_model_to_time_stays_float32() -> None:
    plan = perf.plan_for("cpu", 58, cpuinfo=ZEN4, environ={})
    assert (plan.precision, plan.precision_source) == ("float32", "uncalibrated")
    assert "not calibrated" in plan.describe()


def test_a_calibration_is_cached_and_says_when(tmp_path: Path) -> None:
    timed: list[Sequence[str]] = []

    def calibrate(policies: Sequence[str]) -> dict[str, float]:
        timed.append(policies)
        return {"float32": 120.0, "mixed_bfloat16": 60.0}

    when = datetime.datetime(2026, 12, 3, 4, 5, tzinfo=datetime.timezone.utc)
    flags = cpu.cpu_flags(ZEN4)
    candidates = calibration.cpu_candidates(flags)
    key = {"cpu": "zen4", "model": "mnist_cnn", "batch": 1024}

    def choose(key: dict[str, object]) -> calibration.PrecisionChoice:
        return calibration.calibrated_choice(candidates, calibrate, key, root=tmp_path, now=lambda: when)

    first = choose(key)
    assert (first.policy, first.source) == ("mixed_bfloat16", "calibrated")
    assert "float32 120.0 ms/step, mixed_bfloat16 60.0 ms/step (2.00x)" in first.reason
    again = choose(key)
    assert (again.policy, again.source) == ("mixed_bfloat16", "cached")
    assert again.reason.startswith("cached from 2026-12-03: float32 120.0 ms/step")
    assert len(timed) == 1
    choose({**key, "batch": 512})
    assert len(timed) == 2  # another batch is another calibration
    entries = sorted((tmp_path / calibration.CACHE_KIND).iterdir())
    assert len(entries) == 2 and not [p for p in tmp_path.rglob("*.tmp")]  # one file per key, no temp left over
    assert {json.loads(p.read_text())["key"]["batch"] for p in entries} == {1024, 512}
    for damage in ("{not json", "[]", json.dumps({"key": {"other": 1}, "value": {}})):
        for path in entries:
            path.write_text(damage)  # unreadable, or another key's: measured again and written over, not fatal
        assert choose(key).source == "calibrated" and choose(key).source == "cached"
    assert len(timed) == 5


def test_a_deferred_calibration_starts_plain_and_a_later_start_reads_the_pick(tmp_path: Path) -> None:
    """The built-in trainer on one process defers: without a cached pick it starts in the plain variant at once,
    plans again without defer after its first epoch (timed and cached then), and the next start takes the pick."""
    timed: list[Sequence[str]] = []

    def calibrate(policies: Sequence[str]) -> dict[str, float]:
        timed.append(policies)
        return {"float32": 120.0, "mixed_bfloat16": 60.0}

    def plan(defer: bool) -> perf.PerfPlan:
        return perf.plan_for(
            "cpu",
            58,
            cpuinfo=ZEN4,
            environ={},
            calibrate=calibrate,
            cache_root=tmp_path,
            model="m",
            batch_size=64,
            defer=defer,
        )

    first = plan(defer=True)
    assert (first.precision, first.precision_source, first.calibration, timed) == ("float32", "deferred", None, [])
    assert "float32 (not calibrated yet: 2 variants to time)" in first.describe()
    assert not (tmp_path / calibration.CACHE_KIND).exists()
    later = plan(defer=False)
    assert (later.precision, later.precision_source, len(timed)) == ("mixed_bfloat16", "calibrated", 1)
    again = plan(defer=True)
    assert (again.precision, again.precision_source, len(timed)) == ("mixed_bfloat16", "cached", 1)


def test_any_part_of_the_key_is_another_calibration(tmp_path: Path) -> None:
    """What a calibration depends on (perf.calibration_key: CPU, flags, builds, model, shapes, batch) is its key:
    a change to any part measures again, the same key is read back."""
    timed: list[Sequence[str]] = []

    def calibrate(policies: Sequence[str]) -> dict[str, float]:
        timed.append(policies)
        return BF16_WINS

    candidates = calibration.cpu_candidates(cpu.cpu_flags(ZEN4))
    key = {"cpu": "AMD EPYC", "cpu_flags": "0123", "cpus": 2, "tensorflow": "2.20.0", "model_digest": "ab", "batch": 64}
    calibration.calibrated_choice(candidates, calibrate, key, root=tmp_path)
    for part, other in (("cpu_flags", "4567"), ("cpus", 4), ("tensorflow", "2.21.0"), ("model_digest", "cd")):
        assert calibration.calibrated_choice(candidates, calibrate, {**key, part: other}, root=tmp_path).source == (
            "calibrated"
        )
    assert len(timed) == 5
    assert calibration.calibrated_choice(candidates, calibrate, dict(key), root=tmp_path).source == "cached"
    assert len(timed) == 5


def test_this_machines_calibration_key_follows_its_cpu_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    """The key of this machine's CPU changes when the flags the choices see change ($RUNNER_CPU_FLAGS), whatever
    flags the machine has: another feature set is another calibration."""
    seen = {cpu.detect(environ={cpu.CPU_FLAGS_ENV: forced}).flags_digest() for forced in ("+avx512_bf16", "none")}
    assert len(seen) == 2
    assert cpu.detect(environ={}).flags_digest() == cpu.detect(environ={}).flags_digest()


def test_a_failed_or_unsaved_calibration_does_not_stop_the_run(tmp_path: Path) -> None:
    def broken(policies: Sequence[str]) -> dict[str, float]:
        raise RuntimeError("oneDNN said no")

    flags = cpu.cpu_flags(ZEN4)
    failed = perf.choose_precision("cpu", flags, calibrate=broken, cache_root=tmp_path, key={"k": 1})
    assert (failed.policy, failed.source) == ("float32", "calibration failed")
    assert "oneDNN said no" in failed.reason
    blocked = tmp_path / "file"
    blocked.write_text("")  # a file where the cache directory should be: not writable
    unsaved = perf.choose_precision("cpu", flags, calibrate=lambda p: BF16_WINS, cache_root=blocked, key={"k": 1})
    assert unsaved.source == "calibrated" and unsaved.reason.endswith("(not cached)")


F = calibration.FUSED


def _fused_wins(variants: Sequence[str]) -> dict[str, float]:
    """ms/step where the fused dropout kernel is 1.4x Keras' and bfloat16 1.2x float32 (about the Zen 4's)."""
    return {v: 100.0 / (1.4 if v.endswith(F) else 1.0) / (1.2 if "bfloat16" in v else 1.0) for v in variants}


@pytest.mark.parametrize(
    ("kind", "cpuinfo", "model", "requested", "jit", "timed"),
    [
        ("cpu", EPYC_AVX2, "mnist_cnn", "auto", None, ("float32", "float32" + F)),  # timed on every CPU
        ("cpu", ZEN4, "mnist_cnn", "auto", None, ("float32", "mixed_bfloat16", "float32" + F, "mixed_bfloat16" + F)),
        ("cpu", ZEN4, "mnist_mlp", "auto", None, ("float32", "mixed_bfloat16")),  # no dropout layer
        ("cpu", EPYC_AVX2, "mnist_mlp", "auto", None, ()),  # nothing to choose: nothing timed
        ("cpu", ZEN4, "mnist_cnn", "mixed_bfloat16", None, ("mixed_bfloat16", "mixed_bfloat16" + F)),
        ("cpu", EPYC_AVX2, "mnist_cnn", "float32", None, ("float32", "float32" + F)),
        ("cpu", ZEN4, "mnist_cnn", "auto", True, ("float32", "mixed_bfloat16")),  # XLA fuses the whole model anyway
        ("gpu", ZEN4, "mnist_cnn", "auto", None, ()),
        ("tpu", ZEN4, "mnist_cnn", "auto", None, ()),
    ],
)
def test_the_dropout_kernel_is_timed_where_the_model_has_dropout(
    kind: str, cpuinfo: str, model: str, requested: str, jit: bool | None, timed: tuple[str, ...], tmp_path: Path
) -> None:
    seen: list[tuple[str, ...]] = []

    def calibrate(variants: Sequence[str]) -> dict[str, float]:
        seen.append(tuple(variants))
        return _fused_wins(variants)

    plan = perf.plan_for(
        kind, 58, cpuinfo=cpuinfo, environ={}, model=model, batch_size=1024, requested_precision=requested,
        requested_jit=jit, calibrate=calibrate, cache_root=tmp_path,
    )  # fmt: skip
    assert seen == ([timed] if timed else [])
    if timed:
        picked = calibration.pick_from_timings(_fused_wins(timed))
        assert (plan.precision, plan.dropout) == calibration.split_variant(picked)
        assert plan.calibration is not None and plan.calibration["candidates"] == list(timed)
        assert ("dropout fused by XLA" in plan.describe()) is (plan.dropout == "xla")
    else:
        assert plan.dropout == "keras" and "dropout fused" not in plan.describe()
    assert plan.as_dict()["dropout"] == plan.dropout  # summary.json's "perf" says which kernel ran


@pytest.mark.parametrize(
    ("timings", "chosen"),
    [
        ({"float32": 100.0, "float32" + F: 95.0}, "float32"),  # 1.05x: inside the noise, the plain variant stays
        ({"float32": 100.0, "float32" + F: 80.0, "mixed_bfloat16": 85.0}, "float32" + F),
        ({"mixed_bfloat16": 100.0, "mixed_bfloat16" + F: 60.0}, "mixed_bfloat16" + F),  # a requested precision
        ({"mixed_bfloat16": 100.0, "mixed_bfloat16" + F: 95.0}, "mixed_bfloat16"),
    ],
)
def test_the_first_variant_stays_unless_another_wins_clearly(timings: dict[str, float], chosen: str) -> None:
    assert calibration.pick_from_timings(timings) == chosen


@pytest.mark.parametrize(
    ("rounds", "chosen", "said"),
    [
        # The AMX Xeon under load: a 1.44x median whose rounds overlap float32's is noise, and float32 stays.
        ({"float32": [100.0, 300.0, 120.0], "mixed_bfloat16": [60.0, 70.0, 250.0]}, "float32", "inside the noise"),
        ({"float32": [100.0, 104.0, 98.0], "mixed_bfloat16": [60.0, 62.0, 66.0]}, "mixed_bfloat16", "(1.61x)"),
        ({"float32": [100.0, 104.0], "mixed_bfloat16": [99.0, 97.0]}, "float32", "(1.04x)"),  # clear, but too small
    ],
)
def test_a_gain_inside_the_rounds_spread_keeps_the_plain_variant(
    rounds: dict[str, list[float]], chosen: str, said: str, tmp_path: Path
) -> None:
    assert calibration.pick_from_timings(rounds) == chosen
    choice = perf.choose_precision(
        "cpu", cpu.cpu_flags(ZEN4), calibrate=lambda variants: rounds, cache_root=tmp_path, key={"k": 1}
    )
    assert (choice.policy, choice.source) == (chosen, "calibrated")
    assert said in choice.reason and "clear of the noise" in choice.reason
    assert choice.calibration is not None and choice.calibration["rounds_ms"] == rounds
    again = perf.choose_precision("cpu", cpu.cpu_flags(ZEN4), calibrate=lambda v: {}, cache_root=tmp_path, key={"k": 1})
    assert (again.policy, again.source) == (chosen, "cached")


def _stored(key: dict[str, object], candidates: Sequence[str]) -> dict[str, object]:
    """The key calibrated_choice stores an entry of `key` and `candidates` under."""
    return {**key, "candidates": list(candidates), "method": calibration.METHOD}


def test_a_cached_choice_without_rounds_or_damaged_is_measured_again(tmp_path: Path) -> None:
    """An entry that keeps no rounds (medians only: it may hold a choice made inside the noise), or whose rounds are
    not numbers, is not trusted: the variants are timed again and the entry written over."""
    key, candidates = {"k": 1}, ("float32", "mixed_bfloat16")
    timed: list[Sequence[str]] = []

    def calibrate(variants: Sequence[str]) -> dict[str, list[float]]:
        timed.append(variants)
        return {"float32": [100.0, 101.0], "mixed_bfloat16": [99.0, 100.0]}

    for entry in (
        {"variant": "mixed_bfloat16", "candidates": list(candidates), "ms_per_step": BF16_WINS},
        {"variant": "mixed_bfloat16", "candidates": list(candidates), "rounds_ms": {"float32": "fast"}},
    ):
        assert startcache.write(calibration.CACHE_KIND, _stored(key, candidates), entry, tmp_path)
        choice = perf.choose_precision("cpu", cpu.cpu_flags(ZEN4), calibrate=calibrate, cache_root=tmp_path, key=key)
        assert (choice.policy, choice.source) == ("float32", "calibrated")
    assert len(timed) == 2
    again = perf.choose_precision("cpu", cpu.cpu_flags(ZEN4), calibrate=calibrate, cache_root=tmp_path, key=key)
    assert again.source == "cached" and len(timed) == 2


def test_every_worker_takes_the_chiefs_choices() -> None:
    """Two processes of one run, as threads summing through a barrier (agreement.broadcast's collective): the
    chief's calibrated choice and the other worker's own, different one; both end with the chief's."""
    import threading

    from runner.train import agreement

    chief_plan = perf.PerfPlan("cpu", "mixed_bfloat16", False, 1, dropout="xla", precision_source="calibrated")
    other_plan = perf.PerfPlan("cpu", "float32", False, 1, precision_source="table")
    posted: list[list[int]] = []
    barrier = threading.Barrier(2)

    def reduce_sum(values: list[int]) -> list[int]:
        posted.append(values)
        barrier.wait()
        return [sum(column) for column in zip(*posted, strict=True)]

    results: dict[bool, perf.PerfPlan] = {}

    def worker(plan: perf.PerfPlan, chief: bool) -> None:
        chosen = agreement.broadcast(choices.run_choices(plan), reduce_sum, chief)
        results[chief] = plan if chief else choices.adopt_choices(plan, chosen)

    threads = [threading.Thread(target=worker, args=a) for a in ((chief_plan, True), (other_plan, False))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert results[True] == chief_plan
    assert (results[False].precision, results[False].dropout) == ("mixed_bfloat16", "xla")
    assert results[False].precision_source == "worker 0"
    assert choices.run_choices(results[False]) == choices.run_choices(chief_plan)


def test_a_calibration_of_other_candidates_is_another_entry(tmp_path: Path) -> None:
    flags = cpu.cpu_flags(ZEN4)
    kwargs = {"fusable": True, "calibrate": _fused_wins, "cache_root": tmp_path, "key": {"k": 1}}
    first = perf.choose_precision("cpu", flags, **kwargs)  # type: ignore[arg-type]
    assert (first.policy, first.dropout, first.source) == ("mixed_bfloat16", "xla", "calibrated")
    again = perf.choose_precision("cpu", flags, **kwargs)  # type: ignore[arg-type]
    assert (again.policy, again.dropout, again.source) == ("mixed_bfloat16", "xla", "cached")
    asked = perf.choose_precision("cpu", flags, requested="float32", **kwargs)  # type: ignore[arg-type]
    assert (asked.policy, asked.dropout, asked.source) == ("float32", "xla", "calibrated")  # other candidates
    assert perf.choose_precision("cpu", flags, requested="float32", **kwargs).source == "cached"  # type: ignore[arg-type]
    assert len(list((tmp_path / calibration.CACHE_KIND).iterdir())) == 2


def test_precision_can_be_forced_but_not_misspelt() -> None:
    assert perf.choose_precision("tpu", frozenset(), requested="float32").policy == "float32"
    assert perf.choose_precision("cpu", frozenset(), requested="mixed_bfloat16").policy == "mixed_bfloat16"
    requested = choices.TableChoice("float32", "requested", "requested")
    assert choices.device_precision("gpu", (8, 0), "float32") == requested
    for kind in ("cpu", "gpu", "tpu"):
        with pytest.raises(ValueError, match="mixed_float16"):
            perf.choose_precision(kind, frozenset(), requested="fp16")


def test_xla_and_steps_per_execution_per_device() -> None:
    assert perf.jit_compile("cpu") is False
    assert perf.jit_compile("gpu") is None and perf.jit_compile("tpu") is None  # Keras' own default
    assert choices.steps_per_execution("cpu", 58) == 1
    assert choices.steps_per_execution("tpu", 58) == 50
    assert choices.steps_per_execution("tpu", 7) == 7


def test_plan_records_the_choices_and_why() -> None:
    plan = perf.plan_for("cpu", 58, cpuinfo=EPYC_AVX2, env={"TF_ENABLE_ONEDNN_OPTS": "1"}, environ={})
    assert (plan.precision, plan.jit_compile, plan.steps_per_execution) == ("float32", False, 1)
    assert plan.cpu == "AMD EPYC 7B13" and not plan.native_bf16
    assert plan.describe().startswith("float32 (no native bfloat16; emulated measured 0.21x on the AVX2 EPYC), ")
    assert "oneDNN" in plan.describe()
    recorded = json.loads(json.dumps(plan.as_dict()))  # summary.json's "perf"
    assert recorded["precision"] == "float32" and recorded["precision_source"] == "table"
    assert recorded["dropout"] == "keras"  # no model given: nothing to fuse
    assert recorded["precision_reason"] and recorded["calibration"] is None
    assert perf.plan_for("cpu", 58, cpuinfo=SAPPHIRE_RAPIDS, requested_steps=4).steps_per_execution == 4


def test_onednn_is_enabled_on_x86_unless_the_user_chose() -> None:
    env: dict[str, str] = {}
    assert perf.process_environment(env, machine="x86_64") == {"TF_ENABLE_ONEDNN_OPTS": "1"}
    assert env == {"TF_ENABLE_ONEDNN_OPTS": "1"}
    user = {"TF_ENABLE_ONEDNN_OPTS": "0"}
    assert perf.process_environment(user, machine="x86_64") == {} and user["TF_ENABLE_ONEDNN_OPTS"] == "0"
    arm: dict[str, str] = {}
    assert perf.process_environment(arm, machine="aarch64") == {} and arm == {}


def test_the_tensorflow_engine_imports_tensorflow_without_jax_and_jax_imports_after() -> None:
    """TensorFlow imports JAX on its way where both are installed (tf.lite asks for jax.jit); the engine's start
    leaves it out, and the process can still import JAX afterwards (a user's model module may)."""
    probe = textwrap.dedent(
        """
        import json, sys
        from runner.spec import TrainingSpec
        from runner.train.engines.tensorflow import TensorFlowEngine
        from runner.train.perf import import_tensorflow
        engine = TensorFlowEngine()
        engine.start(TrainingSpec(), None)
        jax_with_tensorflow = "jax" in sys.modules
        import jax.numpy as jnp
        print(json.dumps({"jax_with_tensorflow": jax_with_tensorflow, "sum": float(jnp.arange(4).sum()),
                          "same": import_tensorflow() is engine.tf, "tensorflow": engine.tf.__name__}))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], env=child_env("TF_", "KERAS_"), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.splitlines()[-1])
    assert result == {"jax_with_tensorflow": False, "sum": 6.0, "same": True, "tensorflow": "tensorflow"}


def test_cpu_quota_from_cgroup_files(tmp_path: Path) -> None:
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "cpu.max").write_text("max 100000\n")
    assert cpu.cpu_quota(str(v2)) is None
    (v2 / "cpu.max").write_text("150000 100000\n")
    assert cpu.cpu_quota(str(v2)) == 1.5
    v1 = tmp_path / "v1" / "cpu"
    v1.mkdir(parents=True)
    (v1 / "cpu.cfs_quota_us").write_text("-1\n")
    (v1 / "cpu.cfs_period_us").write_text("100000\n")
    assert cpu.cpu_quota(str(tmp_path / "v1")) is None
    (v1 / "cpu.cfs_quota_us").write_text("400000\n")
    assert cpu.cpu_quota(str(tmp_path / "v1")) == 4.0
    assert cpu.cpu_quota(str(tmp_path / "none")) is None
    assert cpu.usable_cpus(1.5, affinity=16) == 2
    assert cpu.usable_cpus(None, affinity=16) == 16
    assert cpu.usable_cpus(32.0, affinity=8) == 8


def test_threads_follow_a_quota_and_are_left_alone_without_one() -> None:
    calls: list[tuple[str, int]] = []

    class Threading:
        def set_intra_op_parallelism_threads(self, n: int) -> None:
            calls.append(("intra", n))

        def set_inter_op_parallelism_threads(self, n: int) -> None:
            calls.append(("inter", n))

    class FakeTf:
        class config:  # shaped like tf.config
            threading = Threading()

    cores = os.cpu_count() or 1
    assert perf.configure_threads(FakeTf, quota=float(cores)) == {} and calls == []  # no smaller than the host
    if cores > 1:
        assert perf.configure_threads(FakeTf, quota=1.0) == {"intra_op": 1, "inter_op": 1}
        assert calls == [("intra", 1), ("inter", 1)]


def test_turns_stop_timing_a_variant_that_can_no_longer_win() -> None:
    """The rounds drop a variant once its rounds overlap the plain one's (it can never be clear of them again) and
    end when only the plain one is left; what they pick is what all the rounds would have picked."""
    F = calibration.FUSED
    figures = {  # ms per step, round by round
        "float32": [100.0, 102.0, 101.0, 99.0, 100.0],
        "mixed_bfloat16": [60.0, 104.0, 61.0, 60.0, 59.0],  # a slow second round: inside the noise from there on
        "float32" + F: [90.0, 91.0, 89.0, 90.0, 92.0],  # clear of float32 in every round, but only 1.11x
        "mixed_bfloat16" + F: [50.0, 51.0, 49.0, 50.0, 50.0],
    }
    calls: list[str] = []

    def one_round(variant: str) -> float:
        calls.append(variant)
        return figures[variant][sum(1 for c in calls if c == variant) - 1]

    rounds = calibration.take_turns(list(figures), one_round)
    assert rounds["mixed_bfloat16"] == [60.0, 104.0]  # timed twice, then dropped
    assert [len(r) for r in rounds.values()] == [5, 2, 5, 5]
    assert calls[:4] == list(figures) and calls[4:8] == list(figures)[::-1]  # ABBA
    assert calibration.pick_from_timings(rounds) == calibration.pick_from_timings(figures) == "mixed_bfloat16" + F

    calls.clear()
    slower = {v: [100.0, 101.0] if v != "float32" else [100.0, 100.5] for v in figures}
    figures.update(slower)
    rounds = calibration.take_turns(list(figures), one_round)
    assert [len(r) for r in rounds.values()] == [2, 2, 2, 2]  # every other variant out after two rounds: done
    assert calibration.pick_from_timings(rounds) == "float32"


def test_the_model_digest_is_what_the_model_is_not_its_layer_names() -> None:
    """The real builders on TensorFlow: the same model gives the same digest however many models the process built
    before (Keras numbers their layers on), another model, another input or another head another digest."""
    tf = pytest.importorskip("tensorflow")
    from runner.train.models import build_model

    first = calibration.model_digest(tf, "mnist_cnn", (28, 28, 1), 10)
    build_model("mnist_cnn", tf.keras)  # layer names now count on from these
    assert calibration.model_digest(tf, "mnist_cnn", (28, 28, 1), 10) == first
    others = {
        calibration.model_digest(tf, "mnist_mlp", (28, 28, 1), 10),
        calibration.model_digest(tf, "mnist_cnn", (32, 32, 3), 10),
        calibration.model_digest(tf, "mnist_cnn", (28, 28, 1), 5),
    }
    assert len(others) == 3 and first not in others


def test_two_starts_writing_one_entry_at_once_leave_a_whole_one(tmp_path: Path) -> None:
    """Two runs starting together both calibrate and both store: a reader meanwhile sees no entry or a whole one,
    never half of one, and what stays is one of the two."""
    import threading

    key = {"cpu": "AMD EPYC", "batch": 1024}
    values = [{"variant": name, "rounds_ms": {"float32": [1.0] * 2000}} for name in ("a", "b")]
    seen: list[object] = []

    def write(value: dict[str, object]) -> None:
        for _ in range(50):
            assert startcache.write("calibration", key, value, tmp_path)

    writers = [threading.Thread(target=write, args=(v,)) for v in values]
    for t in writers:
        t.start()
    while any(t.is_alive() for t in writers):
        seen.append(startcache.read("calibration", key, tmp_path))
    for t in writers:
        t.join()
    assert all(v is None or v in values for v in seen)
    assert startcache.read("calibration", key, tmp_path) in values
    assert [p.name for p in (tmp_path / "calibration").iterdir() if not p.name.startswith(".")] == [
        startcache.entry_path("calibration", key, tmp_path).name
    ]
    assert not [p for p in (tmp_path / "calibration").iterdir() if p.name.startswith(".")]  # no temporary left
