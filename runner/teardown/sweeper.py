"""Teardown outside a running `submit`: `runner gc` for whatever was left behind (and `runner down`'s helpers).

Three layers keep a TPU from idling on the bill (DESIGN.md): the submitting runner deletes what it created (a
`finally` in runner.lifecycle), the VM deletes its own node when the job ends (runner/launch/startup-script.sh), and
this sweeper finds runner-labelled nodes and queued resources that both missed (a runner killed while creating, a VM
whose delete call failed) and deletes them. It only ever touches resources labelled managed-by=tpu-runner, tries
every one even when some fail, and never asks twice for a deletion already under way. A queued resource is judged
and deleted as a whole (with force: its node goes with it); its node is never deleted on its own.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from runner import contract
from runner.backends.tpu_api import OperationState, TpuApi
from runner.backends.tpu_vm import LABEL_DEADLINE, LABEL_MANAGED, LABEL_RUN, MANAGED_BY
from runner.errors import RunnerError
from runner.storage import open_storage
from runner.timings import Timings

# A live node whose job has written no heartbeat for this long (and that is older than the grace below) is
# orphaned: its runner is gone and its job never started or died without an exit record.
STALE_HEARTBEAT_S = 15 * 60
STARTUP_GRACE_S = 20 * 60
_DEAD_NODE_STATES = {"PREEMPTED", "TERMINATED", "STOPPED"}
_DEAD_QUEUED_STATES = {"FAILED", "SUSPENDED"}
_GOING = {"DELETING"}


@dataclass(frozen=True)
class Leftover:
    kind: str  # "node" | "queued resource"
    name: str  # full resource name
    zone: str
    state: str
    run_id: str | None
    age_s: float
    orphaned_because: str | None  # None: still in use, kept

    @property
    def short_name(self) -> str:
        return self.name.rsplit("/", 1)[-1]


@dataclass(frozen=True)
class Swept:
    """What became of one orphan: deleted (confirmed gone), delete requested (still going), or failed."""

    leftover: Leftover
    outcome: str  # "deleted" | "delete requested" | "failed"
    error: str | None = None


def _seconds(ts: Any) -> float | None:
    try:
        return ts.timestamp() if ts else None
    except (AttributeError, ValueError):
        return None


def _orphaned_run(run_dir: str, age_s: float, now: float) -> str | None:
    """Why the run in `run_dir` no longer needs its machine, or None if it may still be using it."""
    try:
        storage = open_storage(run_dir)
        info = json.loads(storage.read_bytes(contract.RUN_INFO) or b"{}")
        exits = storage.list(contract.EXIT_DIR + "/")
        beat = json.loads(storage.read_bytes(contract.HEARTBEAT) or b"null")
    except (RunnerError, ValueError, TypeError):
        return None  # the run directory cannot be read: not evidence enough to delete anything
    if not isinstance(info, dict):
        return None
    if exits and len(exits) >= int(info.get("num_workers", 1)):
        return "its run has finished"
    if isinstance(beat, dict) and now - float(beat.get("time", now)) > STALE_HEARTBEAT_S:
        return f"its job has sent no heartbeat for {(now - float(beat['time'])) / 60:.0f} min"
    if not beat and age_s > STARTUP_GRACE_S:
        return f"no job started on it in {age_s / 60:.0f} min"
    return None


def _past_or_ended(labels: dict[str, str], now: float, ended_runs: dict[str, str] | None) -> str | None:
    run_id = labels.get(LABEL_RUN)
    if labels.get(LABEL_DEADLINE, "").isdigit() and now > int(labels[LABEL_DEADLINE]):
        return "its deadline (max_runtime) has passed"
    if run_id and ended_runs and run_id in ended_runs:
        return f"its run ended ({ended_runs[run_id]}) on this machine"
    return None


def classify_node(node: Any, zone: str, now: float, ended_runs: dict[str, str] | None = None) -> Leftover:
    """Any live state is judged (a node a killed runner left CREATING comes up and is judged like any other)."""
    labels = dict(node.labels)
    created = _seconds(node.create_time) or now
    age = now - created
    state = node.state.name
    if state in _DEAD_NODE_STATES:
        reason: str | None = f"it is {state} and can never run the job again"
    else:
        reason = _past_or_ended(labels, now, ended_runs)
        run_dir = dict(node.metadata).get(contract.RUN_DIR_METADATA)
        if reason is None and state not in _GOING and run_dir:
            reason = _orphaned_run(run_dir, age, now)
    return Leftover("node", node.name, zone, state, labels.get(LABEL_RUN), age, reason)


def classify_queued(qr: Any, zone: str, now: float, ended_runs: dict[str, str] | None = None) -> Leftover | None:
    """Like a node: FAILED and SUSPENDED ones never provision; any other is a leftover once its run's deadline has
    passed or its run ended, and an ACTIVE one once its run directory says its job is over or silent."""
    specs = list(qr.tpu.node_spec) if qr.tpu else []
    labels = dict(specs[0].node.labels) if specs else {}
    if labels.get(LABEL_MANAGED) != MANAGED_BY:
        return None
    state = qr.state.state.name if qr.state else "STATE_UNSPECIFIED"
    age = now - (_seconds(qr.create_time) or now)
    if state in _DEAD_QUEUED_STATES:
        reason: str | None = f"it is {state}: it will never provision"
    else:
        reason = _past_or_ended(labels, now, ended_runs)
        run_dir = dict(specs[0].node.metadata).get(contract.RUN_DIR_METADATA)
        if reason is None and state == "ACTIVE" and run_dir:
            reason = _orphaned_run(run_dir, age, now)
    return Leftover("queued resource", qr.name, zone, state, labels.get(LABEL_RUN), age, reason)


class Sweeper:
    def __init__(
        self,
        api: TpuApi,
        project: str,
        zones: list[str],
        *,
        say: Callable[[str], None] = print,
        ended_runs: dict[str, str] | None = None,
        poll_s: float = 2.0,
    ) -> None:
        self.api, self.project, self.zones, self.say = api, project, zones, say
        self.ended_runs = ended_runs or {}  # run id -> terminal state, from this machine's run records
        self.poll_s = poll_s

    def scan(self, now: float | None = None) -> list[Leftover]:
        now = now or time.time()
        found: list[Leftover] = []
        for zone in self.zones:
            queued = [
                leftover
                for qr in self.api.list_queued_resources(self.project, zone)
                if (leftover := classify_queued(qr, zone, now, self.ended_runs)) is not None
            ]
            held = {q.name for q in queued}
            for node in self.api.list_nodes(self.project, zone):
                if node.queued_resource in held:
                    continue  # judged, and deleted, with its queued resource
                if dict(node.labels).get(LABEL_MANAGED) == MANAGED_BY:
                    found.append(classify_node(node, zone, now, self.ended_runs))
            found += queued
        return found

    def _request(self, leftover: Leftover) -> str | None:
        if leftover.kind == "node":
            return self.api.delete_node(self.project, leftover.zone, leftover.short_name)
        return self.api.delete_queued_resource(leftover.name, project=self.project, zone=leftover.zone)

    def _exists(self, leftover: Leftover) -> bool:
        if leftover.kind == "node":
            return self.api.get_node(self.project, leftover.zone, leftover.short_name) is not None
        return self.api.get_queued_resource(leftover.name, project=self.project, zone=leftover.zone) is not None

    def delete(self, orphans: list[Leftover], *, confirm_s: float = 60.0) -> list[Swept]:
        """Ask for every orphan's deletion (one failure does not stop the others; one already DELETING is not
        asked again), then wait up to confirm_s for them to be gone, reading each delete operation's outcome."""
        results: dict[str, Swept] = {}
        pending: dict[str, tuple[Leftover, str | None]] = {}
        for leftover in orphans:
            try:
                operation = None if leftover.state in _GOING else self._request(leftover)
            except RunnerError as exc:
                results[leftover.name] = Swept(leftover, "failed", exc.message)
                continue
            pending[leftover.name] = (leftover, operation)
        give_up = time.monotonic() + confirm_s
        while pending:
            for name, (leftover, operation) in list(pending.items()):
                try:
                    op: OperationState | None = (
                        self.api.get_operation(operation, project=self.project, zone=leftover.zone)
                        if operation
                        else None
                    )
                    if op is not None and op.failure is not None:
                        results[name] = Swept(leftover, "failed", op.failure.said())
                        del pending[name]
                    elif not self._exists(leftover):
                        results[name] = Swept(leftover, "deleted")
                        del pending[name]
                except RunnerError as exc:
                    results[name] = Swept(leftover, "failed", exc.message)
                    del pending[name]
            if not pending or time.monotonic() > give_up:
                break
            time.sleep(self.poll_s)
        for name, (leftover, _) in pending.items():
            results[name] = Swept(leftover, "delete requested")
        return [results[o.name] for o in orphans]


def sweeper_for(
    project: str | None, zones: list[str] | None, *, all_zones: bool, say: Callable[[str], None]
) -> Sweeper:
    """The sweep `runner gc` asks for: `zones` only, or (without them, or with all_zones) the zones of this
    machine's runs, every zone of the catalog and gcloud's default zone. Runs this machine saw end are passed on:
    a node of a run that ended here is a leftover, whatever its run directory says."""
    from runner.errors import UsageError
    from runner.plan import catalog, gcloud
    from runner.watch import runs

    project = project or gcloud.default_project()
    if not project:
        raise UsageError("no project to sweep", hint="pass --project or `gcloud config set project PROJECT`")
    records = runs.list_records()
    chosen = set(zones or [])
    if all_zones or not zones:
        chosen |= {z for t in catalog.all_types() for z in t.zones}
        chosen |= {str(r.handle["zone"]) for r in records if r.backend == "tpu-vm" and r.handle.get("zone")}
        if default := gcloud.default_zone():
            chosen.add(default)
    ended = {r.run_id: str(r.state) for r in records if r.state.is_terminal()}
    timings = Timings.from_env()
    api = TpuApi(timings=timings)
    return Sweeper(api, project, sorted(chosen), say=say, ended_runs=ended, poll_s=timings.sweep_poll_s)
