"""The run's JobSet: created (a 409 is this run's only when it carries this submit's nonce), its next attempt after
a restart, and its deletion in the foreground, confirmed by a list of its pods that comes back empty.

An API server that does not answer (restarting) is waited for, up to the wait given: a teardown must never end
on a control plane's upgrade. A delete the server refuses (an admission webhook, a 500) is asked again a few
times, then said with how to delete it by hand.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from runner.backends import labels
from runner.backends.gke.api import KubeApi, Unreachable
from runner.backends.gke.handles import GkeHandle
from runner.backends.gke.watch import JOBSET_NAME, RESTART_ATTEMPT
from runner.errors import AlreadyExists, BackendError
from runner.interrupts import hurry

T = TypeVar("T")


@dataclass
class Workload:
    say: Callable[[str], None]
    poll_s: float
    retries: int = 3

    def create(self, kube: KubeApi, body: dict[str, Any], nonce: str) -> None:
        meta = body["metadata"]
        try:
            kube.create_jobset(body)
        except AlreadyExists:
            found = kube.jobset(meta["namespace"], meta["name"])
            if found is None or not labels.owned(found["metadata"].get("labels") or {}, nonce):
                owner = (found or {}).get("metadata", {}).get("labels", {}).get(labels.RUN, "gone")
                raise AlreadyExists(
                    f"JobSet {meta['name']} exists already in namespace {meta['namespace']} (run {owner})",
                    hint="submit again (a new run id names a new JobSet)",
                ) from None

    def patiently(self, action: Callable[[], T], wait_s: float) -> T:
        """`action`, asked again while the API server does not answer, for up to wait_s."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                return action()
            except Unreachable:
                if time.monotonic() > deadline or hurry.is_set():
                    raise
            time.sleep(min(self.poll_s, 2.0))

    def next_attempt(self, kube: KubeApi, handle: GkeHandle, wait_s: float) -> GkeHandle | None:
        """The JobSet's next attempt, once it restarted and no pod of an earlier attempt is left; None when it
        will not (it ended, or is gone) within wait_s."""
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and not hurry.is_set():
            js = self.patiently(lambda: kube.jobset(handle.namespace, handle.jobset), wait_s)
            if js is None or js["metadata"].get("deletionTimestamp"):
                return None
            status = js.get("status") or {}
            if status.get("terminalState"):
                return None
            restarts = int(status.get("restarts") or 0)
            if restarts > handle.restarts:
                pods, _ = self.patiently(lambda: kube.pods(handle.namespace, f"{JOBSET_NAME}={handle.jobset}"), wait_s)
                older = [p for p in pods if int((p.metadata.labels or {}).get(RESTART_ATTEMPT, "0")) < restarts]
                if not older:
                    return replace(handle, restarts=restarts)
            time.sleep(min(self.poll_s, 2.0))
        return None

    def delete(self, kube: KubeApi, handle: GkeHandle, *, wait_s: float, announce: bool = True) -> bool:
        """Delete the JobSet in the foreground and confirm it and its pods gone; False when still there after
        wait_s (said, with how to delete it); BackendError when the server refused it every time."""
        t0 = time.monotonic()
        what = f"JobSet {handle.jobset} (namespace {handle.namespace})"
        hint = f"kubectl delete jobset {handle.jobset} -n {handle.namespace} --cascade=foreground"
        refused = 0
        requested = False
        while True:
            try:
                js = kube.jobset(handle.namespace, handle.jobset)
                pods, _ = kube.pods(handle.namespace, f"{JOBSET_NAME}={handle.jobset}")
                if js is None and not pods:
                    break
                if js is not None and not js["metadata"].get("deletionTimestamp"):
                    if announce and not requested:
                        self.say(f"deleting {what}")
                    requested = True
                    kube.delete_jobset(handle.namespace, handle.jobset)
            except Unreachable as exc:
                if not requested:
                    self.say(f"{exc.message}; asking again")
                    requested = True
            except BackendError as exc:
                refused += 1
                if refused > self.retries:
                    raise BackendError(f"{exc.message}; it is still there", hint=hint) from exc
                self.say(f"deleting {what} failed ({exc.message}); asking again")
            waited = time.monotonic() - t0
            if hurry.is_set() or waited > wait_s:
                why = "stopped waiting" if hurry.is_set() else f"still there after {waited:.0f}s"
                self.say(f"{why}: {what} in {handle.cluster} is being deleted. Check: kubectl get pods -n "
                         f"{handle.namespace} -l {JOBSET_NAME}={handle.jobset}; {hint} (or `runner gc`)")  # fmt: skip
                return False
            time.sleep(min(self.poll_s, 2.0))
        if announce and requested:
            self.say(f"{what} and its pods are gone ({time.monotonic() - t0:.0f}s)")
        return True
