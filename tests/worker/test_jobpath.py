"""A bare jax.distributed.initialize() in the job: the supervisor's hook on the job's path (runner/worker/jobpath)
makes the runner's cluster one of JAX's cluster kinds (runner.train.jaxcluster), in a real interpreter started as
the supervisor starts the job's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from runner import contract
from runner.worker.supervisor import JOB_PATH, Supervisor
from tests.conftest import REPO
from tests.environ import child_env

# What JAX's initialize() would take from the cluster kinds, asked the way it asks (no arguments at all).
DETECT = """
import json, sys
assert "jax" not in sys.modules, "the hook imported JAX before the job did"
import jax._src.clusters as clusters
found = clusters.ClusterEnv.auto_detect_unset_distributed_params(None, None, None, None, None, 300)
print(json.dumps({"first": clusters.ClusterEnv._cluster_types[0].name, "found": found[:3]}))
"""
SLURM = {
    "SLURM_JOB_ID": "7",
    "SLURM_NTASKS": "1",
    "SLURM_PROCID": "0",
    "SLURM_LOCALID": "0",
    "SLURM_STEP_NODELIST": "outer",
}


def job_python(code: str, pythonpath: list[Path], **env: str) -> subprocess.CompletedProcess[str]:
    base = child_env("SLURM_", "JAX_")
    paths = os.pathsep.join(str(p) for p in [*pythonpath, REPO])
    return subprocess.run(
        [sys.executable, "-c", code],
        env={**base, "PYTHONPATH": paths, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def cluster_env(coordinator: str = "127.0.0.1:12345", workers: int = 3, worker: int = 2) -> dict[str, str]:
    return {
        contract.COORDINATOR_ADDRESS: coordinator,
        contract.NUM_WORKERS: str(workers),
        contract.WORKER_ID: str(worker),
    }


def test_the_supervisor_puts_the_hook_first_only_where_the_runner_made_a_cluster(tmp_path: Path) -> None:
    base = {contract.RUN_DIR: str(tmp_path / "run"), "PYTHONPATH": "/users/own"}
    with_cluster = Supervisor({**base, **cluster_env()}).job_env()
    assert with_cluster["PYTHONPATH"].split(os.pathsep) == [str(JOB_PATH), "/users/own"]
    assert (JOB_PATH / "sitecustomize.py").is_file()
    assert Supervisor(base).job_env()["PYTHONPATH"] == "/users/own"  # one host, or a real TPU slice: untouched


def test_a_bare_initialize_finds_the_runners_cluster_first_and_the_jobs_own_sitecustomize_still_runs(
    tmp_path: Path,
) -> None:
    """Even inside an outer cluster environment (a SLURM allocation here), the runner's word about this job is what
    JAX finds; a sitecustomize of the job's own, further down the path, runs too."""
    own = tmp_path / "own"
    own.mkdir()
    (own / "sitecustomize.py").write_text("import os\nos.environ['OWN_SITECUSTOMIZE'] = 'ran'\n")
    code = "import os\nprint(os.environ.get('OWN_SITECUSTOMIZE'))\n" + DETECT
    result = job_python(code, [JOB_PATH, own], **cluster_env(), **SLURM)
    assert result.returncode == 0, result.stderr
    ran, detected = result.stdout.splitlines()
    assert ran == "ran"
    assert json.loads(detected) == {"first": "tpu_runner", "found": ["127.0.0.1:12345", 3, 2]}
    port = job_python(DETECT, [JOB_PATH], **cluster_env(), JAX_COORDINATOR_PORT="23456")  # JAX's own override
    assert json.loads(port.stdout)["found"] == ["127.0.0.1:23456", 3, 2], port.stderr


def test_where_the_runner_made_no_cluster_jax_finds_its_own_as_before() -> None:
    """A real TPU slice: no RUNNER_COORDINATOR_ADDRESS, so the runner's cluster is not there and JAX's own detection
    (here SLURM's, standing in for GceTpuCluster, which needs TPU chips) answers unchanged."""
    registered = job_python(
        "import jax._src.clusters as c\nfrom runner.train.jaxcluster import register\nassert register() is register()\n"
        "print(c.ClusterEnv._cluster_types[0].name, c.ClusterEnv.auto_detect_unset_distributed_params("
        "None, None, None, None, None, 300)[:3])",
        [],
        **SLURM,
    )
    assert registered.stdout.split(" ", 1) == ["tpu_runner", "('outer:61447', 1, 0)\n"], registered.stderr
