"""Lifecycle events: one JSON line per event, one file per writer (see runner.contract for why)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from runner import contract
from runner.storage import Storage
from runner.watch.rundir import parse_jsonl, where


def now() -> float:
    return round(time.time(), 3)


class EventLog:
    """Append-only event file of one source. Rewrites the whole object on each event: there is no append on
    Cloud Storage, and event files stay small (tens of lines)."""

    def __init__(self, storage: Storage, source: str) -> None:
        self.storage = storage
        self.source = source
        self.key = contract.events_key(source)
        existing = storage.read_bytes(self.key)  # a restarted writer continues its own file
        self._lines: list[bytes] = existing.splitlines() if existing else []

    def emit(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"time": now(), "source": self.source, "event": kind, **fields}
        self._lines.append(json.dumps(event, sort_keys=False).encode())
        self.storage.write_bytes(self.key, b"\n".join(self._lines) + b"\n")
        return event


@dataclass(frozen=True)
class Event:
    time: float
    source: str
    event: str
    fields: dict[str, Any] = field(default_factory=dict)


def _event(raw: dict[str, Any]) -> Event:
    fields = dict(raw)
    return Event(float(fields.pop("time")), str(fields.pop("source")), str(fields.pop("event")), fields)


def read_events(storage: Storage, problems: list[str] | None = None) -> list[Event]:
    """Every source's events, merged in time order. A torn last line (its writer died mid-line) is skipped
    silently; other lines that are not events are skipped too, and named in `problems` when it is given, with
    the file, so that a corrupt file is reported rather than quietly empty."""
    out: list[Event] = []
    for info in storage.list(contract.EVENTS_DIR + "/"):
        data = storage.read_bytes(info.key) or b""
        out += parse_jsonl(data, where(storage, info.key), problems, _event)
    return sorted(out, key=lambda e: e.time)
