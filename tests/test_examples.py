"""examples/: the seed guides' own code as runner jobs. Each is changed from the published code only where it must be
(the guides' original.py beside each train.py holds them to it), and each, stopped mid-epoch (Ctrl-C, as a user
would) and continued with `runner resume`, trains exactly the uninterrupted run's optimizer steps with one metrics
line per epoch; the built-in trainer with a model and data of yours too, on both engines."""

from __future__ import annotations

import difflib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from runner import contract, datasets
from tests.environ import child_env
from tests.stops import FAST_PROGRESS, freeze_mid_epoch, job_pid, sigterm_pending
from tests.waiting import wait_for

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
RUNNER = [sys.executable, "-m", "runner.cli"]
SEEDS = ("gpu_tpu_guide", "colab_tpu", "gpu_vs_tpu")


def changed_lines(example: str) -> list[str]:
    original = (EXAMPLES / example / "original.py").read_text().splitlines()
    ours = (EXAMPLES / example / "train.py").read_text().splitlines()
    return [
        line
        for line in difflib.unified_diff(original, ours, lineterm="", n=0)
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]


@pytest.mark.parametrize("example", SEEDS)
def test_each_guide_changes_only_where_it_must(example: str) -> None:
    """What changes: the data's source (the data cache), the TPU connection (the runner's strategy resolution, which
    falls back on a machine without one and never quietly on a TPU VM), and one callbacks= for metrics, checkpoints
    and exact resume (plus their imports); the model, its compile and its training arguments stay the guide's."""
    changed = changed_lines(example)
    added = [line[1:] for line in changed if line.startswith("+")]
    assert any("callbacks=keras_callbacks()" in line for line in added)
    assert any("from runner.datasets import mnist" in line for line in added)
    removed = [line[1:] for line in changed if line.startswith("-")]
    # What goes: the TPU connection, the data's source, the fit's last line; nothing of the model or its compile.
    connection = (
        r"TPU|tpu|strategy|resolver|Running on|except|try:|mnist|model\.fit\(|validation_data|get_model|^\s*#|^$"
    )
    for line in removed:
        assert re.search(connection, line), line
    assert len([line for line in added if not line.strip().startswith("#")]) <= 7


def data_cache(tmp_path: Path, train: int, test: int, name: str = "data") -> Path:
    """A data cache holding the first `train` and `test` examples of real MNIST, under the cache's own name, so that
    the guides' unchanged mnist.load_data() lines read a slice."""
    real = datasets.load_npz(datasets.fetch_mnist())
    cache = tmp_path / name
    cache.mkdir()
    np.savez_compressed(
        cache / datasets.MNIST_NPZ,
        x_train=real.x_train[:train],
        y_train=real.y_train[:train],
        x_test=real.x_test[:test],
        y_test=real.y_test[:test],
    )
    return cache


def copy_example(example: str, tmp_path: Path) -> Path:
    where = tmp_path / example
    shutil.copytree(EXAMPLES / example, where, ignore=shutil.ignore_patterns("runs", "__pycache__"))
    return where


def env_for(home: Path, cache: Path) -> dict[str, str]:
    env = child_env()
    # The precision as on a CPU without native bfloat16: these tests are about steps, not speed choices.
    return {
        **env,
        "RUNNER_HOME": str(home),
        "RUNNER_DATA_DIR": str(cache),
        "RUNNER_CPU_FLAGS": "-avx512_bf16,-amx_bf16",
        "RUNNER_TIMINGS": FAST_PROGRESS,  # where interrupt_mid_epoch reads the job's step
    }


def run_dir_of(home: Path) -> Path | None:
    records = list((home / "runs").glob("*.json")) if (home / "runs").is_dir() else []
    return Path(json.loads(records[0].read_text())["run_dir"]) if records else None


def interrupt_mid_epoch(proc: subprocess.Popen[str], home: Path, what: str) -> Path:
    """Ctrl-C the runner while its job is in the first half of an epoch after the first: the job is frozen there
    (tests/stops; its whole process group: a shell form's program is the shell's child), so that the SIGTERM lands
    mid-epoch however loaded the machine is. The run writes progress.json every 0.1 s (env_for's RUNNER_TIMINGS)."""
    run_dir = wait_for(lambda: run_dir_of(home), f"{what}'s run record", timeout=300)
    pid = wait_for(lambda: job_pid(run_dir), f"{what}'s job to start", timeout=300)

    def ended() -> str | None:
        return None if proc.poll() is None else proc.communicate()[0][-3000:]

    freeze_mid_epoch(run_dir / contract.PROGRESS, pid, ended, what, group=True, after_epoch=1)  # it leads its group
    proc.send_signal(signal.SIGINT)

    def forwarded() -> bool:
        try:
            return sigterm_pending(pid)
        except FileNotFoundError:  # a frozen job goes only by SIGKILL: say what the runner printed
            pytest.fail(f"{what}: the stopped job was killed:\n{proc.communicate()[0][-3000:]}")

    wait_for(forwarded, f"{what}: the runner to stop the job", timeout=60, poll_s=0.01)
    os.killpg(pid, signal.SIGCONT)
    return run_dir


def rows(path: Path) -> list[dict]:  # type: ignore[type-arg]
    return [json.loads(line) for line in path.read_text().splitlines()]


def stop_and_resume(example: str, tmp_path: Path, train: int) -> tuple[Path, Path, str]:
    """`runner submit job.yaml --local` in a copy of the example, Ctrl-C mid-epoch, then `runner resume`: the run
    directory, the runner home and what the resume printed."""
    home, cache = tmp_path / f"home-{example}", data_cache(tmp_path, train, 512, f"data-{example}")
    where, env = copy_example(example, tmp_path), env_for(home, cache)
    proc = subprocess.Popen(
        [*RUNNER, "submit", "job.yaml", "--local"],
        cwd=where,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    run_dir = interrupt_mid_epoch(proc, home, example)
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode == 130, out[-3000:]
    assert re.search(r"SIGTERM: saved ckpt-\d{6}-s\d{6}\.keras", out), out[-3000:]
    resumed = subprocess.run(
        [*RUNNER, "resume", run_dir.name], cwd=where, env=env, capture_output=True, text=True, timeout=600
    )
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    return run_dir, home, resumed.stdout


# Per guide: the training examples of its data-cache slice; the CNN's batch of 1024 needs more for several steps
# (4 an epoch: its first half is 2 steps of a few tenths of a second, progress.json rewritten every 0.1 s), and the
# Dense guide's 3 ms steps of 64 need 128 of them for an epoch that outlasts a loaded test's poll.
SLICES = {"gpu_tpu_guide": 8192, "colab_tpu": 2048, "gpu_vs_tpu": 4096}


@pytest.mark.slow
def test_each_guide_stopped_mid_epoch_and_resumed_trains_the_uninterrupted_steps(tmp_path: Path) -> None:
    # The three are independent runs: each is followed, stopped and resumed in a thread of its own, at once.
    with ThreadPoolExecutor(len(SEEDS)) as pool:
        done = {example: pool.submit(stop_and_resume, example, tmp_path, SLICES[example]) for example in SEEDS}
    for example, future in done.items():
        run_dir, home, out = future.result()
        assert f"resuming {run_dir.name} (cancelled) as its attempt 2" in out
        assert re.search(r"\[runner\] resumed from ckpt-\d{6}-s\d{6}\.keras: epoch \d+ step \d+ of \d+", out), out
        progress = json.loads((run_dir / contract.PROGRESS).read_text())
        metrics = rows(run_dir / contract.METRICS)
        # One line per epoch, the interrupted one too; the last one's global step is every epoch's steps: none lost
        # and none trained twice.
        assert [r["epoch"] for r in metrics] == list(range(1, progress["epochs"] + 1)), example
        assert metrics[-1]["global_step"] == progress["epochs"] * progress["steps_per_epoch"], example
        assert sum(1 for r in metrics if r.get("resumed_at_step")) == 1, example
        record = json.loads(next((home / "runs").glob("*.json")).read_text())
        assert record["state"] == "succeeded" and [a["state"] for a in record["attempts"]] == ["cancelled"]


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["tensorflow", "jax"])
def test_a_model_and_data_of_yours_in_the_built_in_trainer_resume_too(tmp_path: Path, framework: str) -> None:
    """examples/dense_model: the Dense guide's model (model:build) on (N, 784) floats (data:load), in the built-in
    trainer, on both engines: stopped mid-epoch, then `runner resume` of the cancelled built-in run."""
    home, cache = tmp_path / "home", data_cache(tmp_path, 16384, 512)  # 256 steps an epoch: see SLICES
    where = copy_example("dense_model", tmp_path)
    env = env_for(home, cache)
    sets = ["--set", f"training.framework={framework}", "--set", "training.epochs=3"]
    proc = subprocess.Popen(
        [*RUNNER, "submit", "job.yaml", "--local", *sets],
        cwd=where,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    run_dir = interrupt_mid_epoch(proc, home, "dense_model")
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode == 130, out[-3000:]
    assert "data:load: 16384 train, 512 test, examples (784,), 10 classes" in out
    resumed = subprocess.run(
        [*RUNNER, "resume", run_dir.name], cwd=where, env=env, capture_output=True, text=True, timeout=600
    )
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    summary = json.loads((run_dir / contract.SUMMARY).read_text())
    assert summary["model"] == "model:build" and summary["framework"] == framework
    assert summary["global_step"] == summary["optimizer_iterations"] == 3 * 256  # 16384 / 64 steps an epoch
    assert summary["resumed_from"]["step"] > 0 and summary["test_accuracy"] > 0.85
    assert [r["epoch"] for r in rows(run_dir / contract.METRICS)] == [1, 2, 3]
