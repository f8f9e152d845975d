"""Follow a run through its run directory: new log output, exit records, heartbeat.

Only the run directory is read, so the same code follows a local process, a TPU VM, or a run whose submitting
runner died long ago (`runner logs RUN -f`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from runner import contract
from runner.storage import Storage
from runner.watch.events import Event, read_events
from runner.watch.rundir import Snapshot, read_snapshot


class LogTail:
    """Reads a worker's log from where it left off (a ranged read on Cloud Storage)."""

    def __init__(self, run_dir: Storage, worker: int = 0, offset: int = 0) -> None:
        self.run_dir = run_dir
        self.key = contract.log_key(worker)
        self.offset = offset

    def skip_existing(self) -> None:
        """Start after what the log holds now (a resumed run: its earlier attempts' output was shown then)."""
        sizes = {o.key: o.size for o in self.run_dir.list(contract.LOGS_DIR + "/")}
        self.offset = sizes.get(self.key, 0)

    def read_new(self, *, flush: bool = False) -> bytes:
        """What was written since the last read (`flush`: for LogTails' sake; a single log is passed on as it is)."""
        data = self.run_dir.read_bytes(self.key, start=self.offset) or b""
        self.offset += len(data)
        return data


def prefix(worker: int) -> bytes:
    return f"[worker {worker}] ".encode()


class LogTails:
    """Every worker's log, each line prefixed with its worker ("[worker 2] ..."); a line still being written is held
    back until it is complete (or `flush`), so that the workers' lines never run into each other."""

    def __init__(self, run_dir: Storage, workers: int) -> None:
        self.tails = [LogTail(run_dir, w) for w in range(workers)]
        self.partial = [b""] * workers

    def skip_existing(self) -> None:
        for tail in self.tails:
            tail.skip_existing()

    def read_new(self, *, flush: bool = False) -> bytes:
        out = []
        for worker, tail in enumerate(self.tails):
            *lines, self.partial[worker] = (self.partial[worker] + tail.read_new()).split(b"\n")
            if flush and self.partial[worker]:
                lines.append(self.partial[worker])
                self.partial[worker] = b""
            out += [prefix(worker) + line + b"\n" for line in lines]
        return b"".join(out)


def whole_logs(run_dir: Storage, workers: int) -> bytes:
    """Every worker's whole log, one after the other, each line prefixed with its worker."""
    return LogTails(run_dir, workers).read_new(flush=True)


def tail_for(run_dir: Storage, workers: int) -> LogTail | LogTails:
    """What to follow of a run: worker 0's log as it is on one host; every worker's, prefixed, on a slice."""
    return LogTails(run_dir, workers) if workers > 1 else LogTail(run_dir)


def follow(
    run_dir: Storage,
    on_output: Callable[[bytes], None],
    *,
    num_workers: int = 1,
    worker: int = 0,
    interval_s: float = 1.0,
    stop: Callable[[Snapshot], bool] | None = None,
    machine_gone: Callable[[], bool] | None = None,
    tail: LogTail | LogTails | None = None,
    on_event: Callable[[Event], None] | None = None,
    seen_events: set[tuple[float, str, str]] | None = None,
    since: float | None = None,
) -> Snapshot:
    """Stream `worker`'s log (or what `tail` reads: every worker's, LogTails) until every worker has an exit
    record, `stop(snapshot)` says so, or the machine is gone (then one last read catches what it wrote before it
    went). Returns the last snapshot. `since`: see read_snapshot."""
    tail = tail or LogTail(run_dir, worker)
    seen = seen_events if seen_events is not None else set()

    def new_events() -> None:
        if on_event is None:
            return
        for event in read_events(run_dir):
            key = (event.time, event.source, event.event)
            if key not in seen:
                seen.add(key)
                on_event(event)

    while True:
        new_events()
        chunk = tail.read_new()
        if chunk:
            on_output(chunk)
        snapshot = read_snapshot(run_dir, with_metrics=False, since=since)
        done = len(snapshot.exits) >= num_workers or (stop is not None and stop(snapshot))
        if not done and machine_gone is not None and machine_gone():
            snapshot = read_snapshot(run_dir, with_metrics=False, since=since)
            done = True
        if done:
            new_events()
            chunk = tail.read_new(flush=True)
            if chunk:
                on_output(chunk)
            return snapshot
        time.sleep(interval_s)
