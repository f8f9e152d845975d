"""The same bootstrap on Compute Engine VMs (the emulator's, running the rendered startup script): the job runs, its
exit record is written, and the VM deletes what bills (its instance, or its slice's group) by itself, through
Compute Engine's REST API ($RUNNER_COMPUTE_API), with nobody's runner watching. The template and the workload policy
of a group are left to the runner's teardown (or `runner gc`): they bill nothing and cannot go while the group is
there."""

from __future__ import annotations

import pytest

from runner.backends.base import MachineState
from runner.backends.compute_engine.api import ENDPOINT_ENV
from runner.backends.compute_engine.backend import ComputeEngineBackend
from runner.backends.compute_engine.handles import GroupHandle
from runner.storage import open_storage
from tests.backends.compute_engine.conftest import QUICK
from tests.backends.compute_engine.plans import plan
from tests.waiting import wait_for
from tpu_emulator import TpuEmulator


@pytest.mark.parametrize("accelerator", ["type: tpu7x-2, zone: us-central1-c", "type: tpu7x-16, zone: us-central1-c"])
def test_the_vm_deletes_itself_when_its_job_is_over(
    cloud: TpuEmulator, bucket_url: str, monkeypatch: pytest.MonkeyPatch, accelerator: str
) -> None:
    monkeypatch.setenv(ENDPOINT_ENV, cloud.endpoint)
    p = plan(accelerator, storage=bucket_url)
    backend = ComputeEngineBackend(say=lambda s: None, timings=QUICK, delete_timeout_s=30.0)
    handle = backend.provision(p, lambda h: None)
    run_dir = open_storage(p.run_dir)
    wait_for(lambda: len(run_dir.list("exit/")) == p.num_workers, timeout=60)
    wait_for(lambda: backend.status(handle) == MachineState.GONE, timeout=60)
    assert not cloud.compute.instances()
    if isinstance(handle, GroupHandle):
        assert backend.teardown(handle, wait_s=20) is True  # the template and policy, after the VM's own delete
