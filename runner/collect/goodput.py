"""Goodput: where every billed second of a run went, and what each disruption cost. One computation, on the run's
timeline (runner.collect.timeline: its phases, from the events and metrics.jsonl) and its billed spans (runner.
collect.cost: each node READY; a local run's machine, which bills nothing, the same way).

Each billed second goes to one cause: of the phases that cover it, the most specific.

    checkpoint save       the trainer's saves (built-in trainer, keras_callbacks(): checkpoint_saved, with seconds)
    checkpoint restore    the supervisor's download onto a new machine; the trainer's verify and load
    data                  the built-in trainer's loading of its data (data_loaded)
    work redone           a resumed attempt's training up to the step the earlier attempts had reached (its resume's
                          step + its steps redone), timed on the attempt's own steps (its first step, metrics.jsonl)
    productive steps      the rest of training: its first step (or epoch 1's start) to its last epoch's end, or to
                          the stop of an attempt that was stopped
    start-up and compile  the container's start, framework import, devices, data and model, to the first step
    image pull            the bootstrap's start to the container's
    provisioning          READY (the API's time) to the startup script's first word: the boot
    final evaluation      the last epoch's end to the job's end
    idle before teardown  the job's end to the delete request (the last upload is in it)
    job                   a job that reports no step (no first_step, no epoch with a time): not split
    not measured          billed time that no evidence covers

Before READY and after the delete request nothing bills; that time is each cause's `waited_s`: waiting for capacity
(each zone without capacity, to the create that got it; a queued resource's or a flex-start's wait has no event of
its end, so it stays inside provisioning), the create to READY, the delete to its confirmation.

What the run gives no evidence of is not measured (None), never 0: data outside the built-in trainer, a command's
own checkpoint saves and loads, redone work with no step to time it by. The billed seconds of the causes add up to
the billed time exactly (what is not measured is in the cause that covers it, said in its note).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from runner.collect.cost import Price, Span
from runner.collect.timeline import Timeline, epoch_rows
from runner.plan.budget import duration, money
from runner.watch.rundir import number

# (key, label) in the order a reader goes through a run
CAUSES = (
    ("productive", "productive steps"),
    ("capacity", "waiting for capacity"),
    ("provisioning", "provisioning"),
    ("image_pull", "image pull"),
    ("startup", "start-up and compile"),
    ("data", "data"),
    ("checkpoint_restore", "checkpoint restore"),
    ("checkpoint_save", "checkpoint save"),
    ("redone", "work redone"),
    ("evaluation", "final evaluation"),
    ("idle", "idle before teardown"),
    ("job", "job (no steps reported)"),
    ("unmeasured", "not measured"),
)
LABELS = dict(CAUSES)
# timeline phase -> (cause, rank): a second covered by several phases goes to the highest rank
_PHASES = {
    "waiting for capacity": ("capacity", 1),
    "queue/provision": ("provisioning", 1),
    "boot": ("provisioning", 1),
    "image pull": ("image_pull", 1),
    "container start": ("startup", 1),
    "worker start": ("startup", 1),
    "framework import": ("startup", 1),
    "device found": ("startup", 1),
    "first step": ("startup", 1),
    "start-up (import, device, data, model)": ("startup", 1),
    "training": ("productive", 1),
    "job": ("job", 1),
    "final evaluation": ("evaluation", 1),
    "after training": ("evaluation", 1),
    "upload": ("idle", 1),
    "idle before teardown": ("idle", 1),
    "teardown": ("idle", 1),
    "data": ("data", 3),
    "checkpoint restore": ("checkpoint_restore", 4),
    "checkpoint save": ("checkpoint_save", 5),
}
_REDONE_RANK = 2
_DISRUPTIONS = {
    "preempted": "preemption",
    "retrying_failure": "failure retried",
    "boot_timeout": "silent boot",
}


@dataclass(frozen=True)
class Cause:
    key: str
    billed_s: float | None  # None: not measured (its time, if any, is in the cause `note` names)
    waited_s: float | None = 0.0  # its time outside the billed spans (not billed); None: not measured
    usd: float | None = None  # None: no price (a local run, a type with no list price) or not measured
    steps: int | None = None  # work redone: the steps
    note: str = ""

    @property
    def label(self) -> str:
        return LABELS[self.key]

    def to_json(self) -> dict[str, Any]:
        return {
            "cause": self.key,
            "label": self.label,
            "billed_s": None if self.billed_s is None else round(self.billed_s, 3),
            "waited_s": None if self.waited_s is None else round(self.waited_s, 3),
            "usd": None if self.usd is None else round(self.usd, 6),
            "steps": self.steps,
            "note": self.note,
        }


@dataclass(frozen=True)
class Disruption:
    """A preemption, a retried failure or a silent boot: the step the run had reached, the step it went on from, and
    what that cost in billed seconds (the work redone, and the restart: the disrupted machine after its training and
    its replacement until it trained again; all of a machine that never trained)."""

    kind: str  # preemption | failure retried | silent boot
    attempt: int  # the machine it ended
    at_s: float  # seconds after the submit
    reached_step: int | None
    resumed_step: int | None
    redone_steps: int | None
    redone_s: float | None
    restart_s: float
    usd: float | None
    back_after_s: float | None  # from it to the next machine's training (wall time); None: it never trained again

    @property
    def lost_s(self) -> float | None:
        return None if self.redone_s is None else self.redone_s + self.restart_s

    def text(self) -> str:
        parts = []
        if self.reached_step is not None:
            parts.append(f"step {self.reached_step} reached")
        if self.resumed_step is not None:
            parts.append(f"resumed from step {self.resumed_step}")
        if self.redone_steps is not None:
            took = "not timed" if self.redone_s is None else duration(self.redone_s)
            parts.append(f"{self.redone_steps} step{'' if self.redone_steps == 1 else 's'} redone ({took})")
        parts.append(f"restart {duration(self.restart_s)} billed")
        if self.usd is not None:
            parts.append(f"{money(self.usd)} lost")
        if self.back_after_s is not None:
            parts.append(f"training again {duration(self.back_after_s)} later")
        return f"{self.kind} of machine {self.attempt} at {duration(self.at_s)}: " + ", ".join(parts)

    def to_json(self) -> dict[str, Any]:
        lost = self.lost_s
        return {
            "kind": self.kind,
            "attempt": self.attempt,
            "at_s": round(self.at_s, 3),
            "reached_step": self.reached_step,
            "resumed_step": self.resumed_step,
            "redone_steps": self.redone_steps,
            "redone_s": None if self.redone_s is None else round(self.redone_s, 3),
            "restart_s": round(self.restart_s, 3),
            "lost_s": None if lost is None else round(lost, 3),
            "usd": None if self.usd is None else round(self.usd, 6),
            "back_after_s": None if self.back_after_s is None else round(self.back_after_s, 3),
        }


@dataclass(frozen=True)
class Goodput:
    billed_s: float
    billable: bool  # False: the machine bills nothing (a local run): its time is split all the same
    open: bool  # a machine still bills: the figures are so far
    causes: tuple[Cause, ...]
    disruptions: tuple[Disruption, ...]
    price: Price | None
    no_price: str | None = None  # why there are no dollars ("$0: a local run ...", "not estimated: ...")

    def cause(self, key: str) -> Cause:
        return next(c for c in self.causes if c.key == key)

    @property
    def productive_s(self) -> float | None:
        return self.cause("productive").billed_s

    @property
    def percent(self) -> float | None:
        productive = self.productive_s
        return None if productive is None or self.billed_s <= 0 else 100 * productive / self.billed_s

    @property
    def usd(self) -> float | None:
        return self.cause("productive").usd

    @property
    def billed_usd(self) -> float | None:
        return None if self.price is None else self.billed_s * self.price.per_hour / 3600

    def cell(self) -> str:
        """For a table column: '62%' ('+': so far), '-' when not measured."""
        percent = self.percent
        return "-" if percent is None else f"{percent:.0f}%" + ("+" if self.open else "")

    def _money(self) -> str:
        if not self.billable:
            return ""  # the cost row says why it is $0
        if self.billed_usd is None:
            return f"; dollars {self.no_price}" if self.no_price else ""
        if self.usd is None:
            return f"; {money(self.billed_usd)} billed"
        return f", {money(self.usd)} of {money(self.billed_usd)}"

    def rows(self) -> list[tuple[str, str]]:
        """`runner status` and the end of `runner submit`: goodput, badput by cause, what did not bill, each
        disruption."""
        what = "billed" if self.billable else "machine time (bills nothing)"
        total = f"{duration(self.billed_s)} {what}" + (" so far" if self.open else "")
        percent = self.percent
        productive = self.productive_s
        if percent is None or productive is None:
            why = self.cause("productive").note or "the job reports no steps"
            head = f"not measured ({why}) of {total}"
        else:
            head = f"{percent:.0f}% of {total}: {duration(productive)} of productive steps"
        rows = [("goodput", head + self._money())]
        bad = sorted(
            (c for c in self.causes if c.key != "productive" and c.billed_s),
            key=lambda c: -(c.billed_s or 0.0),
        )
        shown = [f"{c.label} {duration(c.billed_s or 0.0)}" + _steps(c) for c in bad]
        unknown = [c.label for c in self.causes if c.billed_s is None and c.key != "productive"]
        text = ", ".join(shown) or "none"
        if unknown:
            text += f"; not measured: {', '.join(unknown)}"
        rows.append(("badput", text))
        waited = [
            f"{name} {duration(c.waited_s)}"
            for c, name in (
                (self.cause("capacity"), "waiting for capacity"),
                (self.cause("provisioning"), "create to READY"),
                (self.cause("idle"), "delete to confirmed"),
            )
            if c.waited_s is not None and c.waited_s >= 0.05
        ]
        if waited:
            rows.append(("not billed", ", ".join(waited)))
        rows += [(f"disruption {n}", d.text()) for n, d in enumerate(self.disruptions, 1)]
        return rows

    def to_json(self) -> dict[str, Any]:
        productive, usd, billed_usd = self.productive_s, self.usd, self.billed_usd
        # the percent is of the seconds as written (to the ms), so a reader who divides the two gets it back
        billed = round(self.billed_s, 3)
        productive = None if productive is None else round(productive, 3)
        percent = None if productive is None or billed <= 0 else round(100 * productive / billed, 2)
        return {
            "billed_s": billed,
            "billable": self.billable,
            "open": self.open,
            "productive_s": productive,
            "percent": percent,
            "usd": None if usd is None else round(usd, 6),
            "billed_usd": None if billed_usd is None else round(billed_usd, 6),
            "no_price": self.no_price,
            "causes": [c.to_json() for c in self.causes],
            "disruptions": [d.to_json() for d in self.disruptions],
        }


def _steps(cause: Cause) -> str:
    return f" ({cause.steps} steps)" if cause.steps else ""


@dataclass(frozen=True)
class _Interval:
    start: float
    end: float
    cause: str
    rank: int
    attempt: int


@dataclass(frozen=True)
class _Segment:
    start: float
    end: float
    cause: str
    attempt: int

    @property
    def seconds(self) -> float:
        return self.end - self.start


def _paint(spans: Sequence[Span], intervals: Sequence[_Interval], timeline: Timeline) -> list[_Segment]:
    """The billed spans cut where any interval starts or ends; each piece given to the highest-ranked interval that
    covers it (ties: the first listed), else to 'unmeasured'. One sweep per span: a long run's hundreds of saves cost
    no more than their number."""
    out: list[_Segment] = []
    for span in spans:
        opens: dict[float, list[int]] = {}
        closes: dict[float, list[int]] = {}
        for n, i in enumerate(intervals):
            start, end = max(i.start, span.start), min(i.end, span.end)
            if end > start:
                opens.setdefault(start, []).append(n)
                closes.setdefault(end, []).append(n)
        active: set[int] = set()
        for a, b in itertools.pairwise(sorted({span.start, span.end, *opens, *closes})):
            active.difference_update(closes.get(a, ()))
            active.update(opens.get(a, ()))
            if not active:
                out.append(_Segment(a, b, "unmeasured", timeline.attempt_at(a)))
                continue
            best = intervals[min(active, key=lambda n: (-intervals[n].rank, n))]
            out.append(_Segment(a, b, best.cause, best.attempt))
    return out


def _outside(start: float, end: float, spans: Sequence[Span]) -> float:
    """Seconds of [start, end] outside every billed span."""
    inside = sum(max(0.0, min(end, s.end) - max(start, s.start)) for s in spans)
    return max(0.0, end - start - inside)


def _redo_until(
    timeline: Timeline, attempt: int, step: int, reached: int, rows: Sequence[tuple[float, float, dict[str, Any]]]
) -> tuple[float, float] | None:
    """(from, until) of the attempt's training that trained again the steps up to `reached`: its training's start
    (at `step`, or one past it at its first step's end) to when its steps passed `reached`, between the two step
    counts that bracket it (its epochs' ends in metrics.jsonl); None when no step of the attempt is timed."""
    training = [p for p in timeline.phases if p.attempt == attempt and p.name == "training"]
    if not training:
        return None
    start, end = training[0].start, training[-1].end
    # at the first step's end (its compile is start-up's) the attempt has trained one step
    points = [(start, float(step + 1 if training[0].evidence.startswith("first_step") else step))]
    for _, ended, row in rows:
        count = number(row.get("global_step"))
        if count is not None and start < ended <= end and timeline.attempt_at(ended) == attempt:
            points.append((ended, count))
    if len(points) < 2:
        return None
    for (t1, s1), (t2, s2) in itertools.pairwise(points):
        if s2 >= reached:
            return start, t2 if s2 <= s1 else t1 + (reached - s1) / (s2 - s1) * (t2 - t1)
    return start, end  # it never got as far: all of its training was done before


def compute(
    timeline: Timeline,
    metrics: Sequence[dict[str, Any]],
    spans: Sequence[Span],
    price: Price | None,
    *,
    billable: bool,
    no_price: str | None = None,
    queued: bool = False,
) -> Goodput:
    """The run's goodput: `timeline` (build_timeline), `metrics` (metrics.jsonl's rows), `spans` (cost.node_spans),
    `price` (None: no dollars, `no_price` says why); `queued`: the spec asks for its machine through a queue (a
    Compute Engine flex-start instance, whose handle does not say so)."""
    rows = epoch_rows(metrics)
    intervals = [_Interval(p.start, p.end, *_PHASES[p.name], p.attempt) for p in timeline.phases if p.name in _PHASES]
    redone_steps, redone_known = 0, True
    redo: dict[int, tuple[int | None, int | None]] = {}  # attempt -> (resumed step, steps redone)
    for attempt, _, said in timeline.resumes:
        redo[attempt] = (said.step, said.redone)
        if said.redone is None or said.step is None:
            redone_known = redone_known and not said.redone
            continue
        if said.redone == 0:
            continue
        window = _redo_until(timeline, attempt, said.step, said.step + said.redone, rows)
        if window is None:
            redone_known = False
            continue
        redone_steps += said.redone
        intervals.append(_Interval(window[0], window[1], "redone", _REDONE_RANK, attempt))
    segments = _paint(spans, intervals, timeline)
    billed = {key: 0.0 for key, _ in CAUSES}
    for seg in segments:
        billed[seg.cause] += seg.seconds
    waited = {key: 0.0 for key, _ in CAUSES}
    for i in intervals:
        if i.cause in ("capacity", "provisioning", "idle"):
            waited[i.cause] += _outside(i.start, i.end, spans)
    names = {p.name for p in timeline.phases}
    trainer = any(s.startswith("trainer-") for s in timeline.sources)
    waits_in_create = queued or timeline.queued
    training = "training" in names and not billed["job"]
    # Not measured: the time it took, if any, is in the cause its note names.
    unmeasured = {
        "data": None if "data" in names else "only the built-in trainer times its data: in start-up",
        "checkpoint_save": None
        if "checkpoint save" in names or trainer
        else "a command's own saves are not timed: in its training",
        "checkpoint_restore": None
        if "checkpoint restore" in names or trainer or timeline.attempts <= 1
        else "a command's own load is not timed: in its start-up",
        "redone": None if redone_known else "a resume said no step, or the attempt timed none: in productive",
        "productive": None
        if training and redone_known
        else "the job reports no steps"
        if not training
        else "redone work is not timed: in not measured",
    }
    if unmeasured["productive"] and billed["productive"]:
        billed["unmeasured"] += billed.pop("productive")
    rate = None if price is None else price.per_hour / 3600
    causes = []
    for key, _ in CAUSES:
        why = unmeasured.get(key)
        seconds = None if why else billed.get(key, 0.0)
        wait: float | None = waited[key]
        if key == "capacity" and waits_in_create:  # before READY, it never bills; how long it waited is unknown
            seconds, wait, why = 0.0, None, "a queued machine's wait has no event of its end: in provisioning"
        usd = None if rate is None or seconds is None else seconds * rate
        steps = redone_steps if key == "redone" and redone_known else None
        causes.append(Cause(key, seconds, None if why and key != "capacity" else wait, usd, steps, why or ""))
    disruptions = _disruptions(timeline, segments, redo, rate)
    return Goodput(
        billed_s=sum(s.seconds for s in spans),
        billable=billable,
        open=any(s.open for s in spans),
        causes=tuple(causes),
        disruptions=tuple(disruptions),
        price=price,
        no_price=no_price if price is None else None,
    )


def _disruptions(
    timeline: Timeline,
    segments: Sequence[_Segment],
    redo: dict[int, tuple[int | None, int | None]],
    rate: float | None,
) -> list[Disruption]:
    """Each disruption the markers show, with what the next machine said of where it went on from."""
    out = []

    def training(attempt: int) -> tuple[float, float] | None:
        spans = [p for p in timeline.phases if p.attempt == attempt and p.name == "training"]
        return (spans[0].start, spans[-1].end) if spans else None

    def billed(attempt: int, after: float = float("-inf"), before: float = float("inf")) -> float:
        return sum(max(0.0, min(s.end, before) - max(s.start, after)) for s in segments if s.attempt == attempt)

    for marker in timeline.markers:
        kind = _DISRUPTIONS.get(marker.event)
        if kind is None:
            continue
        attempt = timeline.attempt_at(marker.time)
        nxt = attempt + 1 if attempt < timeline.attempts else None
        trained = training(attempt)
        # What it cost: the disrupted machine after its training (all of it, if it never trained) ...
        restart = billed(attempt, after=trained[1]) if trained else billed(attempt)
        back = None
        step, redone = redo.get(nxt, (None, None)) if nxt else (None, None)
        redone_s: float | None = 0.0
        if nxt is not None and (again := training(nxt)) is not None:
            back = max(0.0, again[0] - marker.time)
            # ... and, if it had trained, its replacement's start until it trained again, then the work redone
            restart += billed(nxt, before=again[0]) if trained else 0.0
            redone_s = sum(s.seconds for s in segments if s.attempt == nxt and s.cause == "redone")
            if redone is None or (redone and not redone_s):
                redone_s = None
        reached = step + redone if step is not None and redone is not None else None
        lost = None if redone_s is None else restart + redone_s
        out.append(
            Disruption(
                kind=kind,
                attempt=attempt,
                at_s=marker.time - timeline.origin,
                reached_step=reached,
                resumed_step=step,
                redone_steps=redone,
                redone_s=redone_s,
                restart_s=restart,
                usd=None if rate is None or lost is None else lost * rate,
                back_after_s=back,
            )
        )
    return out


def record_in_summary(run_dir: str, goodput: Goodput) -> str | None:
    """Add the run's goodput to its summary.json once the run is over (the job, its only writer until then, has
    ended; `runner status` computes the same figures from the events any time). A summary.json that is missing, not
    a JSON object, or holding a `goodput` of the job's own is left as it is. Why it could not be written, or None."""
    import json

    from runner import contract
    from runner.errors import RunnerError
    from runner.storage import open_storage

    try:
        storage = open_storage(run_dir)
        raw = storage.read_bytes(contract.SUMMARY)
        if raw is None:
            return None
        try:
            summary = json.loads(raw)
        except ValueError:
            return None
        if not isinstance(summary, dict):
            return None
        own = summary.get("goodput")
        if own is not None and not (isinstance(own, dict) and "billed_s" in own):
            return None
        summary["goodput"] = goodput.to_json()
        storage.write_bytes(contract.SUMMARY, json.dumps(summary, indent=1).encode())
    except RunnerError as exc:
        return f"the goodput was not added: {exc.message}"
    return None
