"""Deleting a cloud machine and confirming it is gone, the same way for every cloud backend.

The delete is requested, its operation read for its outcome, and the resource read until it is gone. A failed
delete operation is requested again (up to `retries`) when the failure is transient, else reported at once. What is
found being deleted by someone else's request (its VM's own) is watched, and deleted again if that deletion fails
and it comes back. A second interrupt (runner.interrupts.hurry) ends the wait, never the request.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from runner.errors import BackendError
from runner.interrupts import hurry


@dataclass(frozen=True)
class OpResult:
    """A delete operation as last read: done or not, and its failure explained (None while it is fine)."""

    done: bool
    error: BackendError | None = None
    transient: bool = False  # a failure worth asking again for (INTERNAL, UNAVAILABLE ...)
    code: str = ""


@dataclass(frozen=True)
class Deletion:
    """One resource to delete, as its backend reads and deletes it."""

    what: str  # "TPU node N", "instance group G (and its 2 VMs)"
    zone: str
    hint: str  # how to delete it by hand
    check: str  # how to look at it by hand
    read_state: Callable[[], str | None]  # its state as the API names it; None once it is gone
    request: Callable[[], str | None]  # send the delete: its operation, or None when it was gone already
    outcome: Callable[[str], OpResult]  # read an operation
    going: tuple[str, ...] = ("DELETING",)  # states that mean a deletion is under way


def delete_and_confirm(
    d: Deletion,
    *,
    say: Callable[[str], None],
    poll_s: float,
    wait_s: float,
    retries: int,
    announce: bool,
) -> bool:
    """True once `d` is confirmed gone; False when it is still there after wait_s, or a second interrupt cut the wait
    short, after saying what is left and how to delete it. BackendError when its deletion failed for good."""
    t0 = time.monotonic()
    operation: str | None = None
    attempts = 0
    announced = False
    while True:
        state = d.read_state()
        if state is None:
            break
        if operation is None and state not in d.going:
            if attempts > retries:
                raise BackendError(f"{d.what} came back {state} after {attempts} deletion(s)", hint=d.hint)
            attempts += 1
            operation = d.request()
            if announce and not announced:
                say(f"deleting {d.what}")
                announced = True
        elif operation is None and not announced:
            say(f"{d.what} is being deleted already")
            announced = True
        if operation is not None:
            result = d.outcome(operation)
            if result.error is not None:
                if not result.transient or attempts > retries:
                    raise BackendError(f"{result.error.message}; it is still there", hint=d.hint) from result.error
                say(f"deleting {d.what} failed ({result.code}); asking again")
                operation = None  # the next round asks again, once it is out of its deletion
            elif result.done:
                operation = None  # the API says deleted; the read confirms it
        waited = time.monotonic() - t0
        if hurry.is_set() or waited > wait_s:
            why = "stopped waiting" if hurry.is_set() else f"still there after {waited:.0f}s"
            say(
                f"{why}: {d.what} in {d.zone} is being deleted but may still bill until it is gone. "
                f"Check: {d.check}; {d.hint} (or `runner gc`)"
            )
            return False
        time.sleep(min(poll_s, 2.0))
    if announce:
        say(f"{d.what} is gone ({time.monotonic() - t0:.0f}s)")
    return True
