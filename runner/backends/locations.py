"""Creating a machine in the first location that has capacity, the same way for every cloud backend that creates one
outright (a TPU node, a Compute Engine instance or slice in a zone): the locations the spec allows, in order, a
stockout moves to the next, and with retries.capacity_wait they are tried again, backing off, until it has passed.
Quota, permission and request errors stop at once: no other location fixes those. A name another run holds gets a
new name, never a delete.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from runner.backends.labels import NameTaken
from runner.errors import AlreadyExists, NoCapacity

H = TypeVar("H")
MAX_BACKOFF_S = 60.0


def first_with_capacity(
    locations: tuple[str, ...],
    create: Callable[[str, str], H],
    *,
    name: str,
    what: str,
    kind: str,
    capacity_wait_s: float,
    backoff_s: float,
    say: Callable[[str], None],
) -> H:
    """create(location, name) in each location in turn until one has capacity (NoCapacity moves on); `what` names
    the accelerator in messages, `kind` the machine (node, instance); NameTaken gives it another name, once."""
    give_up_at = time.monotonic() + capacity_wait_s
    backoff = backoff_s
    last: NoCapacity | None = None
    while True:
        for location in locations:
            try:
                try:
                    return create(location, name)
                except NameTaken as taken:
                    say(f"{taken}: this run's {kind} is named {taken.new_id} instead")
                    name = taken.new_id
                    return create(location, name)
            except NameTaken as taken:
                raise AlreadyExists(f"{taken}, and so does the new name", hint="submit again") from None
            except NoCapacity as exc:
                last = exc
            if time.monotonic() + backoff > give_up_at and location == locations[-1]:
                raise NoCapacity(f"no capacity for {what} in {', '.join(locations)}", hint=last.hint) from last
            say(f"{location}: no capacity for {what}; next attempt in {backoff:.0f}s")
            time.sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF_S)
