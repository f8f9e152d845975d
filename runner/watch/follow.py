"""Follow a run through its run directory: new log output, exit records, heartbeat.

Only the run directory is read, so the same code follows a local process, a TPU VM, or a run whose submitting
runner died long ago (`runner logs RUN -f`).

A run directory that cannot be read says nothing about the run: following goes on, with backoff, saying so
(`Sight`), and the judgements that hang on what the run directory says are timed on a clock that stops meanwhile.
Only a bucket that no longer exists ends it (BucketMissing): nothing the run writes can land there any more.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from runner import contract
from runner.errors import BucketMissing, StorageError
from runner.storage import Storage
from runner.watch.events import Event, read_events
from runner.watch.rundir import Snapshot, read_snapshot

# Between reads of a run directory that cannot be read: doubling from the follow interval up to this.
MAX_BACKOFF_S = 30.0
REMIND_S = 60.0  # how often "still cannot read" is said while it lasts
# A read that fails with an error no storage raises is a fault of this runner's reading, met while a job rewrites
# what it reads: said, and read again at the next poll; this many in a row, and it is raised to the caller.
UNEXPECTED_IN_A_ROW = 3


class Sight:
    """Whether the run directory can be read now, said when that changes; and `clock()`, a monotonic clock that
    stands still while it cannot, for durations judged from what the run directory shows (a silent boot, a
    heartbeat that stopped changing): time spent blind is no evidence of anything."""

    def __init__(self, say: Callable[[str], None] | None, interval_s: float) -> None:
        self.say = say or (lambda _text: None)
        self.interval_s = interval_s
        self.lost_at: float | None = None  # time.monotonic() when the run directory went out of sight
        self.blind_s = 0.0  # seconds out of sight before that
        self._backoff = interval_s
        self._said_at = 0.0

    @property
    def blind(self) -> bool:
        return self.lost_at is not None

    def clock(self) -> float:
        now = time.monotonic()
        return now - self.blind_s - (now - self.lost_at if self.lost_at is not None else 0.0)

    def lost(self, exc: StorageError) -> float:
        """The run directory could not be read: says so (once, then every REMIND_S), returns how long to wait."""
        now = time.monotonic()
        if self.lost_at is None:
            self.lost_at, self._backoff, self._said_at = now, self.interval_s, now
            self.say(
                f"cannot read the run directory: {exc.message}. The run's state is unknown, not over: the job is "
                f"left alone, and the run directory read again every {self.interval_s:g}s to {MAX_BACKOFF_S:g}s"
            )
        else:
            self._backoff = min(self._backoff * 2, MAX_BACKOFF_S)
            if now - self._said_at >= REMIND_S:
                self._said_at = now
                self.say(f"the run directory still cannot be read ({now - self.lost_at:.0f}s): {exc.message}")
        return self._backoff

    def back(self) -> None:
        if self.lost_at is not None:
            away = time.monotonic() - self.lost_at
            self.blind_s += away
            self.lost_at = None
            self.say(f"the run directory can be read again (after {away:.0f}s)")


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
    sight: Sight | None = None,
    judge_blind: bool = False,
) -> Snapshot:
    """Stream `worker`'s log (or what `tail` reads: every worker's, LogTails) until every worker has an exit
    record, `stop(snapshot)` says so, or the machine is gone (then one last read catches what it wrote before it
    went). Returns the last snapshot. `since`: see read_snapshot.

    While the run directory cannot be read, `sight` says so and the reads back off; `stop` is asked about the last
    snapshot read only with `judge_blind` (a caller whose judgement rests on more than the run directory: the API,
    its own deadlines). BucketMissing ends it: the bucket is gone. A read that fails unexpectedly (not a
    StorageError: a fault of the runner's own reading) is said and tried again at the next poll; UNEXPECTED_IN_A_ROW
    such failures in a row are raised."""
    tail = tail or LogTail(run_dir, worker)
    seen = seen_events if seen_events is not None else set()
    sight = sight or Sight(None, interval_s)
    last = Snapshot([], None, [], None)
    unexpected = 0

    def new_events() -> None:
        if on_event is None:
            return
        for event in read_events(run_dir):
            key = (event.time, event.source, event.event)
            if key not in seen:
                seen.add(key)
                on_event(event)

    while True:
        try:
            new_events()
            chunk = tail.read_new()
            if chunk:
                on_output(chunk)
            snapshot = read_snapshot(run_dir, with_metrics=False, since=since)
        except BucketMissing:
            raise
        except StorageError as exc:
            wait = sight.lost(exc)
            if judge_blind and stop is not None and stop(last):
                return last
            time.sleep(wait)
            continue
        except Exception as exc:
            unexpected += 1
            if unexpected >= UNEXPECTED_IN_A_ROW:
                raise
            sight.say(f"warning: reading the run directory failed ({fault(exc)}); reading it again")
            time.sleep(interval_s)
            continue
        unexpected = 0
        sight.back()
        last = snapshot
        done = len(snapshot.exits) >= num_workers or (stop is not None and stop(snapshot))
        if not done and machine_gone is not None and machine_gone():
            snapshot = _read_or(last, lambda: read_snapshot(run_dir, with_metrics=False, since=since))
            done = True
        if done:
            try:  # the last of it, if it can be read; what cannot be is still in the run directory
                new_events()
                chunk = tail.read_new(flush=True)
                if chunk:
                    on_output(chunk)
            except BucketMissing:
                raise
            except StorageError as exc:
                sight.say(f"the end of the output could not be read ({exc.message}); `runner logs` shows it later")
            return snapshot
        time.sleep(interval_s)


def _read_or(fallback: Snapshot, read: Callable[[], Snapshot]) -> Snapshot:
    try:
        return read()
    except BucketMissing:
        raise
    except StorageError:
        return fallback


def fault(exc: BaseException) -> str:
    """'FileNotFoundError: [Errno 2] ... (local.py:97)': an unexpected error, and where it was raised."""
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    where = f" ({Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}: {str(exc)[:300]}{where}"
