"""Plan a run: resolve the run id, the run directory and the job's environment, with no side effects.

Everything a backend needs is decided here, so `--dry-run` shows exactly what would happen and a backend never
reads the spec file or the user's flags itself.
"""

from __future__ import annotations

import json
import os
import secrets
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from runner import contract, datasets
from runner.errors import PlanError, UsageError
from runner.launch import deps, variants
from runner.launch.imageref import ImageRef
from runner.plan import gcloud, limits
from runner.plan.budget import RuntimeLimit, duration, limited, runtime_limit
from runner.plan.target import PLACEHOLDER_PROJECT, Problems, Resolve, Target
from runner.spec import JobSpec, check_storage
from runner.spec.secrets import SecretRef
from runner.timings import Timings

T = TypeVar("T")

RUNS_DIR = "runs"
DATASETS_DIR = "datasets"  # <storage>/datasets: this machine's data cache, for the jobs on TPU VMs
CLOUD_DATA_DIR = "/tmp/tpu-runner/datasets"  # RUNNER_DATA_DIR inside a TPU VM's container: writable by any user
# What a dry run shows in place of a missing storage (a missing project: runner.plan.target.PLACEHOLDER_PROJECT).
PLACEHOLDER_STORAGE = "gs://BUCKET/tpu-runner"
EXAMPLE_PROJECT = "my-project"  # the project the shipped jobs' `image:` names, until `make push` prints yours
# A pod slice whose progress stops (a collective waiting for a host that never comes: a multi-host checkpoint in
# per-host directories, a dead peer) bills every host while it waits. Without a hang_timeout in the spec, its job is
# stopped as hung after this long without progress, once it reports progress (progress.json, metrics.jsonl): long
# enough for a large checkpoint's upload or an evaluation that writes nothing meanwhile.
SLICE_HANG_DEFAULT_S = 1800


SECRET_FILE_LIMIT = 64 * 1024  # Secret Manager's own limit on a secret's size


@dataclass(frozen=True)
class PlannedSecret:
    """One secret of the run: the job's variable, how it holds the secret, and where the secret is read from."""

    name: str
    mode: str  # "env": the variable holds the value; "file": the path of a file with it
    ref: SecretRef
    source: str  # projects/P/secrets/S/versions/V (Secret Manager), env:NAME, or file:<absolute path>

    @property
    def secret_manager(self) -> bool:
        return self.ref.kind == "secretmanager"


@dataclass(frozen=True)
class Plan:
    spec: JobSpec
    spec_path: str | None
    run_id: str
    backend: str  # the registry's name of the backend (runner.backends)
    storage_url: str  # gs://bucket/prefix or an absolute path
    run_dir: str  # <storage_url>/runs/<run_id>
    env: dict[str, str] = field(default_factory=dict)  # the job's environment, the same on every backend
    created_at: float = 0.0
    deadline: float = 0.0
    num_workers: int = 1
    attach: bool = False  # the machine exists already (accelerator.node): never deleted
    cloud: Target | None = None  # where a cloud run goes, as its backend resolved it; None on this machine
    limit: RuntimeLimit | None = None  # how long it may run and why (max_runtime, or what the budget buys)
    secrets: tuple[PlannedSecret, ...] = ()  # references only: values are read where the job runs
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
    spec: JobSpec,
    run_id: str,
    run_dir: str,
    *,
    strategy: str,
    deadline: float,
    num_workers: int = 1,
    timings: Timings | None = None,
) -> dict[str, str]:
    """The environment every worker's container gets: the spec's env, then the contract (which wins), with the
    runner's job cadences (runner.timings) where they are not the container's defaults."""
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
    elif num_workers > 1:
        env[contract.HANG_DEFAULT_S] = str(SLICE_HANG_DEFAULT_S)
    every, keep = spec.checkpoint_policy
    env[contract.CHECKPOINT_EVERY], env[contract.CHECKPOINT_KEEP] = str(every), str(keep)
    if spec.training is not None:
        env[contract.TRAINING] = spec.training.model_dump_json()
    if spec.command is not None:
        env[contract.COMMAND] = json.dumps(spec.command)
    if own_code(spec) and (requirements := deps.find(Path.cwd())) is not None:
        env[contract.REQUIREMENTS] = requirements.encode()  # a process run installs them; an image holds them
    if spec.secrets:  # names only: the supervisor redacts what these variables hold
        env[contract.SECRETS] = json.dumps({name: secret.as_ for name, secret in sorted(spec.secrets.items())})
    env.update((timings or Timings()).job_env())
    return env


@dataclass(frozen=True)
class HangLimit:
    """How long a run's progress may stand still before its job is stopped as hung: `default` is a pod slice's
    (SLICE_HANG_DEFAULT_S), which applies once the job reports progress; otherwise it is the spec's hang_timeout."""

    seconds: int
    default: bool

    @property
    def why(self) -> str:
        return "a pod slice's default hang limit" if self.default else "teardown.hang_timeout"

    def row(self) -> tuple[str, str]:
        if self.default:
            return (
                "hang limit",
                f"{duration(self.seconds)} without progress, once the job reports it (progress.json, metrics): "
                "stopped as hung; a pod slice's default, teardown.hang_timeout sets another",
            )
        return "hang limit", f"{duration(self.seconds)} without progress: stopped as hung (teardown.hang_timeout)"


def hang_limit(plan: Plan) -> HangLimit | None:
    """The run's hang limit (the job's environment says it to the supervisor), or None: a single host whose spec
    sets no hang_timeout is never stopped for standing still."""
    if plan.spec.teardown.hang_timeout:
        return HangLimit(plan.spec.teardown.hang_timeout, default=False)
    if default := plan.env.get(contract.HANG_DEFAULT_S):
        return HangLimit(int(default), default=True)
    return None


def own_code(spec: JobSpec) -> bool:
    """Whether the job runs code of the user's (a command, or a module:function of theirs), whose directory (where
    `runner submit` runs) may name its own requirements (runner.launch.deps)."""
    if spec.command is not None:
        return True
    refs = (spec.training.model, spec.training.data) if spec.training is not None else ()
    return any(ref and ":" in ref and not ref.startswith("gs://") for ref in refs)


def plan_secrets(spec: JobSpec, project: str | None, *, local: bool) -> tuple[PlannedSecret, ...]:
    """Each secret's source, checked as far as this machine can without reading a value: on a cloud machine only
    Secret Manager can be read; here the variable is set, the file is a readable regular file of at most 64 KiB.
    PlanError (exit 2) names the first that fails. (Whether Secret Manager grants access is the pre-flight's:
    runner.backends.secretmanager.)"""
    planned = []
    for name, secret in sorted(spec.secrets.items()):
        ref = secret.reference
        where = f"secrets.{name}"
        if ref.kind == "secretmanager":
            if not ref.project and not project:
                raise PlanError(
                    f"{where}: {ref.text} names no project, and the run has none",
                    hint="write projects/PROJECT/secrets/NAME/versions/latest, or set accelerator.project",
                )
            source = ref.version_name(project or "")
        elif not local:
            raise PlanError(
                f"{where}: {ref.text} is this machine's, which a TPU VM cannot read",
                hint="keep it in Secret Manager and write NAME/versions/latest (the VM reads it with its own "
                "service account), or run the job here with --local",
            )
        elif ref.kind == "env":
            if not os.environ.get(ref.local):
                raise PlanError(
                    f"{where}: ${ref.local} is not set (or empty) in this shell", hint=f"export {ref.local}"
                )
            source = ref.text
        else:
            path = Path(ref.local).expanduser().absolute()
            try:
                info = path.stat()
                ok = stat.S_ISREG(info.st_mode) and os.access(path, os.R_OK) and info.st_size <= SECRET_FILE_LIMIT
            except (OSError, RuntimeError):
                ok = False
            if not ok:
                raise PlanError(
                    f"{where}: {path} is not a readable file of at most {SECRET_FILE_LIMIT // 1024} KiB",
                    hint="check the path after file: (relative to where `runner submit` runs; ~ is your home)",
                )
            source = f"file:{path}"
        planned.append(PlannedSecret(name, secret.as_, ref, source))
    return tuple(planned)


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
    backend: str,
    storage: str | None = None,
    strategy: str = "auto",
    workers: int = 1,
    continued: Continued | None = None,
    timings: Timings | None = None,
) -> Plan:
    """A run on this machine: the same container (or its entrypoint as a process), CPU or GPU. `workers` above 1 is
    the multi-worker rehearsal: that many worker processes on the CPU, as the hosts of a pod slice (the local
    backend gives each its worker id and the addresses of the others). `backend`: the registry's name of this
    machine's backend (runner.backends.plan_local passes it). `continued`: the run to go on with.
    `timings`: the runner's, whose job cadences the job gets."""
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
    env = job_env(spec, run_id, run_dir, strategy=strategy, deadline=deadline, num_workers=workers, timings=timings)
    env.setdefault(contract.DATA_DIR, str(datasets.cache_dir()))
    # The job's process gets this machine's environment and the job's: what execve can take is this machine's.
    if found := limits.exec_problems(spec.command or [], {**os.environ, **env}, os.sysconf("SC_ARG_MAX")):
        raise PlanError("\n".join(found), hint="keep large values out of `env:`: put them in a file the job reads")
    limit = runtime_limit(spec, 0.0)  # no TPU here: a budget is not applied
    planned = (
        plan_secrets(spec, spec.accelerator.project or gcloud.default_project(), local=True) if spec.secrets else ()
    )
    return Plan(
        spec,
        spec_path,
        run_id,
        backend,
        storage_url,
        run_dir,
        env,
        now,
        deadline,
        num_workers=workers,
        limit=limit,
        secrets=planned,
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


def check_priced(spec: JobSpec, target: Target) -> None:
    """A budget becomes a deadline through the catalog's price: without one it would limit nothing."""
    generation = target.accelerator.generation
    if spec.budget is not None and not generation.priced:
        raise PlanError(
            f"budget: the catalog has no price for {generation.title}, so a budget cannot limit the run",
            hint="drop `budget:` and bound the run with teardown.max_runtime",
        )


def plan_cloud(
    spec: JobSpec,
    spec_path: str | None,
    *,
    resolve: Resolve,
    storage: str | None = None,
    project: str | None = None,
    zone: str | None = None,
    environ: dict[str, str] | None = None,
    now: float | None = None,
    run_suffix: str | None = None,
    nonce: str | None = None,
    problems: Problems | None = None,
    continued: Continued | None = None,
    timings: Timings | None = None,
) -> Plan:
    """A run on a cloud machine, whose target `resolve` gives (the chosen backend's: runner.backends.resolver).
    Raises PlanError (exit 2) for anything that would fail after paying: the first problem, or with `problems`
    every one of them, collected there while the plan goes on with placeholders (it raises only when nothing can be
    planned: an accelerator type the catalog does not know).
    `now`, `run_suffix` and `nonce` pin what is otherwise unique to each submit (golden tests)."""
    collect = problems is not None
    found = problems if problems is not None else Problems()

    def check(step: Callable[[], T], fallback: T) -> T:
        return found.attempt(step, fallback) if collect else step()

    now = now or time.time()
    run_id = continued.run_id if continued else new_run_id(spec.name, now, run_suffix)
    if continued is not None and not continued.run_dir.startswith("gs://"):
        unreachable = PlanError(
            f"run {run_id} has a local run directory, which a cloud VM cannot reach",
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
    target = resolve(spec, run_id, project=project, zone=zone, environ=environ, problems=found if collect else None)
    check(lambda: check_image_project(spec.image, target.project), None)
    check(lambda: check_priced(spec, target), None)
    # The budget, where it is earlier, is the run's max_runtime from here on: deadline, VM watchdog, job safety net.
    limit = check(
        lambda: runtime_limit(spec, target.price_per_hour),
        runtime_limit(spec.model_copy(update={"budget": None}), target.price_per_hour),
    )
    spec = limited(spec, limit)
    # What the target asks the cloud for never outlasts the deadline, the budget's included.
    target = target.within(spec.teardown.max_runtime)
    run_dir = continued.run_dir if continued else f"{storage_url}/{RUNS_DIR}/{run_id}"
    # Worker ids are global across the slices of a multislice: slice s, host h is worker s * hosts + h.
    workers = target.hosts * target.slices if target.trainer_workers == "all" else 1
    deadline = now + spec.teardown.max_runtime
    env = job_env(spec, run_id, run_dir, strategy="auto", deadline=deadline, num_workers=workers, timings=timings)
    env.update(target.job_env(spec))  # what the backend's machines add (a TPU VM's TPU name, ...)
    # The same contract on every backend: the data-set cache is a directory of the container's own on a VM, filled
    # from this machine's cache, which the run copies beside its run directory once (lifecycle: share_data).
    env[contract.DATA_DIR] = CLOUD_DATA_DIR
    if datasets.mnist_path(fetch=False) is not None:
        env[contract.DATA_URL] = f"{storage_url}/{DATASETS_DIR}"
    if spec.training is not None and spec.training.framework == "tensorflow" and spec.training.keras == "auto":
        env[contract.LEGACY_KERAS] = "1"  # keras-team/keras#19448: Keras 3 under TPUStrategy fails on TPU VMs
    no_secrets: tuple[PlannedSecret, ...] = ()
    planned = check(lambda: plan_secrets(spec, target.project, local=False), no_secrets)
    return Plan(
        spec,
        spec_path,
        run_id,
        target.backend,
        storage_url,
        run_dir,
        env,
        now,
        deadline,
        num_workers=workers,
        attach=target.attach,
        cloud=target,
        limit=limit,
        secrets=planned,
        **({"nonce": nonce} if nonce else {}),
    )
