"""What a run cost, from what it left behind: pure functions over logs, events and the emulator's request log.

Nothing here touches a process, a socket or a clock, so each is unit-tested on hand-made inputs
(tests/faults/test_faults.py). The suite (faults/suite.py) gathers the inputs while a case runs.

Where the trainer leaves structured data (summary.json, checkpoints/latest.json, progress.json, events) the suite
reads that. What only the log says is parsed here: each start of the trainer and what it resumed from, which
checkpoints it skipped and why, and the exact step a stop saved at. The lines are runner.train's (trainer.py,
callbacks.py, checkpoints.py); a change of their wording shows up as a failing unit test here.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from runner.train.checkpoints import Position, parse_name

# What the trainer writes to logs/worker-N.log.
_ATTEMPT_START = re.compile(r"^\[trainer\] strategy: ")
_DATA = re.compile(r"^\[trainer\] data: .*; (\d+) steps/epoch")
_RESUMED = re.compile(r"^\[trainer\] resumed from (\S+\.keras): .*(?:optimizer|global) step (\d+)")
_FRESH = re.compile(r"^\[trainer\] no checkpoint verifies")
_SKIPPED = re.compile(r"^\[trainer\] skipping (\S+\.keras): (.*)$")
_SCANNED = re.compile(r"^\[trainer\] checkpoints/latest\.json (is missing|is unreadable|names missing files)")
# A stop (SIGTERM) saves where training stands, or says a checkpoint already holds it; both give the global step.
_STOPPED = re.compile(r"^\[trainer\] SIG[A-Z]+: (?:saved \S+ at|\S+ already holds) .*\(global step (\d+)\)")
# A stop between two epochs' fits says only this: it stopped where its last completed epoch ended.
_STOPPED_AT_EPOCH_END = re.compile(r"^\[trainer\] stopped before the end")
_EPOCH_END = re.compile(r"^Epoch (\d+)/(\d+) (\d+)/(\d+) - ")
_NODE_PATH = re.compile(r"^/v2/projects/([^/]+)/locations/([^/]+)/nodes(?:/([^/]+))?$")


# -- the trainer's attempts -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Attempt:
    """One start of the trainer, as its log shows it."""

    resumed_from: str | None = None  # the checkpoint file it resumed from; None: from scratch
    completed: tuple[int, ...] = ()  # epochs it finished, in order
    start_step: int = 0  # the global step it went on from
    stop_step: int | None = None  # the global step a stop saved at (exact); None: no such line (killed, or ended)
    stopped: bool = False  # it stopped on a signal and said so (not killed): where it stopped is known
    steps_per_epoch: int | None = None
    skipped: tuple[tuple[str, str], ...] = ()  # (checkpoint file, why) it would not resume from
    scanned: str | None = None  # why it scanned checkpoints/ instead of trusting latest.json

    @property
    def position(self) -> Position:
        """(epochs done, steps of the next) it resumed at; (0, 0) from scratch."""
        return (parse_name(self.resumed_from) or (0, 0)) if self.resumed_from else (0, 0)

    @property
    def epochs_reached(self) -> int:
        return max(self.completed or (self.position[0],))


def parse_attempts(log: str) -> list[Attempt]:
    """Split a worker log (every attempt appends to the same log) into the trainer's attempts.

    The trainer chooses its checkpoint before TensorFlow is imported, so its "skipping" and "scanning" lines come
    before the "strategy:" line that marks its start: they are held until the next line says whose they are (a
    start takes them; a resume or a fresh start of the current attempt keeps them)."""
    attempts: list[dict[str, Any]] = []
    held: dict[str, Any] = {"skipped": [], "scanned": None}

    def take_held(into: dict[str, Any]) -> None:
        into["skipped"] += held["skipped"]
        into["scanned"] = into["scanned"] or held["scanned"]
        held.update(skipped=[], scanned=None)

    for raw in log.splitlines():
        line = raw.strip("\r")
        if _ATTEMPT_START.match(line):
            attempts.append({"resumed_from": None, "completed": [], "start_step": 0, "stop_step": None,
                             "stopped": False, "steps_per_epoch": None, "skipped": [], "scanned": None})  # fmt: skip
            take_held(attempts[-1])
        elif m := _SKIPPED.match(line):
            held["skipped"].append((m.group(1), m.group(2)))
        elif m := _SCANNED.match(line):
            held["scanned"] = m.group(1).removeprefix("is ")
        elif not attempts:
            continue
        elif m := _RESUMED.match(line):
            attempts[-1].update(resumed_from=m.group(1), start_step=int(m.group(2)))
            take_held(attempts[-1])
        elif _FRESH.match(line):
            take_held(attempts[-1])
        elif m := _DATA.match(line):
            attempts[-1]["steps_per_epoch"] = int(m.group(1))
        elif m := _STOPPED.match(line):
            attempts[-1]["stop_step"] = int(m.group(1))
        elif _STOPPED_AT_EPOCH_END.match(line):
            attempts[-1]["stopped"] = True
        elif (m := _EPOCH_END.match(line)) and m.group(3) == m.group(4):
            attempts[-1]["completed"].append(int(m.group(1)))
    return [Attempt(**{**a, "completed": tuple(a["completed"]), "skipped": tuple(a["skipped"])}) for a in attempts]


def epochs_redone(attempts: Sequence[Attempt]) -> int:
    """Completed epochs trained more than once, across attempts."""
    counts = Counter(e for a in attempts for e in a.completed)
    return sum(n - 1 for n in counts.values() if n > 1)


def partial_epochs(attempts: Sequence[Attempt], epochs: int) -> int:
    """Attempts cut off before the last epoch, each in the middle of one (what that costs is in steps_lost)."""
    return sum(1 for a in attempts[:-1] if a.epochs_reached < epochs)


def checkpoints_lost(
    attempts: Sequence[Attempt],
    restart_times: Sequence[float],
    first_seen: Mapping[Position, float],
    *,
    final_epoch: int | None = None,
    final_ok: bool = True,
    destroyed: Collection[Position] = (),
) -> int:
    """Checkpoints that reached the bucket before a restart but that the restarted attempt did not resume from or
    after; plus, at the end, completed epochs newer than the bucket's final manifest (`final_epoch`), or 1 when
    the manifest names a file the bucket does not have (`final_ok` False). Checkpoints the case itself destroyed
    (`destroyed`: a torn file) are not the runner's loss.

    `restart_times[i]` is when attempt i+1 started (its worker_started event); `first_seen` is when each
    checkpoint position (epochs done, steps of the next) was first seen in the bucket."""
    lost = 0
    for i, started in enumerate(restart_times):
        if i + 1 >= len(attempts):
            break
        resumed = attempts[i + 1].position
        lost += sum(1 for pos, seen in first_seen.items() if seen < started and pos > resumed and pos not in destroyed)
    if final_epoch is not None and attempts:
        lost += max(0, attempts[-1].epochs_reached - final_epoch)
    if not final_ok:
        lost += 1
    return lost


@dataclass(frozen=True)
class StepsLost:
    """Steps an attempt trained before it stopped that the next attempt trained again."""

    steps: int
    exact: bool  # False: the stop left no "saved ... (global step G)" line, so `steps` is a lower bound

    def __str__(self) -> str:
        return f"{self.steps}" if self.exact else f">={self.steps}"


def steps_lost(attempts: Sequence[Attempt], observed: Sequence[int | None] = ()) -> list[StepsLost]:
    """One entry per restart. Where an attempt got to is its stop line's global step (exact); without one, a stop
    it reported came between two epochs (trainer.fit returns there without a line), so its last completed epoch's
    end (exact); else, killed before it could say, the highest global step seen for it in the bucket while it ran
    (`observed[i]`: progress.json and manifest entries; a lower bound). What the next attempt went on from is its
    resume line's."""
    out = []
    for i in range(len(attempts) - 1):
        before, after = attempts[i], attempts[i + 1]
        if before.stop_step is not None:
            out.append(StepsLost(max(0, before.stop_step - after.start_step), True))
            continue
        reached = before.start_step
        if before.steps_per_epoch and before.completed:
            reached = max(reached, before.completed[-1] * before.steps_per_epoch)
        if not before.stopped and i < len(observed) and observed[i] is not None:
            reached = max(reached, observed[i] or 0)
        out.append(StepsLost(max(0, reached - after.start_step), before.stopped))
    return out


def _short(name: str) -> str:
    return name.removesuffix(".keras")


def recovered_from(attempt: Attempt) -> str:
    """What a restarted attempt resumed from, and what it would not use: 'ckpt-000002 (skipped ckpt-000002-s000031:
    size mismatch)'."""
    what = _short(attempt.resumed_from) if attempt.resumed_from else "scratch"
    why = []
    if attempt.scanned:
        why.append(f"latest.json {attempt.scanned}: scanned")
    why += [f"skipped {_short(name)}: {reason.split(' (')[0]}" for name, reason in attempt.skipped]
    return what + (f" ({'; '.join(why)})" if why else "")


# -- nodes and idle time ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """The part of an emulator request record the measurements need."""

    time: float
    method: str
    path: str
    status: int
    node_id: str | None = None  # create: the ?nodeId=
    caller: str = "runner"  # "vm": sent with the VM's metadata-server token (the bootstrap); "runner": anonymous


@dataclass(frozen=True)
class ApiOperation:
    """One long-running operation as the TPU API lists it: its timestamps are the API's clock."""

    verb: str  # create | delete | ...
    target: str  # projects/P/locations/Z/nodes/N
    start: float  # metadata.createTime
    end: float | None  # metadata.endTime; None while it runs
    failed: bool


def billed_spans(operations: Iterable[ApiOperation], node: str) -> list[tuple[float, float | None]]:
    """The truth a run's cost is held to: each READY span of `node` by the API's own clock, from the end of a create
    that went through to the start of the first deletion after it that went through (None: not deleted)."""
    ops = sorted(operations, key=lambda o: o.start)
    ready = [o.end for o in ops if o.target == node and o.verb == "create" and not o.failed and o.end is not None]
    deletes = [o.start for o in ops if o.target == node and o.verb == "delete" and not o.failed]
    return [(r, next((d for d in deletes if d >= r), None)) for r in sorted(ready)]


@dataclass(frozen=True)
class Idle:
    """One VM's job end and the first accepted deletion of its node after it."""

    node: str  # projects/P/locations/Z/nodes/N
    ended_at: float  # container_exited (or image_pull_failed): the VM knows the job is over
    delete_at: float | None  # None: never deleted
    preempted: bool  # the node was preempted while this job ran
    by: str  # what ended it: container_exited / image_pull_failed
    deleted_by: str | None = None  # who sent that DELETE: vm / runner
    shutdown: bool = False  # the bootstrap saw the VM shut down (a preemption, or a delete before the job ended)

    @property
    def seconds(self) -> float | None:
        return None if self.delete_at is None else max(0.0, self.delete_at - self.ended_at)


def node_lifetimes(requests: Iterable[Request]) -> list[tuple[float, str]]:
    """(time, node name) of every accepted create."""
    out = []
    for r in requests:
        m = _NODE_PATH.match(r.path)
        if r.method == "POST" and m and m.group(3) is None and r.status < 300 and r.node_id:
            out.append((r.time, f"projects/{m.group(1)}/locations/{m.group(2)}/nodes/{r.node_id}"))
    return sorted(out)


def node_deletes(requests: Iterable[Request]) -> list[tuple[float, str, str]]:
    """(time, node name, caller) of every accepted DELETE of a node."""
    return sorted(
        (r.time, r.path[len("/v2/") :], r.caller)
        for r in requests
        if r.method == "DELETE" and r.status < 300 and (m := _NODE_PATH.match(r.path)) and m.group(3)
    )


def idle_intervals(
    job_ends: Iterable[dict[str, Any]],
    requests: Sequence[Request],
    preemptions: Sequence[float] = (),
    failed_deletes: Sequence[tuple[float, str]] = (),
) -> list[Idle]:
    """For each VM's job end (bootstrap events container_exited / image_pull_failed), the node it ran on (the
    newest accepted create before it) and the first accepted DELETE of that node after that create whose deletion
    went through. A job end after a preemption (times in `preemptions`) of that node is marked preempted.

    `failed_deletes`: (time, node) of delete operations that failed (the node came back and kept billing); the
    accepted DELETE that started each (the nearest of that node, within a second) does not end the idle time."""
    creates = node_lifetimes(requests)
    deletes = node_deletes(requests)
    for t, node in failed_deletes:
        near = [d for d in deletes if d[1] == node and abs(d[0] - t) <= 1.0]
        if near:
            deletes.remove(min(near, key=lambda d: abs(d[0] - t)))
    out = []
    for end in sorted(job_ends, key=lambda e: float(e["time"])):
        t = float(end["time"])
        before = [c for c in creates if c[0] <= t]
        if not before:
            continue
        created, node = before[-1]
        delete = next(((d, who) for d, name, who in deletes if name == node and d >= created), (None, None))
        preempted = any(created <= p <= t for p in preemptions)
        out.append(Idle(node, t, delete[0], preempted, str(end.get("event")), delete[1], bool(end.get("shutdown"))))
    return out


def idle_from_events(events: Iterable[dict[str, Any]]) -> list[float]:
    """Without the emulator's request log: job end -> the next delete_requested (bootstrap) or teardown_requested
    (runner) event, per job end, from the run directory's events alone."""
    ordered = sorted(events, key=lambda e: float(e["time"]))
    out = []
    for i, e in enumerate(ordered):
        if e.get("event") in ("container_exited", "image_pull_failed"):
            nxt = next(
                (
                    float(x["time"])
                    for x in ordered[i + 1 :]
                    if x.get("event") in ("delete_requested", "teardown_requested")
                ),
                None,
            )
            if nxt is not None:
                out.append(round(nxt - float(e["time"]), 3))
    return out


@dataclass(frozen=True)
class Observed:
    """A global step seen in the bucket (progress.json or a manifest entry) at a time: where training had got."""

    time: float
    global_step: int


def reached_per_attempt(observed: Iterable[Observed], restart_times: Sequence[float]) -> list[int | None]:
    """The highest global step seen for each attempt: seen before the next attempt started."""
    bounds = [*restart_times, float("inf")]
    out: list[int | None] = [None] * len(bounds)
    for seen in observed:
        i = next(k for k, t in enumerate(bounds) if seen.time < t)
        out[i] = max(out[i] or 0, seen.global_step)
    return out
