"""What a job on a TPU VM gets in its environment beyond the contract every backend shares, whichever API created
the VM (the Cloud TPU API's node, a Compute Engine instance or group): the two VM backends' targets return it from
Target.job_env; a backend whose machines are not TPU VMs gives its own."""

from __future__ import annotations

from runner import contract
from runner.plan.target import Target


def tpu_vm_env(target: Target) -> dict[str, str]:
    """The TPU's name for TensorFlow's cluster resolver (contract.THIS_TPU on one host, the node on a pod slice; a
    multislice's VMs name their own node: the bootstrap adds it), and, where TensorFlow runs on worker 0 only, no TPU
    library in the other workers' processes (worker 0 drives the slice through the TPU runtime, as Google's TF pod CI
    does)."""
    env: dict[str, str] = {}
    if target.slices == 1:
        env[contract.TPU_NAME] = target.machine_id if target.accelerator.multi_host else contract.THIS_TPU
    if target.trainer_workers == "0":
        env["TPU_LOAD_LIBRARY"] = "0"
    return env
