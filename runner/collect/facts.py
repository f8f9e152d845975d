"""One run's facts beyond its state, read back from its run directory: its metrics and summary, what it cost, how
long it took to start, its phases, its checkpoints. `runner status`, `runner list`, the end of `runner submit` and
`runner report` all read them here, so the four never disagree.

A `command` job may write no metrics.jsonl, progress.json or summary.json. Its metrics are then Keras' epoch lines
in logs/worker-0.log (runner.watch.keraslog), and so is where an epoch in progress stands; a finished run without
a summary.json gets the one its metrics and log give (runner.watch.results, what the supervisor writes at the
job's end). Its checkpoints are what it wrote under checkpoints/, each read by its format (runner.checkpoints:
the runner's own with what its manifest says of them, Orbax steps, TensorFlow saves, a backup, any other files).

Everything is read tolerantly: a run directory written by another version, or by user code, costs a warning naming
the file, never a traceback.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from runner import backends, contract
from runner.checkpoints import Listing, Saved, survey
from runner.checkpoints.resumed import Resumed, latest
from runner.collect.cost import Price, RunCost, node_spans, price_for, run_cost, unpriced
from runner.collect.goodput import Goodput
from runner.collect.goodput import compute as compute_goodput
from runner.collect.timeline import Startup, Timeline, build_timeline, startup
from runner.storage import Storage
from runner.watch.events import Event, read_events
from runner.watch.keraslog import KerasLog, parse_keras_log
from runner.watch.logtext import clean_log
from runner.watch.results import LOG_TAIL_BYTES, derive_summary
from runner.watch.rundir import Progress, Snapshot, Summary, number, read_snapshot, where
from runner.watch.runs import RunRecord


@dataclass(frozen=True)
class CheckpointInfo:
    """One committed checkpoint under checkpoints/, as its format reads it (runner.checkpoints): its path (a file, a
    directory, a TensorFlow prefix), its format, the training step it holds when its format says (Orbax's step, the
    runner's manifest's global step), and for the runner's own files the epochs done and the steps into the next."""

    file: str
    epochs_done: int | None
    step: int | None
    global_step: int | None
    size: int | None
    time: float | None
    format: str = "files"
    files: int = 1
    title: str = ""

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def of(cls, saved: Saved) -> CheckpointInfo:
        return cls(
            file=saved.path,
            epochs_done=saved.epochs_done,
            step=saved.epoch_step,
            global_step=saved.step,
            size=saved.size,
            time=saved.time,
            format=saved.format,
            files=len(saved.keys),
            title=saved.title,
        )


def list_checkpoints(storage: Storage, problems: list[str]) -> list[CheckpointInfo]:
    """Every committed checkpoint under checkpoints/, whoever wrote it, newest first (by its format's save time,
    else when its objects were written); one still being written (an Orbax step not yet committed) is left out."""
    found = survey(Listing.of_storage(storage, contract.CHECKPOINTS + "/"))
    if (problem := found.problem("Keras")) is not None and problem != "is missing":
        unreadable = problem.startswith("is unreadable: ")
        said = f"is corrupt: {problem.removeprefix('is unreadable: ')}" if unreadable else problem
        problems.append(f"{where(storage, contract.LATEST_CHECKPOINT)} {said}")
    return [CheckpointInfo.of(saved) for saved in found.committed()]


def checkpoints_text(checkpoints: list[CheckpointInfo]) -> str:
    """'2 checkpoints (Orbax), 1.2 MB; newest step 640 (Orbax)'; a job's own files by count: '3 files, 1.2 MB;
    newest model-03.keras'."""
    if not checkpoints:
        return "none"
    counts: dict[str, int] = {}
    for c in checkpoints:
        counts[c.format] = counts.get(c.format, 0) + (c.files if c.format == "files" else 1)
    parts = [
        f"{n} file{'s' if n > 1 else ''}" if fmt == "files" else f"{n} checkpoint{'s' if n > 1 else ''} ({fmt})"
        for fmt, n in counts.items()
    ]
    size = sum(c.size or 0 for c in checkpoints)
    return f"{', '.join(parts)}, {size_text(size)}; newest {checkpoints[0].title or checkpoints[0].file}"


def size_text(size: float) -> str:
    """Bytes for a person: 812 B, 14.2 KB, 1.2 MB, 3.40 GB."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if size >= scale:
            return f"{size / scale:.{2 if unit == 'GB' else 1}f} {unit}"
    return f"{size:.0f} B"


def read_log(storage: Storage, worker: int = 0) -> str | None:
    """A worker's log as text, cleaned as the supervisor stores it (a log from an older runner may hold raw
    redraws); of a long log, its last LOG_TAIL_BYTES from a line start. None when there is none."""
    key = contract.log_key(worker)
    found = storage.list(key)
    size = next((info.size for info in found if info.key == key), None)
    if size is None:
        return None
    start = max(0, size - LOG_TAIL_BYTES)
    data = storage.read_bytes(key, start) or b""
    if start:
        data = data[data.find(b"\n") + 1 :]
    return clean_log(data).decode(errors="replace")


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
    cost: RunCost | None  # None: no TPU (a local run), a type the catalog does not know or has no price of
    startup: Startup
    timeline: Timeline
    checkpoints: list[CheckpointInfo] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    # metrics.jsonl's rows, else the epochs Keras printed to the log; where they came from (None: nowhere)
    metrics: list[dict[str, Any]] = field(default_factory=list)
    metrics_from: str | None = None
    summary: Summary | None = None  # summary.json, else (the run over) the one its metrics and log give
    log_progress: Progress | None = None  # where the epoch in progress stands, from Keras' lines in the log
    resumed: Resumed | None = None  # where the current attempt went on from (its event, else summary.json's)
    goodput: Goodput | None = None  # where the billed (a local run: the machine's) time went; None: no machine yet

    @property
    def budget(self) -> float | None:
        return number(self.spec.get("budget"))

    def cost_text(self) -> str:
        return self.cost.text() if self.cost is not None else no_price(self.record, self.spec)

    def cost_cell(self) -> str:
        """The cost for a table column: '$0.02' ('+': a node still bills), '$0' for a local run, '-' unknown."""
        from runner.plan.budget import money

        if self.cost is None:
            return "$0" if not backends.info(self.record.backend).bills else "-"
        return money(self.cost.usd) + ("+" if self.still_billing else "")

    @property
    def still_billing(self) -> bool:
        """A node may still bill: the events say one is READY, or this machine's record says a deletion failed."""
        return bool(self.record.still_billing) or (self.cost is not None and self.cost.open)

    def rows(self) -> list[tuple[str, str]]:
        """The rows `runner status` and the end of `runner submit` add to the summary."""
        rows = [("resumed", self.resumed.row())] if self.resumed is not None else []
        rows.append(("cost", self.cost_text()))
        if self.record.still_billing:
            rows.append(("billing", self.record.still_billing))
        if self.events:
            rows.append(("startup", self.startup.text()))
        if self.goodput is not None:
            rows += self.goodput.rows()
        return rows

    @property
    def last_metrics(self) -> dict[str, Any] | None:
        return self.metrics[-1] if self.metrics else None

    def to_json(self) -> dict[str, Any]:
        return {
            "cost": self.cost.to_json() if self.cost is not None else None,
            "startup": self.startup.to_json(),
            "timeline": self.timeline.to_json(),
            "checkpoints": [c.to_json() for c in self.checkpoints],
            "resumed": self.resumed.to_json() if self.resumed is not None else None,
            "goodput": self.goodput.to_json() if self.goodput is not None else None,
        }


def no_price(record: RunRecord, spec: dict[str, Any]) -> str:
    """Why a run has no dollar figure: '$0: ...' (a backend that bills nothing), 'not estimated: ...', 'unknown'."""
    if (free := backends.info(record.backend).no_cost) is not None:
        return f"$0: {free}"
    acc = spec.get("accelerator")
    title = unpriced(acc["type"]) if isinstance(acc, dict) and isinstance(acc.get("type"), str) else None
    if title is not None:
        return f"not estimated: no list price of {title} is known (see its pricing page)"
    return "unknown: the run's accelerator type is not in this runner's catalog"


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
    """Everything the run directory says of the run's metrics, summary, cost and phases. Pass what the caller has
    read already (`snapshot`, `events`: read with one_clock, see read_events); `checkpoints` lists checkpoints/ too."""
    warnings: list[str] = []
    if snapshot is None:
        snapshot = read_snapshot(storage)
        warnings += snapshot.problems
    if events is None:  # the machines' clocks need not agree: everything measured here is on the storage's
        events = read_events(storage, warnings, one_clock=True)
    spec = read_spec(storage, warnings)
    now = time.time() if now is None else now
    info = backends.info(record.backend)
    price = spec_price(spec) if info.bills else None
    cost = None if price is None else run_cost(events, price, now=now, budget=number(spec.get("budget")))
    metrics, metrics_from = snapshot.metrics, contract.METRICS if snapshot.metrics else None
    summary = snapshot.summary
    ended = bool(snapshot.exits)
    keras = KerasLog()
    # The log is read only for what nothing else says: metrics when there is no metrics.jsonl, a summary when a
    # finished run has no summary.json.
    if not metrics or (summary is None and ended):
        log = read_log(storage)
        keras = parse_keras_log(log) if log else keras
        if not metrics and keras.epochs:
            metrics, metrics_from = keras.epochs, contract.log_key(0)
        if summary is None and ended and (derived := derive_summary(snapshot.metrics, log)) is not None:
            summary = Summary.from_json(derived)
    resumed = latest(events) or (Resumed.from_json(summary.get("resumed")) if summary is not None else None)
    log_progress = None
    if (where_now := keras.progress()) is not None and not snapshot.metrics:
        log_progress = Progress.from_json(where_now)
    timeline = build_timeline(
        events,
        snapshot.metrics,
        created_at=_created_at(record, events),
        evaluated=summary is not None and summary.evaluated,
    )
    spans = cost.spans if cost is not None else tuple(node_spans(events, now=now))
    acc = spec.get("accelerator")
    goodput = None
    if spans:
        goodput = compute_goodput(
            timeline,
            snapshot.metrics,
            spans,
            price,
            billable=info.bills,
            no_price=no_price(record, spec),
            queued=isinstance(acc, dict) and acc.get("provisioning") == "queued",
        )
    return RunFacts(
        record=record,
        spec=spec,
        events=events,
        snapshot=snapshot,
        cost=cost,
        startup=startup(events, snapshot.metrics, ready=info.ready),
        timeline=timeline,
        checkpoints=list_checkpoints(storage, warnings) if checkpoints else [],
        warnings=warnings,
        metrics=metrics,
        metrics_from=metrics_from,
        summary=summary,
        log_progress=log_progress,
        resumed=resumed,
        goodput=goodput,
    )
