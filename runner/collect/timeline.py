"""A run's phases in time, and its startup breakdown, from its events and the trainer's metrics: evidence only.

    phase             from                                   to
    plan              run.json's created_at                  submitted                     (runner)
    waiting for       submitted, or the machine's first      its last provisioning: each   (runner)
      capacity          provisioning                           zone without capacity
    queue/provision   submitted, or the machine's (last)     provisioned (READY)           (runner)
                        provisioning
    boot              provisioned                            bootstrap_started             (the VM's startup script)
    image pull        bootstrap_started                      container_started
    container start   container_started (or provisioned)     job_started                   (the supervisor)
    framework import  job_started                            framework_imported            (the trainer)
    device found      framework_imported                     device_found                  (the trainer)
    first step        device_found / framework_imported      first_step                    (the trainer)
    start-up          job_started                            first_step, else epoch 1 began (metrics.jsonl:
                                                             time - epoch_time_s), when the job says no
                                                             framework_imported (keras_callbacks(), a command)
    training          first_step, or the attempt's first epoch's start     its last metrics row; an attempt
                                                             stopped or failed: its worker_exited
    job               job_started                            worker_exited                 (a job with no metrics)
    final evaluation  the last metrics row                   worker_exited                 (the run reports a test
                                                                                           metric: it evaluated)
    after training    the last metrics row                   worker_exited                 (it reports none)
    upload            worker_exited                          container_exited              (the last push, on a VM)
    idle before       worker_exited (or container_exited)   the delete request, or the runner's preempted
      teardown
    teardown          teardown/delete/down requested         teardown_done / down_done
    checkpoint save   an interval event's `seconds` before   checkpoint_saved              (the trainer)
    checkpoint        it                                     checkpoint_restored           (the supervisor's
      restore                                                                              download, the trainer's
                                                                                           verify and load)
    data                                                     data_loaded                   (the built-in trainer)

A phase whose ends are not both in the evidence is left out, never guessed. Each machine (attempt) gets its own
phases: a preemption, a silent boot or a retried failure starts the next at its `provisioning` event (one after a
create that brought no machine, a zone without capacity, is the same machine asked for again); preemptions,
restarts and the runner's decisions are markers. The VM's events are by its clock, the runner's by this machine's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from runner.checkpoints.resumed import EVENT as RESUMED
from runner.checkpoints.resumed import RESTORED, SAVED, Resumed
from runner.watch.events import Event
from runner.watch.rundir import number

# The trainer's own events (a `trainer-N` source); the phases use them when they are there.
FRAMEWORK_IMPORTED = "framework_imported"
DEVICE_FOUND = "device_found"
FIRST_STEP = "first_step"
DATA_LOADED = "data_loaded"
# Events said when something that took their `seconds` ended: each is a phase of its own.
INTERVALS = {SAVED: "checkpoint save", RESTORED: "checkpoint restore", DATA_LOADED: "data"}
_REQUESTS = ("teardown_requested", "delete_requested", "down_requested")

_MARKERS = {
    "preempted": "preempted",
    "boot_timeout": "silent boot",
    "retrying_failure": "failure: retried",
    "deadline_passed": "deadline passed",
    "hung": "hung",
    "cancel_requested": "cancelled",
    "down_requested": "runner down",
    "image_pull_failed": "image pull failed",
    "provision_failed": "provision failed",
}


@dataclass(frozen=True)
class Phase:
    name: str
    start: float
    end: float
    attempt: int
    evidence: str  # which events (or files) its two ends come from

    @property
    def seconds(self) -> float:
        return max(0.0, self.end - self.start)

    def to_json(self, origin: float) -> dict[str, Any]:
        return {
            "name": self.name,
            "attempt": self.attempt,
            "start_s": round(self.start - origin, 3),
            "seconds": round(self.seconds, 3),
            "evidence": self.evidence,
        }


@dataclass(frozen=True)
class Marker:
    time: float
    label: str
    event: str

    def to_json(self, origin: float) -> dict[str, Any]:
        return {"at_s": round(self.time - origin, 3), "label": self.label, "event": self.event}


@dataclass(frozen=True)
class Timeline:
    origin: float  # the submit (or the first event): every figure is seconds after it
    phases: list[Phase] = field(default_factory=list)
    markers: list[Marker] = field(default_factory=list)
    attempts: int = 0
    # Beside the phases, for what is measured on them (runner.collect.goodput); not in to_json:
    starts: tuple[float, ...] = ()  # when each machine after the first was asked for
    resumes: tuple[tuple[int, float, Resumed], ...] = ()  # (attempt, time, what it said) of each resume
    sources: frozenset[str] = frozenset()  # who wrote events: runner, bootstrap-N, worker-N, trainer-N
    queued: bool = False  # a machine was asked for through a queue: its wait for capacity has no event of its end

    def attempt_at(self, time: float) -> int:
        """The machine (attempt, from 1) a time belongs to."""
        return 1 + sum(1 for start in self.starts if start <= time)

    def to_json(self) -> dict[str, Any]:
        return {
            "origin": self.origin,
            "attempts": self.attempts,
            "phases": [p.to_json(self.origin) for p in self.phases],
            "markers": [m.to_json(self.origin) for m in self.markers],
        }


def _first(events: Sequence[Event], name: str, source: str | None = None) -> Event | None:
    return next((e for e in events if e.event == name and (source is None or e.source.startswith(source))), None)


def _last(events: Sequence[Event], name: str, source: str | None = None) -> Event | None:
    found = [e for e in events if e.event == name and (source is None or e.source.startswith(source))]
    return found[-1] if found else None


def machine_starts(events: Sequence[Event]) -> list[int]:
    """Where each attempt begins in `events` (sorted by time): the runner's first `provisioning`, and each later one
    once the machine before came up (provisioned) or was taken back while it booted (preempted). A `provisioning`
    after a create that brought no machine (a zone without capacity, a name taken) asks for the same machine again.
    A `restarted` (the platform restarted the job by itself: a JobSet's next attempt) begins one on the machines it
    has."""
    starts: list[int] = []
    came = True
    for i, e in enumerate(events):
        if e.source != "runner":
            continue
        if e.event == "provisioning":
            if came:
                starts.append(i)
            came = False
        elif e.event == "restarted":
            starts.append(i)
            came = True
        elif e.event in ("provisioned", "preempted"):
            came = True
    return starts


def _queued(event: Event) -> bool:
    """A provisioning event's machine is asked for through a queue (a queued resource, a flex-start request)."""
    handle = event.fields.get("handle")
    return isinstance(handle, dict) and bool(handle.get("queued_resource") or handle.get("resize_request"))


def epoch_rows(metrics: Sequence[dict[str, Any]]) -> list[tuple[float, float, dict[str, Any]]]:
    """(began, ended, row) of each metrics row that says when it ended and how long it took: the trainer's rows."""
    out = []
    for row in metrics:
        ended, took = number(row.get("time")), number(row.get("epoch_time_s"))
        if ended is not None and took is not None and took >= 0:
            out.append((ended - took, ended, row))
    return out


def _attempt_phases(
    attempt: int,
    window: list[Event],
    rows: list[tuple[float, float, dict[str, Any]]],
    start: Event | None,
    evaluated: bool,
) -> list[Phase]:
    phases: list[Phase] = []

    def add(name: str, a: tuple[float, str] | None, b: tuple[float, str] | None) -> None:
        if a is not None and b is not None and b[0] >= a[0]:
            phases.append(Phase(name, a[0], b[0], attempt, f"{a[1]} -> {b[1]}"))

    def at(e: Event | None) -> tuple[float, str] | None:
        return None if e is None else (e.time, e.event)

    asks = [e for e in window if e.event == "provisioning" and e.source == "runner"]
    if len(asks) > 1:  # zones without capacity before the one that had it
        add("waiting for capacity", at(start), at(asks[-1]))
        start = asks[-1]
    provisioned = _first(window, "provisioned", "runner")
    add("queue/provision", at(start), at(provisioned))
    boot = _first(window, "bootstrap_started", "bootstrap")
    add("boot", at(provisioned), at(boot))
    container = _first(window, "container_started", "bootstrap")
    add("image pull", at(boot), at(container))
    job = _first(window, "job_started", "worker")
    add("container start" if container else "worker start", at(container or provisioned), at(job))
    imported = _first(window, FRAMEWORK_IMPORTED)
    device = _first(window, DEVICE_FOUND)
    first_step = _first(window, FIRST_STEP)
    add("framework import", at(job), at(imported))
    add("device found", at(imported), at(device))
    add("first step", at(device or imported), at(first_step))
    exited = _first(window, "worker_exited", "worker")
    stop = exited if exited is not None and exited.fields.get("state") != "succeeded" else None
    began = None
    if rows:
        began = (rows[0][0], "epoch 1 began (metrics.jsonl)" if rows[0][2].get("epoch") == 1 else "epoch began")
    if imported is None and (first_step is not None or began is not None):
        add("start-up (import, device, data, model)", at(job), at(first_step) or began)
    if rows:
        # An attempt stopped or failed trained on past its last epoch's end, to its stop (and its save).
        last = (rows[-1][1], "last epoch ended (metrics.jsonl)")
        add("training", at(first_step) or began, at(stop) if stop is not None and stop.time >= last[0] else last)
        if exited is not None and stop is None:
            add("final evaluation" if evaluated else "after training", (rows[-1][1], "last epoch ended"), at(exited))
    elif first_step is not None:
        add("training", at(first_step), at(exited))
    else:
        add("job", at(job), at(exited))
    add("upload", at(exited), at(_first(window, "container_exited", "bootstrap")))
    ended = exited or _first(window, "container_exited", "bootstrap")
    if ended is not None:
        after = [e for e in window if e.time >= ended.time]
        gone = next(
            (e for e in after if e.event in _REQUESTS or (e.event == "preempted" and e.source == "runner")), None
        )
        add("idle before teardown", at(ended), at(gone))
    request = next((e for e in window if e.event in _REQUESTS), None)
    done = None
    if request is not None:
        done = next((e for e in window if e.event in ("teardown_done", "down_done") and e.time >= request.time), None)
    add("teardown", at(request), at(done))
    for e in window:
        seconds = number(e.fields.get("seconds")) if e.event in INTERVALS else None
        if seconds is not None and 0 <= seconds <= e.time - window[0].time + 1:
            phases.append(Phase(INTERVALS[e.event], e.time - seconds, e.time, attempt, f"{e.event} ({e.source})"))
    return phases


def build_timeline(
    events: Sequence[Event],
    metrics: Sequence[dict[str, Any]],
    *,
    created_at: float | None = None,
    evaluated: bool = False,
) -> Timeline:
    """Every phase with evidence for both of its ends, per attempt, and the markers. `evaluated`: the run reports a
    test metric (its summary), so the time from its last epoch to its end is a final evaluation."""
    events = sorted(events, key=lambda e: e.time)
    submitted = _first(events, "submitted", "runner")
    origin = submitted.time if submitted else (events[0].time if events else (created_at or 0.0))
    starts = machine_starts(events)
    phases: list[Phase] = []
    if created_at is not None and submitted is not None and submitted.time >= created_at:
        phases.append(Phase("plan", created_at, submitted.time, 1, "run.json created_at -> submitted"))
    rows = epoch_rows(metrics)
    bounds = starts or [0]
    for n, i in enumerate(bounds):
        end = bounds[n + 1] if n + 1 < len(bounds) else len(events)
        window = events[i:end] if n else events[:end]  # the first attempt has the submit and anything before
        t0 = window[0].time if window else origin
        t1 = events[end].time if end < len(events) else float("inf")
        in_window = [r for r in rows if t0 <= r[1] < t1]
        start = submitted if n == 0 and submitted else (events[i] if starts else None)
        phases += _attempt_phases(n + 1, window, in_window, start, evaluated)
    markers = [Marker(e.time, _MARKERS[e.event], e.event) for e in events if e.event in _MARKERS]
    markers += [Marker(events[i].time, f"machine {n + 1}", "provisioning") for n, i in enumerate(starts) if n]
    machines = tuple(events[i].time for i in starts[1:])
    resumes = []
    for e in events:
        if e.event == RESUMED and e.source in ("worker-0", "trainer-0"):
            said = Resumed.from_json(e.fields)
            if said is not None:
                resumes.append((1 + sum(1 for t in machines if t <= e.time), e.time, said))
    return Timeline(
        origin,
        phases,
        sorted(markers, key=lambda m: m.time),
        len(starts),
        starts=machines,
        resumes=tuple(resumes),
        sources=frozenset(e.source for e in events),
        queued=any(_queued(e) for e in events if e.event == "provisioning" and e.source == "runner"),
    )


@dataclass(frozen=True)
class Startup:
    """Seconds from the submit to each milestone of the first machine; None where the run has no evidence."""

    ready_s: float | None = None  # provisioned: the API said READY (local: the process started)
    image_pulled_s: float | None = None  # container_started: the image is on the VM
    job_started_s: float | None = None  # the supervisor started the job
    framework_imported_s: float | None = None  # the trainer's framework_imported event
    device_found_s: float | None = None  # the trainer's device_found event
    first_step_s: float | None = None  # the trainer's first_step event
    training_started_s: float | None = None  # epoch 1 began, from metrics.jsonl (its time - epoch_time_s)
    first_epoch_done_s: float | None = None
    missing: tuple[str, ...] = ()  # milestones that need an event the run does not have
    ready_label: str = "READY"  # what `ready_s` is on this backend

    def to_json(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__ if k not in ("missing", "ready_label")}
        return {**{k: None if v is None else round(v, 3) for k, v in out.items()}, "missing": list(self.missing)}

    def text(self) -> str:
        """One line: 'READY 0.6s, image pulled 1.0s, ...' (after the submit), with what is missing."""
        labels = [
            (self.ready_label, self.ready_s),
            ("image pulled", self.image_pulled_s),
            ("job started", self.job_started_s),
            ("framework imported", self.framework_imported_s),
            ("device found", self.device_found_s),
            ("first step", self.first_step_s),
        ]
        if self.first_step_s is None:
            labels.append(("epoch 1 began", self.training_started_s))
        shown = [f"{name} {value:.1f}s" for name, value in labels if value is not None]
        text = (", ".join(shown) + " after the submit") if shown else "-"
        if self.missing:
            text += f"; {', '.join(self.missing)}: no event says when"
        return text


def startup(events: Sequence[Event], metrics: Sequence[dict[str, Any]], *, ready: str = "READY") -> Startup:
    """The first machine's startup, as seconds after the submit (the numbers TPU users ask about first); `ready` is
    what its backend calls the machine being up (runner.backends.BackendInfo.ready)."""
    events = sorted(events, key=lambda e: e.time)
    submitted = _first(events, "submitted", "runner")
    if submitted is None:
        return Startup()
    t0 = submitted.time
    second = [events[i].time for i in machine_starts(events)][1:2]
    first_machine = [e for e in events if not second or e.time < second[0]]

    def since(name: str, source: str | None = None) -> float | None:
        found = _first(first_machine, name, source)
        return None if found is None else round(found.time - t0, 3)

    rows = [r for r in epoch_rows(metrics) if not second or r[1] < second[0]]
    first_epoch = rows[0] if rows and rows[0][2].get("epoch") == 1 else None
    values = {
        "ready_s": since("provisioned", "runner"),
        "image_pulled_s": since("container_started", "bootstrap"),
        "job_started_s": since("job_started", "worker"),
        "framework_imported_s": since(FRAMEWORK_IMPORTED),
        "device_found_s": since(DEVICE_FOUND),
        "first_step_s": since(FIRST_STEP),
        "training_started_s": None if first_epoch is None else round(first_epoch[0] - t0, 3),
        "first_epoch_done_s": None if first_epoch is None else round(first_epoch[1] - t0, 3),
    }
    trains = bool(rows) or any(e.event in (FRAMEWORK_IMPORTED, FIRST_STEP) for e in events)
    missing = []
    if trains:
        missing = [
            name
            for name, key in (("framework imported", "framework_imported_s"), ("first step", "first_step_s"))
            if values[key] is None
        ]
    return Startup(**values, missing=tuple(missing), ready_label=ready)
