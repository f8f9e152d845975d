"""Time in the emulator: an agenda of transitions that are due at a time, and one thread that wakes it up.

The emulated cloud's state is a function of time. Every transition (a node becomes READY, a deletion ends) is put
on the Agenda with the time it is due, and is applied, in order, by whoever comes first once that time has come:
- a read: every API request and every admin or Python look at the state settles the agenda first, so what is
  read is exactly what elapsed time says, never late because a thread was slow;
- the Scheduler's thread, for the transitions marked `wake`: those with effects outside the API (VM processes
  booted or stopped, a queued resource's nodes created) happen on time even if nobody reads, as a real node boots
  whether or not anyone looks.
A transition applied late (by a read) runs with the agenda's clock set to its due time, so what it starts next is
due relative to when it should have happened, not to when it was noticed.
"""

from __future__ import annotations

import heapq
import itertools
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any, Protocol


class Scheduler:
    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._queue: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._stopped = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="tpu-emulator-scheduler", daemon=True)
        self._thread.start()

    def after(self, delay_s: float, fn: Callable[[], None]) -> None:
        with self._cv:
            if self._stopped:
                return
            heapq.heappush(self._queue, (time.monotonic() + max(0.0, delay_s), next(self._seq), fn))
            self._cv.notify()

    def clear(self) -> None:
        with self._cv:
            self._queue.clear()

    def stop(self) -> None:
        with self._cv:
            self._stopped = True
            self._queue.clear()
            self._cv.notify()
        if self._thread is not None:
            self._thread.join(10)

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._stopped and (not self._queue or self._queue[0][0] > time.monotonic()):
                    self._cv.wait(self._queue[0][0] - time.monotonic() if self._queue else None)
                if self._stopped:
                    return
                _, _, fn = heapq.heappop(self._queue)
            try:
                fn()
            except Exception:  # a bug in one transition must not stop the clock
                traceback.print_exc(file=sys.stderr)


class _Lock(Protocol):
    def __enter__(self) -> object: ...

    def __exit__(self, *args: Any) -> Any: ...


class Agenda:
    """Transitions due at a monotonic time; `settle` (called with `lock` held) applies every one that is due."""

    def __init__(self, scheduler: Scheduler, lock: _Lock) -> None:
        self._scheduler = scheduler
        self._lock = lock
        self._queue: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._applying: float | None = None  # the due time of the transition being applied
        self.paused = False  # set when the emulator stops: nothing happens any more
        self.held = False  # a test holds the clock (TpuEmulator.frozen): nothing falls due until it lets go

    def now(self) -> float:
        """The agenda's monotonic time: the due time of the transition being applied, else the clock's."""
        return self._applying if self._applying is not None else time.monotonic()

    def wall(self) -> float:
        """`now()` as epoch seconds, for the timestamps the API shows."""
        return time.time() - (time.monotonic() - self.now())

    def at(self, delay_s: float, fn: Callable[[], None], *, wake: bool = False) -> float:
        """Make `fn` due `delay_s` from now; with `wake` the scheduler applies it on time even if nobody reads."""
        due = self.now() + max(0.0, delay_s)
        heapq.heappush(self._queue, (due, next(self._seq), fn))
        if wake:
            self._scheduler.after(due - time.monotonic(), self.tick)
        return due

    def settle(self) -> None:
        """Apply, in order, every transition due by now (including ones that those make due)."""
        if self._applying is not None or self.paused or self.held:
            return  # a transition that reads state must not apply the ones after it
        now = time.monotonic()
        while self._queue and self._queue[0][0] <= now and not self.paused and not self.held:
            due, _, fn = heapq.heappop(self._queue)
            self._applying = due
            try:
                fn()
            except Exception:  # a bug in one transition must not stop the clock
                traceback.print_exc(file=sys.stderr)
            finally:
                self._applying = None

    def advance(self, seconds: float) -> None:
        """Let `seconds` pass for what is on the agenda: every transition due within them is due now, in order, and
        the rest that much sooner (a maxRunDuration of hours, rehearsed in seconds). The caller holds the lock."""
        self._queue = [(due - seconds, seq, fn) for due, seq, fn in self._queue]
        heapq.heapify(self._queue)
        self._scheduler.after(0.0, self.tick)
        for due, _, _ in self._queue:
            self._scheduler.after(due - time.monotonic(), self.tick)

    def tick(self) -> None:
        with self._lock:
            self.settle()

    def clear(self) -> None:
        self._queue.clear()
