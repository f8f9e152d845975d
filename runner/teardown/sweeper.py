"""Teardown outside a running `submit`: `runner gc` for whatever was left behind, on every cloud backend.

Three layers keep a TPU from idling on the bill (DESIGN.md): the submitting runner deletes what it created (a
`finally` in runner.lifecycle), the VM deletes its own machine when the job ends (runner/launch/startup-script.sh),
and this sweeper finds runner-labelled leftovers that both missed (a runner killed while creating, a VM whose delete
call failed) and deletes them. Each cloud backend lists what it has and deletes one of its resources
(runner.backends.sweep.Sweep, through the registry); judging is done here, the same way for all of them. It only
ever touches resources labelled managed-by=tpu-runner, tries every one even when some fail, never asks twice for a
deletion already under way, and deletes what follows another (an instance group's template and workload policy)
only after it.

It sweeps everything it can, location by location (each backend's own: zones for the VM backends): one that cannot
be listed (a zone the project may not use, a 500) is reported with the API's reason and skipped, and the others are
swept. Liveness never compares two machines' clocks: a job's
heartbeat is judged by when Cloud Storage stored it against the API's own time (the Date of its answers), a
resource's age by its creation time against the same; a run directory that cannot be read is no evidence either
way (kept, and said), while one whose bucket no longer exists is (nothing the job writes can be kept).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace

from runner import contract
from runner.backends import labels
from runner.backends.sweep import Found, Sweep
from runner.errors import BucketMissing, RunnerError, StorageError
from runner.storage import open_storage
from runner.timings import Timings


@dataclass(frozen=True)
class Leftover:
    backend: str
    found: Found
    run_id: str | None
    age_s: float | None  # by the API's clock; None when it did not say its time
    orphaned_because: str | None  # None: still in use, kept
    unknown: str | None = None  # why it could not be judged (kept): its run directory could not be read

    @property
    def kind(self) -> str:
        return self.found.kind

    @property
    def name(self) -> str:
        return self.found.name

    @property
    def short_name(self) -> str:
        return self.found.short_name

    @property
    def location(self) -> str:
        return self.found.location

    @property
    def state(self) -> str:
        return self.found.state


@dataclass(frozen=True)
class Swept:
    """What became of one orphan: deleted (confirmed gone), delete requested (still going), or failed."""

    leftover: Leftover
    outcome: str  # "deleted" | "delete requested" | "failed"
    error: str | None = None


class Unknown(Exception):
    """What a machine's run directory says could not be read: not evidence enough to delete anything."""


@dataclass(frozen=True)
class Limits:
    """How long a job may go without a stored heartbeat, and a machine without any, before it is orphaned."""

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


def _past_or_ended(found: dict[str, str], now: float, ended_runs: dict[str, str] | None) -> str | None:
    run_id = found.get(labels.RUN)
    if found.get(labels.DEADLINE, "").isdigit() and now > int(found[labels.DEADLINE]):
        return "its deadline (max_runtime) has passed"
    if run_id and ended_runs and run_id in ended_runs:
        return f"its run ended ({ended_runs[run_id]}) on this machine"
    return None


def classify(
    backend: str,
    found: Found,
    now: float,
    ended_runs: dict[str, str] | None = None,
    api_now: float | None = None,
    limits: Limits = Limits(),
) -> Leftover:
    """Any live state is judged (a machine a killed runner left being created comes up and is judged like any
    other). `now`: this machine's clock, for the deadline this runner wrote; `api_now`: the API's, for ages."""
    age = None if found.created_at is None or api_now is None else max(0.0, api_now - found.created_at)
    unknown = None
    reason = found.dead or _past_or_ended(found.labels, now, ended_runs)
    if reason is None and found.judge and not found.going and found.run_dir:
        try:
            reason = _orphaned_run(found.run_dir, age, api_now, limits)
        except Unknown as exc:
            unknown = f"its run directory cannot be read: {exc}"
    return Leftover(backend, found, found.labels.get(labels.RUN), age, reason, unknown)


def _follow(leftovers: list[Leftover]) -> list[Leftover]:
    """What follows another (runner.backends.sweep.Found.follows) is orphaned or kept with it."""
    by_name = {left.name: left for left in leftovers}
    out = []
    for left in leftovers:
        leader = by_name.get(left.found.follows or "")
        if leader is not None and leader is not left:
            why = f"its {leader.kind} {leader.short_name} is orphaned" if leader.orphaned_because else None
            left = replace(left, orphaned_because=why, unknown=leader.unknown)
        out.append(left)
    return out


class Sweeper:
    def __init__(
        self,
        sweeps: list[Sweep],
        project: str,
        locations: Mapping[str, Iterable[str]],
        *,
        say: Callable[[str], None] = print,
        ended_runs: dict[str, str] | None = None,
        poll_s: float = 2.0,
        limits: Limits = Limits(),
    ) -> None:
        """`locations`: by location kind (runner.backends.sweep.Sweep.location_kind), where each sweep of that kind
        lists; a kind that is not there is not swept."""
        self.sweeps, self.project, self.say = sweeps, project, say
        self.locations = {kind: sorted(set(where)) for kind, where in locations.items()}
        self.ended_runs = ended_runs or {}  # run id -> terminal state, from this machine's run records
        self.poll_s = poll_s
        self.limits = limits
        self.skipped: dict[str, str] = {}  # location -> why it could not be swept (the API's reason)
        self._by_backend = {sweep.backend: sweep for sweep in sweeps}

    @property
    def swept(self) -> list[str]:
        """Every location it lists, of every kind."""
        return sorted({where for kinds in self.locations.values() for where in kinds})

    def kind_of(self, location: str) -> str:
        """The kind of a location it lists ("zone"), for what it says about one."""
        return next((kind for kind, where in self.locations.items() if location in where), "location")

    def scan(self, now: float | None = None) -> list[Leftover]:
        """Every runner-labelled leftover in the locations that can be listed; the others go to `skipped`."""
        now = now or time.time()
        found: dict[str, Leftover] = {}  # by name: a region's or the project's resources are found from each zone
        for sweep in self.sweeps:
            for location in self.locations.get(sweep.location_kind, []):
                try:
                    listed = sweep.scan(self.project, location)
                except RunnerError as exc:
                    self.skipped[location] = "; ".join(filter(None, (self.skipped.get(location), exc.message)))
                    continue
                api_now = sweep.api_now()
                for item in listed:
                    if item.name not in found:
                        found[item.name] = classify(sweep.backend, item, now, self.ended_runs, api_now, self.limits)
        return _follow(list(found.values()))

    def delete(self, orphans: list[Leftover], *, confirm_s: float = 60.0) -> list[Swept]:
        """Ask for every orphan's deletion (one failure does not stop the others; one already being deleted is not
        asked again), then wait up to confirm_s for them to be gone, reading each delete operation's outcome. What
        follows another goes after it, once it is gone."""
        results: dict[str, Swept] = {}
        first = [o for o in orphans if not o.found.follows]
        self._delete(first, results, confirm_s)
        self._delete([o for o in orphans if o.found.follows], results, confirm_s)
        return [results[o.name] for o in orphans]

    def _delete(self, orphans: list[Leftover], results: dict[str, Swept], confirm_s: float) -> None:
        pending: dict[str, tuple[Leftover, str | None]] = {}
        for leftover in orphans:
            sweep = self._by_backend[leftover.backend]
            try:
                operation = None if leftover.found.going else sweep.request_delete(self.project, leftover.found)
            except RunnerError as exc:
                results[leftover.name] = Swept(leftover, "failed", exc.message)
                continue
            pending[leftover.name] = (leftover, operation)
        give_up = time.monotonic() + confirm_s
        while pending:
            for name, (leftover, operation) in list(pending.items()):
                sweep = self._by_backend[leftover.backend]
                try:
                    failed = sweep.outcome(self.project, leftover.found, operation)[1] if operation else None
                    if failed is not None:
                        results[name] = Swept(leftover, "failed", failed)
                        del pending[name]
                    elif not sweep.exists(self.project, leftover.found):
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


def sweeper_for(
    project: str | None,
    locations: Mapping[str, Iterable[str]] | None,
    *,
    everywhere: bool,
    say: Callable[[str], None],
    backends: list[str] | None = None,
) -> Sweeper:
    """The sweep `runner gc` asks for, on every cloud backend (or `backends`): `locations` only (by kind: {"zone":
    [...]}; a kind not named is not swept), or (without them, or with `everywhere`) each backend's own: the
    locations of this machine's runs, every location of its catalog slice and those this machine's configuration
    names (gcloud's default zone). Runs this machine saw end are passed on: a machine of a run that ended here is a
    leftover, whatever its run directory says."""
    from runner import backends as registry
    from runner.errors import UsageError
    from runner.plan import gcloud
    from runner.watch import runs

    project = project or gcloud.default_project()
    if not project:
        raise UsageError("no project to sweep", hint="pass --project or `gcloud config set project PROJECT`")
    timings = Timings.from_env()
    # Every cloud backend this runner has; one it does not have cannot have created anything from here (and the
    # registry says so, with exit 2, when it is asked for by name).
    names = backends or [name for name in registry.CLOUD if name in registry.installed()]
    sweeps = [registry.sweeper(name, timings) for name in names]
    records = runs.list_records()
    chosen: dict[str, set[str]] = {kind: set(where) for kind, where in (locations or {}).items()}
    if everywhere or not locations:
        for sweep in sweeps:
            own = chosen.setdefault(sweep.location_kind, set())
            own |= sweep.locations() | sweep.configured_locations()
            recorded = (sweep.recorded_location(r.handle) for r in records if r.backend == sweep.backend and r.handle)
            own |= {where for where in recorded if where}
    ended = {r.run_id: str(r.state) for r in records if r.state.is_terminal()}
    limits = Limits(timings.sweep_stale_heartbeat_s, timings.sweep_startup_grace_s, timings.storage_patience_s)
    return Sweeper(sweeps, project, chosen, say=say, ended_runs=ended, poll_s=timings.sweep_poll_s, limits=limits)
