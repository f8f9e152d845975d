"""Fault-injection suite: real `runner submit` runs on the Cloud TPU API emulator and a Cloud Storage emulator, each
with one injected fault, measured against the promise that a TPU never idles on the bill and a preemption never
loses more than one checkpoint interval.

    .venv/bin/python scripts/faults.py                       # every case once (make faults)
    .venv/bin/python scripts/faults.py --only preemption-x2 --only container-crash --repeat 3 --json out.json
    .venv/bin/python scripts/faults.py --list

Each case runs the real command line, `python -m runner.cli submit SPEC`, as a subprocess pointed at the emulators
by its environment (RUNNER_TPU_ENDPOINT, RUNNER_REGISTRY_ENDPOINT, STORAGE_EMULATOR_HOST, a private RUNNER_HOME),
then reads what happened from the run directory (events, exit records, the log, checkpoints) and from the emulator
(nodes left, every request with its time). It prints one table: the terminal state against the expected one,
nodes leaked, checkpoints lost, epochs trained twice after a preemption, and the idle billable seconds of each run
(container exit -> the first accepted DELETE of its node, from the emulator's own request log).
See docs/faults.md. Exit status 1 when a run is not as expected, leaks a node or loses a checkpoint.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from runner.storage import Storage, open_storage  # noqa: E402

IMAGE = "us-central1-docker.pkg.dev/test-project/runner/trainer:test"
PROJECT = "test-project"
ZONES = ("us-central1-b", "us-central1-c")
THIRD_ZONE = "europe-west4-a"  # also offers v2-8 (runner/data/tpu_catalog.yaml)
BUCKET = "runner-faults"
IDLE_GOAL_S = 10.0
UNREACHABLE = "http://127.0.0.1:9"  # nothing listens: a registry check that cannot tell

# What the trainer writes to logs/worker-N.log (runner/train/trainer.py, runner/train/callbacks.py).
_ATTEMPT_START = re.compile(r"^\[trainer\] strategy: ")
_RESUMED = re.compile(r"^\[trainer\] resumed from ckpt-(\d+)\.keras")
_EPOCH_END = re.compile(r"^Epoch (\d+)/(\d+) (\d+)/(\d+) - ")
_CKPT = re.compile(r"(?:^|/)ckpt-(\d+)\.keras$")
_NODE_PATH = re.compile(r"^/v2/projects/([^/]+)/locations/([^/]+)/nodes(?:/([^/]+))?$")


# -- measurements (pure: unit-tested on hand-made inputs) -------------------------------------------------------------


@dataclass(frozen=True)
class Attempt:
    """One start of the trainer, as its log shows it."""

    resumed_from: int | None  # the checkpoint epoch it resumed from; None: from scratch
    completed: tuple[int, ...]  # epochs it finished, in order


def parse_attempts(log: str) -> list[Attempt]:
    """Split a worker log (every attempt appended to the same log) into the trainer's attempts."""
    attempts: list[tuple[int | None, list[int]]] = []
    for raw in log.splitlines():
        line = raw.strip("\r")
        if _ATTEMPT_START.match(line):
            attempts.append((None, []))
            continue
        if not attempts:
            continue
        if m := _RESUMED.match(line):
            attempts[-1] = (int(m.group(1)), attempts[-1][1])
        elif (m := _EPOCH_END.match(line)) and m.group(3) == m.group(4):
            attempts[-1][1].append(int(m.group(1)))
    return [Attempt(r, tuple(c)) for r, c in attempts]


def epochs_redone(attempts: Sequence[Attempt]) -> int:
    """Completed epochs trained more than once, across attempts."""
    counts = Counter(e for a in attempts for e in a.completed)
    return sum(n - 1 for n in counts.values() if n > 1)


def partial_epochs(attempts: Sequence[Attempt], epochs: int) -> int:
    """Attempts cut off before the last epoch (each loses the epoch it was in the middle of)."""
    return sum(1 for a in attempts[:-1] if max(a.completed or (a.resumed_from or 0,), default=0) < epochs)


def checkpoints_lost(
    attempts: Sequence[Attempt],
    restart_times: Sequence[float],
    first_seen: dict[int, float],
    *,
    final_epoch: int | None = None,
    final_ok: bool = True,
) -> int:
    """Checkpoint epochs that reached the bucket before a restart but that the restarted attempt did not resume from
    or after; plus, at the end, completed epochs newer than the bucket's final manifest (`final_epoch`), or 1 when
    the manifest names a file the bucket does not have (`final_ok` False).

    `restart_times[i]` is when attempt i+1 started (its worker_started event); `first_seen` is when each
    checkpoint epoch was first seen in the bucket."""
    lost = 0
    for i, started in enumerate(restart_times):
        if i + 1 >= len(attempts):
            break
        resumed = attempts[i + 1].resumed_from or 0
        lost += sum(1 for epoch, seen in first_seen.items() if seen < started and epoch > resumed)
    if final_epoch is not None and attempts:
        done = max(attempts[-1].completed or (attempts[-1].resumed_from or 0,), default=0)
        lost += max(0, done - final_epoch)
    if not final_ok:
        lost += 1
    return lost


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


def idle_intervals(
    job_ends: Iterable[dict[str, Any]], requests: Sequence[Request], preemptions: Sequence[float] = ()
) -> list[Idle]:
    """For each VM's job end (bootstrap events container_exited / image_pull_failed), the node it ran on (the
    newest accepted create before it) and the first accepted DELETE of that node after that create. A job end
    after a preemption (times in `preemptions`) of that node is marked preempted."""
    creates = node_lifetimes(requests)
    deletes = sorted(
        (r.time, r.path[len("/v2/") :], r.caller)
        for r in requests
        if r.method == "DELETE" and r.status < 300 and (m := _NODE_PATH.match(r.path)) and m.group(3)
    )
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


# -- the table ------------------------------------------------------------------------------------------------------


@dataclass
class RunResult:
    """One run of one case, measured."""

    case: str
    fault: str
    expected: str  # the expected terminal state, or "rejected (exit 2)"
    got: str
    exit_code: int | None
    expected_exit: int
    as_expected: bool
    nodes_leaked: int
    checkpoints_lost: int | None  # None: the case trains nothing
    epochs_redone: int | None
    partial_epochs: int | None
    idle_s: list[float | None] = field(default_factory=list)  # one per VM that ran the job
    idle_preempted_s: list[float | None] = field(default_factory=list)  # VMs stopped by a preemption
    wall_s: float = 0.0
    run_id: str | None = None
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def idle_max(self) -> float | None:
        values = [v for v in self.idle_s + self.idle_preempted_s if v is not None]
        return max(values) if values else None

    @property
    def idle_undeleted(self) -> int:
        return sum(1 for v in self.idle_s + self.idle_preempted_s if v is None)


COLUMNS = (
    "fault",
    "runs",
    "terminal state (expected)",
    "as expected",
    "nodes leaked",
    "ckpts lost",
    "epochs re-done",
    "idle billable s",
)


def _fmt_s(value: float | None) -> str:
    return "never" if value is None else f"{value:.1f}"


def summarize(results: Sequence[RunResult]) -> list[dict[str, str]]:
    """One table row per case: every run of it folded together."""
    rows = []
    by_case: dict[str, list[RunResult]] = {}
    for r in results:
        by_case.setdefault(r.case, []).append(r)
    for runs in by_case.values():
        first = runs[0]
        states = Counter(r.got for r in runs)
        got = ", ".join(s if n == 1 else f"{s} x{n}" for s, n in states.items())
        ok = sum(r.as_expected for r in runs)
        trains = [r for r in runs if r.checkpoints_lost is not None]
        redone = "-"
        if trains:
            total = sum(r.epochs_redone or 0 for r in trains)
            partial = sum(r.partial_epochs or 0 for r in trains)
            redone = f"{total}" + (f" (+{partial} partial)" if partial else "")
        idles = [r.idle_max for r in runs if r.idle_s or r.idle_preempted_s]
        never = sum(r.idle_undeleted for r in runs)
        if idles:
            known = [v for v in idles if v is not None]
            idle = _fmt_s(max(known)) if known else "never"
            if len(runs) > 1 and known:
                idle = f"max {idle}, " + " ".join(_fmt_s(v) for v in idles)
            if never:
                idle += f" ({never} never deleted)"
        else:
            idle = "-"
        rows.append(
            {
                "fault": first.fault,
                "runs": str(len(runs)),
                "terminal state (expected)": f"{got} ({first.expected})",
                "as expected": "yes" if ok == len(runs) else f"NO ({ok}/{len(runs)})",
                "nodes leaked": str(sum(r.nodes_leaked for r in runs)),
                "ckpts lost": str(sum(r.checkpoints_lost or 0 for r in trains)) if trains else "-",
                "epochs re-done": redone,
                "idle billable s": idle,
            }
        )
    return rows


def render_table(rows: Sequence[dict[str, str]], columns: Sequence[str] = COLUMNS) -> str:
    widths = [max(len(c), *(len(r.get(c, "")) for r in rows)) if rows else len(c) for c in columns]
    numeric = {"runs", "nodes leaked", "ckpts lost"}

    def line(values: Sequence[str]) -> str:
        cells = [v.rjust(w) if c in numeric else v.ljust(w) for c, v, w in zip(columns, values, widths, strict=True)]
        return "  ".join(cells).rstrip()

    out = [line(list(columns)), line(["-" * w for w in widths])]
    out += [line([r.get(c, "") for c in columns]) for r in rows]
    return "\n".join(out)


def longest_idle(results: Sequence[RunResult]) -> tuple[float, str] | None:
    best: tuple[float, str] | None = None
    for r in results:
        for kind, values in (("", r.idle_s), (" (preempted VM)", r.idle_preempted_s)):
            for v in values:
                if v is not None and (best is None or v > best[0]):
                    best = (v, f"{r.case}{kind}, run {r.run_id}")
    return best


# -- cases ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    name: str
    fault: str  # what the table calls it
    expect: str | None  # the terminal state; None: refused before anything is created (exit 2)
    expect_exit: int
    train: bool = False  # the built-in trainer on real MNIST (else `command`)
    command: tuple[str, ...] = ("python", "-c", "print('hello from the VM', flush=True)")
    epochs: int = 4
    train_examples: int = 1024
    spot: bool = False
    zones: tuple[str, ...] = ZONES
    teardown: dict[str, Any] = field(default_factory=dict)
    retries: dict[str, Any] = field(default_factory=dict)
    registry: str | None = None  # RUNNER_REGISTRY_ENDPOINT; None: the emulator
    setup: Callable[[Ctx], None] | None = None  # before submit: inject faults
    during: Callable[[Ctx], None] | None = None  # in a thread while the run lives
    check: Callable[[Ctx, RunResult], None] | None = None  # extra expectations, after the run
    kills_runner: bool = False  # the run finishes on the VM alone: wait for it
    fast: bool = False  # quick enough for `make test`
    timeout_s: float = 420.0
    gcs_faults: int = 0  # 503s the flaky proxy answers to the first uploads of each checkpoint object
    proxy: bool = False  # the VMs reach Cloud Storage through a FlakyProxy (ctx.proxy) even without gcs_faults
    runner_via_proxy: bool = False  # the runner too (its STORAGE_EMULATOR_HOST is the proxy)

    def spec_yaml(self, storage: str, data: str | None) -> str:
        acc = {"type": "v2-8", "zones": list(self.zones), "project": PROJECT}
        if self.spot:
            acc["spot"] = True
        doc: dict[str, Any] = {"name": "faults", "image": IMAGE, "accelerator": acc, "storage": storage}
        if self.train:
            doc["training"] = {
                "model": "mnist_mlp",
                "epochs": self.epochs,
                "batch_size": 128,
                "max_train_examples": self.train_examples,
                "max_test_examples": 256,
                "checkpoint_every": 1,
                "data": data,
            }
        else:
            doc["command"] = list(self.command)
        if self.teardown:
            doc["teardown"] = dict(self.teardown)
        if self.retries:
            doc["retries"] = dict(self.retries)
        return json.dumps(doc, indent=1) + "\n"  # JSON is YAML


LONG_COMMAND = ("python", "-c", "import time\nfor i in range(900):\n    print('working', i, flush=True); time.sleep(1)")


def _preempt_at(*epochs: int) -> Callable[[Ctx], None]:
    """Preempt the node once the newest checkpoint in the bucket reaches each of `epochs` in turn (and, after a
    preemption, only once the recreated VM has trained and checkpointed further)."""

    def during(ctx: Ctx) -> None:
        floor = 0
        for epoch in epochs:
            target = max(epoch, floor + 1)
            node = ctx.wait_for(lambda t=target: ctx.ready_node_with_checkpoint(t), timeout=ctx.case.timeout_s)
            if node is None:
                ctx.problem(f"never reached checkpoint epoch {target} on a READY node: no preemption")
                return
            listed = ctx.checkpoint_epochs()
            ctx.emulator.preempt(node, wait=False)
            at = ctx.manifest_epoch() or 0
            ctx.preemptions.append({"time": time.time(), "at_checkpoint": at, "bucket": listed})
            floor = at
            # The next preemption is for the next VM: wait until this node is gone.
            ctx.wait_for(lambda: not any(n.state == "PREEMPTED" for n in ctx.emulator.nodes()) or None, timeout=120)

    return during


def _preempt_when_ready(ctx: Ctx) -> None:
    """Preempt the node the moment it is READY, before the runner's next poll sees it (a spot VM can go any time)."""
    node = ctx.wait_for(
        lambda: next((n.node_id for n in ctx.emulator.nodes() if n.state == "READY"), None),
        timeout=ctx.case.timeout_s,
        interval=0.02,
    )
    if node is None:
        ctx.problem("no node became READY: no preemption")
        return
    ctx.emulator.preempt(node, wait=False)
    ctx.preemptions.append({"time": time.time(), "at_checkpoint": 0, "bucket": []})


def _check_boot_preemption(ctx: Ctx, result: RunResult) -> None:
    """A node taken back while it boots is a preemption (retries.preemptions), not a stockout."""
    _check_preemptions(1)(ctx, result)
    seen = [e for e in ctx.events if e.get("source") == "runner" and e.get("event") == "preempted"]
    zones = [name.split("/")[3] for _, name in node_lifetimes(ctx.requests)]
    result.notes.append(
        f"the runner recorded {len(seen)} preemption(s); creates accepted in: {', '.join(zones) or 'none'}"
    )


def _check_preemptions(n: int) -> Callable[[Ctx, RunResult], None]:
    def check(ctx: Ctx, result: RunResult) -> None:
        if len(ctx.preemptions) != n:
            result.problems.append(f"{len(ctx.preemptions)} preemption(s) injected, {n} planned")
        seen = [e for e in ctx.events if e.get("source") == "runner" and e.get("event") == "preempted"]
        if len(seen) != len(ctx.preemptions):
            result.problems.append(f"the runner recorded {len(seen)} preemption(s), {len(ctx.preemptions)} happened")
        if ctx.case.train:
            at = ", ".join(str(p["at_checkpoint"]) for p in ctx.preemptions)
            resumed = ", ".join(str(a.resumed_from) for a in ctx.attempts[1:])
            done = "; ".join(",".join(map(str, a.completed)) or "-" for a in ctx.attempts)
            result.notes.append(
                f"preempted with checkpoint epoch {at} in the bucket; resumed from {resumed}; "
                f"epochs per attempt: {done}"
            )

    return check


def _kill_runner_after(what: str, ready: Callable[[Ctx], bool]) -> Callable[[Ctx], None]:
    def during(ctx: Ctx) -> None:
        if ctx.wait_for(lambda: ready(ctx) or None, timeout=ctx.case.timeout_s) is None:
            ctx.problem(f"never saw {what}: the runner was not killed")
            return
        assert ctx.proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.kill(ctx.proc.pid, signal.SIGKILL)
        ctx.killed_at = time.time()
        ctx.note(f"runner SIGKILLed after {what}")

    return during


def _job_running(ctx: Ctx) -> bool:
    store = ctx.storage()
    return store is not None and bool(store.read_bytes("heartbeat"))


def _first_checkpoint(ctx: Ctx) -> bool:
    return bool(ctx.checkpoint_epochs())


def _check_status_after_kill(ctx: Ctx, result: RunResult) -> None:
    if ctx.killed_at is None:
        result.problems.append("the runner was never killed")
        return
    ended = [e for e in ctx.exit_records if e.get("finished_at")]
    what = ", ".join(
        f"{e.get('state')} (exit {e.get('exit_code')}) {float(e['finished_at']) - ctx.killed_at:.0f}s after the kill"
        for e in ended
    )
    result.notes.append(f"the VM alone recorded {what or 'nothing'}; `runner status` then says {result.got}")


def _check_safety_stop(ctx: Ctx, result: RunResult) -> None:
    for e in ctx.exit_records:
        if e.get("exit_code") != 124:
            result.problems.append(f"worker exit code {e.get('exit_code')}, expected 124 (safety stop)")
        if e.get("started_at") and e.get("finished_at"):
            took = float(e["finished_at"]) - float(e["started_at"])
            result.notes.append(f"job stopped {took:.0f}s after it started: {e.get('error')}")


def _check_nothing_created(ctx: Ctx, result: RunResult) -> None:
    creates = [r for r in ctx.requests if r.method == "POST" and r.path.endswith("/nodes")]
    if creates:
        result.problems.append(f"{len(creates)} create request(s) sent")
    result.notes.append(f"{len(creates)} create requests; refused before anything was paid for")


def _check_vm_recorded_pull_failure(ctx: Ctx, result: RunResult) -> None:
    if not any(e.get("event") == "image_pull_failed" for e in ctx.events):
        result.problems.append("no image_pull_failed event from the VM")
    exits = ctx.exit_records
    codes = sorted({e.get("exit_code") for e in exits})
    result.notes.append(f"VM recorded image_pull_failed; exit record codes {codes}")


def _check_zone(zone: str) -> Callable[[Ctx, RunResult], None]:
    def check(ctx: Ctx, result: RunResult) -> None:
        lives = node_lifetimes(ctx.requests)
        ran = [name.split("/")[3] for _, name in lives]
        result.notes.append(f"creates accepted in: {', '.join(ran)}")
        ended = [i.node.split("/")[3] for i in ctx.idle]
        if ended and ended[-1] != zone:
            result.problems.append(f"the job ran in {ended[-1]}, expected {zone}")

    return check


def _check_http_burst(status: int, count: int) -> Callable[[Ctx, RunResult], None]:
    def check(ctx: Ctx, result: RunResult) -> None:
        hits = [r for r in ctx.requests if r.status == status]
        if len(hits) != count:
            result.problems.append(f"{len(hits)} requests answered {status}, {count} injected")
        where = Counter(f"{r.method} {'nodes/*' if r.path.count('/') > 6 else r.path.rsplit('/', 1)[-1]}" for r in hits)
        result.notes.append(f"{status}s answered to: " + ", ".join(f"{k} x{v}" for k, v in where.items()))

    return check


def _check_gcs_faults(ctx: Ctx, result: RunResult) -> None:
    assert ctx.proxy is not None
    injected = ctx.proxy.injected
    names = Counter(Path(r.object_name or "?").name for r in injected)
    if not injected or any(n != ctx.case.gcs_faults for n in names.values()):
        result.problems.append(f"uploads failed by the proxy: {dict(names)}; planned {ctx.case.gcs_faults} each")
    result.notes.append("503 to uploads of " + ", ".join(f"{k} x{v}" for k, v in sorted(names.items())))
    result.notes.append(f"bucket checkpoints: {ctx.checkpoint_epochs()}; manifest epoch {ctx.final_manifest_epoch}")


def _fail_exit_check(ctx: Ctx) -> None:
    """One 503 to the VM's check of its exit record. The runner's listings of exit/ are answered 3 s late, so that
    the VM makes its check before the runner, having seen the record, deletes the node under it."""
    assert ctx.proxy is not None
    ctx.proxy.fail_requests(r"/o/.+/exit/worker-0\.json$", 1, method="GET")
    ctx.proxy.slow_answers(r"[?&]prefix=[^&]*/exit/", 3.0, method="GET")


def _check_exit_record(ctx: Ctx, result: RunResult) -> None:
    assert ctx.proxy is not None
    injected = ctx.proxy.injected
    if len(injected) != 1:
        result.problems.append(f"{len(injected)} exit-record checks failed by the proxy, 1 planned")
    for e in ctx.exit_records:
        result.notes.append(
            f"exit/worker-{e.get('worker')}.json in the end: {e.get('state')}, exit {e.get('exit_code')}"
            + (f", {e.get('error')!r}" if e.get("error") else "")
        )


def _check_self_delete(ctx: Ctx, result: RunResult) -> None:
    deletes = [r for r in ctx.requests if r.method == "DELETE"]
    result.notes.append("DELETE answers in order: " + ", ".join(f"{r.status} ({r.caller})" for r in deletes))


CASES: tuple[Case, ...] = (
    Case(
        "preemption-x2",
        "preemption mid-training, twice (spot)",
        "succeeded",
        0,
        train=True,
        epochs=12,
        train_examples=24576,
        spot=True,
        during=_preempt_at(2, 6),
        check=_check_preemptions(2),
    ),
    Case(
        "preempt-at-boot",
        "spot preemption as the node turns READY",
        "succeeded",
        0,
        spot=True,
        during=_preempt_when_ready,
        check=_check_boot_preemption,
    ),
    Case(
        "preempt-at-boot-1zone",
        "spot preemption as the node turns READY, one zone",
        "succeeded",
        0,
        spot=True,
        zones=(ZONES[0],),
        during=_preempt_when_ready,
        check=_check_boot_preemption,
        fast=True,
    ),
    Case(
        "stockout-first-zone",
        "stockout in the first zone",
        "succeeded",
        0,
        setup=lambda ctx: ctx.emulator.stockout(ZONES[0]),
        check=_check_zone(ZONES[1]),
        fast=True,
    ),
    Case(
        "stockout-two-zones",
        "stockout in the first two of three zones",
        "succeeded",
        0,
        zones=(*ZONES, THIRD_ZONE),
        setup=lambda ctx: (ctx.emulator.stockout(ZONES[0]), ctx.emulator.stockout(ZONES[1])),
        check=_check_zone(THIRD_ZONE),
    ),
    Case(
        "capacity-wait",
        "stockout everywhere, then capacity (capacity_wait)",
        "succeeded",
        0,
        retries={"capacity_wait": "2m"},
        setup=lambda ctx: ctx.emulator.stockout(None, count=2),
        check=_check_zone(ZONES[0]),
    ),
    Case(
        "429-burst",
        "429 burst (3 requests)",
        "succeeded",
        0,
        setup=lambda ctx: ctx.emulator.http_errors(429, count=3),
        check=_check_http_burst(429, 3),
    ),
    Case(
        "503-burst",
        "503 burst (3 requests)",
        "succeeded",
        0,
        setup=lambda ctx: ctx.emulator.http_errors(503, count=3),
        check=_check_http_burst(503, 3),
        fast=True,
    ),
    Case(
        "503-on-delete",
        "503 burst on the VM's self-delete (3)",
        "succeeded",
        0,
        setup=lambda ctx: ctx.emulator.http_errors(503, count=3, method="DELETE"),
        check=_check_self_delete,
    ),
    Case(
        "runner-sigkill",
        "runner SIGKILL mid-training",
        "succeeded",
        -9,
        train=True,
        epochs=6,
        train_examples=16384,
        during=_kill_runner_after("the first checkpoint in the bucket", _first_checkpoint),
        check=_check_status_after_kill,
        kills_runner=True,
    ),
    Case(
        "container-crash",
        "container crash (exit 3)",
        "failed",
        6,
        command=("python", "-c", "import sys; print('about to crash', flush=True); sys.exit(3)"),
        fast=True,
    ),
    Case(
        "image-missing",
        "image not in the registry (pre-flight)",
        None,
        2,
        setup=lambda ctx: ctx.emulator.missing_image(IMAGE),
        check=_check_nothing_created,
    ),
    Case(
        "image-pull-on-vm",
        "image pull failure on the VM",
        "failed",
        6,
        registry=UNREACHABLE,
        setup=lambda ctx: ctx.emulator.missing_image(IMAGE),
        check=_check_vm_recorded_pull_failure,
    ),
    Case(
        "gcs-5xx-checkpoint",
        "GCS 503 x2 on every checkpoint upload",
        "succeeded",
        0,
        train=True,
        epochs=4,
        train_examples=8192,
        gcs_faults=2,
        check=_check_gcs_faults,
    ),
    Case(
        "gcs-5xx-exit-check",
        "GCS 503 on the VM's exit-record check (1)",
        "succeeded",
        0,
        proxy=True,
        runner_via_proxy=True,
        setup=_fail_exit_check,
        check=_check_exit_record,
        fast=True,
    ),
    Case(
        "max-runtime",
        "max_runtime exceeded (60s)",
        "timed_out",
        6,
        command=LONG_COMMAND,
        teardown={"max_runtime": "60s"},
        check=_check_safety_stop,
    ),
    Case(
        "lost-heartbeat",
        "runner lost (heartbeat timeout 60s)",
        "cancelled",
        -9,
        command=LONG_COMMAND,
        teardown={"runner_heartbeat_timeout": "60s"},
        during=_kill_runner_after("the job's heartbeat", _job_running),
        check=lambda ctx, result: (_check_status_after_kill(ctx, result), _check_safety_stop(ctx, result)),
        kills_runner=True,
    ),
)


def case_named(name: str) -> Case:
    for case in CASES:
        if case.name == name:
            return case
    raise KeyError(f"no case {name!r}; known: {', '.join(c.name for c in CASES)}")


# -- running a case -------------------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Ctx:
    """What a case's hooks see while it runs, and what the recorder collects."""

    def __init__(self, case: Case, emulator: Any, proxy: Any, home: Path, storage_url: str) -> None:
        self.case, self.emulator, self.proxy, self.home, self.storage_url = case, emulator, proxy, home, storage_url
        self.proc: subprocess.Popen[bytes] | None = None
        self.done = threading.Event()
        self.killed_at: float | None = None
        self.preemptions: list[dict[str, Any]] = []
        self.problems: list[str] = []
        self.notes: list[str] = []
        self.first_seen: dict[int, float] = {}  # checkpoint epoch -> first time seen in the bucket
        self.bootstrap_seen: dict[str, dict[tuple[float, str], dict[str, Any]]] = {}  # source -> events
        self.events: list[dict[str, Any]] = []
        self.exit_records: list[dict[str, Any]] = []
        self.attempts: list[Attempt] = []
        self.requests: list[Request] = []
        self.idle: list[Idle] = []
        self.final_manifest_epoch: int | None = None
        self._run_id: str | None = None
        self._storage: Storage | None = None
        self._lock = threading.Lock()

    def note(self, text: str) -> None:
        with self._lock:
            self.notes.append(text)

    def problem(self, text: str) -> None:
        with self._lock:
            self.problems.append(text)

    @property
    def run_id(self) -> str | None:
        if self._run_id is None:
            records = sorted((self.home / "runs").glob("*.json"))
            if records:
                self._run_id = json.loads(records[0].read_text())["run_id"]
        return self._run_id

    @property
    def run_dir(self) -> str | None:
        return f"{self.storage_url}/runs/{self.run_id}" if self.run_id else None

    def storage(self) -> Storage | None:
        """The run directory, opened once (one Cloud Storage client for every probe of the run)."""
        if self._storage is None and self.run_dir:
            self._storage = open_storage(self.run_dir)
        return self._storage

    def wait_for(self, probe: Callable[[], Any], *, timeout: float, interval: float = 0.3) -> Any:
        """probe() until it returns something truthy (returned), the case ends, or `timeout` passes (None)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self.done.is_set():
            with contextlib.suppress(Exception):
                value = probe()
                if value:
                    return value
            time.sleep(interval)
        return None

    def checkpoint_epochs(self) -> list[int]:
        store = self.storage()
        if store is None:
            return []
        return sorted(int(m.group(1)) for o in store.list("checkpoints/") if (m := _CKPT.search(o.key)))

    def manifest_epoch(self) -> int | None:
        store = self.storage()
        raw = store.read_bytes("checkpoints/latest.json") if store else None
        return int(json.loads(raw)["epoch"]) if raw else None

    def ready_node_with_checkpoint(self, epoch: int) -> str | None:
        """A READY node whose job is still training and whose newest checkpoint in the bucket is `epoch` or later."""
        nodes = [n for n in self.emulator.nodes() if n.state == "READY"]
        store = self.storage()
        if not nodes or store is None or not epoch <= (self.manifest_epoch() or 0) < self.case.epochs:
            return None
        return None if store.list("exit/") else str(nodes[0].node_id)

    # The recorder: what the run directory shows over time (files get replaced: a recreated VM starts its
    # bootstrap event file anew, checkpoints are overwritten when an epoch is trained again).
    def record(self) -> None:
        while not self.done.wait(0.5):
            with contextlib.suppress(Exception):
                self._record_once()

    def _record_once(self) -> None:
        store = self.storage()
        if store is None:
            return
        now = time.time()
        for info in store.list("checkpoints/"):
            if (m := _CKPT.search(info.key)) and int(m.group(1)) not in self.first_seen:
                self.first_seen[int(m.group(1))] = now
        for info in store.list("events/"):
            source = info.key.rsplit("/", 1)[-1].removesuffix(".jsonl")
            if not source.startswith("bootstrap-"):
                continue
            for line in (store.read_bytes(info.key) or b"").splitlines():
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    e = json.loads(line)
                    self.bootstrap_seen.setdefault(source, {})[(float(e["time"]), str(e["event"]))] = e


class Suite:
    """Cloud Storage (gcp-storage-emulator, in this process, unless `gcs_endpoint` names one) with real MNIST in
    its bucket; each case gets its own TPU API emulator, runner home and run directory."""

    def __init__(
        self,
        workdir: Path,
        *,
        gcs_endpoint: str | None = None,
        bucket: str = BUCKET,
        mnist: Path | None = None,
        say: Callable[[str], None] = print,
        vm_grace_s: float = 10.0,
    ) -> None:
        self.workdir = Path(workdir).absolute()
        self.bucket = bucket
        self.say = say
        self.vm_grace_s = vm_grace_s
        self._gcs_endpoint = gcs_endpoint
        self._gcs_server: Any = None
        self._mnist = mnist
        self._env_before: str | None = None
        self.data_url: str | None = None

    @property
    def gcs(self) -> str:
        assert self._gcs_endpoint is not None
        return self._gcs_endpoint

    def __enter__(self) -> Suite:
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self._gcs_endpoint is None:
            from gcp_storage_emulator.server import create_server

            port = _free_port()
            self._gcs_server = create_server("127.0.0.1", port, in_memory=True, default_bucket=self.bucket)
            self._gcs_server.start()
            self._gcs_endpoint = f"http://127.0.0.1:{port}"
        self._env_before = os.environ.get("STORAGE_EMULATOR_HOST")
        os.environ["STORAGE_EMULATOR_HOST"] = self.gcs  # this process reads the run directories directly
        return self

    def __exit__(self, *exc: object) -> None:
        if self._env_before is None:
            os.environ.pop("STORAGE_EMULATOR_HOST", None)
        else:
            os.environ["STORAGE_EMULATOR_HOST"] = self._env_before
        if self._gcs_server is not None:
            self._gcs_server.stop()

    def mnist_url(self) -> str:
        """Real MNIST in the bucket, uploaded once: on a VM the trainer reads its data from Cloud Storage."""
        if self.data_url is None:
            from runner import datasets

            path = self._mnist or datasets.fetch_mnist()
            store = open_storage(f"gs://{self.bucket}/data")
            if store.read_bytes("mnist.npz", start=path.stat().st_size - 1) is None:
                store.upload_file(path, "mnist.npz")
            self.data_url = f"gs://{self.bucket}/data/mnist.npz"
        return self.data_url

    def runner_env(self, ctx: Ctx, case: Case) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RUNNER_") and k != "STORAGE_EMULATOR_HOST"}
        env.update(
            RUNNER_TPU_ENDPOINT=ctx.emulator.endpoint,
            RUNNER_REGISTRY_ENDPOINT=case.registry or ctx.emulator.endpoint,  # the emulator doubles as the registry
            STORAGE_EMULATOR_HOST=ctx.proxy.url if case.runner_via_proxy and ctx.proxy else self.gcs,
            RUNNER_HOME=str(ctx.home),
            CLOUDSDK_CONFIG="/nonexistent",
            PYTHONUNBUFFERED="1",
            PYTHONPATH=str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""),
        )
        return env

    def run_case(self, case: Case, index: int = 1) -> RunResult:
        from runner.emulator import TpuEmulator
        from runner.emulator.flaky_proxy import FlakyProxy

        t0 = time.time()
        where = self.workdir / f"{case.name}-{index}"
        where.mkdir(parents=True, exist_ok=True)
        proxy = FlakyProxy(self.gcs).start() if case.gcs_faults or case.proxy else None
        if proxy is not None and case.gcs_faults:
            proxy.fail_uploads(r"(^|/)checkpoints/", case.gcs_faults, per_object=True)
        emulator = TpuEmulator(
            workdir=where / "emulator", gcs_endpoint=proxy.url if proxy else self.gcs, vm_grace_s=self.vm_grace_s
        ).start()
        storage_url = f"gs://{self.bucket}/{case.name}-{uuid.uuid4().hex[:8]}"
        ctx = Ctx(case, emulator, proxy, where / "runner-home", storage_url)
        try:
            spec = where / "job.yaml"
            spec.write_text(case.spec_yaml(storage_url, self.mnist_url() if case.train else None))
            if case.setup:
                case.setup(ctx)
            out = (where / "runner.out").open("wb")
            ctx.proc = subprocess.Popen(
                [sys.executable, "-m", "runner.cli", "submit", str(spec)],
                env=self.runner_env(ctx, case),
                cwd=where,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
            threads = [threading.Thread(target=ctx.record, daemon=True)]
            if case.during:
                threads.append(threading.Thread(target=case.during, args=(ctx,), daemon=True))
            for t in threads:
                t.start()
            exit_code = self._wait_runner(ctx, case)
            out.close()
            if case.kills_runner:
                self._wait_vm_alone(ctx, case)
            leaked = self._settle(ctx)
            ctx._record_once()
            ctx.done.set()
            for t in threads:
                t.join(10)
            return self._measure(ctx, case, exit_code, leaked, t0)
        finally:
            ctx.done.set()
            if ctx.proc is not None and ctx.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(ctx.proc.pid, signal.SIGKILL)
                ctx.proc.wait()
            emulator.stop()
            if proxy is not None:
                proxy.stop()

    def _wait_runner(self, ctx: Ctx, case: Case) -> int | None:
        assert ctx.proc is not None
        try:
            return ctx.proc.wait(case.timeout_s)
        except subprocess.TimeoutExpired:
            ctx.problem(f"the runner was still running after {case.timeout_s:.0f}s: killed")
            with contextlib.suppress(ProcessLookupError):
                os.killpg(ctx.proc.pid, signal.SIGKILL)
            ctx.proc.wait()
            return None

    def _wait_vm_alone(self, ctx: Ctx, case: Case) -> None:
        """The runner is dead: the VM must finish the job, record it and delete its own node."""

        def finished() -> bool:
            store = ctx.storage()
            return bool(store and store.list("exit/")) and not ctx.emulator.nodes()

        if ctx.wait_for(finished, timeout=case.timeout_s, interval=1.0) is None:
            ctx.problem("the VM did not finish and delete its node on its own")

    def _settle(self, ctx: Ctx, settle_s: float = 30.0) -> int:
        """Nodes left once the run is over, after a short settle (a VM deleting itself, a delete in progress)."""
        ctx.wait_for(lambda: not ctx.emulator.nodes(), timeout=settle_s)
        return len(ctx.emulator.nodes())

    def _status(self, ctx: Ctx, case: Case) -> tuple[str, dict[str, Any] | None]:
        if ctx.run_id is None:
            return ("rejected" if ctx.proc and ctx.proc.returncode == 2 else "no run"), None
        proc = subprocess.run(
            [sys.executable, "-m", "runner.cli", "status", ctx.run_id, "--json"],
            env=self.runner_env(ctx, case),
            capture_output=True,
            timeout=120,
            check=False,
        )
        try:
            status = json.loads(proc.stdout)
            return str(status["state"]), status
        except (ValueError, KeyError):
            return f"status error ({proc.returncode})", None

    def _measure(self, ctx: Ctx, case: Case, exit_code: int | None, leaked: int, t0: float) -> RunResult:
        got, _status = self._status(ctx, case)
        store = ctx.storage()
        run_events: list[dict[str, Any]] = []
        log = ""
        if store is not None:
            from runner.events import read_events

            run_events = [
                {"time": e.time, "source": e.source, "event": e.event, **e.fields} for e in read_events(store)
            ]
            log = (store.read_bytes("logs/worker-0.log") or b"").decode(errors="replace")
            for info in store.list("exit/"):
                with contextlib.suppress(ValueError):
                    ctx.exit_records.append(json.loads(store.read_bytes(info.key) or b"{}"))
            ctx.final_manifest_epoch = ctx.manifest_epoch()
        # The bootstrap events as the recorder saw them over the run, and whether the run directory kept them all.
        seen = {k: e for source in ctx.bootstrap_seen.values() for k, e in source.items()}
        final = {
            (float(e["time"]), str(e["event"])): e for e in run_events if str(e["source"]).startswith("bootstrap-")
        }
        if set(seen) - set(final):
            ctx.problem(
                f"{len(set(seen) - set(final))} bootstrap event(s) of an earlier VM are no longer in the run "
                "directory's events/bootstrap-0.jsonl (the recreated VM's bootstrap overwrote the file)"
            )
        bootstrap = sorted({**final, **seen}.values(), key=lambda e: float(e["time"]))
        ctx.events = sorted(run_events + [e for k, e in seen.items() if k not in final], key=lambda e: float(e["time"]))
        ctx.requests = [
            Request(
                r.time,
                r.method,
                r.path,
                r.status,
                r.query.get("nodeId"),
                "vm" if (r.authorization or "").startswith("Bearer ") else "runner",
            )
            for r in ctx.emulator.requests
            if r.path.startswith("/v2/")
        ]
        ends = [e for e in bootstrap if e.get("event") in ("container_exited", "image_pull_failed")]
        ctx.idle = idle_intervals(ends, ctx.requests, [p["time"] for p in ctx.preemptions])
        ctx.attempts = parse_attempts(log) if case.train else []
        expected = case.expect or "rejected (exit 2)"
        if case.expect is None:
            got = "rejected" if exit_code == 2 and ctx.run_id is None else got
            expected = "rejected"
        result = RunResult(
            case=case.name,
            fault=case.fault,
            expected=expected,
            got=got,
            exit_code=exit_code,
            expected_exit=case.expect_exit,
            as_expected=False,
            nodes_leaked=leaked,
            checkpoints_lost=None,
            epochs_redone=None,
            partial_epochs=None,
            idle_s=[round(i.seconds, 2) if i.seconds is not None else None for i in ctx.idle if not i.preempted],
            idle_preempted_s=[round(i.seconds, 2) if i.seconds is not None else None for i in ctx.idle if i.preempted],
            run_id=ctx.run_id,
        )
        if case.train:
            restarts = sorted(
                float(e["time"]) for e in run_events if e["source"] == "worker-0" and e["event"] == "worker_started"
            )[1:]
            manifest_ok = True
            if store is not None and ctx.final_manifest_epoch is not None:
                manifest_ok = ctx.final_manifest_epoch in ctx.checkpoint_epochs()
            result.checkpoints_lost = checkpoints_lost(
                ctx.attempts,
                restarts,
                ctx.first_seen,
                final_epoch=ctx.final_manifest_epoch if got == "succeeded" else None,
                final_ok=manifest_ok,
            )
            result.epochs_redone = epochs_redone(ctx.attempts)
            result.partial_epochs = partial_epochs(ctx.attempts, case.epochs)
            if got == "succeeded" and ctx.final_manifest_epoch != case.epochs:
                result.problems.append(f"the bucket's newest checkpoint is epoch {ctx.final_manifest_epoch}")
        worker = [e for e in run_events if e["source"] == "worker-0"]
        starts = [i for i, e in enumerate(worker) if e["event"] == "worker_started"]
        if ctx.exit_records and starts and not any(e["event"] == "worker_exited" for e in worker[starts[-1] :]):
            result.notes.append(
                "exit/worker-0.json is in the run directory but the worker_exited event after it is not "
                "(the node was deleted during the supervisor's last upload)"
            )
        if case.check:
            case.check(ctx, result)
        said = (ctx.home.parent / "runner.out").read_text(errors="replace").splitlines()
        errors = [line for line in said if line.startswith("error: ")]
        if errors and got != expected:
            result.notes.append(f"the runner said: {errors[-1]}")
        if exit_code != case.expect_exit:
            result.problems.append(f"runner exit code {exit_code}, expected {case.expect_exit}")
        for idle in ctx.idle:
            if idle.seconds is None:
                result.problems.append(f"{idle.node} was never deleted after its job ended")
            elif idle.seconds > IDLE_GOAL_S:
                result.problems.append(
                    f"{idle.node.rsplit('/', 3)[0].rsplit('/', 1)[-1]}: idle {idle.seconds:.1f}s after the job ended "
                    f"({'preempted VM' if idle.preempted else idle.by}; goal <= {IDLE_GOAL_S:.0f}s)"
                )
        if ctx.idle:
            result.notes.append(
                "idle per VM: "
                + ", ".join(
                    f"{_fmt_s(None if i.seconds is None else round(i.seconds, 2))}s"
                    + (" (preempted)" if i.preempted else "")
                    + (" (deleted before the container had exited)" if i.shutdown and not i.preempted else "")
                    + (f" deleted by the {i.deleted_by}" if i.deleted_by else "")
                    for i in ctx.idle
                )
            )
        result.problems = ctx.problems + result.problems
        result.notes = ctx.notes + result.notes
        result.as_expected = got == expected and not result.problems and leaked == 0
        result.wall_s = round(time.time() - t0, 1)
        (ctx.home.parent / "result.json").write_text(json.dumps(asdict(result), indent=1, default=str))
        return result


def run_cases(suite: Suite, cases: Sequence[Case], repeat: int = 1) -> list[RunResult]:
    results = []
    for case in cases:
        for i in range(1, repeat + 1):
            suite.say(f"[faults] {case.name} ({i}/{repeat}): {case.fault} ...")
            result = suite.run_case(case, i)
            mark = "ok" if result.as_expected else "NOT AS EXPECTED"
            suite.say(
                f"[faults] {case.name}: {result.got}, exit {result.exit_code}, {result.nodes_leaked} leaked, idle "
                f"{_fmt_s(result.idle_max) if result.idle_s or result.idle_preempted_s else '-'} s, "
                f"{result.wall_s:.0f}s wall: {mark}"
            )
            for text in result.problems:
                suite.say(f"[faults]   problem: {text}")
            results.append(result)
    return results


def report(results: Sequence[RunResult]) -> str:
    lines = [render_table(summarize(results)), ""]
    best = longest_idle(results)
    if best:
        lines.append(f"longest idle billable time: {best[0]:.1f}s ({best[1]}); goal <= {IDLE_GOAL_S:.0f}s")
    for r in results:
        for text in r.notes:
            lines.append(f"  {r.case}: {text}")
        for text in r.problems:
            lines.append(f"  {r.case}: PROBLEM: {text}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("--only", action="append", metavar="NAME", help="run only this case (repeatable)")
    parser.add_argument("--repeat", type=int, default=1, metavar="N", help="run each case N times")
    parser.add_argument("--json", metavar="FILE", help="write every run's measurements here")
    parser.add_argument("--fast", action="store_true", help="only the quick cases (the ones `make test` runs)")
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    parser.add_argument("--workdir", metavar="DIR", help="keep emulator VM directories and runner output here")
    args = parser.parse_args(argv)
    if args.list:
        for case in CASES:
            print(f"{case.name:<22} {case.fault}{'  (fast)' if case.fast else ''}")
        return 0
    try:
        cases = [case_named(n) for n in args.only] if args.only else [c for c in CASES if c.fast or not args.fast]
    except KeyError as exc:
        parser.error(str(exc.args[0]))
    import logging

    for name in ("gcp_storage_emulator", "api"):  # the storage emulator logs every 404 as an error
        logging.getLogger(name).setLevel(logging.CRITICAL)
    t0 = time.time()
    with contextlib.ExitStack() as stack:
        workdir = args.workdir or stack.enter_context(tempfile.TemporaryDirectory(prefix="runner-faults-"))
        suite = stack.enter_context(Suite(Path(workdir), say=lambda s: print(s, flush=True)))
        results = run_cases(suite, cases, args.repeat)
    print()
    print(report(results))
    print(f"\n{len(results)} run(s) in {time.time() - t0:.0f}s")
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in results], indent=1, default=str))
    bad = [r for r in results if not r.as_expected or r.nodes_leaked or r.checkpoints_lost]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
