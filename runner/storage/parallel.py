"""Many requests to one storage at once, in a small bounded pool.

A pod slice's run directory holds a few objects per host, and a reader that needs many of them (a poll of what
changed, `runner status`, the deletes before a recreate) waited on each in turn: against Cloud Storage's round trip
(about 40 ms) hundreds of them took longer than a poll's interval. Each request is I/O, so THREADS in flight cover
the round trip; the storage client's connection pool holds 10 (requests' default: more would open and throw away a
connection each), and one bucket takes thousands of requests a second. A local directory is read in turn: its reads
do not wait on a network.

`urgent` requests go before the others waiting: a follower reads the exit records it decides on before the logs it
only shows.
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

from runner.storage import ObjectInfo, Storage

THREADS = 8
_NAME = "runner-storage"

T = TypeVar("T")
R = TypeVar("R")


class _Pool:
    """THREADS daemon threads taking calls by priority, then in order (a daemon: a process that ends does not
    wait for a read it no longer needs)."""

    def __init__(self, threads: int) -> None:
        self._queue: queue.PriorityQueue[tuple[int, int, Callable[[], Any], Future[Any]]] = queue.PriorityQueue()
        self._order = itertools.count()
        self._threads = threads
        self._started = False
        self._lock = threading.Lock()

    def submit(self, call: Callable[[], R], *, urgent: bool) -> Future[R]:
        with self._lock:
            if not self._started:
                for n in range(self._threads):
                    threading.Thread(target=self._work, name=f"{_NAME}-{n}", daemon=True).start()
                self._started = True
        future: Future[R] = Future()
        self._queue.put((0 if urgent else 1, next(self._order), call, future))
        return future

    def _work(self) -> None:
        while True:
            _priority, _n, call, future = self._queue.get()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(call())
            except BaseException as exc:  # handed to the caller, which raises it
                future.set_exception(exc)


_pool = _Pool(THREADS)


def each(storage: Storage, call: Callable[[T], R], items: Sequence[T], *, urgent: bool = False) -> list[R]:
    """`call` on every item, in the pool when storage is remote; the results in the items' order. The first error
    raised (a StorageError) is raised here, once every call has ended."""
    nested = threading.current_thread().name.startswith(_NAME)  # a call in the pool must not wait on the pool
    if storage.is_local or len(items) <= 1 or nested:
        return [call(item) for item in items]
    futures = [_pool.submit(lambda item=item: call(item), urgent=urgent) for item in items]  # type: ignore[misc]
    errors = [exc for f in futures if (exc := f.exception()) is not None]
    if errors:
        raise errors[0]
    return [f.result() for f in futures]


def read_many(storage: Storage, wanted: Sequence[tuple[str, int]], *, urgent: bool = False) -> list[bytes | None]:
    """Each (key, start): the object's bytes from `start`, or None when it does not exist."""
    return each(storage, lambda item: storage.read_bytes(item[0], start=item[1]), wanted, urgent=urgent)


def list_many(storage: Storage, prefixes: Sequence[str], *, urgent: bool = False) -> list[list[ObjectInfo]]:
    """Each prefix's listing."""
    return each(storage, storage.list, prefixes, urgent=urgent)


def delete_many(storage: Storage, keys: Sequence[str]) -> None:
    each(storage, storage.delete, keys)
