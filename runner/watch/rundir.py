"""The run directory's files as typed records, one per file, shared by every writer and reader of that file.

    file                record        written by                                        read by
    exit/worker-N.json  ExitRecord    supervisor; the bootstrap (bash, write_exit)     runner, status, gc
    heartbeat           Heartbeat     supervisor (worker 0)                             runner, status, gc
    heartbeats/worker-N Heartbeat     supervisor (worker N)                             runner (each worker's word)
    progress.json       Progress      the trainer, or user code                         supervisor (hang), status
    summary.json        Summary       the trainer, user code in any shape, or           submit, status, list
                                      the supervisor (derived: runner.watch.results)
    metrics.jsonl       dict per line the trainer, or user code                         status
    events/*.jsonl      Event         runner, supervisor, bootstrap (runner.watch.events)
    run.json            RunRecord's run_info (runner.watch.runs)

Every reader is tolerant: user code may write summary.json, metrics.jsonl and progress.json in any shape, and a
file torn or corrupt costs a warning naming it (Snapshot.problems), never a traceback. `from_json` raises
KeyError, TypeError or ValueError (with what is wrong) for content that is not that record at all; fields of the
wrong type in a tolerant record are left out instead. The bash writer's format (runner/launch/startup-script.sh,
write_exit and event) is held to these records by tests/launch/test_bootstrap.py.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from runner.storage import Storage
from runner.watch.state import RunState

T = TypeVar("T")


def json_kind(value: Any) -> str:
    """What a parsed JSON value is, in JSON's words (for messages about a file that holds the wrong one)."""
    names = {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def number(value: Any) -> float | None:
    """A finite JSON number as a float; None for anything else (booleans, strings, NaN, ints too big for a float)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        as_float = float(value)
    except OverflowError:
        return None
    return as_float if math.isfinite(as_float) else None


def _object(raw: Any) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise TypeError(f"a JSON {json_kind(raw)}, not an object")
    return raw


def _drop_none(data: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if v is not None}


@dataclass(frozen=True)
class ExitRecord:
    """exit/worker-N.json: how worker N's job ended. The supervisor writes it; the bootstrap writes one when the
    container could not (a failed image pull, a container killed before it could)."""

    worker: int
    state: RunState
    exit_code: int
    finished_at: float
    started_at: float | None = None
    error: str | None = None
    tail: list[str] = field(default_factory=list)  # the job's last output lines
    # `cancelled` by the job's own stop's exit code (143, 130), not its supervisor's: on a pod slice, the stop its
    # peers agreed on (JAX's preemption sync) reaching it first. The run counts it as stopped only while another
    # worker was (runner.watch.state.worker_states), as failed otherwise.
    peer_stop: bool = False

    @classmethod
    def from_json(cls, raw: Any) -> ExitRecord:
        raw = _object(raw)
        tail = raw.get("tail") or []
        started = number(raw.get("started_at"))
        return cls(
            worker=int(raw["worker"]),
            state=RunState(raw["state"]),
            exit_code=int(raw["exit_code"]),
            finished_at=float(raw["finished_at"]),
            started_at=started,
            error=None if raw.get("error") is None else str(raw["error"]),
            tail=[str(line) for line in tail] if isinstance(tail, list) else [str(tail)],
            peer_stop=raw.get("peer_stop") is True,
        )

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "state": str(self.state)}


TRAINING_DONE = "done"  # progress.json's phase once training ran to its end (runner.train writes it)


@dataclass(frozen=True)
class Progress:
    """progress.json: where training stands, rewritten every few seconds. Every field is optional: user code may
    write only a step. The supervisor counts a change of any of (global_step, epoch, step, phase, validation_step)
    as progress."""

    time: float | None = None
    epoch: int | None = None  # 1-based epoch in progress
    epochs: int | None = None
    step: int | None = None  # steps done of that epoch
    steps_per_epoch: int | None = None
    global_step: int | None = None
    phase: str | None = None  # "train" | "validate" | "done" (TRAINING_DONE: every epoch trained)
    validation_step: int | None = None

    @classmethod
    def from_json(cls, raw: Any) -> Progress:
        raw = _object(raw)
        ints = {
            k: int(v)
            for k in ("epoch", "epochs", "step", "steps_per_epoch", "global_step", "validation_step")
            if (v := number(raw.get(k))) is not None
        }
        phase = raw.get("phase")
        return cls(time=number(raw.get("time")), phase=phase if isinstance(phase, str) else None, **ints)

    def to_json(self) -> dict[str, Any]:
        return _drop_none(dataclasses.asdict(self))

    @property
    def marker(self) -> tuple[object, ...]:
        return (self.global_step, self.epoch, self.step, self.phase, self.validation_step)


@dataclass(frozen=True)
class Heartbeat:
    """heartbeats/worker-N.json: the supervisor of worker N says it is alive, what phase the job is in, and when
    the job's progress last advanced (by the VM's own clock, like `time`); `heartbeat` is worker 0's, the run's."""

    time: float
    phase: str = "running"  # starting | running | exited
    worker: int = 0
    pid: int | None = None
    host: str | None = None
    uptime_s: float | None = None
    progress: Progress | None = None
    progress_at: float | None = None

    @classmethod
    def from_json(cls, raw: Any) -> Heartbeat:
        raw = _object(raw)
        stamp = number(raw.get("time"))
        if stamp is None:
            raise ValueError(f"its time is {raw.get('time')!r}, not a number")
        progress = raw.get("progress")
        return cls(
            time=stamp,
            phase=str(raw.get("phase") or "running"),
            worker=int(number(raw.get("worker")) or 0),
            pid=int(pid) if (pid := number(raw.get("pid"))) is not None else None,
            host=str(raw["host"]) if raw.get("host") is not None else None,
            uptime_s=number(raw.get("uptime_s")),
            progress=Progress.from_json(progress) if isinstance(progress, dict) else None,
            progress_at=number(raw.get("progress_at")),
        )

    def to_json(self) -> dict[str, Any]:
        out = _drop_none({k: v for k, v in dataclasses.asdict(self).items() if k != "progress"})
        out["progress"] = self.progress.to_json() if self.progress else None
        return out

    @property
    def age_s(self) -> float:
        return max(0.0, time.time() - self.time)


# summary.json fields the trainer writes, with the type a reader may rely on; anything else is `extra`.
_SUMMARY_FIELDS: dict[str, type | tuple[type, ...]] = {
    "run_id": str,
    "state": str,
    "model": str,
    "dataset": str,
    "data_source": str,
    "epochs": int,
    "steps_per_epoch": int,
    "global_step": int,
    "steps_this_attempt": int,
    "optimizer_iterations": int,
    "resumed_from": dict,
    "resumed_from_epoch": int,
    "resumed": dict,  # where the attempt went on from (runner.checkpoints.resumed), derived summaries too
    "test_accuracy": float,
    "test_loss": float,
    "train_examples": int,
    "test_examples": int,
    "global_batch_size": int,
    "per_replica_batch_size": int,
    "learning_rate": float,
    "epoch_times_s": list,
    "examples_per_s": float,
    "strategy": dict,
    "framework": str,
    "keras": str,
    "perf": dict,
    "versions": dict,
    "checkpoint": str,
    "wall_time_s": float,
    # a summary derived from what a job wrote (runner.watch.results): where from, its last row, its test metrics
    "derived_from": list,
    "steps": int,
    "last_metrics": dict,
    "test": dict,
}


def _typed(value: Any, kind: type | tuple[type, ...]) -> Any:
    """`value` as `kind`, or None when it is not one (a bool is no number; an int is a float)."""
    if kind in (int, float):
        as_float = number(value)
        if as_float is None or (kind is int and not float(as_float).is_integer()):
            return None
        return int(as_float) if kind is int else as_float
    return value if isinstance(value, kind) else None


@dataclass(frozen=True)
class Summary:
    """summary.json. The built-in trainer fills the known fields (`fields`); user code may write anything, which
    is kept in `extra` (and a known field of the wrong type goes there too, never to a reader that trusts it)."""

    fields: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, **values: Any) -> Summary:
        """A summary from the trainer's values (checked like anything read back)."""
        return cls.from_json(values)

    @classmethod
    def from_json(cls, raw: Any) -> Summary:
        raw = _object(raw)
        known: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        for key, value in raw.items():
            kind = _SUMMARY_FIELDS.get(key)
            if kind is None:
                extra[key] = value
            elif value is None:
                known[key] = None  # said to be absent (resumed_from: null): a reader's get() gives None too
            elif (typed := _typed(value, kind)) is not None:
                known[key] = typed
            else:
                extra[key] = value
        if known.get("epoch_times_s") is not None:
            known["epoch_times_s"] = [t for t in map(number, known["epoch_times_s"]) if t is not None]
        return cls(known, extra)

    def to_json(self) -> dict[str, Any]:
        return {**self.extra, **self.fields}

    def get(self, key: str) -> Any:
        return self.fields.get(key)

    @property
    def is_trainers(self) -> bool:
        """Written by the built-in trainer (a test accuracy is what it always reports)."""
        return self.fields.get("test_accuracy") is not None and not self.is_derived

    @property
    def is_derived(self) -> bool:
        """Derived from the job's metrics and log, not written by it (runner.watch.results)."""
        return self.fields.get("derived_from") is not None

    @property
    def evaluated(self) -> bool:
        """Whether the run reports a test metric, i.e. it evaluated after training."""
        test = self.fields.get("test")
        return self.test_accuracy is not None or self.fields.get("test_loss") is not None or bool(test)

    @property
    def test_accuracy(self) -> float | None:
        return self.fields.get("test_accuracy")


@dataclass(frozen=True)
class Snapshot:
    """What the run directory says right now. Files that could not be understood are left out of the fields and
    named in `problems`, one line each, so that one corrupt file costs a warning, never the whole status."""

    exits: list[ExitRecord]
    heartbeat: Heartbeat | None
    metrics: list[dict[str, Any]]
    summary: Summary | None
    problems: list[str] = field(default_factory=list)
    progress: Progress | None = None
    heartbeats: dict[int, Heartbeat] = field(default_factory=dict)  # worker -> its own heartbeat
    heartbeat_at: float | None = None  # when the heartbeat was stored, by the storage's clock (not the VM's)
    # When each worker's heartbeat was stored, by the storage's clock: it changes with every beat, whether or not
    # the reader read the beat again (runner.watch.view reads a heartbeat's content only as often as it must).
    heartbeats_at: dict[int, float] = field(default_factory=dict)

    @property
    def heartbeat_age_s(self) -> float | None:
        """Seconds since the heartbeat was stored (by the storage's clock when known: the VM's may be off)."""
        if self.heartbeat is None:
            return None
        return max(0.0, time.time() - self.heartbeat_at) if self.heartbeat_at is not None else self.heartbeat.age_s


def where(storage: Storage, key: str) -> str:
    """A run-directory object as a user can find it: the full path or gs:// URL."""
    return f"{storage.url.rstrip('/')}/{key}"


def loads(data: bytes) -> Any:
    """json.loads; a ValueError (with the reason) for anything that is not JSON, including nesting too deep."""
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def read_record(storage: Storage, key: str, record: Callable[[Any], T], problems: list[str]) -> T | None:
    """The record stored at `key`; None when it is missing, or corrupt (then named in `problems`)."""
    return parse_record(storage.read_bytes(key), where(storage, key), record, problems)


def parse_record(data: bytes | None, name: str, record: Callable[[Any], T], problems: list[str]) -> T | None:
    """The record in `data` (the object `name`, as read); None when it is missing, or corrupt (then named in
    `problems`)."""
    if data is None:
        return None
    try:
        value = loads(data)
    except ValueError as exc:
        problems.append(f"{name} is corrupt: not JSON ({exc})")
        return None
    try:
        return record(value)
    except KeyError as exc:
        problems.append(f"{name} is corrupt: {exc} is missing")
    except (TypeError, ValueError, OverflowError) as exc:
        problems.append(f"{name} is corrupt: {exc}")
    return None


def parse_jsonl(data: bytes, name: str, problems: list[str] | None, convert: Callable[[dict[str, Any]], T]) -> list[T]:
    """The lines of a JSON-lines file that are JSON objects `convert` accepts (it raises KeyError, TypeError or
    ValueError for those it does not).

    A last line without its newline that starts like an object is a write cut short (the writer died mid-line,
    or is writing it now) and is dropped silently. Other bad lines are counted in `problems`, and a file with no
    good line at all is reported as corrupt, naming `name`."""
    lines = data.split(b"\n")
    last = lines.pop().strip()  # b"" when the file ends with a newline, as a complete file does
    out: list[T] = []
    bad: list[int] = []
    why = ""  # what is wrong with the first bad line, when the record says (a time no clock reads, ...)
    for line_number, line in enumerate([*lines, last], start=1):
        if not line.strip():
            continue
        try:
            raw = _object(loads(line))
        except (TypeError, ValueError):
            if not (line_number == len(lines) + 1 and line.startswith(b"{")):  # a torn last line is not corrupt
                bad.append(line_number)
            continue
        try:
            out.append(convert(raw))
        except (KeyError, TypeError, ValueError, OverflowError) as exc:
            bad.append(line_number)
            why = why or (f" ({exc})" if isinstance(exc, ValueError) else "")
    if problems is not None and bad:
        if out:
            problems.append(f"{name}: skipped {len(bad)} corrupt line(s), the first is line {bad[0]}{why}")
        else:
            problems.append(f"{name} is corrupt: not one line is a valid JSON record{why}")
    return out


def read_snapshot(run_dir: Storage, *, with_metrics: bool = True, since: float | None = None) -> Snapshot:
    """Everything the run directory says now. Never fails on what a file holds: a corrupt file is left out and
    named in `problems` (a storage that cannot be read at all still raises StorageError). Its records are read at
    once (runner.watch.view), a pod slice's hundreds of them too.

    `since` (the storage's own time when the current attempt's machine was asked for) leaves out exit records and
    heartbeats stored before it: a machine replaced after a preemption can still land its last uploads after the
    runner cleared them, and its `cancelled` must not end the next attempt. It is compared with each object's
    `updated`, the storage's clock, never with a time the machine wrote: a VM's clock can be far off."""
    from runner.watch.view import RunDirView  # it builds on the records above

    return RunDirView(run_dir, since=since).poll(metrics=with_metrics, summary=True)
