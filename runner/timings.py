"""How often the runner polls and how long it backs off: one place, read once at the top (the CLI) and handed down.

The defaults suit the real Cloud TPU API (a create takes minutes; its quotas count every read). A rehearsal on the
emulators does not need to wait that long: $RUNNER_TIMINGS overrides any of them, e.g.

    RUNNER_TIMINGS="api_poll_s=0.2,api_backoff_s=0.2,api_retry_initial_s=0.1,job_sync_s=0.5"

which the test suite and the fault table use. A value that is not a known field or not a positive number is a
UsageError, not silence. The job_*_s ones are the job's own cadences in its container: the plan gives them to the
job's environment (runner.contract.CADENCES) where they are not the defaults, so a rehearsal's VM syncs, beats and
writes its progress as fast as its runner reads.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass

from runner import contract

ENV = "RUNNER_TIMINGS"


@dataclass(frozen=True)
class Timings:
    api_poll_s: float = 5.0  # TPU API: between reads of a node or an operation being waited on
    api_backoff_s: float = 5.0  # first wait after a stockout in every zone (doubling, up to 60 s)
    api_retry_initial_s: float = 1.0  # first retry of a 429/503 (doubling, up to 20 s)
    api_retry_deadline_s: float = 120.0  # retries of one request stop after this long
    follow_local_s: float = 0.5  # reads of a local run directory
    follow_gcs_s: float = 2.0  # reads of a run directory on Cloud Storage (each costs requests)
    machine_status_every_s: float = 10.0  # the backend's word on a machine, while following it
    sweep_poll_s: float = 2.0  # `runner gc`: between checks that orphans are gone
    sweep_stale_heartbeat_s: float = 900.0  # `runner gc`: a job whose heartbeat was stored longer ago is gone
    sweep_startup_grace_s: float = 1200.0  # `runner gc`: a node this old with no heartbeat never ran its job
    worker_stale_s: float = 300.0  # a worker whose heartbeat has not changed for this long is lost
    # A worker's heartbeat changes every 10 s on every host: that it changed is in the listing (liveness); its
    # content (progress, for hang_timeout) is read again at most this often, once the worker runs.
    heartbeat_read_every_s: float = 30.0
    # One read or write of a run directory on Cloud Storage retries this long, then it is "unknown" (said, and tried
    # again later): the runner's own deadlines and the API's word on a machine do not wait on storage.
    storage_patience_s: float = 20.0
    # The lease of the runner that owns a run (runner.lifecycle.lease): rewritten this often while it lives, and
    # taken over once Cloud Storage has stored no refresh of it for lease_ttl_s (by the storage's own clock).
    lease_refresh_s: float = 20.0
    lease_ttl_s: float = 120.0
    # gke: a watch on the JobSet and its pods ends after this long (its timeoutSeconds) and is renewed from the last
    # resourceVersion seen, or listed again when that has expired (410 Gone).
    cluster_watch_s: float = 60.0
    # In the job's container: the supervisor's copy of its output to a gs:// run directory, each worker's heartbeat,
    # the trainer's progress.json. What the runner sees of a job on a VM trails it by up to a sync plus a progress.
    job_sync_s: float = contract.CADENCES[contract.SYNC_S]
    job_heartbeat_s: float = contract.CADENCES[contract.HEARTBEAT_S]
    job_progress_s: float = contract.CADENCES[contract.PROGRESS_S]
    job_agree_s: float = contract.CADENCES[contract.AGREE_S]  # runner.train.agreement's aim between mid-epoch points

    def job_env(self) -> dict[str, str]:
        """The job's cadences (runner.contract.CADENCES) that differ from the defaults its container assumes."""
        values = {
            contract.SYNC_S: self.job_sync_s,
            contract.HEARTBEAT_S: self.job_heartbeat_s,
            contract.PROGRESS_S: self.job_progress_s,
            contract.AGREE_S: self.job_agree_s,
        }
        return {name: f"{value:g}" for name, value in values.items() if value != contract.CADENCES[name]}

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Timings:
        from runner.errors import UsageError

        text = (os.environ if environ is None else environ).get(ENV, "").strip()
        if not text:
            return cls()
        known = {f.name for f in dataclasses.fields(cls)}
        values: dict[str, float] = {}
        for item in text.split(","):
            key, _, raw = item.strip().partition("=")
            try:
                value = float(raw)
            except ValueError:
                value = -1.0
            if key not in known or not value > 0:
                raise UsageError(
                    f"${ENV}: {item.strip()!r} is not NAME=SECONDS with a positive number",
                    hint=f"names: {', '.join(sorted(known))}",
                )
            values[key] = value
        return cls(**values)
