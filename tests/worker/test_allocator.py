"""The allocator settings the built-in JAX trainer gets where XLA's temporaries are host memory
(runner.worker.allocator): decided from the job, the machine's device files and the job's own environment, and kept
by glibc as a per-step block needs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from runner import contract
from runner.worker.allocator import CHOSEN, SETTINGS, accelerator_device_files, allocator_env, described, for_engine
from runner.worker.supervisor import Supervisor
from tests.worker.test_supervisor import run_worker, worker_env

JAX = {contract.TRAINING: json.dumps({"framework": "jax", "epochs": 1})}


def test_the_builtin_jax_trainer_on_a_machine_without_accelerator_files_gets_the_settings() -> None:
    assert allocator_env({"PATH": "/usr/bin", **JAX}, devices=[]) == SETTINGS


@pytest.mark.parametrize(
    "environ",
    [
        {contract.TRAINING: json.dumps({"framework": "tensorflow"})},  # allocates no such blocks
        {contract.TRAINING: "{}"},  # TensorFlow, the default
        {contract.TRAINING: "not json"},
        {**JAX, contract.COMMAND: json.dumps(["python", "train.py"])},  # your own command: yours to choose
    ],
)
def test_any_other_job_keeps_the_default(environ: dict[str, str]) -> None:
    assert allocator_env(environ, devices=[]) == {}


def test_the_engine_decides_for_a_job_and_for_the_bench_alike() -> None:
    """`runner bench` asks for its own trainer's arm by engine what the supervisor decides from a job."""
    assert for_engine("jax", {}, devices=[]) == SETTINGS == allocator_env(JAX, devices=[])
    assert for_engine("tensorflow", {}, devices=[]) == for_engine(None, {}, devices=[]) == {}
    assert for_engine("jax", {"MALLOC_ARENA_MAX": "4"}, devices=[]) == {}


def test_the_settings_a_process_started_with_are_described() -> None:
    assert described({"PATH": "/usr/bin"}) == "glibc defaults"
    assert described({**SETTINGS, "PATH": "/usr/bin"}) == (
        "MALLOC_ARENA_MAX=1, MALLOC_MMAP_MAX_=0, MALLOC_TRIM_THRESHOLD_=1073741824"
    )


@pytest.mark.parametrize("devices", [["/dev/accel0"], ["/dev/vfio/0"], ["/dev/nvidia0"]])
def test_a_machine_with_tpu_or_gpu_chips_keeps_the_default(devices: list[str]) -> None:
    assert allocator_env(JAX, devices=devices) == {}


@pytest.mark.parametrize("name", CHOSEN)
def test_a_job_that_chose_its_allocator_keeps_its_choice(name: str) -> None:
    assert allocator_env({**JAX, name: "x"}, devices=[]) == {}


def test_the_supervisor_gives_the_trainer_what_this_machine_decides(tmp_path: Path) -> None:
    base = {contract.RUN_DIR: str(tmp_path / "run"), **JAX}
    env = Supervisor(base).job_env()
    assert {k: v for k, v in env.items() if k.startswith("MALLOC_")} == allocator_env(base, accelerator_device_files())
    own = Supervisor({**base, "MALLOC_ARENA_MAX": "4"}).job_env()
    assert {k: v for k, v in own.items() if k.startswith("MALLOC_")} == {"MALLOC_ARENA_MAX": "4"}


def test_a_command_job_runs_with_the_environment_it_was_given(tmp_path: Path) -> None:
    show = "import json, os; print(json.dumps({k: v for k, v in os.environ.items() if k.startswith('MALLOC_')}))"
    env = worker_env(str(tmp_path / "run"), [sys.executable, "-c", show], **JAX)
    for name in CHOSEN:
        env.pop(name, None)
    result = run_worker(env)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[0]) == {}


# A step's temporary block as XLA on CPU allocates it (posix_memalign, from a thread of its pool), written whole and
# freed, ten times: the page faults of the last nine say whether glibc handed the same pages back. (A small block
# that something else takes after the big one can make the next one not fit once or twice; then they are reused.)
BLOCKS = """
import ctypes, resource, sys, threading
libc = ctypes.CDLL(None)
size = 100 << 20
faults = []
def step():
    ptr = ctypes.c_void_p()
    assert libc.posix_memalign(ctypes.byref(ptr), 64, size) == 0
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    ctypes.memset(ptr, 1, size)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    libc.free(ptr)
for _ in range(10):
    t = threading.Thread(target=step)
    t.start()
    t.join()
print(sum(faults[1:]))
"""


def test_glibc_reuses_a_freed_step_block_with_the_settings_and_maps_it_afresh_without() -> None:
    def later_faults(extra: dict[str, str]) -> int:
        env = {"PATH": "/usr/bin:/bin", **extra}
        done = subprocess.run([sys.executable, "-c", BLOCKS], env=env, capture_output=True, text=True, check=True)
        return int(done.stdout)

    fresh = later_faults({})  # each block mapped, faulted in and zeroed again (in 4 KiB or 2 MiB pages, as THP says)
    reused = later_faults(SETTINGS)
    assert fresh >= 9 * 50 and reused * 3 < fresh, (fresh, reused)  # 9 blocks of at least 50 huge pages each
