"""Forker: one long-lived thread that runs what forks the rehearsal's processes. The control plane's components die
with the thread that started them (PR_SET_PDEATHSIG, so that none outlives a crashed test session), so an API
server restarted from a short-lived thread (a fault case's hook, a test's helper thread) would end with it.

    forker = Forker()
    away_s = forker.run(kube.cluster.restart_apiserver)
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class Forker:
    def __init__(self) -> None:
        self._jobs: queue.Queue[tuple[Callable[[], Any], threading.Event, list[Any]] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._serve, name="kube-forker", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while (job := self._jobs.get()) is not None:
            step, done, out = job
            try:
                out.append(step())
            except BaseException as exc:
                out.append(exc)
            done.set()

    def run(self, step: Callable[[], T], timeout_s: float = 240.0) -> T:
        """`step()` on the forker's thread; its answer, or what it raised."""
        done, out = threading.Event(), []  # type: ignore[var-annotated]
        self._jobs.put((step, done, out))
        if not done.wait(timeout_s):
            raise TimeoutError(f"the forker's step did not end in {timeout_s:.0f}s")
        if isinstance(out[0], BaseException):
            raise out[0]
        return out[0]

    def stop(self) -> None:
        self._jobs.put(None)
