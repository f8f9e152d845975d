"""Teardown outside a running `submit`: `runner down RUN` for one run, `runner gc` for whatever was left behind.

Three layers keep a TPU from idling on the bill (DESIGN.md): the submitting runner deletes what it created (a
`finally` in runner.lifecycle), the VM deletes its own node when the job ends (infra/startup-script.sh), and this
sweeper finds runner-labelled nodes and queued resources that both missed (a runner killed while creating, a VM
whose delete call failed) and deletes them. It only ever touches resources labelled managed-by=tpu-runner.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from runner import contract
from runner.backends.tpu_api import TpuApi
from runner.backends.tpu_vm import LABEL_DEADLINE, LABEL_MANAGED, LABEL_RUN, MANAGED_BY
from runner.errors import RunnerError
from runner.storage import open_storage

# A READY node whose job has written no heartbeat for this long (and that is older than the grace below) is
# orphaned: its runner is gone and its job never started or died without an exit record.
STALE_HEARTBEAT_S = 15 * 60
STARTUP_GRACE_S = 20 * 60
_DEAD_NODE_STATES = {"PREEMPTED", "TERMINATED", "STOPPED"}
_DEAD_QUEUED_STATES = {"FAILED", "SUSPENDED"}


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
    if exits and len(exits) >= int(info.get("num_workers", 1)):
        return "its run has finished"
    if beat and now - float(beat.get("time", now)) > STALE_HEARTBEAT_S:
        return f"its job has sent no heartbeat for {(now - float(beat['time'])) / 60:.0f} min"
    if not beat and age_s > STARTUP_GRACE_S:
        return f"no job started on it in {age_s / 60:.0f} min"
    return None


def classify_node(node: Any, zone: str, now: float) -> Leftover:
    labels = dict(node.labels)
    created = _seconds(node.create_time) or now
    age = now - created
    state = node.state.name
    reason: str | None = None
    if state in _DEAD_NODE_STATES:
        reason = f"it is {state} and can never run the job again"
    elif labels.get(LABEL_DEADLINE, "").isdigit() and now > int(labels[LABEL_DEADLINE]):
        reason = "its deadline (max_runtime) has passed"
    elif state == "READY" and (run_dir := dict(node.metadata).get("tpu-runner-run-dir")):
        reason = _orphaned_run(run_dir, age, now)
    return Leftover("node", node.name, zone, state, labels.get(LABEL_RUN), age, reason)


def classify_queued(qr: Any, zone: str, now: float) -> Leftover | None:
    specs = list(qr.tpu.node_spec) if qr.tpu else []
    labels = dict(specs[0].node.labels) if specs else {}
    if labels.get(LABEL_MANAGED) != MANAGED_BY:
        return None
    state = qr.state.state.name if qr.state else "STATE_UNSPECIFIED"
    age = now - (_seconds(qr.create_time) or now)
    reason = f"it is {state}: it will never provision" if state in _DEAD_QUEUED_STATES else None
    return Leftover("queued resource", qr.name, zone, state, labels.get(LABEL_RUN), age, reason)


class Sweeper:
    def __init__(self, api: TpuApi, project: str, zones: list[str], *, say: Callable[[str], None] = print) -> None:
        self.api, self.project, self.zones, self.say = api, project, zones, say

    def scan(self, now: float | None = None) -> list[Leftover]:
        now = now or time.time()
        found: list[Leftover] = []
        for zone in self.zones:
            for node in self.api.list_nodes(self.project, zone):
                if dict(node.labels).get(LABEL_MANAGED) == MANAGED_BY:
                    found.append(classify_node(node, zone, now))
            for qr in self.api.list_queued_resources(self.project, zone):
                leftover = classify_queued(qr, zone, now)
                if leftover:
                    found.append(leftover)
        return found

    def delete(self, leftover: Leftover) -> None:
        if leftover.kind == "node":
            self.api.delete_node(self.project, leftover.zone, leftover.short_name)
        else:
            self.api.delete_queued_resource(leftover.name, project=self.project, zone=leftover.zone)
