"""What the compute-engine backend's two flows (an instance, a slice's group) share beyond runner.backends.flows:
Compute Engine's failures in words, and how they wait for an operation.

Compute Engine has no DELETING status: a deleted instance goes PENDING_STOP or STOPPING (then DEPROVISIONING), then
is gone. Those are the states a deletion may be under way in; one found there is watched, not asked again, and asked
for once it has stopped (TERMINATED) if it has not gone.
"""

from __future__ import annotations

import time

from runner.backends import flows
from runner.backends.compute_engine.api import ComputeApi, explain
from runner.backends.google_api import ApiFailure
from runner.errors import BackendError

GOING = ("PENDING_STOP", "STOPPING", "DEPROVISIONING")


class Context(flows.Context[ComputeApi]):
    def explain(self, failure: ApiFailure, action: str, *, project: str, zone: str) -> BackendError:
        return explain(failure, action, project=project, zone=zone)

    def finish(self, ref: str, action: str, *, project: str, zone: str, deadline: float) -> float | None:
        """Until the operation `ref` is DONE; its failure raised in words, else when it ended (the API's clock)."""
        t0 = time.monotonic()
        while True:
            op = self.api.get_operation(ref, project=project, zone=zone)
            if op.failure is not None:
                raise explain(op.failure, action, project=project, zone=zone)
            if op.done:
                return op.ended_at
            if time.time() > deadline:
                raise BackendError(f"could not {action} before the run's max_runtime ran out (operation {ref})")
            time.sleep(self.pause(t0))

    def pause(self, t0: float) -> float:
        """Every second at first, then every poll_s: a TPU VM takes minutes, an operation on a template a moment."""
        return min(self.poll_s, 0.2 + (time.monotonic() - t0) / 10)
