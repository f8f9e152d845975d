"""Backends: how a machine is provisioned, watched and torn down. Each is a package under runner/backends/<name>/
with the same set of names (SkyPilot's sky/provision dispatcher, here for three backends), and this module is the
one registry the rest of the runner goes through without naming a backend:

    local           this machine: the job's container, or its entrypoint as a process (--local)
    tpu-vm          Cloud TPU VMs through the Cloud TPU API: nodes, queued resources, attached nodes
    compute-engine  TPU VMs as Compute Engine instances, multi-host slices as managed instance groups
    gke             a JobSet on a GKE cluster's TPU node pools (an existing pool, or one made for the run)

Every package has INFO (what a backend is, for collect and watch) and make(); the cloud ones also resolve(), their
plan target from their catalog slice (runner.plan.target), findings() (the same checks, offline, for `runner
validate`) and sweep() (their part of `runner gc`, through sweeper() here). A package is imported only when it is
asked for, and none of them imports a Google SDK until a machine is. A backend the table names whose package is
missing is NotInstalled (a PlanError, exit 2), never an ImportError.

Nothing outside a backend's package and this table names a backend (tests/test_layers.py holds it): what differs
between them is a capability each declares. Here: whether it is a cloud's (Registered.cloud: is_cloud, CLOUD,
here), and whether `auto` may pick it (Registered.auto).
Its INFO (BackendInfo): whether it bills, what the startup breakdown calls its machine up, whether it pulls the image.
Its Backend (runner.backends.base): whether its machines end with their job (ephemeral), its provider's words for up
and stopped. Its plan target (runner.plan.target.Target): the job environment its machines add (job_env) and what
its VM's bootstrap deletes (self_delete). Its sweep (runner.backends.sweep.Sweep): the kind of its locations and
which they are (zones for the VM backends).
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol, cast

from runner.errors import PlanError, RunnerError, StorageError
from runner.timings import Timings

if TYPE_CHECKING:
    from runner.backends.base import Backend
    from runner.backends.sweep import Sweep
    from runner.plan import compat
    from runner.plan.catalog import AcceleratorType
    from runner.plan.planner import Plan
    from runner.plan.target import Resolve, Target
    from runner.spec import JobSpec
    from runner.watch.rundir import Snapshot
    from runner.watch.runs import RunRecord
    from runner.watch.state import RunState


@dataclass(frozen=True)
class Registered:
    """A backend as the registry knows it without importing it: its package, and whether it is a cloud backend (a
    machine of its own: planned by plan_cloud, swept by `runner gc`, the package a CloudPackage), which must be known
    also when its package is not installed (a resume of its run says so, rather than running the job here)."""

    package: str
    cloud: bool = True
    auto: bool = True  # `backend: auto` may pick it; False: it needs what only the spec can say (a cluster)


# The one table that names the backends, in the order `auto` prefers among the cloud ones.
_REGISTRY = {
    "local": Registered("runner.backends.local", cloud=False),
    "tpu-vm": Registered("runner.backends.tpu_vm"),
    "compute-engine": Registered("runner.backends.compute_engine"),
    "gke": Registered("runner.backends.gke", auto=False),
}
NAMES = tuple(_REGISTRY)
CLOUD = tuple(name for name, registered in _REGISTRY.items() if registered.cloud)


class NotInstalled(PlanError):
    """A backend the registry names whose package this runner does not have (exit 2: nothing was created)."""


@dataclass(frozen=True)
class BackendInfo:
    """What a backend is, for those who read a run afterwards (collect, watch): no import of the backend itself."""

    name: str
    title: str  # "Cloud TPU VMs (Cloud TPU API)"
    bills: bool = True  # its machines cost money: the catalog's price applies
    no_cost: str | None = None  # what a run costs when it bills nothing, in words
    ready: str = "READY"  # what the startup breakdown calls the machine being up
    pulls_image: bool = True  # its machines pull the job's image (the report's "image pulled")


class Package(Protocol):
    INFO: BackendInfo

    def make(self, say: Callable[[str], None], timings: Timings, *, process: bool = False) -> Backend[Any]: ...


class CloudPackage(Package, Protocol):
    @property
    def resolve(self) -> Resolve: ...

    def findings(self, spec: JobSpec) -> tuple[AcceleratorType | None, list[compat.Finding]]: ...

    def sweep(self, timings: Timings) -> Sweep: ...

    def machine_metadata(self, plan: Plan) -> tuple[str, dict[str, str], dict[str, str]]: ...


def package(name: str) -> Package:
    """The backend package the registry names `name`; StorageError for a name it does not know (a run record from
    another runner), NotInstalled for one whose package is not there."""
    registered = _REGISTRY.get(name)
    if registered is None:
        raise StorageError(f"backend {name!r} is not one this runner knows ({', '.join(NAMES)})")
    path = registered.package
    try:
        return cast(Package, importlib.import_module(path))
    except ModuleNotFoundError as exc:
        if exc.name != path:
            raise  # the package is there, and something it imports is not: a broken install, with its traceback
        raise NotInstalled(
            f"the {name} backend is not installed in this runner",
            hint=f"its package {path} is missing; backends this runner has: {', '.join(installed())}",
        ) from None


def installed() -> list[str]:
    """The registry's backends whose package is there (without importing any of them)."""
    return [name for name, r in _REGISTRY.items() if importlib.util.find_spec(r.package) is not None]


def is_cloud(name: str) -> bool:
    """Whether `name` is one of the cloud backends (a run on a machine of its own), not this machine; a name the
    registry does not know is neither."""
    registered = _REGISTRY.get(name)
    return registered is not None and registered.cloud


def cloud(name: str) -> CloudPackage:
    if not is_cloud(name):
        raise StorageError(f"backend {name!r} is not a cloud backend ({', '.join(CLOUD)})")
    return cast(CloudPackage, package(name))


def here() -> str:
    """The backend of a run on this machine (`--local`): the registry's one backend that is not a cloud's."""
    (name,) = (name for name, registered in _REGISTRY.items() if not registered.cloud)
    return name


def plan_local(spec: JobSpec, spec_path: str | None, **kwargs: Any) -> Plan:
    """runner.plan.planner.plan_local, on this machine's backend (here())."""
    from runner.plan.planner import plan_local as plan

    return plan(spec, spec_path, backend=here(), **kwargs)


def info(name: str) -> BackendInfo:
    """What `name` is; a backend this runner does not know is taken for a cloud one that bills."""
    try:
        return package(name).INFO
    except RunnerError:  # another runner's backend, or one not installed here
        return BackendInfo(name, name)


def backend_named(
    name: str, say: Callable[[str], None] = print, timings: Timings | None = None, *, process: bool = False
) -> Backend[Any]:
    """The backend a run record (or a plan) names, ready to use. Imports only the one asked for."""
    return package(name).make(say, timings or Timings.from_env(), process=process)


def chosen(spec: JobSpec) -> tuple[str, str]:
    """The cloud backend a spec goes to, and why: accelerator.backend when it names one; `auto`, the first backend
    the catalog lists for the type's generation (one that is not in the catalog: the Cloud TPU API's, whose checks
    say what is wrong with it)."""
    from runner.plan import catalog

    asked = spec.accelerator.backend
    if asked != "auto":
        return asked, "accelerator.backend"
    try:
        generation = catalog.accelerator(spec.accelerator.type).generation
    except catalog.CatalogError:
        return CLOUD[0], "auto"  # the registry's first cloud backend, whose checks say what is wrong with the type
    offered = [b for b in generation.backends if is_cloud(b) and _REGISTRY[b].auto]
    if not offered:
        return CLOUD[0], "auto"
    if len(offered) == 1:
        return offered[0], f"auto: {generation.title} is created only through {offered[0]}"
    return offered[0], f"auto: {generation.title} can go through {' or '.join(offered)}; auto picks {offered[0]}"


def resolver(spec: JobSpec) -> Callable[..., Target]:
    """The chosen backend's plan target resolution (runner.plan.target.Resolve), its choice written on the target.
    A backend that is not installed is a PlanError that also says what else is wrong with the spec there."""
    name, why = chosen(spec)
    try:
        resolve = cloud(name).resolve
    except NotInstalled as exc:
        more = [f for f in _common(spec, name) if f.error]
        lines = "".join(f"\n  {f.message}" + (f" ({f.hint})" if f.hint else "") for f in more)
        raise NotInstalled(f"{exc.message} ({why}){lines}", hint=exc.hint) from None

    def resolved(*args: Any, **kwargs: Any) -> Target:
        return replace(resolve(*args, **kwargs), choice=why)

    return resolved


def plan_cloud(spec: JobSpec, spec_path: str | None, **kwargs: Any) -> Plan:
    """runner.plan.planner.plan_cloud on the backend the spec goes to, and the platform's limits on what its create
    request carries (runner.plan.limits: the metadata, the startup script in it, the labels): PlanError, or with
    `problems` each one there."""
    from runner.plan import limits
    from runner.plan.planner import plan_cloud as plan

    planned = plan(spec, spec_path, resolve=resolver(spec), **kwargs)
    if planned.attach:
        return planned  # nothing is created: the bootstrap goes over ssh
    what, metadata, labels = cloud(planned.backend).machine_metadata(planned)
    found = limits.metadata_problems(metadata, what) + limits.label_problems(labels, what)
    found += limits.env_problems(planned.env, where="the job's environment")
    errors = [PlanError(f, hint="keep large values out of `env:`: put them in a file the job reads") for f in found]
    problems = kwargs.get("problems")
    if problems is None and errors:
        raise errors[0] if len(errors) == 1 else PlanError("\n".join(e.message for e in errors), hint=errors[0].hint)
    if problems is not None:
        problems.extend(errors)
    return planned


def findings(spec: JobSpec) -> tuple[AcceleratorType | None, list[compat.Finding]]:
    """Where the spec would run, checked offline against its backend's catalog slice (`runner validate`); for a
    backend that is not installed, what the shared catalog says, and that."""
    from runner.plan import compat

    name, why = chosen(spec)
    try:
        return cloud(name).findings(spec)
    except NotInstalled as exc:
        accel, found = compat.common(spec, name)
        return accel, [*found, compat.Finding(True, f"{exc.message} ({why})", exc.hint)]


def _common(spec: JobSpec, name: str) -> list[compat.Finding]:
    from runner.plan import compat

    return compat.common(spec, name)[1]


def sweeper(name: str, timings: Timings) -> Sweep:
    """`name`'s part of `runner gc` (its package's sweep()). Not called `sweep`: that is the module of Sweep."""
    return cloud(name).sweep(timings)


def usable(record: RunRecord, warnings: list[str]) -> RunRecord:
    """The record as a state may be judged from it: a handle its backend cannot read (a corrupt or foreign record)
    is dropped with a warning, and the state is then judged from the run directory alone."""
    from runner import contract
    from runner.watch import runs
    from runner.watch.logtext import one_line

    if not record.handle or record.state.is_terminal():
        return record  # nobody asks a backend about these
    try:
        backend_named(record.backend).handle_from_dict(record.handle)
    except StorageError as exc:
        local = runs.runner_home() / "runs" / f"{record.run_id}.json"  # else it came from run.json (resolve)
        source = local if local.is_file() else f"{record.run_dir.rstrip('/')}/{contract.RUN_INFO}"
        warnings.append(
            f"{source}: its {one_line(record.backend, 20)} machine handle cannot be read ({exc}); "
            "the state comes from the run directory alone"
        )
        return record.updated(handle={})
    return record


def machine_alive(record: RunRecord, backend: Backend[Any] | None = None) -> bool | None:
    """Whether the run's machine is up (running or being created), as its backend says now; None when it cannot
    say (no credentials, the API unreachable) or nobody need ask (no handle, a run over). Pass `backend` when
    asking repeatedly (logs -f, list): one API client for all."""
    from runner.backends.base import MachineState
    from runner.errors import RunnerError

    if not record.handle or record.state.is_terminal():
        return None
    try:
        backend = backend or backend_named(record.backend)
        machine = backend.status(backend.handle_from_dict(record.handle))
    except RunnerError:
        return None  # judge by the run directory alone
    return None if machine == MachineState.UNKNOWN else machine in (MachineState.RUNNING, MachineState.CREATING)


def run_state(
    record: RunRecord, snapshot: Snapshot, warnings: list[str] | None = None, backend: Backend[Any] | None = None
) -> RunState:
    """The run's state now (runner.watch.lookup.current_state), with its backend's word on its machine; a handle
    that cannot be read is dropped, with a warning in `warnings`."""
    from runner.watch.lookup import current_state

    record = usable(record, warnings if warnings is not None else [])
    return current_state(record, snapshot, machine_alive(record, backend))
