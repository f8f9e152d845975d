"""Plan a run: resolve the run id, the run directory and the job's environment, with no side effects.

Everything a backend needs is decided here, so `--dry-run` shows exactly what would happen and a backend never
reads the spec file or the user's flags itself.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TypeVar

from runner import contract, datasets
from runner.errors import PlanError, UsageError
from runner.launch import variants
from runner.launch.imageref import ImageRef
from runner.plan import catalog, compat
from runner.plan.budget import RuntimeLimit, limited, runtime_limit
from runner.spec import JobSpec, check_storage

T = TypeVar("T")

RUNS_DIR = "runs"
DATASETS_DIR = "datasets"  # <storage>/datasets: this machine's data cache, for the jobs on TPU VMs
CLOUD_DATA_DIR = "/tmp/tpu-runner/datasets"  # RUNNER_DATA_DIR inside a TPU VM's container: writable by any user
# What a dry run shows in place of what is missing, so that the whole plan can still be read (and every problem
# listed at its end). They can never reach an API: a plan with problems is never submitted.
PLACEHOLDER_PROJECT = "PROJECT"
PLACEHOLDER_STORAGE = "gs://BUCKET/tpu-runner"
EXAMPLE_PROJECT = "my-project"  # the project the shipped jobs' `image:` names, until `make push` prints yours


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
class CloudTarget:
    """Where a TPU VM run goes, resolved and checked before any API call."""

    project: str
    zones: tuple[str, ...]  # in the order to try
    accelerator: catalog.AcceleratorType
    runtime_version: str
    node_id: str
    attach_node: str | None  # an existing node: attach, never create or delete
    trainer_workers: str  # "0": TensorFlow runs on worker 0 (other hosts serve the TPU runtime); "all"
    price_per_hour: float
    warnings: tuple[str, ...] = ()  # what the plan lets through but the user should know (runner.plan.compat)
    provisioning: str = "node"  # "node": create the node; "queued": a queued resource that waits for capacity
    max_wait_s: int = 0  # queued: how long it may wait in each zone (its validUntilDuration)
    slices: int = 1  # multislice: this many slices of `accelerator`, one queued resource (multisliceParams)


@dataclass(frozen=True)
class Plan:
    spec: JobSpec
    spec_path: str | None
    run_id: str
    backend: str  # "local" | "tpu-vm"
    storage_url: str  # gs://bucket/prefix or an absolute path
    run_dir: str  # <storage_url>/runs/<run_id>
    env: dict[str, str] = field(default_factory=dict)  # the job's environment, the same on every backend
    created_at: float = 0.0
    deadline: float = 0.0
    num_workers: int = 1
    attach: bool = False  # the machine exists already (accelerator.node): never deleted
    cloud: CloudTarget | None = None
    limit: RuntimeLimit | None = None  # how long it may run and why (max_runtime, or what the budget buys)
    # Unique to this submit, labelled on what it creates: two runs that end up with the same node name (a retried
    # create, a collision) can tell their own node from the other's.
    nonce: str = field(default_factory=lambda: secrets.token_hex(4))

    @property
    def storage_is_local(self) -> bool:
        return not self.storage_url.startswith("gs://")


def new_run_id(name: str, now: float | None = None, suffix: str | None = None) -> str:
    """<name>-<UTC yyyymmdd-hhmmss>-<4 hex>: sortable, unique, and valid as a TPU node id and label value."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now or time.time()))
    return f"{name}-{stamp}-{suffix or secrets.token_hex(2)}"


def resolve_storage(spec: JobSpec, override: str | None, *, cloud: bool) -> str:
    """The storage root of a run: `override` (submit --storage) if given, else the spec's `storage:`. An override
    passes the spec's own validator, so that `--storage gs://` is refused as `storage: gs://` is."""
    if override is None:
        url = spec.storage
    else:
        try:
            url = check_storage(override)
        except ValueError as exc:
            raise UsageError(f"--storage: {exc}") from None
    if url.startswith("gs://"):
        return url
    if cloud:
        raise PlanError(
            f"storage {url!r} is a local path, but a TPU VM can only write its run directory to Cloud Storage",
            hint="set `storage: gs://BUCKET/PREFIX` in the job spec or pass --storage gs://BUCKET/PREFIX; "
            "or run the job on this machine with --local",
        )
    try:
        return str(Path(url).expanduser().absolute())
    except RuntimeError:  # '~nobody/runs': pathlib cannot find that user's home
        raise PlanError(f"storage {url!r}: no home directory for {url.split('/')[0]!r}") from None


def job_env(
    spec: JobSpec, run_id: str, run_dir: str, *, strategy: str, deadline: float, num_workers: int = 1
) -> dict[str, str]:
    """The environment every worker's container gets: the spec's env, then the contract (which wins)."""
    env = dict(spec.env)
    env.update(
        {
            contract.RUN_ID: run_id,
            contract.RUN_DIR: run_dir,
            contract.NUM_WORKERS: str(num_workers),
            contract.WORKER_ID: "0",
            contract.STRATEGY: strategy,
            contract.MAX_RUNTIME_S: str(spec.teardown.max_runtime),
            contract.DEADLINE: str(int(deadline)),
        }
    )
    if spec.teardown.runner_heartbeat_timeout:
        env[contract.SUBMITTER_TIMEOUT_S] = str(spec.teardown.runner_heartbeat_timeout)
    if spec.teardown.hang_timeout:
        env[contract.HANG_TIMEOUT_S] = str(spec.teardown.hang_timeout)
    every, keep = spec.checkpoint_policy
    env[contract.CHECKPOINT_EVERY], env[contract.CHECKPOINT_KEEP] = str(every), str(keep)
    if spec.training is not None:
        env[contract.TRAINING] = spec.training.model_dump_json()
    if spec.command is not None:
        env[contract.COMMAND] = json.dumps(spec.command)
    return env


@dataclass(frozen=True)
class Continued:
    """The run a plan continues (`runner resume`): its id and run directory stay; everything else is planned anew."""

    run_id: str
    run_dir: str

    @property
    def storage_url(self) -> str:
        return self.run_dir.rstrip("/").rsplit(f"/{RUNS_DIR}/", 1)[0]


def plan_local(
    spec: JobSpec,
    spec_path: str | None,
    *,
    storage: str | None = None,
    strategy: str = "auto",
    workers: int = 1,
    continued: Continued | None = None,
) -> Plan:
    """A run on this machine: the same container (or its entrypoint as a process), CPU or GPU. `workers` above 1 is
    the multi-worker rehearsal: that many worker processes on the CPU, as the hosts of a pod slice (the local
    backend gives each its worker id and the addresses of the others). `continued`: the run to go on with."""
    if workers < 1:
        raise UsageError(f"--workers {workers}: give 1 or more")
    now = time.time()
    if continued is not None:
        run_id, storage_url, run_dir = continued.run_id, continued.storage_url, continued.run_dir
    else:
        run_id = new_run_id(spec.name, now)
        storage_url = resolve_storage(spec, storage, cloud=False)
        run_dir = f"{storage_url}/{RUNS_DIR}/{run_id}"
    deadline = now + spec.teardown.max_runtime
    if workers > 1:
        strategy = "cpu"  # N processes on one machine: the CPU's collectives (a GPU would be shared by all of them)
    env = job_env(spec, run_id, run_dir, strategy=strategy, deadline=deadline, num_workers=workers)
    env.setdefault(contract.DATA_DIR, str(datasets.cache_dir()))
    limit = runtime_limit(spec, 0.0)  # no TPU here: a budget is not applied
    return Plan(
        spec, spec_path, run_id, "local", storage_url, run_dir, env, now, deadline, num_workers=workers, limit=limit
    )


def check_image_for_cloud(image: str) -> None:
    """A TPU VM pulls the image itself: it must name a registry (Artifact Registry, gcr.io, a host of one's own)."""
    try:
        ref = ImageRef.parse(image)
    except ValueError as exc:
        raise PlanError(str(exc)) from None
    if ref.host is None:
        raise PlanError(
            f"image {image!r} names no registry, so a TPU VM cannot pull it",
            hint="push it to Artifact Registry and use REGION-docker.pkg.dev/PROJECT/REPO/IMAGE:TAG",
        )
    if problem := ref.artifact_registry_problem:
        raise PlanError(f"image {image!r}: {problem}")


def check_image_project(image: str, project: str) -> None:
    """The shipped jobs name an image in the example project: a run elsewhere would boot a VM that cannot pull it."""
    ref = ImageRef.parse(image)
    if not (ref.host or "").endswith("-docker.pkg.dev") or ref.path.split("/")[0] != EXAMPLE_PROJECT:
        return
    if project == EXAMPLE_PROJECT:
        return
    raise PlanError(
        f"image {image!r} is the example job's placeholder (project {EXAMPLE_PROJECT!r}), not an image of yours",
        hint=f"`make push VARIANT=tpu PROJECT={project if project != PLACEHOLDER_PROJECT else 'P'} REGION=R` builds "
        "and pushes the trainer image and prints its reference: put it in `image:`",
    )


def check_image_variant(spec: JobSpec, device: str) -> None:
    """An image `runner build` named (trainer-<variant>) must be the variant the job needs: a TensorFlow image
    cannot run training.framework jax, nor a JAX image TensorFlow, and a CPU or GPU image on a TPU VM would fail
    (or train on the CPU) only after the VM is paid for."""
    framework = spec.training.framework if spec.training is not None else None
    if problem := variants.mismatch(spec.image, framework, device):
        choices = (
            [variants.variant_for(framework, device)]
            if framework
            else [variants.variant_for(f, device) for f in ("tensorflow", "jax")]
        )
        make = " or ".join(f"`make push VARIANT={v} PROJECT=...`" for v in choices)
        raise PlanError(
            problem, hint=f"build and push the image with {make}, and put the reference it prints in `image:`"
        )


def resolve_cloud_target(
    spec: JobSpec,
    run_id: str,
    *,
    project: str | None,
    zone: str | None,
    environ: dict[str, str] | None = None,
    problems: Problems | None = None,
) -> CloudTarget:
    """Pre-flight for a TPU VM run: everything that can be checked without the network or credentials. With
    `problems`, each one is collected there and a placeholder stands in (a missing project, a missing zone)."""
    from runner.plan import gcloud as gcloud_config

    acc = spec.accelerator
    project = acc.project or project or gcloud_config.default_project(environ)
    zones = tuple(acc.candidate_zones) or ((zone,) if zone else ())
    if not zones and (default := gcloud_config.default_zone(environ)):
        zones = (default,)
    accel, findings = compat.check(spec, zones)
    errors = [PlanError(f.message, hint=f.hint) for f in findings if f.error]
    if problems is not None:
        problems += errors
        if accel is None:  # nothing can be planned without the type: every problem so far, at once
            problems.raise_all()
    elif errors:
        more = "".join(f"\n  {e.message}" + (f" ({e.hint})" if e.hint else "") for e in errors[1:])
        raise PlanError(errors[0].message + more, hint=errors[0].hint)
    assert accel is not None
    if not project:
        missing = PlanError(
            "no Google Cloud project",
            hint="set accelerator.project, pass --project, or run `gcloud config set project PROJECT`",
        )
        if problems is None:
            raise missing
        problems.append(missing)
        project = PLACEHOLDER_PROJECT
    if not zones:
        missing = PlanError(
            "no zone for the TPU VM",
            hint=f"{accel.name} is offered in {', '.join(accel.zones)}; set "
            "accelerator.zone(s), pass --zone, or `gcloud config set compute/zone ZONE`",
        )
        if problems is None:
            raise missing
        problems.append(missing)
        zones = (accel.zones[0],)
    offered = [z for z in zones if z in accel.zones]
    runtime = acc.runtime_version or accel.generation.default_runtime
    # TensorFlow on a pod slice runs on worker 0 (the other hosts serve the TPU runtime); JAX and commands run on
    # every worker.
    tensorflow = spec.training is not None and spec.training.framework == "tensorflow"
    trainer_workers = "0" if tensorflow and accel.multi_host else "all"
    provisioning = accel.provisioning if acc.provisioning == "auto" else acc.provisioning
    if acc.slices > 1:
        # Multislice exists only through queued resources (cloud.google.com/tpu/docs/multislice-introduction); the
        # spec refuses `provisioning: node` and TensorFlow with it, compat.check TPU v2 and v3.
        provisioning = "queued"
    if acc.node:
        provisioning = "node"  # attached: nothing is created
    warnings = [f.message + (f" ({f.hint})" if f.hint else "") for f in findings if not f.error]
    if acc.max_wait is not None and provisioning == "node":
        warnings.append(
            f"accelerator.max_wait applies to queued resources; {accel.name} gets a node (provisioning auto)"
        )
    if provisioning == "queued" and spec.retries.capacity_wait:
        warnings.append("retries.capacity_wait applies to nodes; a queued resource waits max_wait in each zone instead")
    # A queued resource never waits past the run's deadline, even when the runner that asked for it is gone.
    max_wait = min(acc.max_wait or spec.teardown.max_runtime, spec.teardown.max_runtime)
    return CloudTarget(
        project=project,
        zones=tuple(offered) if offered else zones,
        accelerator=accel,
        runtime_version=runtime,
        node_id=acc.node or run_id,
        attach_node=acc.node,
        trainer_workers=trainer_workers,
        price_per_hour=accel.price_per_hour(spot=acc.spot) * acc.slices,
        warnings=tuple(warnings),
        provisioning=provisioning,
        max_wait_s=max_wait,
        slices=acc.slices,
    )


def plan_cloud(
    spec: JobSpec,
    spec_path: str | None,
    *,
    storage: str | None = None,
    project: str | None = None,
    zone: str | None = None,
    environ: dict[str, str] | None = None,
    now: float | None = None,
    run_suffix: str | None = None,
    nonce: str | None = None,
    problems: Problems | None = None,
    continued: Continued | None = None,
) -> Plan:
    """A run on a Cloud TPU VM. Raises PlanError (exit 2) for anything that would fail after paying: the first
    problem, or with `problems` every one of them, collected there while the plan goes on with placeholders (it
    raises only when nothing can be planned: an accelerator type the catalog does not know).
    `now`, `run_suffix` and `nonce` pin what is otherwise unique to each submit (golden tests)."""
    collect = problems is not None
    found = problems if problems is not None else Problems()

    def check(step: Callable[[], T], fallback: T) -> T:
        return found.attempt(step, fallback) if collect else step()

    now = now or time.time()
    run_id = continued.run_id if continued else new_run_id(spec.name, now, run_suffix)
    if continued is not None and not continued.run_dir.startswith("gs://"):
        unreachable = PlanError(
            f"run {run_id} has a local run directory, which a TPU VM cannot reach",
            hint=f"`runner resume {run_id} --local` continues it on this machine",
        )
        if not collect:
            raise unreachable
        found.append(unreachable)
    storage_url = (
        continued.storage_url
        if continued
        else check(lambda: resolve_storage(spec, storage, cloud=True), PLACEHOLDER_STORAGE)
    )
    check(lambda: check_image_for_cloud(spec.image), None)
    check(lambda: check_image_variant(spec, "tpu"), None)
    target = resolve_cloud_target(
        spec, run_id, project=project, zone=zone, environ=environ, problems=found if collect else None
    )
    check(lambda: check_image_project(spec.image, target.project), None)
    # The budget, where it is earlier, is the run's max_runtime from here on: deadline, VM watchdog, job safety net.
    limit = check(
        lambda: runtime_limit(spec, target.price_per_hour),
        runtime_limit(spec.model_copy(update={"budget": None}), target.price_per_hour),
    )
    spec = limited(spec, limit)
    # A queued resource never waits past the deadline, the budget's included.
    target = replace(target, max_wait_s=min(target.max_wait_s, spec.teardown.max_runtime))
    run_dir = continued.run_dir if continued else f"{storage_url}/{RUNS_DIR}/{run_id}"
    # Worker ids are global across the slices of a multislice: slice s, host h is worker s * hosts + h.
    workers = target.accelerator.hosts * target.slices if target.trainer_workers == "all" else 1
    deadline = now + spec.teardown.max_runtime
    env = job_env(spec, run_id, run_dir, strategy="auto", deadline=deadline, num_workers=workers)
    if target.slices == 1:  # a multislice's VMs name their own node (the bootstrap adds it)
        env[contract.TPU_NAME] = target.node_id if target.accelerator.multi_host else "local"
    # The same contract on every backend: the data-set cache is a directory of the container's own on a VM, filled
    # from this machine's cache, which the run copies beside its run directory once (lifecycle: share_data).
    env[contract.DATA_DIR] = CLOUD_DATA_DIR
    if datasets.mnist_path(fetch=False) is not None:
        env[contract.DATA_URL] = f"{storage_url}/{DATASETS_DIR}"
    if target.trainer_workers == "0":
        env["TPU_LOAD_LIBRARY"] = "0"  # worker 0 drives the slice through the TPU runtime, as Google's TF pod CI does
    if spec.training is not None and spec.training.framework == "tensorflow" and spec.training.keras == "auto":
        env["TF_USE_LEGACY_KERAS"] = "1"  # keras-team/keras#19448: Keras 3 under TPUStrategy fails on TPU VMs
    return Plan(
        spec,
        spec_path,
        run_id,
        "tpu-vm",
        storage_url,
        run_dir,
        env,
        now,
        deadline,
        num_workers=workers,
        attach=target.attach_node is not None,
        cloud=target,
        limit=limit,
        **({"nonce": nonce} if nonce else {}),
    )
