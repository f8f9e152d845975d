"""What a run cost on Cloud TPU, from its events. A node bills while it is READY, idle or not.

Each node a run created (or attached to) is one billable span, per attempt: a preempted node and the node that
replaced it are two spans. A span starts when the node turned READY: by the API's own clock when the runner read it
from the create operation (the `provisioned` event's `ready_at`), else at that event (the runner polls,
so READY may have come a poll earlier). It ends at the first of

    preempted                               the runner found it PREEMPTED or gone: a preempted node bills no more
    teardown_requested, delete_requested,   someone asked for its deletion (the runner, its own startup script,
    down_requested                          `runner down`): the node leaves READY for DELETING

and its deletion is `confirmed` when a teardown_done / down_done with confirmed true follows. A `delete_failed`
after a request means the deletion did not happen (its operation failed, the node is READY again): the span goes
on, and from then on only the runner's (or `runner down`'s) requests end it: a VM's own request, whose outcome
nobody read, is no evidence against a refusal already seen. A node the run kept (teardown_skipped:
teardown.policy) or one the events never show going is counted up to `now` and marked open: as far as the run
directory says, it still bills. A node preempted while it booted was never READY: no span.

The events come from several machines whose clocks need not agree: the caller puts them on one clock first
(runner.watch.events.read_events(one_clock=True)). A span is clamped to what can be: never negative, never past `now`.

cost = chips x hours x the catalog's list price per chip-hour (Spot or on-demand; a reservation is billed on its own
terms, so its figure is the on-demand list price, and says so). Pure: events in, numbers out; no clock read here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from runner.plan.budget import duration, money
from runner.watch.events import Event

_CLOSE_REQUEST = ("teardown_requested", "delete_requested", "down_requested")
_CONFIRM = ("teardown_done", "down_done")
_FAILED = "delete_failed"  # a deletion that did not happen: the node bills on


@dataclass(frozen=True)
class Price:
    """The list price of one accelerator type, as the catalog has it."""

    accelerator: str
    chips: int
    spot: bool
    reserved: bool
    per_chip_hour: float  # USD
    read_on: str = ""

    @property
    def per_hour(self) -> float:
        return self.chips * self.per_chip_hour

    @property
    def kind(self) -> str:
        return "Spot" if self.spot else "reserved (on-demand list price)" if self.reserved else "on-demand"

    def to_json(self) -> dict[str, Any]:
        return {
            "accelerator": self.accelerator,
            "chips": self.chips,
            "spot": self.spot,
            "reserved": self.reserved,
            "usd_per_chip_hour": self.per_chip_hour,
            "usd_per_hour": round(self.per_hour, 4),
            "prices_read_on": self.read_on,
        }


def price_for(accelerator_type: str, *, spot: bool, reserved: bool = False, slices: int = 1) -> Price | None:
    """The catalog's price of a type (`slices` of it: a multislice bills every slice), or None for a type it does
    not know (a run directory from elsewhere) or has no list price of (unpriced(): never a $0 figure)."""
    from runner.plan import catalog

    try:
        accel = catalog.accelerator(accelerator_type)
    except catalog.CatalogError:
        return None
    g = accel.generation
    if not g.priced:
        return None
    return Price(
        accelerator=accel.name if slices == 1 else f"{slices} x {accel.name}",
        chips=accel.chips * slices,
        spot=spot,
        reserved=reserved,
        per_chip_hour=g.spot_price if spot else g.on_demand_price,
        read_on=catalog.prices_info()["read_on"],
    )


def unpriced(accelerator_type: str) -> str | None:
    """The generation's title when the catalog knows the type but has no list price of it (TPU7x), else None."""
    from runner.plan import catalog

    try:
        generation = catalog.accelerator(accelerator_type).generation
    except catalog.CatalogError:
        return None
    return None if generation.priced else generation.title


@dataclass(frozen=True)
class Span:
    """One node, READY from `start` to `end` (seconds since the epoch)."""

    node: str
    start: float
    end: float
    ended_by: str  # preempted | delete requested | kept (teardown.policy) | still READY
    confirmed: bool = False  # its deletion was confirmed (the node is gone)
    open: bool = False  # no end in the events: counted up to `now`
    attached: bool = False  # an existing node: it bills before and after this run too

    @property
    def seconds(self) -> float:
        return max(0.0, self.end - self.start)

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "ready_at": self.start,
            "until": self.end,
            "seconds": round(self.seconds, 3),
            "ended_by": self.ended_by,
            "deletion_confirmed": self.confirmed,
            "open": self.open,
            "attached": self.attached,
        }


def _node_name(event: Event) -> str:
    """The machine a provisioned event names: in its handle (a node's id, an instance's or group's name), or how its
    backend described it."""
    handle = event.fields.get("handle")
    if isinstance(handle, dict):
        name = handle.get("node_id") or handle.get("name") or handle.get("container_name") or handle.get("pid")
        if name is not None:
            return str(name)
    machine = event.fields.get("machine")
    return str(machine) if machine else "?"


def _attached(event: Event) -> bool:
    """An existing machine the run attached to (the event says so; a handle written before it did: created false)."""
    if isinstance(attached := event.fields.get("attached"), bool):
        return attached
    handle = event.fields.get("handle")
    return isinstance(handle, dict) and handle.get("created") is False


def _ready_at(event: Event) -> float:
    """When the node turned READY: the API's own time of it, if the provisioned event carries one that can be, else
    the provisioned event's."""
    stamp = event.fields.get("ready_at")
    if isinstance(stamp, int | float) and not isinstance(stamp, bool) and event.time - 3600 <= stamp <= event.time + 60:
        return float(stamp)
    return event.time


def node_spans(events: Sequence[Event], *, now: float) -> list[Span]:
    """Every READY span in time order. `events` may come in any order (on one clock); the runner's, the startup
    scripts' and `runner down`'s all count."""
    spans: list[Span] = []
    current: Event | None = None  # the provisioned event of the node READY now
    ended: Event | None = None  # the provisioned event of the span just closed by a request, until confirmed
    kept = False
    refused = False  # a deletion of the current node failed: a VM's own request (its outcome unknown) ends nothing
    taken: Event | None = None  # the provisioned event of the span a preemption just closed

    def span(provisioned: Event, end: float, ended_by: str, confirmed: bool = False, open: bool = False) -> Span:
        start = min(_ready_at(provisioned), now)
        return Span(
            _node_name(provisioned),
            start,
            min(max(end, start), max(now, start)),
            ended_by,
            confirmed,
            open,
            _attached(provisioned),
        )

    for event in sorted(events, key=lambda e: e.time):
        kind = event.event
        if kind == "provisioned" and event.source == "runner":
            if current is not None:  # a new node with no end seen for the last: it went when this one came
                spans.append(span(current, event.time, "replaced"))
            current, ended, kept, refused, taken = event, None, False, False, None
        elif current is not None and kind == "preempted" and event.source == "runner":
            spans.append(span(current, event.time, "preempted"))
            current, ended, taken = None, None, current
        elif kind == "restarted" and event.source == "runner" and taken is not None and spans:
            # The platform restarted the job on the machines it has (a JobSet on its node pool): they never stopped
            # billing (a preempted node's replacement is counted from the preemption: an upper bound).
            spans.pop()
            current, taken = taken, None
        elif current is not None and kind in _CLOSE_REQUEST and not (refused and not event.source.startswith("runner")):
            # the runner stopped an attached node's job; that node was never this run's to delete
            spans.append(span(current, event.time, "job stopped" if _attached(current) else "delete requested"))
            current, ended = None, current
        elif current is not None and kind == "teardown_skipped":
            kept = True
        elif ended is not None and kind == _FAILED:
            spans.pop()  # the deletion did not happen: the node is READY again, billing
            current, ended, refused = ended, None, True
        elif ended is not None and kind in _CONFIRM and event.fields.get("confirmed") is True:
            last = spans[-1]
            spans[-1] = Span(last.node, last.start, last.end, "deleted", True, attached=last.attached)
            ended = None
    if current is not None:
        spans.append(span(current, now, "kept (teardown.policy)" if kept else "still READY", open=True))
    return spans


@dataclass(frozen=True)
class RunCost:
    price: Price
    spans: tuple[Span, ...]
    preemptions: int
    budget: float | None = None

    @property
    def seconds(self) -> float:
        return sum(s.seconds for s in self.spans)

    @property
    def chip_hours(self) -> float:
        return self.price.chips * self.seconds / 3600

    @property
    def usd(self) -> float:
        return self.chip_hours * self.price.per_chip_hour

    @property
    def open(self) -> bool:
        return any(s.open for s in self.spans)

    def text(self) -> str:
        """One line: the figure, and how it was reached."""
        nodes = len(self.spans)
        what = (
            f"{self.price.accelerator} {self.price.kind}, {money(self.price.per_hour)}/h x "
            f"{duration(self.seconds)} READY on {nodes} node{'s' if nodes != 1 else ''}"
        )
        if self.preemptions:
            what += f", {self.preemptions} preemption{'s' if self.preemptions != 1 else ''}"
        parts = [f"{money(self.usd)}{' so far' if self.open else ''}  ({what})"]
        if self.budget is not None:
            parts.append(f"of budget {money(self.budget)}")
        if any(s.ended_by.startswith("kept") for s in self.spans):
            parts.append("a node was kept (teardown.policy): it bills until deleted")
        if any(s.attached for s in self.spans):
            parts.append("attached node: billed outside this run too")
        return "; ".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {
            "usd": round(self.usd, 6),
            "chip_hours": round(self.chip_hours, 6),
            "ready_seconds": round(self.seconds, 3),
            "open": self.open,
            "preemptions": self.preemptions,
            "budget_usd": self.budget,
            "price": self.price.to_json(),
            "nodes": [s.to_json() for s in self.spans],
        }


def run_cost(events: Sequence[Event], price: Price, *, now: float, budget: float | None = None) -> RunCost:
    """What the run cost: every node's READY seconds x the price."""
    preemptions = sum(1 for e in events if e.event == "preempted" and e.source == "runner")
    return RunCost(price, tuple(node_spans(events, now=now)), preemptions, budget)
