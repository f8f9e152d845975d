"""The bench's driver: the trainers take turns epoch by epoch, so a slow spell of a shared machine hits both sides
of each ratio.

On CPU and GPU each (trainer, batch size) runs in its own worker process (the baseline needs TensorFlow's defaults,
ours the settings perf.py makes before TensorFlow's import), all of them started at once and only one running at a
time: epoch 1 of every arm, then epoch 2 of every arm, and so on. Our trainer's process starts with the C allocator's
settings a job of the built-in trainer gets from the supervisor (runner.worker.allocator: on the JAX engine without
accelerator chips), the plain fit's with the defaults a notebook has. On a TPU the arms share the bench's process,
because only one process per host may hold the TPU: one batch size after the other, the two trainers alternating.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from runner.bench.arms import ArmSpec, EpochTime
from runner.bench.notebook import BATCH_SIZES
from runner.bench.report import ArmResult, BenchResult
from runner.errors import RunnerError

ORDER = ("baseline", "ours")


class BenchError(RunnerError):
    """A bench worker failed; the message ends with the tail of its log."""


@dataclass(frozen=True)
class BenchOptions:
    batch_sizes: tuple[int, ...] = BATCH_SIZES
    epochs: int = 3
    examples: int | None = None
    test_examples: int | None = None
    learning_rate: float = 3e-3
    seed: int = 0
    precision: str = "auto"
    steps_per_execution: int | None = None
    jit_compile: bool | None = None
    data: str | None = None
    framework: str = "tensorflow"  # the engine of both trainers: tensorflow or jax
    baseline_framework: str | None = None  # the plain fit's engine when not `framework` (the notebook's: tensorflow)
    label: str | None = None
    in_process: bool | None = None  # None: in one process on a TPU host, in two worker processes elsewhere

    def spec(self, trainer: str, batch_size: int) -> ArmSpec:
        """One arm's settings: every field ArmSpec shares with these options, and the arm's trainer and batch."""
        shared = {f.name: getattr(self, f.name) for f in fields(ArmSpec) if f.name not in ("trainer", "batch_size")}
        if trainer == "baseline" and self.baseline_framework:
            shared["framework"] = self.baseline_framework
        return ArmSpec(trainer=trainer, batch_size=batch_size, **shared)


@contextmanager
def _environment(extra: Mapping[str, str]) -> Iterator[None]:
    """os.environ with `extra` while a worker starts: a spawned interpreter starts with the environment of the
    process that starts it (there is no other way to give it one), and glibc reads its settings as a process
    starts."""
    saved = {key: os.environ.get(key) for key in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class _Worker:
    """One arm in its own process, spoken to over a pipe (see arms.serve)."""

    def __init__(self, spec: ArmSpec, log: Path, mp: Any, env: Mapping[str, str]) -> None:
        from runner.bench import arms

        self.name, self.log = spec.trainer, log
        self.conn, child = mp.Pipe()
        self.process = mp.Process(target=arms.serve, args=(child, spec.as_dict(), str(log)), daemon=True)
        with _environment(env):
            self.process.start()
        child.close()

    def _reply(self) -> Any:
        try:
            tag, value = self.conn.recv()
        except (EOFError, OSError) as exc:
            self.process.join(5)
            raise BenchError(
                f"the {self.name} worker exited (code {self.process.exitcode}); {self.log}:\n{_tail(self.log)}"
            ) from exc
        if tag == "error":
            raise BenchError(f"the {self.name} worker failed; {self.log}:\n{_tail(self.log)}")
        return value

    def ready(self) -> dict[str, Any]:
        return self._reply()

    def epoch(self) -> EpochTime:
        self.conn.send("epoch")
        return EpochTime(*self._reply())

    def finish(self) -> float:
        self.conn.send("finish")
        return float(self._reply())

    def close(self) -> None:
        self.conn.close()
        self.process.join(30)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(10)


class _InProcess:
    """Both arms in this process (a TPU host); the same interface as _Worker."""

    def __init__(self, arm: Any) -> None:
        self.arm = arm

    def ready(self) -> dict[str, Any]:
        return self.arm.info

    def epoch(self) -> EpochTime:
        return self.arm.epoch()

    def finish(self) -> float:
        return self.arm.finish()

    def close(self) -> None:
        pass


Key = tuple[str, int]  # (trainer, batch size)


def _start(options: BenchOptions, batches: tuple[int, ...], logs: Path, in_process: bool) -> dict[Key, Any]:
    if in_process:
        from runner.bench import arms

        (batch,) = batches
        ours = arms.make_arm(options.spec("ours", batch))  # resolves the strategy; the baseline reuses it
        base = arms.make_arm(options.spec("baseline", batch), strategy=ours.strategy)  # type: ignore[union-attr]
        return {("ours", batch): _InProcess(ours), ("baseline", batch): _InProcess(base)}
    from runner.worker import allocator

    mp = multiprocessing.get_context("spawn")  # a fresh interpreter: TensorFlow reads its settings at import
    logs.mkdir(parents=True, exist_ok=True)
    ours_env = allocator.for_engine(options.framework, os.environ)  # as the supervisor starts the built-in trainer
    return {
        (t, b): _Worker(options.spec(t, b), logs / f"{t}-batch{b}.log", mp, ours_env if t == "ours" else {})
        for b in batches
        for t in ORDER
    }


def _rate(info: dict[str, Any], epoch: EpochTime) -> float:
    return float(info["examples_per_epoch"]) / epoch.epoch_s


def turns(epochs: int, batches: Sequence[int]) -> Iterator[tuple[int, int, tuple[str, str]]]:
    """(epoch index, batch size, the two trainers in the order they run) for every epoch pair, in running order:
    epoch 1 at every batch size, then epoch 2, and so on, the batch sizes forwards in one epoch and backwards in
    the next. The order of the two trainers flips from one epoch to the next at every batch size (AB, BA, AB, ...),
    whatever the number of batch sizes, and from one pair to the next, so the whole sequence is ABBA too. (Flipping
    once per pair over a fixed batch order gave each batch size the same order in every epoch when there were an
    even number of batch sizes.)"""
    for e in range(epochs):
        positions = range(len(batches)) if e % 2 == 0 else range(len(batches) - 1, -1, -1)
        for i in positions:
            yield e, batches[i], ORDER if (e + i) % 2 == 0 else (ORDER[1], ORDER[0])


def _run_group(
    options: BenchOptions, batches: tuple[int, ...], out: Path, in_process: bool, say: Callable[[str], None]
) -> tuple[list[ArmResult], dict[str, dict[str, Any]]]:
    """Start every arm of these batch sizes, then let them take turns (see turns), so neither trainer always runs
    first."""
    workers = _start(options, batches, out / "bench-logs", in_process)
    try:
        info = {key: worker.ready() for key, worker in workers.items()}
        times: dict[Key, list[EpochTime]] = {key: [] for key in workers}
        for e, batch, order in turns(options.epochs, batches):
            for t in order:
                times[t, batch].append(workers[t, batch].epoch())
            base, ours = times["baseline", batch][-1], times["ours", batch][-1]
            ratio = _rate(info["ours", batch], ours) / _rate(info["baseline", batch], base)
            note = "compiling, excluded" if e == 0 else f"ours {ratio:.2f}x the examples/s"
            say(
                f"batch {batch}, epoch {e + 1}/{options.epochs}: plain fit {base.epoch_s:.1f} s, "
                f"ours {ours.epoch_s:.1f} s ({note})"
            )
        accuracy = {key: worker.finish() for key, worker in workers.items()}
    finally:
        for worker in workers.values():
            worker.close()
    results = [
        ArmResult(
            trainer=t,
            batch_size=b,
            examples_per_epoch=int(info[t, b]["examples_per_epoch"]),
            epoch_times_s=tuple(round(x.epoch_s, 4) for x in times[t, b]),
            train_times_s=tuple(round(x.train_s, 4) for x in times[t, b]),
            test_accuracy=accuracy[t, b],
            settings={"keras": info[t, b]["keras"], **info[t, b]["settings"]},
        )
        for b in batches
        for t in ORDER
    ]
    return results, {t: info[t, batches[0]] for t in ORDER}


def run_bench(
    options: BenchOptions, out: Path, say: Callable[[str], None] = print, command: str | None = None
) -> BenchResult:
    """On CPU and GPU all batch sizes run at once (2 worker processes each, one of them busy at any time), so a
    slow spell hits every batch size as well as both trainers. On a TPU, one batch size after the other: all arms
    live in this process, and each trainer arm initialises the TPU system."""
    if options.epochs < 2:
        raise BenchError("the bench needs at least 2 epochs: the first, compiling one is excluded")
    if options.in_process is None:
        from runner.train.strategy import tpu_present

        in_process = tpu_present()
    else:
        in_process = options.in_process
    groups = [(b,) for b in options.batch_sizes] if in_process else [tuple(options.batch_sizes)]
    results: list[ArmResult] = []
    info: dict[str, dict[str, Any]] = {}
    for batches in groups:
        group_results, info = _run_group(options, batches, out, in_process, say)
        results += group_results
    device = info["ours"].get("device", {})
    versions = {"engine": info["ours"]["engine"], "keras": info["ours"]["keras"]}
    if info["baseline"]["engine"] != info["ours"]["engine"]:
        versions["engine_baseline"] = f"{info['baseline']['engine']} (plain fit)"
    if info["baseline"]["keras"] != info["ours"]["keras"]:
        versions["keras_baseline"] = f"{info['baseline']['keras']} (plain fit)"
    schedule = (
        "both trainers in one process (a TPU host allows one), epochs alternated, one batch size after the other"
        if in_process
        else "each trainer and batch size in its own process, epochs taking turns (ABBA), one running at a time"
    )
    engine = "JAX" if options.framework == "jax" else "TensorFlow"
    return BenchResult(
        label=options.label or f"{device.get('label', 'this machine')}, {engine}",
        framework=options.framework,
        device=device,
        versions=versions,
        train_examples=int(info["baseline"]["examples_per_epoch"]),  # the plain fit trains on every example
        test_examples=int(info["baseline"]["test_examples"]),
        epochs=options.epochs,
        schedule=schedule,
        arms=tuple(results),
        command=command if command is not None else " ".join(sys.argv),
        created=round(time.time(), 3),
    )
