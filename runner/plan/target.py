"""Where a cloud run goes: what every backend's plan target has, so that the planner, the budget, the bootstrap and
the job's environment need not know which backend it is.

Each cloud backend resolves its own target (runner.backends.<name>.target: the catalog slice it serves, its
pre-flight checks, what only it needs, such as a runtime version or a machine type) and subclasses this one; the
planner receives it through `Resolve`, from the backend registry (runner.backends), and never names a backend.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from runner.errors import PlanError
from runner.plan import catalog, compat
from runner.spec import JobSpec

T = TypeVar("T")
# What a dry run shows in place of a missing project, so that the whole plan can still be read (and every problem
# listed at its end). It can never reach an API: a plan with problems is never submitted.
PLACEHOLDER_PROJECT = "PROJECT"


class Problems(list[PlanError]):
    """Pre-flight problems collected instead of raised (`submit --dry-run` lists them all at its end)."""

    def attempt(self, check: Callable[[], T], fallback: T) -> T:
        try:
            return check()
        except PlanError as exc:
            self.append(exc)
            return fallback

    def raise_all(self) -> None:
        """One PlanError that names every problem (the first one's hint), or nothing when there is none."""
        if not self:
            return
        if len(self) == 1:
            raise self[0]
        lines = "".join(
            f"\n  {i}. {p.message}" + (f"\n     hint: {p.hint}" if p.hint else "") for i, p in enumerate(self, 1)
        )
        raise PlanError(f"{len(self)} pre-flight problems:{lines}")


@dataclass(frozen=True)
class Target:
    backend: str  # the registry's name of the backend that creates it
    project: str
    zones: tuple[str, ...]  # in the order to try
    accelerator: catalog.AcceleratorType
    machine_id: str  # what the run's machine is named: the run id (a node, an instance, a group), or the attached node
    trainer_workers: str  # "0": TensorFlow runs on worker 0 (the other hosts serve the TPU runtime); "all"
    price_per_hour: float
    slices: int = 1  # multislice: this many slices of `accelerator`
    attach: bool = False  # an existing machine: attach, never create or delete
    warnings: tuple[str, ...] = ()  # what the plan lets through but the user should know
    choice: str = ""  # why this backend: accelerator.backend, or what `auto` found in the catalog

    @property
    def self_delete(self) -> str:
        """What the VM's bootstrap deletes when its job is over (the startup script's SELF_DELETE): each backend whose
        machines run the runner's startup script says what (a Cloud TPU node, an instance, a group); nothing here."""
        return ""

    def job_env(self, spec: JobSpec) -> dict[str, str]:
        """The variables this backend's machines add to the job's environment, beyond the contract every backend
        shares (runner.plan.planner.job_env, which sets them first; these win over the spec's `env:`): a TPU VM's
        own (its TPU's name, the TPU runtime's library). `spec` is the run's, its budget applied. None here."""
        return {}

    @property
    def hosts(self) -> int:
        """Hosts per slice."""
        return self.accelerator.hosts

    def within(self, max_runtime_s: int) -> Target:
        """This target with whatever it asks the cloud for bounded by the run's max_runtime (the budget's, where it
        is shorter): a queue's wait, a VM's own run duration. The base target has nothing to bound."""
        return self


class Resolve(Protocol):
    """A backend's resolution of its target: pre-flight against its catalog slice, no network, no credentials.
    With `problems`, each problem is collected there and a placeholder stands in (a missing project, a zone);
    without, the first one is raised (PlanError)."""

    def __call__(
        self,
        spec: JobSpec,
        run_id: str,
        *,
        project: str | None,
        zone: str | None,
        environ: dict[str, str] | None,
        problems: Problems | None,
    ) -> Target: ...


def location(spec: JobSpec, *, project: str | None, zone: str | None, environ: dict[str, str] | None) -> tuple[
    str | None, tuple[str, ...]
]:  # fmt: skip
    """The project and zones a cloud run asks for: the spec's, else the flags', else gcloud's configuration."""
    from runner.plan import gcloud as gcloud_config

    acc = spec.accelerator
    project = acc.project or project or gcloud_config.default_project(environ)
    zones = tuple(acc.candidate_zones) or ((zone,) if zone else ())
    if not zones and (default := gcloud_config.default_zone(environ)):
        zones = (default,)
    return project, zones


def settle(
    findings: list[compat.Finding], accel: catalog.AcceleratorType | None, problems: Problems | None
) -> tuple[catalog.AcceleratorType, list[str]]:
    """The type and the warnings, once every error finding is collected in `problems` (or the first raised); nothing
    can be planned without the type, so an unknown one raises whatever was collected."""
    errors = [PlanError(f.message, hint=f.hint) for f in findings if f.error]
    if problems is not None:
        problems += errors
        if accel is None:
            problems.raise_all()
    elif errors:
        more = "".join(f"\n  {e.message}" + (f" ({e.hint})" if e.hint else "") for e in errors[1:])
        raise PlanError(errors[0].message + more, hint=errors[0].hint)
    assert accel is not None
    return accel, [f.message + (f" ({f.hint})" if f.hint else "") for f in findings if not f.error]


def require_project(project: str | None, problems: Problems | None) -> str:
    if project:
        return project
    missing = PlanError(
        "no Google Cloud project",
        hint="set accelerator.project, pass --project, or run `gcloud config set project PROJECT`",
    )
    if problems is None:
        raise missing
    problems.append(missing)
    return PLACEHOLDER_PROJECT


def require_zones(
    zones: tuple[str, ...], offered: tuple[str, ...], accelerator: str, what: str, problems: Problems | None
) -> tuple[str, ...]:
    """The zones to try, in order: those of `zones` where `accelerator` is offered (all of them when none is: the
    backend's checks report that); where none is given, the first zone it is offered in stands in for the plan."""
    if not zones:
        missing = PlanError(
            f"no zone for the {what}",
            hint=f"{accelerator} is offered in {', '.join(offered)}; set accelerator.zone(s), pass --zone, or "
            "`gcloud config set compute/zone ZONE`",
        )
        if problems is None:
            raise missing
        problems.append(missing)
        return offered[:1]
    kept = tuple(z for z in zones if z in offered)
    return kept or zones
