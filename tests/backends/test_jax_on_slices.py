"""A bare `jax.distributed.initialize()` on the emulated 2-host slices, through the whole cloud path: a Cloud TPU
v4-16 node and a Compute Engine tpu7x-16 slice (a managed instance group of 2 VMs). Their VMs run the real
bootstrap; the emulator's `docker` tells each container what JAX's Cloud TPU detection would find on a real VM
(which needs TPU chips), as the runner's RUNNER_COORDINATOR_ADDRESS, and the job's interpreter knows the runner's
cluster (runner.train.jaxcluster): the job passes no arguments and reads no KERAS_DISTRIBUTION_* variable."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cloudjobs import IMAGE, submit
from tpu_emulator import TpuEmulator

# Plain JAX, no runner import: a bare jax.distributed.initialize() (the runner's cluster, runner.train.jaxcluster),
# then a psum over every process's devices.
PSUM_SCRIPT = """\
import jax, jax.numpy as jnp
jax.distributed.initialize()
x = jnp.full(jax.local_device_count(), jax.process_index() + 1.0)
total = jax.pmap(lambda v: jax.lax.psum(v, "i"), axis_name="i")(x)
print(f"process {jax.process_index()} of {jax.process_count()}: psum {float(total[0])}", flush=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    "accelerator", ["{type: v4-16, zone: us-central2-b", "{type: tpu7x-16, zone: us-central1-c"], ids=["tpu-vm", "gce"]
)
def test_a_bare_initialize_connects_the_hosts_of_an_emulated_slice(
    cloud: TpuEmulator, tmp_path: Path, bucket_url: str, accelerator: str
) -> None:
    script = tmp_path / "psum.py"
    script.write_text(PSUM_SCRIPT)
    spec = tmp_path / "slice.yaml"
    spec.write_text(
        f"name: psum\nimage: {IMAGE}\naccelerator: {accelerator}, project: test-project}}\n"
        f"storage: {bucket_url}\ncommand: [python, {script}]\n"
    )
    result = submit(str(spec))
    assert result.exit_code == 0, result.output
    for worker in (0, 1):
        assert f"[worker {worker}] process {worker} of 2: psum 3.0" in result.output, result.output
