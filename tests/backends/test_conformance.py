"""One conformance suite for every backend: the local process backend, and the TPU VM and Compute Engine backends on
the emulators, go through the same cases, holding each to the Backend contract (runner/backends/base.py): the handle
is announced before anything is created, the machine runs the job through the run-directory contract, a machine
taken away is seen as gone, teardown is idempotent and confirms, and a handle that is not the backend's is a clear
error."""

from __future__ import annotations

import os
import signal
import sys
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from runner.backends import backend_named, plan_cloud, plan_local
from runner.backends.base import Backend, MachineState
from runner.backends.local.backend import LocalBackend
from runner.errors import StorageError
from runner.plan.planner import Plan
from runner.spec.loader import load_spec_text
from runner.storage import open_storage
from runner.timings import Timings
from runner.watch.rundir import read_snapshot
from tests.cloudjobs import IMAGE
from tests.waiting import wait_for
from tpu_emulator import TpuEmulator

GONE = (MachineState.GONE, MachineState.PREEMPTED, MachineState.STOPPED, MachineState.DELETING)


@dataclass
class Subject:
    backend: Backend[Any]
    plan: Plan
    take_away: Callable[[Any], None]  # what a provider (or a crash) does to the machine under the runner


# Each cloud backend's accelerator (a type its catalog slice offers where it is offered), and what takes its machine
# away under the runner: a Cloud TPU node's preemption, a Spot VM's on Compute Engine.
CLOUDS: dict[str, tuple[str, Callable[[TpuEmulator, Any], None]]] = {
    "tpu-vm": ("type: v2-8, zone: us-central1-b", lambda emulator, h: emulator.preempt(h.node_id)),
    "compute-engine": (
        "type: tpu7x-2, zone: us-central1-c, spot: true, backend: compute-engine",
        lambda emulator, h: emulator.compute.preempt(h.name),
    ),
}


def spec_text(storage: str, seconds: int, accelerator: str = CLOUDS["tpu-vm"][0]) -> str:
    script = f"import time; print('on the machine', flush=True); time.sleep({seconds})"
    return textwrap.dedent(f"""\
        name: conform
        image: {IMAGE}
        command: [python, -c, "{script}"]
        accelerator: {{{accelerator}, project: test-project}}
        storage: {storage}
        """)


def local_subject(tmp_path: Path, seconds: int) -> Subject:
    spec = load_spec_text(spec_text(str(tmp_path / "store"), seconds).replace("python,", f"{sys.executable},"))
    backend = LocalBackend(prefer="process")

    def kill(handle: Any) -> None:
        os.killpg(handle.pgid, signal.SIGKILL)

    return Subject(backend, plan_local(spec, None), kill)


@pytest.fixture(params=["local", *CLOUDS])
def subject(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[int], Subject]]:
    """A factory: a backend (made by the registry, as a run makes it) and a plan whose job sleeps `seconds`."""
    if request.param == "local":
        yield lambda seconds: local_subject(tmp_path, seconds)
        return
    cloud = request.getfixturevalue("cloud")
    accelerator, take_away = CLOUDS[request.param]

    def make(seconds: int) -> Subject:
        spec = load_spec_text(spec_text(f"gs://runner-test/{uuid.uuid4().hex[:8]}", seconds, accelerator))
        plan = plan_cloud(spec, None, environ={})
        assert plan.backend == request.param
        backend = backend_named(plan.backend, lambda s: None, Timings.from_env())
        return Subject(backend, plan, lambda h: take_away(cloud, h))

    yield make


def test_a_handle_is_announced_before_the_machine_and_runs_the_job(subject: Callable[[int], Subject]) -> None:
    s = subject(0)
    announced: list[Any] = []
    handle = s.backend.provision(s.plan, announced.append)
    try:
        assert announced and announced[-1] == handle  # on_handle came first, with what was then created
        assert s.backend.handle_from_dict(handle.to_dict()) == handle
        storage = open_storage(s.plan.run_dir)
        (done,) = wait_for(lambda: read_snapshot(storage).exits, what="the job's exit record")
        assert done.state == "succeeded"
        assert b"on the machine" in (storage.read_bytes("logs/worker-0.log") or b"")
    finally:
        assert s.backend.teardown(handle) is True
    assert s.backend.status(handle) in GONE


def test_a_machine_taken_away_is_gone_and_teardown_is_idempotent(subject: Callable[[int], Subject]) -> None:
    s = subject(300)
    handle = s.backend.provision(s.plan, lambda h: None)
    storage = open_storage(s.plan.run_dir)
    wait_for(lambda: storage.read_bytes("heartbeat"), what="the job's heartbeat")
    assert s.backend.status(handle) == MachineState.RUNNING
    s.take_away(handle)
    wait_for(lambda: s.backend.status(handle) in GONE, what="the machine to be seen gone")
    assert s.backend.teardown(handle) is True
    assert s.backend.teardown(handle) is True  # twice: nothing left, no error
    assert s.backend.status(handle) == MachineState.GONE


@pytest.mark.parametrize("backend", CLOUDS)
def test_a_machine_up_before_its_create_ends_is_billed_from_the_end(cloud: TpuEmulator, backend: str) -> None:
    """The machine is READY (RUNNING) a while before its create operation ends: provision reads on for the
    operation's end, when billing starts by the API's clock (the report's cost and goodput start there)."""
    lag = 2.0
    (cloud.late_operation if backend == "tpu-vm" else cloud.compute.late_operation)(lag, count=1)
    spec = load_spec_text(spec_text(f"gs://runner-test/{uuid.uuid4().hex[:8]}", 60, CLOUDS[backend][0]))
    plan = plan_cloud(spec, None, environ={})
    machine = backend_named(plan.backend, lambda s: None, Timings.from_env())
    before = time.time()
    handle = machine.provision(plan, lambda h: None)
    try:
        ready_at = machine.ready_at(handle)
        assert ready_at is not None and before + lag <= ready_at <= time.time()
    finally:
        assert machine.teardown(handle) is True


def test_a_handle_of_another_backend_is_a_storage_error(subject: Callable[[int], Subject]) -> None:
    s = subject(0)
    with pytest.raises(StorageError, match="machine handle"):
        s.backend.handle_from_dict({"bogus": 1})
