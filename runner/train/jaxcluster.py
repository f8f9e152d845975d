"""A bare `jax.distributed.initialize()` in every mode: the runner's cluster as one of JAX's own cluster kinds.

jax.distributed.initialize() with no arguments reads only JAX_COORDINATOR_ADDRESS from the environment; the process
count and id come from the first registered ClusterEnv (jax/_src/clusters/cluster.py) whose is_env_present() holds:
Open MPI, SLURM, GKE and Cloud TPU VMs (GceTpuCluster asks the metadata server, and only where there are TPU
chips), Kubernetes. Every subclass registers itself when it is defined (ClusterEnv.__init_subclass__), and JAX
documents that way in: "cluster environments need to derive from ClusterEnv ... subclasses are automatically
detected when imported". So the runner defines one that reads its own variables (runner.contract.cluster):

  * present only where the runner made the cluster (RUNNER_COORDINATOR_ADDRESS: `--local --workers N`, the
    emulated TPU and Compute Engine slices), so on a real TPU slice nothing of it is there and JAX's GceTpuCluster
    finds the cluster as it always has;
  * consulted first where it is present: the runner's word is about this very job, while an outer environment's
    may not be (a `--local --workers 2` rehearsal on a TPU VM, where GceTpuCluster would count the VM's one host,
    or inside a SLURM allocation);
  * read when initialize() asks, never cached: each attempt is a new process with a coordinator made for it.

The supervisor registers it in the job's interpreter through runner/worker/jobpath/sitecustomize.py, as JAX is
imported. `register()` is also there to call directly (a job that starts Python with -I or -S, where no
sitecustomize runs): it is idempotent.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from runner import contract

NAME = "tpu_runner"  # jax.distributed.initialize(cluster_detection_method="tpu_runner") names it explicitly


def register(clusters: ModuleType | None = None) -> type | None:
    """Define the runner's ClusterEnv in `clusters` (jax._src.clusters, imported if not given) and put it first
    among JAX's cluster kinds; returns it, or None where this JAX has no ClusterEnv to extend (initialize() then
    needs its arguments, or keras.distribution's KERAS_DISTRIBUTION_* variables, which the runner sets too)."""
    if clusters is None:
        try:
            import jax._src.clusters as clusters
        except ImportError:
            return None
    base: Any = getattr(clusters, "ClusterEnv", None)
    kinds = getattr(base, "_cluster_types", None)
    if base is None or not isinstance(kinds, list):
        return None
    for kind in kinds:
        if getattr(kind, "name", None) == NAME:
            return kind

    class RunnerCluster(base):
        """The processes `runner submit` started, as its variables say (runner.contract.cluster)."""

        name = NAME
        opt_in_only_method = False

        @classmethod
        def is_env_present(cls) -> bool:
            return contract.cluster() is not None

        @classmethod
        def get_coordinator_address(
            cls, timeout_secs: int | None = None, override_coordinator_port: str | None = None
        ) -> str:
            found = _cluster()
            if not override_coordinator_port:  # JAX_COORDINATOR_PORT
                return found.coordinator
            return f"{found.coordinator.rsplit(':', 1)[0]}:{override_coordinator_port}"

        @classmethod
        def get_process_count(cls) -> int:
            return _cluster().num_processes

        @classmethod
        def get_process_id(cls) -> int:
            return _cluster().process_id

    kinds.remove(RunnerCluster)  # registered last by __init_subclass__: consulted first instead
    kinds.insert(0, RunnerCluster)
    return RunnerCluster


def _cluster() -> contract.Cluster:
    found = contract.cluster()
    if found is None:
        raise RuntimeError(f"{contract.COORDINATOR_ADDRESS} is not set: the runner made no cluster for this process")
    return found
