"""One run's facts beyond its state, read back from its run directory: what it cost, how long it took to start,
its phases, its checkpoints. `runner status`, `runner list`, the end of `runner submit` and `runner report` all read
them here, so the four never disagree.

Everything is read tolerantly: a run directory written by another version, or by user code, costs a warning naming
the file, never a traceback.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from runner import contract
from runner.collect.cost import Price, RunCost, price_for, run_cost
from runner.collect.timeline import Startup, Timeline, build_timeline, startup
from runner.storage import Storage
from runner.watch.events import Event, read_events
from runner.watch.rundir import Snapshot, json_kind, loads, number, read_snapshot, where
from runner.watch.runs import RunRecord


@dataclass(frozen=True)
class CheckpointInfo:
    """One entry of checkpoints/latest.json, as far as it can be read."""

    file: str
    epochs_done: int | None
    step: int | None
    global_step: int | None
    size: int | None
    time: float | None

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _int(value: Any) -> int | None:
    as_float = number(value)
    return int(as_float) if as_float is not None and as_float.is_integer() else None


def read_checkpoints(storage: Storage, problems: list[str]) -> list[CheckpointInfo]:
    """The kept checkpoints, newest first, from the manifest the trainer writes (format 1 or 2)."""
    raw = storage.read_bytes(contract.LATEST_CHECKPOINT)
    if raw is None:
        return []
    try:
        doc = loads(raw)
        if not isinstance(doc, dict):
            raise ValueError(f"a JSON {json_kind(doc)}, not an object")
    except ValueError as exc:
        problems.append(f"{where(storage, contract.LATEST_CHECKPOINT)} is corrupt: {exc}")
        return []
    entries = doc.get("checkpoints")
    if not isinstance(entries, list):  # format 1: the newest only
        entries = [{"file": doc.get("path"), "epochs_done": doc.get("epoch"), "time": doc.get("time")}]
    out = []
    for entry in entries:
        if isinstance(entry, dict) and isinstance(entry.get("file"), str):
            out.append(
                CheckpointInfo(
                    file=entry["file"],
                    epochs_done=_int(entry.get("epochs_done")),
                    step=_int(entry.get("step")),
                    global_step=_int(entry.get("global_step")),
                    size=_int(entry.get("size")),
                    time=number(entry.get("time")),
                )
            )
    return out


def read_spec(storage: Storage, problems: list[str]) -> dict[str, Any]:
    """spec.yaml as plain data ({} when missing). Not validated as a JobSpec: a run directory from another version
    of the runner may hold fields this one does not know, and only a few of them are read here."""
    import yaml

    raw = storage.read_bytes(contract.SPEC)
    if raw is None:
        return {}
    try:
        data = yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        problems.append(f"{where(storage, contract.SPEC)} is corrupt: {str(exc).splitlines()[0]}")
        return {}
    return data if isinstance(data, dict) else {}


def spec_price(spec: dict[str, Any]) -> Price | None:
    """The price of the spec's accelerator, or None when the spec does not say one the catalog knows."""
    acc = spec.get("accelerator")
    if not isinstance(acc, dict) or not isinstance(acc.get("type"), str):
        return None
    slices = acc.get("slices")
    return price_for(
        acc["type"],
        spot=acc.get("spot") is True,
        reserved=acc.get("reserved") is True,
        slices=slices if isinstance(slices, int) and slices > 1 else 1,
    )


@dataclass(frozen=True)
class RunFacts:
    record: RunRecord
    spec: dict[str, Any]
    events: list[Event]
    snapshot: Snapshot
    cost: RunCost | None  # None: no TPU (a local run), or a type the catalog does not know
    startup: Startup
    timeline: Timeline
    checkpoints: list[CheckpointInfo] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def budget(self) -> float | None:
        return number(self.spec.get("budget"))

    def cost_text(self) -> str:
        if self.cost is not None:
            return self.cost.text()
        if self.record.backend == "local":
            return "$0: a local run pays for no TPU"
        return "unknown: the run's accelerator type is not in this runner's catalog"

    def cost_cell(self) -> str:
        """The cost for a table column: '$0.02' ('+': a node still bills), '$0' for a local run, '-' unknown."""
        from runner.plan.budget import money

        if self.cost is None:
            return "$0" if self.record.backend == "local" else "-"
        return money(self.cost.usd) + ("+" if self.still_billing else "")

    @property
    def still_billing(self) -> bool:
        """A node may still bill: the events say one is READY, or this machine's record says a deletion failed."""
        return bool(self.record.still_billing) or (self.cost is not None and self.cost.open)

    def rows(self) -> list[tuple[str, str]]:
        """The rows `runner status` and the end of `runner submit` add to the summary."""
        rows = [("cost", self.cost_text())]
        if self.record.still_billing:
            rows.append(("billing", self.record.still_billing))
        if self.events:
            rows.append(("startup", self.startup.text()))
        return rows

    def to_json(self) -> dict[str, Any]:
        return {
            "cost": self.cost.to_json() if self.cost is not None else None,
            "startup": self.startup.to_json(),
            "timeline": self.timeline.to_json(),
            "checkpoints": [c.to_json() for c in self.checkpoints],
        }


def _created_at(record: RunRecord, events: list[Event]) -> float:
    """When the run was planned, on the events' clock (moved as the runner's own events were)."""
    runner = next((e for e in events if e.source == "runner"), None)
    return record.created_at - (runner.clock_offset if runner is not None else 0.0)


def gather(
    record: RunRecord,
    storage: Storage,
    *,
    snapshot: Snapshot | None = None,
    events: list[Event] | None = None,
    now: float | None = None,
    checkpoints: bool = False,
) -> RunFacts:
    """Everything the run directory says of the run's cost and phases. Pass what the caller has read already
    (`snapshot`, `events`: read with one_clock, see read_events); `checkpoints` reads checkpoints/latest.json too."""
    warnings: list[str] = []
    if snapshot is None:
        snapshot = read_snapshot(storage)
        warnings += snapshot.problems
    if events is None:  # the machines' clocks need not agree: everything measured here is on the storage's
        events = read_events(storage, warnings, one_clock=True)
    spec = read_spec(storage, warnings)
    now = time.time() if now is None else now
    price = spec_price(spec) if record.backend != "local" else None
    cost = None if price is None else run_cost(events, price, now=now, budget=number(spec.get("budget")))
    return RunFacts(
        record=record,
        spec=spec,
        events=events,
        snapshot=snapshot,
        cost=cost,
        startup=startup(events, snapshot.metrics, backend=record.backend),
        timeline=build_timeline(events, snapshot.metrics, created_at=_created_at(record, events)),
        checkpoints=read_checkpoints(storage, warnings) if checkpoints else [],
        warnings=warnings,
    )
