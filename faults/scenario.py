"""A fault case as data: the job, the fault, what happens while it runs, and what must come of it.

A case is a `Scenario`: its hooks are small functions of the case's context (faults/context.py), built from the
verbs in faults/actions.py and faults/checks.py, so that a new case is a few lines in a module of
faults/scenarios/. The one runner (faults/suite.py) does the rest the same way for every case: the emulators, the
real `runner submit` subprocess, the recorder and every measurement.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from faults.context import Ctx
    from faults.result import RunResult

IMAGE = "us-central1-docker.pkg.dev/test-project/runner/trainer:test"
PROJECT = "test-project"
ZONES = ("us-central1-b", "us-central1-c")
THIRD_ZONE = "europe-west4-a"  # also offers v2-8 (runner/plan/tpu_catalog.yaml)
MULTI_HOST_ZONE = "us-central2-b"  # v4 slices, single and multi-host
GKE_LOCATION, GKE_CLUSTER = "us-central1", "tpu-cluster"  # the gke cases' cluster (faults/cluster.py)
UNREACHABLE = "http://127.0.0.1:9"  # nothing listens: a registry check that cannot tell

Hook = Callable[["Ctx"], object]  # what a hook returns (a fault it added, say) is not used
Check = Callable[["Ctx", "RunResult"], None]

HELLO = ("python", "-c", "print('hello from the VM', flush=True)")
# Prints every second for 15 minutes: a job that outlives any safety net under test.
LONG_COMMAND = ("python", "-c", "import time\nfor i in range(900):\n    print('working', i, flush=True); time.sleep(1)")
# Runs until a preemption ends its first attempt, however loaded the machine (a preemption that must land within a
# few seconds of ticks is a race), and ends its next attempt after 6 ticks: worker 0 marks the first attempt in its
# checkpoint directory, which the mirror copies to the bucket (STARTED: the event to preempt on) and every recreated
# host gets back; an empty file, so there is no half-written one for the mirror to copy. At most 2 minutes, so that
# a preemption that never comes fails the case instead of hanging it.
STARTED = "checkpoints/started"
UNTIL_PREEMPTED = (
    "import os, pathlib, time\n"
    "mark = pathlib.Path(os.environ['RUNNER_CHECKPOINT_DIR']) / 'started'\n"
    "again = mark.exists()\n"
    "if os.environ['RUNNER_WORKER_ID'] == '0' and not again:\n"
    "    mark.parent.mkdir(parents=True, exist_ok=True)\n"
    "    mark.touch()\n"
    "for i in range(6):\n"
    "    print('tick', i, flush=True); time.sleep(0.5)\n"
    "end = time.time() + 120\n"
    "while not again and time.time() < end:\n"
    "    time.sleep(0.5)\n"
)


@dataclass(frozen=True)
class Train:
    """The built-in trainer on real MNIST (the bucket's copy): mnist_mlp, one checkpoint per epoch."""

    epochs: int = 4
    examples: int = 1024
    batch_size: int = 128
    test_examples: int = 256
    framework: str | None = None  # training.framework (None: the spec's default, TensorFlow; TPU7x needs jax)

    @property
    def steps_per_epoch(self) -> int:
        return self.examples // self.batch_size

    def section(self, data: str | None) -> dict[str, Any]:
        return ({"framework": self.framework} if self.framework else {}) | {
            "model": "mnist_mlp",
            "epochs": self.epochs,
            "batch_size": self.batch_size,
            "max_train_examples": self.examples,
            "max_test_examples": self.test_examples,
            "checkpoint_every": 1,
            "data": data,
        }


@dataclass(frozen=True)
class Command:
    """A custom command where training is not the point."""

    argv: tuple[str, ...] = HELLO


@dataclass(frozen=True)
class Scenario:
    """One fault case. `expect` None means refused before anything exists (exit code 2, shown as `rejected`)."""

    name: str
    fault: str  # what the table calls it
    expect: str | None  # the terminal state `runner status` must report
    exit: int  # the runner's exit code (-9: the case SIGKILLs it)
    job: Train | Command = Command()
    spot: bool = False
    provisioning: str | None = None  # accelerator.provisioning (None: the spec's default, auto)
    accelerator: str = "v2-8"  # accelerator.type (a v4 lives in MULTI_HOST_ZONE, not ZONES)
    backend: str | None = None  # accelerator.backend (None: auto, which the catalog decides from the type)
    slices: int = 1  # accelerator.slices: above 1, a multislice
    zones: tuple[str, ...] = ZONES
    teardown: dict[str, Any] = field(default_factory=dict)
    retries: dict[str, Any] = field(default_factory=dict)
    registry: str | None = None  # RUNNER_REGISTRY_ENDPOINT; None: the emulator
    timings: str = ""  # $RUNNER_TIMINGS the case adds to the suite's (runner.timings: name=value,...)
    setup: tuple[Hook, ...] = ()  # before submit: inject faults, plant nodes
    during: tuple[Hook, ...] = ()  # each in a thread while the runner lives
    after: tuple[Hook, ...] = ()  # once the runner has exited: what finishes the case (`runner down`, gc, a VM alone)
    checks: tuple[Check, ...] = ()  # the case's own expectations, on the measured result
    fast: bool = False  # a few seconds: run by `make test` (tests/faults/test_faults.py)
    timeout_s: float = 420.0  # for the runner to exit
    gcs_faults: int = 0  # 503s the flaky proxy answers to the first uploads of each checkpoint object
    proxy: bool = False  # the VMs reach Cloud Storage through a FlakyProxy (ctx.proxy) even without gcs_faults
    runner_via_proxy: bool = False  # the runner too (its STORAGE_EMULATOR_HOST is the proxy)
    own_bucket: bool = False  # the run directory in a bucket of its own (which the case may delete)
    reference: bool = False  # first run the same job without the fault, for the checks to compare with
    # Held to the idle goal (IDLE_GOAL_S). Not where every delete is refused: the node idles until a person acts.
    idle_goal: bool = True
    # The VMs pull the real trainer image (this checkout's cpu image, pushed to a registry on loopback) and run it
    # under Docker or Podman (tpu_emulator.vm_engine), instead of running its entrypoint as a process.
    container: bool = False

    @property
    def trains(self) -> bool:
        return isinstance(self.job, Train)

    @property
    def on_cluster(self) -> bool:
        """A gke case: its JobSet runs on the Kubernetes rehearsal (faults/cluster.py), reached through GKE's API."""
        return self.backend == "gke"

    def spec_yaml(self, storage: str, data: str | None, image: str = IMAGE, namespace: str = "faults") -> str:
        acc: dict[str, Any] = {"type": self.accelerator, "zones": list(self.zones), "project": PROJECT}
        if self.on_cluster:
            acc["cluster"] = {"location": GKE_LOCATION, "name": GKE_CLUSTER, "namespace": namespace}
        if self.slices > 1:
            acc["slices"] = self.slices
        if self.spot:
            acc["spot"] = True
        if self.provisioning:
            acc["provisioning"] = self.provisioning
        if self.backend:
            acc["backend"] = self.backend
        doc: dict[str, Any] = {"name": "faults", "image": image, "accelerator": acc, "storage": storage}
        if isinstance(self.job, Train):
            doc["training"] = self.job.section(data)
        else:
            doc["command"] = list(self.job.argv)
        if self.teardown:
            doc["teardown"] = dict(self.teardown)
        if self.retries:
            doc["retries"] = dict(self.retries)
        return json.dumps(doc, indent=1) + "\n"  # JSON is YAML

    def without_fault(self) -> Scenario:
        """The same job with nothing injected: the reference run."""
        return Scenario(
            f"{self.name}-reference",
            f"{self.fault}: reference",
            "succeeded",
            0,
            job=self.job,
            spot=self.spot,
            provisioning=self.provisioning,
            accelerator=self.accelerator,
            backend=self.backend,
            slices=self.slices,
            zones=self.zones,
            teardown=self.teardown,
            retries=self.retries,
            timeout_s=self.timeout_s,
            container=self.container,
        )
