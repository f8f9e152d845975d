"""Ctrl-C and SIGTERM during a run: an exception while running, and no interruption while tearing down."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


class Interrupted(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextmanager
def _handled(handler: Callable[[int, Any], None]) -> Iterator[None]:
    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def signals_raise() -> contextlib.AbstractContextManager[None]:
    """SIGINT and SIGTERM raise Interrupted in the main thread (SIGTERM would otherwise kill us without cleanup)."""

    def handler(signum: int, _frame: Any) -> None:
        raise Interrupted(signum)

    return _handled(handler)


def signals_deferred(say: Callable[[str], None] = print) -> contextlib.AbstractContextManager[None]:
    """During teardown a second Ctrl-C must not leave a machine behind: note it and carry on."""

    def handler(signum: int, _frame: Any) -> None:
        say(f"{signal.Signals(signum).name} received; still tearing down, so nothing is left running")

    return _handled(handler)
