"""One thread that runs callbacks at their time: the emulator's state machine ticks through it."""

from __future__ import annotations

import heapq
import itertools
import sys
import threading
import time
import traceback
from collections.abc import Callable


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
