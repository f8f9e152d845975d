"""The trainer image built from docker/Dockerfile by the engine this machine has (Docker, or Podman as `make
containers` sets it up) and run for real: the built-in trainer on real MNIST through `runner submit --local`, a
command job whose code `runner build --context` put at /workspace, a SIGTERM mid-epoch (`docker stop`), and two
variants built in a row, each holding exactly its own packages. Where no engine can run they skip (fail with
CI=true): tests/containers.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from runner import contract
from runner.backends import container
from runner.launch import build
from runner.launch.engine import Engine
from runner.spec import TrainingSpec
from runner.train.checkpoints import read_manifest
from runner.watch.runs import RunRecord
from tests.containers import GROUP
from tests.launch.test_docker import image_requirements, locked
from tests.stops import FAST_PROGRESS, freeze_mid_epoch, job_pid, sigterm_pending
from tests.train.test_trainer import EXACT, SAVED_ON_SIGTERM, rows
from tests.waiting import wait_for
from tpu_emulator.registry import machine_ca_certs

pytestmark = [pytest.mark.slow, GROUP]
RUNNER = [sys.executable, "-m", "runner.cli"]
SIZE_BUDGET = 1.2e9  # the cpu image, on disk: a VM pulls it in seconds (docker/README.md, Sizes)


def submit_local(spec: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*RUNNER, "submit", str(spec), "--local"], capture_output=True, text=True, timeout=timeout, check=False
    )


def only_record(home: Path) -> RunRecord:
    (path,) = list((home / "runs").glob("*.json"))
    return RunRecord.model_validate_json(path.read_text())


def in_image(engine: Engine, ref: str, code: str) -> str:
    """What `python -c CODE` prints in a fresh container of `ref`, off the network."""
    result = engine.run("run", "--rm", "--network", "none", "--entrypoint", "python", ref, "-c", code, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_the_cpu_image_is_built_once_checked_and_small(container_engine: Engine, cpu_image: build.ImageResult) -> None:
    said: list[str] = []
    again = build.ensure_image("cpu", ca_certs=machine_ca_certs(), engine=container_engine, say=said.append)
    assert (again.built, again.reference) == (False, cpu_image.reference)  # same code, same tag: no rebuild
    assert said[0].startswith(f"{cpu_image.reference}: ") and " GB on disk (already built" in said[0]
    inspect = container_engine.run("image", "inspect", "--format", "{{json .Config}}", cpu_image.reference)
    config = json.loads(inspect.stdout)
    assert config["Entrypoint"] == container.ENTRYPOINT and config["User"] == "1000:1000"
    size = build.Cli(container_engine).size(cpu_image.reference)
    assert size is not None and size < SIZE_BUDGET, f"{size / 1e9:.2f} GB"
    build.verify(build.Cli(container_engine), cpu_image.reference)  # its packages: exactly the cpu lock
    seen = json.loads(
        in_image(
            container_engine,
            cpu_image.reference,
            "import importlib.util as u, json, os, sys\n"
            "tf = u.find_spec('tensorflow').submodule_search_locations[0]\n"
            "print(json.dumps({'tools': [m for m in ('pytest', 'ruff', 'mypy') if u.find_spec(m)],\n"
            "  'include': os.path.isdir(os.path.join(tf, 'include')), 'libclang': bool(u.find_spec('clang')),\n"
            "  'tests': sum(d == 'tests' for _, ds, _ in os.walk(os.path.dirname(tf)) for d in ds),\n"
            "  'pip_cache': os.path.isdir(os.path.expanduser('~/.cache/pip'))}))",
        )
    )
    assert seen == {"tools": [], "include": False, "libclang": False, "tests": 0, "pip_cache": False}


def test_the_builtin_trainer_trains_in_the_container(
    use_container_engine: Engine,
    cpu_image: build.ImageResult,
    tmp_path: Path,
    runner_home: Path,
    mnist_npz: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cache = tmp_path / "startup"
    monkeypatch.setenv(contract.CACHE_DIR, str(cache))  # this machine's start-up cache, as the runner finds it
    spec = tmp_path / "job.yaml"
    spec.write_text(
        textwrap.dedent(f"""\
        name: in-a-container
        image: {cpu_image.reference}
        training: {{max_train_examples: 256, max_test_examples: 256, epochs: 2, batch_size: 128}}
        storage: {tmp_path / "store"}
        """)
    )
    done = submit_local(spec)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    runs_as = next(line for line in done.stdout.splitlines() if "runs as" in line)
    assert f"{use_container_engine.title}, image {cpu_image.reference}, CPU" in runs_as
    run_dir = Path(only_record(runner_home).run_dir)
    summary = json.loads((run_dir / contract.SUMMARY).read_text())
    assert summary["train_examples"] == 256 and summary["strategy"]["kind"] == "cpu"
    assert summary["test_accuracy"] >= 0.2  # four steps of 128 real images; chance is 0.1
    assert [r["epoch"] for r in rows(run_dir / contract.METRICS)] == [1, 2]
    assert read_manifest(run_dir / contract.CHECKPOINTS)  # the epochs' checkpoints, in the run directory
    exit_record = json.loads((run_dir / contract.exit_key(0)).read_text())
    assert (exit_record["state"], exit_record["exit_code"]) == ("succeeded", 0)
    # The data cache reached the container read-only at /data, as the runner mounts it.
    assert f"{container.CONTAINER_DATA_DIR}/{mnist_npz.name}" in (run_dir / contract.log_key(0)).read_text()
    # The start-up cache reached it read-write: a calibration made inside (after the first epoch, the cache being
    # empty) is kept on this machine for the next run.
    perf = summary["perf"]
    if perf["precision_source"] == "calibrated":
        assert perf["calibrated_after_epoch"] == 1
        assert not perf["precision_reason"].endswith("(not cached)")
        assert len(list((cache / "calibration").glob("*.json"))) == 1


def test_a_command_job_runs_the_code_runner_build_put_in_the_image(
    use_container_engine: Engine, cpu_image: build.ImageResult, tmp_path: Path, runner_home: Path
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text(
        "import os, pathlib\n"
        "out = pathlib.Path(os.environ['RUNNER_OUTPUT_DIR'])\n"
        "(out / 'made-by-train.txt').write_text(open(__file__).read())\n"
        "print('cwd', os.getcwd(), 'files', sorted(os.listdir('.')), 'version 1')\n"
    )
    (project / "notes.tmp").write_text("left out")
    (project / ".dockerignore").write_text("*.tmp\n")
    ca_certs = machine_ca_certs()
    built = subprocess.run(
        [*RUNNER, "build", "--variant", "cpu", "--context", str(project)]
        + (["--ca-certs", str(ca_certs)] if ca_certs else []),
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    ref = built.stdout.strip().splitlines()[-1].removeprefix("image: ")
    assert ref.startswith(cpu_image.reference + "-code-")
    # The host's copy changes after the build: the job runs the image's.
    (project / "train.py").write_text("print('version 2')\n")
    spec = tmp_path / "job.yaml"
    spec.write_text(f"name: code\nimage: {ref}\ncommand: python train.py\nstorage: {tmp_path / 'store'}\n")
    done = submit_local(spec)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run_dir = Path(only_record(runner_home).run_dir)
    log = (run_dir / contract.log_key(0)).read_text()
    assert "cwd /workspace files ['.dockerignore', 'train.py'] version 1" in log
    assert "version 1" in (run_dir / "made-by-train.txt").read_text()
    assert json.loads((run_dir / contract.exit_key(0)).read_text())["state"] == "succeeded"


def host_pid(engine: Engine, name: str, pid_inside: int) -> int:
    """The host's pid of the container's process `pid_inside` (its pid in the container's own namespace)."""
    init = int(engine.run("inspect", "--format", "{{.State.Pid}}", name).stdout.strip())
    namespace = os.readlink(f"/proc/{init}/ns/pid")
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if os.readlink(entry / "ns" / "pid") != namespace:
                continue
            status = (entry / "status").read_text().splitlines()
        except OSError:
            continue
        nspid = next((line.split()[1:] for line in status if line.startswith("NSpid:")), [])
        if nspid and int(nspid[-1]) == pid_inside:
            return int(entry.name)
    raise AssertionError(f"no process {pid_inside} in container {name}")


def container_ended(engine: Engine, name: str, run_dir: Path) -> str | None:
    """Why the container's job can no longer be stopped mid-epoch, or None while it runs: it ended by positive
    evidence (its exit record, or the engine saying the container exited), so an inspection that fails while the
    engine is busy is not taken for the job's end."""
    if (run_dir / contract.exit_key(0)).exists():
        return (run_dir / contract.log_key(0)).read_text()[-3000:]
    try:
        state = engine.run("inspect", "--format", "{{.State.Status}}", name).stdout.strip()
    except subprocess.TimeoutExpired:  # an engine busy for a minute (a storage lock) has not ended the job
        return None
    return f"the container is {state}" if state in ("exited", "stopped", "dead") else None


# The process tests' job with 4x the examples: an epoch lasts seconds even on a fast CPU.
IN_CONTAINER = {**EXACT, "max_train_examples": 8192}
STEPS = 8192 // 8


def test_sigterm_mid_epoch_in_the_container_saves_exactly_and_runner_resume_goes_on(
    use_container_engine: Engine, cpu_image: build.ImageResult, tmp_path: Path, runner_home: Path
) -> None:
    """`docker stop` (a preemption, `runner down`) of a detached `--local` run mid-epoch: the SIGTERM reaches the
    trainer through the init process and the supervisor, and the run directory is what a process run leaves (as
    tests/train/test_trainer.py checks it): the step-exact checkpoint, no metrics row for the cut epoch, `cancelled`.
    Then `runner resume` runs the same image again, from that checkpoint: every step of the run once."""
    engine = use_container_engine
    training = json.dumps(TrainingSpec.model_validate(IN_CONTAINER).model_dump(mode="json", exclude_defaults=True))
    spec = tmp_path / "job.yaml"
    spec.write_text(
        f"name: stopped\nimage: {cpu_image.reference}\ntraining: {training}\nstorage: {tmp_path / 'store'}\n"
    )
    started = subprocess.run(  # progress.json every 0.1 s: where the test freezes the trainer (tests/stops)
        [*RUNNER, "submit", str(spec), "--local", "--detach"],
        env={**os.environ, "RUNNER_TIMINGS": FAST_PROGRESS},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert started.returncode == 0, started.stdout[-3000:] + started.stderr[-3000:]
    record = only_record(runner_home)
    run_dir, name = Path(record.run_dir), f"runner-{record.run_id}"  # the container the local backend names
    try:
        inside = wait_for(lambda: job_pid(run_dir), "the trainer to start in the container", 600)
        pid = host_pid(engine, name, inside)
        # Frozen mid-epoch (tests/stops), so the SIGTERM lands there however loaded this machine is.
        seen = freeze_mid_epoch(
            run_dir / contract.PROGRESS,
            pid,
            lambda: container_ended(engine, name, run_dir),
            "the trainer in the container",
            after_epoch=1,
            timeout=600,
        )
        stop = subprocess.Popen(engine.command("stop", "--time", "60", name), env=engine.env(), stdout=subprocess.PIPE)
        wait_for(lambda: sigterm_pending(pid), "docker stop's SIGTERM to reach the trainer", timeout=60)
        os.kill(pid, signal.SIGCONT)
        assert stop.wait(120) == 0
    finally:
        engine.run("rm", "--force", name)
    log = (run_dir / contract.log_key(0)).read_text()
    match = SAVED_ON_SIGTERM.search(log)
    assert match, log[-3000:]
    file, epochs_done, step, epoch, step_shown, steps, global_step = match.groups()
    epochs_done, step, epoch, global_step = int(epochs_done), int(step), int(epoch), int(global_step)
    assert (epoch, int(step_shown), int(steps)) == (seen["epoch"], step, STEPS)
    assert epochs_done == epoch - 1 and seen["step"] <= step < STEPS
    assert global_step == epochs_done * STEPS + step
    assert [r["epoch"] for r in rows(run_dir / contract.METRICS)] == list(range(1, epoch))
    newest = read_manifest(run_dir / contract.CHECKPOINTS)[0]
    assert (newest.file, newest.position, newest.global_step) == (file, (epochs_done, step), global_step)
    assert (run_dir / contract.CHECKPOINTS / file).is_file()
    exit_record = json.loads((run_dir / contract.exit_key(0)).read_text())
    assert (exit_record["state"], exit_record["exit_code"]) == ("cancelled", 143)
    status = subprocess.run([*RUNNER, "status", record.run_id, "--json"], capture_output=True, text=True, timeout=120)
    assert json.loads(status.stdout)["state"] == "cancelled"

    resumed = subprocess.run([*RUNNER, "resume", record.run_id], capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert f"resuming {record.run_id} (cancelled) as its attempt 2" in resumed.stdout
    assert engine.title.split()[0] in resumed.stdout  # the plan's `runs as` names the engine: in the container again
    log = (run_dir / contract.log_key(0)).read_text()
    assert f"[trainer] resumed from {file}: epoch {epoch} step {step} of {STEPS} (global step {global_step})" in log
    metrics = rows(run_dir / contract.METRICS)
    assert [r["epoch"] for r in metrics] == [1, 2, 3]
    assert [r.get("resumed_at_step") for r in metrics] == [step if r["epoch"] == epoch else None for r in metrics]
    summary = json.loads((run_dir / contract.SUMMARY).read_text())
    assert (summary["global_step"], summary["steps_this_attempt"]) == (3 * STEPS, 3 * STEPS - global_step)
    assert summary["resumed_from"]["checkpoint"] == file


def installed(engine: Engine, ref: str) -> dict[str, str]:
    """{canonical name: version} of every distribution in the image, read in a container of its own."""
    code = "import importlib.metadata as m, json; print(json.dumps({d.name: d.version for d in m.distributions()}))"
    found = json.loads(in_image(engine, ref, code))
    return {image_requirements._canonical(name): version for name, version in found.items()}


def test_two_variants_built_in_a_row_each_hold_exactly_their_own_packages(
    container_engine: Engine, cpu_image: build.ImageResult, tmp_path: Path
) -> None:
    """The gpu variant built after the cpu one (the order in which Podman's cache once handed the second variant the
    first one's dependency layer): each image, read outside any build step, holds its own lock and nothing else."""
    # The check tells the variants apart: the cpu image measured against the gpu lock fails, naming the difference.
    gpu_lock = tmp_path / "gpu.txt"
    gpu_lock.write_text("".join(f"{k}=={v}\n" for k, v in locked("gpu").items()))
    against = container_engine.run(
        "run", "--rm", "--network", "none", "-v", f"{gpu_lock}:/tmp/gpu.txt:ro", "--entrypoint", "python",
        cpu_image.reference, "/opt/requirements/requirements.py", "check",
        "--no-deps", "/opt/requirements/no-deps.txt", "--constraints", "/tmp/gpu.txt", timeout=300,
    )  # fmt: skip
    assert against.returncode == 1 and "tensorflow: locked 2.20.0, installed nothing" in against.stdout
    gpu = build.ensure_image("gpu", ca_certs=machine_ca_certs(), engine=container_engine)
    for variant, ref in (("cpu", cpu_image.reference), ("gpu", gpu.reference)):
        build.verify(build.Cli(container_engine), ref)
        want = {k: v for k, v in locked(variant).items() if k not in image_requirements.NOT_AT_RUN_TIME}
        found = installed(container_engine, ref)
        have = {k: v for k, v in found.items() if k in want or k not in image_requirements.BASE_PACKAGES}
        assert have == want, (variant, set(have) ^ set(want))
    assert "tensorflow-cpu" in locked("cpu") and "tensorflow" in locked("gpu")
