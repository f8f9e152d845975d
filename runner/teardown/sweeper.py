"""Teardown outside a running `submit`: `runner gc` for whatever was left behind (and `runner down`'s helpers).

Three layers keep a TPU from idling on the bill (DESIGN.md): the submitting runner deletes what it created (a
`finally` in runner.lifecycle), the VM deletes its own node when the job ends (runner/launch/startup-script.sh), and
this sweeper finds runner-labelled nodes and queued resources that both missed (a runner killed while creating, a VM
whose delete call failed) and deletes them. It only ever touches resources labelled managed-by=tpu-runner, tries
every one even when some fail, and never asks twice for a deletion already under way. A queued resource is judged
and deleted as a whole (with force: its node goes with it); its node is never deleted on its own.

It sweeps everything it can: a zone that cannot be listed (a zone the project may not use, a 500) is reported with
the API's reason and skipped, and the other zones are swept. Liveness never compares two machines' clocks: a job's
heartbeat is judged by when Cloud Storage stored it against the API's own time (the Date of its answers), a node's
age by its createTime against the same; a run directory that cannot be read is no evidence either way (kept, and
said), while one whose bucket no longer exists is (nothing the job writes can be kept).
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
from runner.errors import BucketMissing, RunnerError, StorageError
from runner.storage import open_storage
from runner.timings import Timings

# A live node whose job has stored no heartbeat for this long (Timings.sweep_stale_heartbeat_s), or none at all in
# its first 20 minutes (sweep_startup_grace_s), is orphaned: its runner is gone and its job died without an exit
# record, or never started.
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
    age_s: float | None  # by the API's clock; None when it did not say its time
    orphaned_because: str | None  # None: still in use, kept
    unknown: str | None = None  # why it could not be judged (kept): its run directory could not be read

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


class Unknown(Exception):
    """What a node's run directory says could not be read: not evidence enough to delete anything."""


@dataclass(frozen=True)
class Limits:
    """How long a job may go without a stored heartbeat, and a node without any, before it is orphaned."""

    stale_heartbeat_s: float = Timings.sweep_stale_heartbeat_s
    startup_grace_s: float = Timings.sweep_startup_grace_s
    storage_patience_s: float = Timings.storage_patience_s  # one unreachable bucket must not hold up the sweep


def _orphaned_run(run_dir: str, age_s: float | None, api_now: float | None, limits: Limits) -> str | None:
    """Why the run in `run_dir` no longer needs its machine, or None if it may still be using it. Unknown when
    the run directory cannot be read. Heartbeats are judged by when Cloud Storage stored them (its clock) against
    the API's now, never by the time a VM wrote in them."""
    try:
        storage = open_storage(run_dir, patience_s=limits.storage_patience_s)
        info = json.loads(storage.read_bytes(contract.RUN_INFO) or b"{}")
        exits = storage.list(contract.EXIT_DIR + "/")
        beats = [o for o in storage.list(contract.HEARTBEAT) if o.key.endswith(".json") or o.key == contract.HEARTBEAT]
    except BucketMissing as exc:
        return f"its run directory's bucket does not exist any more ({exc.message})"
    except StorageError as exc:
        raise Unknown(exc.message) from exc
    except (ValueError, TypeError):
        return None  # run.json is not a runner's: not evidence enough either
    if not isinstance(info, dict):
        return None
    if exits and len(exits) >= int(info.get("num_workers", 1)):
        return "its run has finished"
    stored = [o.updated for o in beats if o.updated is not None]
    if stored and api_now is not None and api_now - max(stored) > limits.stale_heartbeat_s:
        return f"its job has stored no heartbeat for {(api_now - max(stored)) / 60:.0f} min"
    if not beats and age_s is not None and age_s > limits.startup_grace_s:
        return f"no job started on it in {age_s / 60:.0f} min"
    return None


def _past_or_ended(labels: dict[str, str], now: float, ended_runs: dict[str, str] | None) -> str | None:
    run_id = labels.get(LABEL_RUN)
    if labels.get(LABEL_DEADLINE, "").isdigit() and now > int(labels[LABEL_DEADLINE]):
        return "its deadline (max_runtime) has passed"
    if run_id and ended_runs and run_id in ended_runs:
        return f"its run ended ({ended_runs[run_id]}) on this machine"
    return None


def _age(create_time: Any, api_now: float | None) -> float | None:
    created = _seconds(create_time)
    return None if created is None or api_now is None else max(0.0, api_now - created)


def classify_node(
    node: Any,
    zone: str,
    now: float,
    ended_runs: dict[str, str] | None = None,
    api_now: float | None = None,
    limits: Limits = Limits(),
) -> Leftover:
    """Any live state is judged (a node a killed runner left CREATING comes up and is judged like any other).
    `now`: this machine's clock, for the deadline this runner wrote; `api_now`: the API's, for ages."""
    labels = dict(node.labels)
    age = _age(node.create_time, api_now)
    state = node.state.name
    unknown = None
    if state in _DEAD_NODE_STATES:
        reason: str | None = f"it is {state} and can never run the job again"
    else:
        reason = _past_or_ended(labels, now, ended_runs)
        run_dir = dict(node.metadata).get(contract.RUN_DIR_METADATA)
        if reason is None and state not in _GOING and run_dir:
            try:
                reason = _orphaned_run(run_dir, age, api_now, limits)
            except Unknown as exc:
                unknown = f"its run directory cannot be read: {exc}"
    return Leftover("node", node.name, zone, state, labels.get(LABEL_RUN), age, reason, unknown)


def classify_queued(
    qr: Any,
    zone: str,
    now: float,
    ended_runs: dict[str, str] | None = None,
    api_now: float | None = None,
    limits: Limits = Limits(),
) -> Leftover | None:
    """Like a node: FAILED and SUSPENDED ones never provision; any other is a leftover once its run's deadline has
    passed or its run ended, and an ACTIVE one once its run directory says its job is over or silent."""
    specs = list(qr.tpu.node_spec) if qr.tpu else []
    labels = dict(specs[0].node.labels) if specs else {}
    if labels.get(LABEL_MANAGED) != MANAGED_BY:
        return None
    state = qr.state.state.name if qr.state else "STATE_UNSPECIFIED"
    age = _age(qr.create_time, api_now)
    unknown = None
    if state in _DEAD_QUEUED_STATES:
        reason: str | None = f"it is {state}: it will never provision"
    else:
        reason = _past_or_ended(labels, now, ended_runs)
        run_dir = dict(specs[0].node.metadata).get(contract.RUN_DIR_METADATA)
        if reason is None and state == "ACTIVE" and run_dir:
            try:
                reason = _orphaned_run(run_dir, age, api_now, limits)
            except Unknown as exc:
                unknown = f"its run directory cannot be read: {exc}"
    return Leftover("queued resource", qr.name, zone, state, labels.get(LABEL_RUN), age, reason, unknown)


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
        limits: Limits = Limits(),
    ) -> None:
        self.api, self.project, self.zones, self.say = api, project, zones, say
        self.ended_runs = ended_runs or {}  # run id -> terminal state, from this machine's run records
        self.poll_s = poll_s
        self.limits = limits
        self.skipped: dict[str, str] = {}  # zone -> why it could not be swept (the API's reason)

    def scan(self, now: float | None = None) -> list[Leftover]:
        """Every runner-labelled leftover in the zones that can be listed; the others go to `skipped`."""
        now = now or time.time()
        found: list[Leftover] = []
        for zone in self.zones:
            try:
                found += self._scan_zone(zone, now)
            except RunnerError as exc:
                self.skipped[zone] = exc.message
        return found

    def _scan_zone(self, zone: str, now: float) -> list[Leftover]:
        queued_resources = self.api.list_queued_resources(self.project, zone)
        nodes = self.api.list_nodes(self.project, zone)
        api_now = self.api.clock.now()
        queued = [
            leftover
            for qr in queued_resources
            if (leftover := classify_queued(qr, zone, now, self.ended_runs, api_now, self.limits)) is not None
        ]
        held = {q.name for q in queued}
        found = [
            classify_node(node, zone, now, self.ended_runs, api_now, self.limits)
            for node in nodes
            if node.queued_resource not in held  # judged, and deleted, with its queued resource
            and dict(node.labels).get(LABEL_MANAGED) == MANAGED_BY
        ]
        return found + queued

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
    limits = Limits(timings.sweep_stale_heartbeat_s, timings.sweep_startup_grace_s, timings.storage_patience_s)
    return Sweeper(api, project, sorted(chosen), say=say, ended_runs=ended, poll_s=timings.sweep_poll_s, limits=limits)
