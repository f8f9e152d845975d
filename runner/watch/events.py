"""Lifecycle events: one JSON line per event, one file per writer (see runner.contract for why).

Each writer stamps its events with its own clock, and the clocks of a run's machines need not agree (a VM's can be
an hour off). Where events of several writers are measured against each other (cost, startup, phases), they are
first put on one clock, the storage's: each writer uploads its file right after adding an event, so its last event's
time against the file's `updated` time (the storage's clock) says how far off that writer's clock is
(read_events(one_clock=True)).
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from runner import contract
from runner.errors import StorageError
from runner.storage import Storage
from runner.storage.parallel import read_many
from runner.watch.rundir import parse_jsonl, where

# An event time outside these years is no clock's reading: the line is corrupt (a warning), never a cost or a date.
EARLIEST, LATEST = 946_684_800.0, 4_102_444_800.0  # 2000-01-01, 2100-01-01


def now() -> float:
    return round(time.time(), 3)


class EventLog:
    """Append-only event file of one source. Rewrites the whole object on each event (event files stay small: tens
    of lines). A write that fails keeps the event: the next successful write carries every event held, and a line
    saying how many were held, so that its time is the upload's (clock_offsets). The failure raises StorageError,
    or, given `on_error`, goes there instead: a writer whose events must never stop what it does (the runner
    deleting a node) records them when it can."""

    def __init__(
        self, storage: Storage, source: str, *, on_error: Callable[[StorageError], None] | None = None
    ) -> None:
        self.storage = storage
        self.source = source
        self.on_error = on_error
        self.key = contract.events_key(source)
        existing = storage.read_bytes(self.key)  # a restarted writer continues its own file
        self._lines: list[bytes] = existing.splitlines() if existing else []
        self._held = 0  # events not yet in storage
        self._holding = False  # hold(): events wait until release()

    @property
    def pending(self) -> bool:
        return self._held > 0

    def emit(self, kind: str, *, happened_at: float | None = None, **fields: Any) -> dict[str, Any]:
        """Record an event, stamped now or `happened_at` (when it happened, by this writer's clock)."""
        event = {
            "time": now() if happened_at is None else round(happened_at, 3),
            "source": self.source,
            "event": kind,
            **fields,
        }
        self._lines.append(json.dumps(event, sort_keys=False).encode())
        self._held += 1
        if not self._holding:
            self._write()
        return event

    def hold(self) -> None:
        """Keep what is emitted from now on in memory, unwritten, until release(): for a writer that must not wait
        on storage now (the runner, between a verdict and the delete it sends)."""
        self._holding = True

    def release(self) -> None:
        """Write what was held, and everything from now on, as it comes."""
        self._holding = False
        self._write()

    def _write(self) -> None:
        try:
            self.flush()
        except StorageError as exc:
            if self.on_error is None:
                raise
            self.on_error(exc)

    def flush(self) -> None:
        """Write what is held; StorageError when it cannot (the events stay held)."""
        if not self._held:
            return
        lines = self._lines
        if self._held > 1:  # some waited: the last line's time must be the upload's
            mark = {"time": now(), "source": self.source, "event": "events_written", "held": self._held}
            lines = [*lines, json.dumps(mark).encode()]
        self.storage.write_bytes(self.key, b"\n".join(lines) + b"\n")
        self._lines, self._held = lines, 0


@dataclass(frozen=True)
class Event:
    time: float
    source: str
    event: str
    fields: dict[str, Any] = field(default_factory=dict)
    clock_offset: float = 0.0  # read with one_clock: how far its writer's clock was ahead (subtracted from `time`)


def _event(raw: dict[str, Any]) -> Event:
    fields = dict(raw)
    stamp = fields.pop("time")
    if isinstance(stamp, bool) or not isinstance(stamp, int | float) or not math.isfinite(float(stamp)):
        raise ValueError(f"time {stamp!r} is not a number")
    if not EARLIEST <= float(stamp) <= LATEST:
        raise ValueError(f"time {stamp!r} is not a date between 2000 and 2100")
    return Event(float(stamp), str(fields.pop("source")), str(fields.pop("event")), fields)


def parse_events(data: bytes, name: str, problems: list[str] | None = None) -> list[Event]:
    """The events in an events file's bytes (or the new bytes of one: whole lines); `name` names it in `problems`."""
    return parse_jsonl(data, name, problems, _event)


def source_of(key: str) -> str:
    """The writer of an events file: events/worker-3.jsonl -> worker-3."""
    return key.removeprefix(contract.EVENTS_DIR + "/").removesuffix(".jsonl")


def read_events(storage: Storage, problems: list[str] | None = None, *, one_clock: bool = False) -> list[Event]:
    """Every source's events, merged in time order. A torn last line (its writer died mid-line) is skipped
    silently; other lines that are not events are skipped too, and named in `problems` when it is given, with
    the file, so that a corrupt file is reported rather than quietly empty.

    `one_clock`: each file's events moved onto the storage's clock (the machines' clocks need not agree): by how far
    its writer's clock is off, its last event's time against the file's `updated` (each writer uploads its file as it
    adds an event). A VM's worker and trainer files take their VM's bootstrap file's offset, which is uploaded at
    once (theirs are mirrored a few seconds late). For what is measured across machines: cost, startup, phases."""
    files: dict[str, tuple[list[Event], float | None]] = {}
    listed = storage.list(contract.EVENTS_DIR + "/")
    for info, data in zip(listed, read_many(storage, [(info.key, 0) for info in listed]), strict=True):
        files[source_of(info.key)] = (parse_events(data or b"", where(storage, info.key), problems), info.updated)
    offsets = _offsets(files) if one_clock else {}
    out: list[Event] = []
    for name, (events, _) in files.items():
        offset = offsets.get(_clock_of(name), offsets.get(name))
        out += [dataclasses.replace(e, time=e.time - offset, clock_offset=offset) for e in events] if offset else events
    return sorted(out, key=lambda e: e.time)


def _clock_of(name: str) -> str:
    """Whose clock a file's events carry: a VM's worker and trainer write with their VM's."""
    kind, _, worker = name.rpartition("-")
    return f"bootstrap-{worker}" if kind in ("worker", "trainer") and worker.isdigit() else name


def _offsets(files: dict[str, tuple[list[Event], float | None]]) -> dict[str, float]:
    """How far each file's writer's clock is ahead of the storage's (negative: behind)."""
    return {
        name: max(e.time for e in events) - updated
        for name, (events, updated) in files.items()
        if events and updated is not None
    }
