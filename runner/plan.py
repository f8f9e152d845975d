"""Plan a run: resolve the run id, the run directory and the job's environment, with no side effects.

Everything a backend needs is decided here, so `--dry-run` shows exactly what would happen and a backend never
reads the spec file or the user's flags itself.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path

from runner import contract, datasets
from runner.errors import PlanError
from runner.spec import JobSpec

RUNS_DIR = "runs"


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

    @property
    def storage_is_local(self) -> bool:
        return not self.storage_url.startswith("gs://")


def new_run_id(name: str, now: float | None = None) -> str:
    """<name>-<UTC yyyymmdd-hhmmss>-<4 hex>: sortable, unique, and valid as a TPU node id and label value."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now or time.time()))
    return f"{name}-{stamp}-{secrets.token_hex(2)}"


def resolve_storage(spec: JobSpec, override: str | None, *, cloud: bool) -> str:
    url = (override or spec.storage).rstrip("/")
    if url.startswith("gs://"):
        return url
    if "://" in url:
        raise PlanError(f"storage {url!r} must be gs://BUCKET/PREFIX or a local path")
    if cloud:
        raise PlanError(
            f"storage {url!r} is a local path, but a TPU VM can only write its run directory to Cloud Storage",
            hint="set `storage: gs://BUCKET/PREFIX` in the job spec, or pass --storage gs://BUCKET/PREFIX",
        )
    return str(Path(url).expanduser().absolute())


def job_env(spec: JobSpec, run_id: str, run_dir: str, *, strategy: str, num_workers: int = 1) -> dict[str, str]:
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
        }
    )
    if spec.training is not None:
        env[contract.TRAINING] = spec.training.model_dump_json()
    if spec.command is not None:
        env[contract.COMMAND] = json.dumps(spec.command)
    return env


def plan_local(spec: JobSpec, spec_path: str | None, *, storage: str | None = None, strategy: str = "auto") -> Plan:
    """A run on this machine: the same container (or its entrypoint as a process), CPU or GPU."""
    now = time.time()
    run_id = new_run_id(spec.name, now)
    storage_url = resolve_storage(spec, storage, cloud=False)
    run_dir = f"{storage_url}/{RUNS_DIR}/{run_id}"
    env = job_env(spec, run_id, run_dir, strategy=strategy)
    env.setdefault(contract.DATA_DIR, str(datasets.cache_dir()))
    return Plan(spec, spec_path, run_id, "local", storage_url, run_dir, env, now, now + spec.teardown.max_runtime)
