"""Follow a run through its run directory: new log output, exit records, heartbeat.

Only the run directory is read, so the same code follows a local process, a TPU VM, or a run whose submitting
runner died long ago (`runner logs RUN -f`).

A run directory that cannot be read says nothing about the run: following goes on, with backoff, saying so
(`Sight`), and the judgements that hang on what the run directory says are timed on a clock that stops meanwhile.
Only a bucket that no longer exists ends it (BucketMissing): nothing the run writes can land there any more.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any

from runner import contract
from runner.errors import BucketMissing, StorageError
from runner.storage import Storage
from runner.storage.parallel import read_many
from runner.watch.events import Event
from runner.watch.rundir import Snapshot
from runner.watch.view import RunDirView

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

    def wanted(self, sizes: dict[str, int]) -> list[tuple[str, int]]:
        """What to read, given the logs' sizes as listed: this log from its offset, if it grew."""
        return [(self.key, self.offset)] if sizes.get(self.key, 0) > self.offset else []

    def take(self, read: dict[str, bytes | None], *, flush: bool = False) -> bytes:
        """What was read of this log (a single log is passed on as it is, `flush` or not)."""
        data = read.get(self.key) or b""
        self.offset += len(data)
        return data

    def read_new(self, *, flush: bool = False) -> bytes:
        """What was written since the last read: one ranged read."""
        return self.take({self.key: self.run_dir.read_bytes(self.key, start=self.offset)}, flush=flush)


def prefix(worker: int) -> bytes:
    return f"[worker {worker}] ".encode()


class LogTails:
    """Every worker's log, each line prefixed with its worker ("[worker 2] ..."); a line still being written is held
    back until it is complete (or `flush`), so that the workers' lines never run into each other."""

    def __init__(self, run_dir: Storage, workers: int) -> None:
        self.run_dir = run_dir
        self.tails = [LogTail(run_dir, w) for w in range(workers)]
        self.partial = [b""] * workers

    def skip_existing(self) -> None:
        sizes = {o.key: o.size for o in self.run_dir.list(contract.LOGS_DIR + "/")}
        for tail in self.tails:
            tail.offset = sizes.get(tail.key, 0)

    def wanted(self, sizes: dict[str, int]) -> list[tuple[str, int]]:
        return [want for tail in self.tails for want in tail.wanted(sizes)]

    def take(self, read: dict[str, bytes | None], *, flush: bool = False) -> bytes:
        out = []
        for worker, tail in enumerate(self.tails):
            *lines, self.partial[worker] = (self.partial[worker] + tail.take(read)).split(b"\n")
            if flush and self.partial[worker]:
                lines.append(self.partial[worker])
                self.partial[worker] = b""
            out += [prefix(worker) + line + b"\n" for line in lines]
        return b"".join(out)

    def read_new(self, *, flush: bool = False) -> bytes:
        """What every log gained: one listing, then the logs that grew, at once, each from its offset."""
        sizes = {o.key: o.size for o in self.run_dir.list(contract.LOGS_DIR + "/")}
        wanted = self.wanted(sizes)
        read = read_many(self.run_dir, wanted)
        return self.take({key: data for (key, _), data in zip(wanted, read, strict=True)}, flush=flush)


def whole_logs(run_dir: Storage, workers: int) -> bytes:
    """Every worker's whole log, one after the other, each line prefixed with its worker."""
    return LogTails(run_dir, workers).read_new(flush=True)


def tail_for(run_dir: Storage, workers: int) -> LogTail | LogTails:
    """What to follow of a run: worker 0's log as it is on one host; every worker's, prefixed, on a slice."""
    return LogTails(run_dir, workers) if workers > 1 else LogTail(run_dir)


class _Judged(Exception):
    """`stop` said so while a poll was still reading."""


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
    view: RunDirView | None = None,
    last_read: bool = True,
) -> Snapshot:
    """Stream `worker`'s log (or what `tail` reads: every worker's, LogTails) until every worker has an exit
    record, `stop(snapshot)` says so, or the machine is gone (then one last read catches what it wrote before it
    went). Returns the last snapshot. `since`: see read_snapshot. `view`: the run directory as read so far (a
    caller that follows more than once, and reads the rest itself after: `last_read` False leaves what the end's
    poll did not read to it, runner.watch.view.RunDirView.drain).

    A poll starts every `interval_s`, or when the last one ends if it took longer; its exit records and heartbeats
    are judged as soon as they are read, while the logs and events it found new are read beside the next one.

    While the run directory cannot be read, `sight` says so and the reads back off; `stop` is asked about the last
    snapshot read only with `judge_blind` (a caller whose judgement rests on more than the run directory: the API,
    its own deadlines), and then also every `interval_s` while a poll is slow: those never wait on storage.
    BucketMissing ends it: the bucket is gone. A read that fails unexpectedly (not a StorageError: a fault of the
    runner's own reading) is said and tried again at the next poll; UNEXPECTED_IN_A_ROW such failures in a row are
    raised."""
    tail = tail or LogTail(run_dir, worker)
    view = view or RunDirView(run_dir, tail=tail, events=on_event is not None)
    view.since = since
    seen = seen_events if seen_events is not None else set()
    sight = sight or Sight(None, interval_s)
    last = Snapshot([], None, [], None)
    unexpected = 0

    def show() -> None:
        show_new(view, seen, on_event, on_output)

    def judge_while(future: Future[Any]) -> Any:
        """The future's result; meanwhile `stop` judges the last snapshot every interval (judge_blind)."""
        while True:
            try:
                return future.result(timeout=interval_s)
            except FutureTimeout:
                if judge_blind and stop is not None and stop(last):
                    raise _Judged from None

    reader = ThreadPoolExecutor(1, thread_name_prefix="follow-poll")
    streams = ThreadPoolExecutor(1, thread_name_prefix="follow-streams")
    streaming: Future[None] | None = None
    try:
        while True:
            began = time.monotonic()
            try:
                snapshot = judge_while(reader.submit(view.poll))
                if streaming is not None and streaming.done():
                    failed, streaming = streaming.exception(), None
                    # A StorageError: read again next time from where it stopped (this poll could read).
                    if failed is not None and (isinstance(failed, BucketMissing) or not _storage(failed)):
                        raise failed
                if streaming is None:
                    streaming = streams.submit(view.read_streams)
            except _Judged:
                return last
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
            show()
            last = snapshot
            done = len(snapshot.exits) >= num_workers or (stop is not None and stop(snapshot))
            if not done and machine_gone is not None and machine_gone():
                snapshot = _read_or(last, view.poll)
                done = True
            if done:
                if last_read:
                    _read_rest(view, streaming, sight)
                    show()
                return snapshot
            rest = interval_s - (time.monotonic() - began)
            if rest > 0 and streaming is not None:  # until the next poll: what the streams read is shown as it comes
                with contextlib.suppress(FutureTimeout, StorageError):
                    streaming.result(timeout=rest)
                show()
                time.sleep(max(0.0, interval_s - (time.monotonic() - began)))
    finally:
        reader.shutdown(wait=False)
        streams.shutdown(wait=False)


def show_new(
    view: RunDirView,
    seen: set[tuple[float, str, str]],
    on_event: Callable[[Event], None] | None,
    on_output: Callable[[bytes], None],
) -> None:
    """What `view` read and was not shown yet: its events not in `seen` (kept there), then its output."""
    events, output = view.drain()
    for event in events:
        key = (event.time, event.source, event.event)
        if on_event is not None and key not in seen:
            seen.add(key)
            on_event(event)
    if output:
        on_output(output)


def say_event(event: Event, say: Callable[[str], None]) -> None:
    """The machine's lifecycle events as they happen (the runner's own are already on screen)."""
    if event.source.startswith("runner"):
        return
    detail = ", ".join(f"{k} {v}" for k, v in event.fields.items() if k in ("exit_code", "state", "image", "host"))
    say(f"{event.source}: {event.event.replace('_', ' ')}" + (f" ({detail})" if detail else ""))


def _storage(exc: BaseException) -> bool:
    return isinstance(exc, StorageError)


def _read_rest(view: RunDirView, streaming: Future[None] | None, sight: Sight) -> None:
    """The last of the logs and events, if they can be read; what cannot be is still in the run directory."""
    try:
        if streaming is not None:
            streaming.result()
        view.poll()
        view.read_streams(flush=True)
    except BucketMissing:
        raise
    except StorageError as exc:
        sight.say(f"the end of the output could not be read ({exc.message}); `runner logs` shows it later")


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
