"""Ctrl-C and SIGTERM during a run: an exception while running, and no interruption while tearing down.

While tearing down, a signal does not stop the teardown (a half-done delete is how TPUs get left running), but it
sets `hurry`: waits for a confirmation (a node that takes minutes to go) end early, after the delete request has
been sent, and say what may still be running and how to delete it.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

# Set by a signal during teardown: stop waiting for confirmations, never stop sending delete requests.
hurry = threading.Event()


class Interrupted(BaseException):
    """Not an Exception, as KeyboardInterrupt is not: the handlers that read on after a failed read (`except
    Exception`, the follow loop's) must not take a Ctrl-C for one. It lands wherever the main thread is, most often
    in the middle of a slow poll of the run directory, where it was once said as a read that failed and swallowed."""

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
    """During teardown a second Ctrl-C must not leave a machine behind: note it, hurry, and carry on."""

    def handler(signum: int, _frame: Any) -> None:
        if not hurry.is_set():
            say(
                f"{signal.Signals(signum).name} received: the delete requests still go out, then the runner stops "
                "waiting for their confirmation"
            )
        hurry.set()

    return _handled(handler)
