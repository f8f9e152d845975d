"""A run directory read by what changed: what it says now, for a reader that keeps coming back.

Following a pod slice polls its run directory every few seconds. Reading every worker's log, events and heartbeat
each time, one after another, cost about 4 requests per host a poll (1,000 at 256 hosts: 48 s against Cloud
Storage's round trip of about 40 ms). Here a poll lists each part of the run directory once (every worker's exit
record in one listing, every heartbeat in another, the events and the logs in two more), and reads only the objects
whose listing shows them changed (a new generation or size), at once (runner.storage.parallel): the logs and events
by their new bytes, a ranged read from where the last read ended. With nothing new, a poll is its four listings,
whatever the number of hosts.

What a follower decides on (exit records, heartbeats: `poll`) is read apart from what it only shows (logs, events:
`read_streams`, which reads what the last poll's listing showed grew), and goes first: the end of a run is seen on
the poll that lists its last exit record, not after every log has been read. What the streams read waits in the
view until a caller takes it (`drain`), so nothing read is lost to a caller that stopped waiting for it.

A worker's heartbeat changes every few seconds on every host. Its content says what the job does (starting, its
progress); that it changed says the worker lives, and the listing alone says that (`Snapshot.heartbeats_at`, the
storage's clock). So a heartbeat is read when it is new, while its worker is starting, and otherwise at most every
`beats_every_s`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from runner import contract
from runner.storage import ObjectInfo, Storage
from runner.storage.parallel import list_many, read_many
from runner.watch.events import Event, parse_events
from runner.watch.rundir import ExitRecord, Heartbeat, Snapshot, Summary, parse_jsonl, parse_record, where

EXITS = contract.EXIT_DIR + "/"
BEATS = contract.HEARTBEAT  # one listing: `heartbeat` (worker 0's, the run's) and heartbeats/worker-N.json
EVENTS = contract.EVENTS_DIR + "/"
LOGS = contract.LOGS_DIR + "/"

Version = tuple[int, int | None, float | None]  # size, generation, updated: what a listing says of an object


class Tail(Protocol):
    """What follows the logs (runner.watch.follow.LogTail, LogTails): which to read from where, given their sizes
    as listed, and what to show of what was read."""

    def wanted(self, sizes: dict[str, int]) -> list[tuple[str, int]]: ...

    def take(self, read: dict[str, bytes | None], *, flush: bool = False) -> bytes: ...


def _version(info: ObjectInfo) -> Version:
    return (info.size, info.generation, info.updated)


def beat_worker(key: str) -> int | None:
    """The worker whose heartbeat `key` is (heartbeats/worker-N.json), or None."""
    worker = key.removeprefix(contract.HEARTBEATS_DIR + "/worker-").removesuffix(".json")
    return int(worker) if worker.isdigit() and key == contract.heartbeat_key(int(worker)) else None


def _is_record(key: str) -> bool:
    return key.startswith(EXITS) or key == contract.HEARTBEAT or beat_worker(key) is not None


class RunDirView:
    """What a run directory says, read by what changed since the last poll. `tail`: the logs to follow (None: no
    logs); `events`: whether to read the events (`drain` hands out the new ones); `since`: see read_snapshot."""

    def __init__(
        self,
        storage: Storage,
        *,
        tail: Tail | None = None,
        events: bool = False,
        since: float | None = None,
        beats_every_s: float = 0.0,
    ) -> None:
        self.storage, self.tail, self.events, self.since = storage, tail, events, since
        self.beats_every_s = beats_every_s
        self._polling = threading.Lock()  # one poll at a time
        self._streaming = threading.Lock()  # one read of the streams at a time
        self._state = threading.Lock()  # what both share: the listing, the results not yet taken
        self._listed: dict[str, ObjectInfo] = {}
        self._read: dict[str, Version] = {}  # record key -> the version whose content is in _records
        self._read_at: dict[str, float] = {}  # record key -> time.monotonic() when its content was read
        self._records: dict[str, ExitRecord | Heartbeat | None] = {}
        self._problems: dict[str, list[str]] = {}
        self._event_at: dict[str, tuple[int, int]] = {}  # events key -> (bytes parsed, its size when read)
        self._new_events: list[Event] = []
        self._output: list[bytes] = []

    # -- what is decided on ----------------------------------------------------------------------------------------

    def poll(self, *, metrics: bool = False, summary: bool = False) -> Snapshot:
        """List the run directory, read the exit records and heartbeats that changed (and metrics.jsonl and
        summary.json, whole, when asked), and say what it holds now. StorageError when it cannot be read."""
        with self._polling:
            prefixes = [EXITS, BEATS] + [EVENTS] * self.events + [LOGS] * (self.tail is not None)
            listed = {info.key: info for found in list_many(self.storage, prefixes, urgent=True) for info in found}
            now = time.monotonic()
            changed = [key for key, info in listed.items() if _is_record(key) and self._stale(key, info, now)]
            extra = [contract.METRICS] * metrics + [contract.SUMMARY] * summary
            got = read_many(self.storage, [(key, 0) for key in changed + extra], urgent=True)
            with self._state:
                self._listed = listed
                for key in [k for k in self._read if k not in listed]:  # gone (a recreate clears them)
                    self._forget(key)
                for key, data in zip(changed, got, strict=False):
                    self._keep(key, listed[key], data, now)
                return self._snapshot(dict(zip(extra, got[len(changed) :], strict=True)))

    def _stale(self, key: str, info: ObjectInfo, now: float) -> bool:
        """Whether the record at `key` is to be read (again) now."""
        if not self._current(info) or self._read.get(key) == _version(info):
            return False
        record = self._records.get(key)
        if beat_worker(key) is None or not isinstance(record, Heartbeat) or record.phase == "starting":
            return True
        return now - self._read_at.get(key, float("-inf")) >= self.beats_every_s

    def _current(self, info: ObjectInfo) -> bool:
        return self.since is None or info.updated is None or info.updated >= self.since

    def _keep(self, key: str, info: ObjectInfo, data: bytes | None, now: float) -> None:
        if data is None:  # deleted after the listing: the next one says so
            return
        problems: list[str] = []
        name = where(self.storage, key)
        parse: Callable[[Any], ExitRecord | Heartbeat] = (
            ExitRecord.from_json if key.startswith(EXITS) else Heartbeat.from_json
        )
        self._records[key] = parse_record(data, name, parse, problems)
        self._problems[key] = problems
        self._read[key], self._read_at[key] = _version(info), now

    def _forget(self, key: str) -> None:
        self._read.pop(key, None)
        self._read_at.pop(key, None)
        self._records.pop(key, None)
        self._problems.pop(key, None)

    def _snapshot(self, extra: dict[str, bytes | None]) -> Snapshot:
        current = {key: info for key, info in self._listed.items() if key in self._read and self._current(info)}
        problems = [problem for key in sorted(current) for problem in self._problems.get(key, [])]
        exits = [r for key in current if key.startswith(EXITS) and isinstance(r := self._records[key], ExitRecord)]
        beats: dict[int, Heartbeat] = {}
        beats_at: dict[int, float] = {}
        for key, info in current.items():
            worker = beat_worker(key)
            if worker is not None and isinstance(record := self._records[key], Heartbeat):
                beats[worker] = record
                if info.updated is not None:
                    beats_at[worker] = info.updated
        beat = self._records.get(contract.HEARTBEAT) if contract.HEARTBEAT in current else None
        beat = beat if isinstance(beat, Heartbeat) else None
        metrics: list[dict[str, Any]] = []
        if contract.METRICS in extra:
            name = where(self.storage, contract.METRICS)
            metrics = parse_jsonl(extra[contract.METRICS] or b"", name, problems, lambda raw: raw)
        summary = None
        if contract.SUMMARY in extra:
            name = where(self.storage, contract.SUMMARY)
            summary = parse_record(extra[contract.SUMMARY], name, Summary.from_json, problems)
        return Snapshot(
            sorted(exits, key=lambda e: e.worker),
            beat,
            metrics,
            summary,
            problems,
            beat.progress if beat else None,
            beats,
            current[contract.HEARTBEAT].updated if beat is not None else None,
            beats_at,
        )

    # -- what is shown -------------------------------------------------------------------------------------------

    def read_streams(self, *, flush: bool = False) -> None:
        """Read what the last poll's listing showed new in the logs and events, by their new bytes; `drain` hands
        it out. `flush`: a log's last line is shown even without its newline (the run is over)."""
        with self._streaming:
            with self._state:
                listed = dict(self._listed)
            events = self._event_reads(listed) if self.events else []
            sizes = {key: info.size for key, info in listed.items() if key.startswith(LOGS)}
            logs = self.tail.wanted(sizes) if self.tail is not None else []
            got = read_many(self.storage, events + logs)
            again = [key for (key, start), data in zip(events, got, strict=False) if not self._parse(key, start, data)]
            if again:  # rewritten, not appended to: read whole
                for key in again:
                    self._event_at[key] = (0, 0)
                for key, data in zip(again, read_many(self.storage, [(k, 0) for k in again]), strict=True):
                    self._parse(key, 0, data)
            read = dict(zip((key for key, _ in logs), got[len(events) :], strict=True))
            output = self.tail.take(read, flush=flush) if self.tail is not None else b""
            with self._state:
                if output:
                    self._output.append(output)

    def _event_reads(self, listed: dict[str, ObjectInfo]) -> list[tuple[str, int]]:
        """Events files that grew: read from the byte before where the last read ended (a newline, if the file
        still holds what was read; events files only grow, as their writers add lines and upload them whole)."""
        out = []
        for key, info in listed.items():
            if not key.startswith(EVENTS) or not key.endswith(".jsonl"):
                continue
            parsed, size = self._event_at.get(key, (0, 0))
            if info.size == size:
                continue
            if info.size < parsed:
                parsed = 0
                self._event_at[key] = (0, 0)
            out.append((key, parsed - 1 if parsed else 0))
        return out

    def _parse(self, key: str, start: int, data: bytes | None) -> bool:
        """Take the events in `data` (read from `start`); False when the file is no longer what was read."""
        if data is None:
            return True
        parsed, _size = self._event_at.get(key, (0, 0))
        if parsed:
            if not data.startswith(b"\n"):
                return False
            data = data[1:]
        whole = data.rfind(b"\n") + 1  # whole lines: a line still being written is read again, whole
        self._event_at[key] = (parsed + whole, start + (1 if parsed else 0) + len(data))
        found = parse_events(data[:whole], where(self.storage, key))
        with self._state:
            self._new_events += sorted(found, key=lambda e: e.time)
        return True

    def drain(self) -> tuple[list[Event], bytes]:
        """The events and log output read since the last drain."""
        with self._state:
            events, output = self._new_events, b"".join(self._output)
            self._new_events, self._output = [], []
        return sorted(events, key=lambda e: e.time), output
