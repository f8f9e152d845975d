"""The built-in trainer on a slice of real MNIST, started the way the container starts it (python -m runner.worker)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from runner import contract
from runner.spec import TrainingSpec
from runner.train.checkpoints import file_crc32c, read_manifest
from runner.train.cpu import CPU_FLAGS_ENV
from tests.environ import child_env
from tests.stops import PROGRESS_S, freeze_mid_epoch, job_pid, sigterm_pending
from tests.train.test_checkpoints import weights_offset
from tests.waiting import wait_for

pytestmark = pytest.mark.slow


NO_NATIVE_BF16 = "-avx512_bf16,-amx_bf16,-bf16"


def worker_env(run_dir: Path, mnist_npz: Path, **training: object) -> dict[str, str]:
    cfg = TrainingSpec.model_validate(
        {"batch_size": 128, "max_train_examples": 512, "max_test_examples": 256, **training}
    )
    env = child_env("TF_USE_LEGACY_KERAS")  # the start-up cache is the suite's, or the test's own where it set one
    env.update(
        {
            contract.RUN_DIR: str(run_dir),
            contract.RUN_ID: "t",
            contract.TRAINING: cfg.model_dump_json(),
            contract.DATA_DIR: str(mnist_npz.parent),
            # The same precision on every CPU: as one without native bfloat16, so no start-up calibration picks it
            # from this machine's timings (tests/bench and the perf tests cover both paths). The CNN's dropout
            # kernel is still timed; the first test runs both kernels.
            CPU_FLAGS_ENV: NO_NATIVE_BF16,
            contract.PROGRESS_S: PROGRESS_S,  # where a test that freezes the trainer reads its step (tests/stops)
        }
    )
    return env


def train(run_dir: Path, mnist_npz: Path, **training: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "runner.worker"],
        env=worker_env(run_dir, mnist_npz, **training),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_trains_writes_the_contract_and_resumes(
    tmp_path: Path, mnist_npz: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = tmp_path / "run"
    cache = tmp_path / "startup"  # a start-up cache of its own: empty at first, and its calibration can be edited
    monkeypatch.setenv(contract.CACHE_DIR, str(cache))
    first = train(run, mnist_npz, epochs=2)
    assert first.returncode == 0, first.stdout[-3000:]
    assert "strategy: DefaultStrategy on CPU, 1 replica" in first.stdout
    # Nothing cached: the first epoch trained at once in the plain variant, then the CNN's dropout kernel was timed
    # on this CPU (Keras' own against one XLA kernel) and the faster one kept for epoch 2 and cached.
    assert "perf: float32 (not calibrated yet: 2 variants to time)" in first.stdout
    assert first.stdout.index("Epoch 1/2 4/4") < first.stdout.index("perf from epoch 2: float32 (calibrated: float32 ")
    perf_one = json.loads((run / contract.SUMMARY).read_text())["perf"]
    assert (perf_one["precision_source"], perf_one["calibrated_after_epoch"]) == ("calibrated", 1)
    assert perf_one["calibration"]["candidates"] == ["float32", "float32+xla_dropout"]
    assert perf_one["calibration"]["variant"] == {"keras": "float32", "xla": "float32+xla_dropout"}[perf_one["dropout"]]
    assert [m["epoch"] for m in rows(run / contract.METRICS)] == [1, 2]
    for m in rows(run / contract.METRICS):
        assert m["examples_per_s"] > 0 and 0 <= m["val_accuracy"] <= 1
    (newest, oldest) = read_manifest(run / contract.CHECKPOINTS)
    assert (oldest.file, oldest.epochs_done, oldest.step, oldest.global_step) == ("ckpt-000001.keras", 1, 0, 4)
    assert (newest.file, newest.epochs_done, newest.step, newest.global_step) == ("ckpt-000002.keras", 2, 0, 8)
    progress = json.loads((run / contract.PROGRESS).read_text())
    assert (progress["epoch"], progress["step"], progress["steps_per_epoch"], progress["global_step"]) == (2, 4, 4, 8)
    assert list((run / contract.TENSORBOARD).rglob("events.out.tfevents.*"))
    summary = json.loads((run / contract.SUMMARY).read_text())
    assert summary["strategy"]["replicas"] == 1 and summary["train_examples"] == 512
    # Whichever variant epoch 2 trained in, the optimizer went on where epoch 1 left it (a switch carries its state).
    assert (summary["global_step"], summary["optimizer_iterations"]) == (8, 8)

    # Same run directory, more epochs: continues from the checkpoint (epoch and optimizer state), under the other
    # dropout kernel (the cached choice flipped): a checkpoint is plain Keras whichever kernel wrote it.
    (entry_file,) = (cache / "calibration").glob("*.json")
    stored = json.loads(entry_file.read_text())
    other, kernel = ("float32", "keras") if perf_one["dropout"] == "xla" else ("float32+xla_dropout", "xla")
    entry_file.write_text(json.dumps({**stored, "value": {**stored["value"], "variant": other}}))
    second = train(run, mnist_npz, epochs=3)
    assert second.returncode == 0, second.stdout[-3000:]
    perf_two = json.loads((run / contract.SUMMARY).read_text())["perf"]
    assert (perf_two["precision_source"], perf_two["dropout"]) == ("cached", kernel)
    assert perf_two["calibrated_after_epoch"] is None
    assert "perf: float32 (cached from " in second.stdout  # the log says the choice came from the cache
    assert "perf from epoch" not in second.stdout
    assert "resumed from ckpt-000002.keras: epoch 2 done, optimizer step 8" in second.stdout
    # Once per attempt, where it went on from and the steps trained again (the first attempt reached step 8).
    said = "resumed from step 8 (Keras, checkpoints/ckpt-000002.keras); 0 steps redone"
    assert f"[trainer] {said}" in second.stdout and "resumed from step" not in first.stdout
    events = [json.loads(line) for line in (run / contract.events_key("trainer-0")).read_text().splitlines()]
    assert [e["text"] for e in events if e["event"] == "resumed_from_checkpoint"] == [said]
    # What took time beside the steps, for the run's goodput: each attempt's data, each save, the second's restore.
    took = [(e["event"], e.get("step") or e.get("stage")) for e in events if isinstance(e.get("seconds"), float)]
    assert took == [
        ("data_loaded", None),
        ("checkpoint_saved", 4),
        ("checkpoint_saved", 8),
        ("checkpoint_restored", "verify"),
        ("data_loaded", None),
        ("checkpoint_restored", "load"),
        ("checkpoint_saved", 12),
    ]
    assert "Epoch 1/3" not in second.stdout
    assert [r["epoch"] for r in rows(run / contract.METRICS)] == [1, 2, 3]
    summary = json.loads((run / contract.SUMMARY).read_text())
    assert summary["resumed_from_epoch"] == 2
    assert summary["resumed_from"] == {"checkpoint": "ckpt-000002.keras", "epoch": 2, "step": 0}
    assert (summary["resumed"]["step"], summary["resumed"]["redone"], summary["resumed"]["text"]) == (8, 0, said)
    assert (summary["global_step"], summary["steps_this_attempt"], summary["optimizer_iterations"]) == (12, 4, 12)
    assert len(summary["epoch_times_s"]) == 3
    # Real data, real learning: this slice reached 0.66, 0.76 and 0.70 with seeds 0-2 (the CNN, 12 steps of 128).
    assert summary["test_accuracy"] >= 0.6
    assert sorted(p.name for p in (run / contract.CHECKPOINTS).glob("*.keras")) == [
        "ckpt-000002.keras",
        "ckpt-000003.keras",
    ]  # the two newest are kept


def test_tf_keras_checkpoint_cannot_be_resumed_by_keras3(tmp_path: Path, mnist_npz: Path) -> None:
    run = tmp_path / "run"
    first = train(run, mnist_npz, model="mnist_mlp", epochs=1, keras="tf_keras")
    assert first.returncode == 0, first.stdout[-3000:]
    assert "tf_keras 2." in first.stdout
    assert json.loads((run / "checkpoints" / "latest.json").read_text())["keras"] == "tf_keras"
    # Neither Keras 3 on TensorFlow nor the JAX engine (Keras 3 only) can read it: each is refused with what to do,
    # not a traceback; auto follows the checkpoint instead of failing. The three starts are independent (the
    # refusals each on a copy of the run directory), so they run at once: each imports an engine, the expensive part.
    shutil.copytree(run, tmp_path / "on-keras3")
    shutil.copytree(run, tmp_path / "on-jax")
    starts = {
        name: subprocess.Popen(
            [sys.executable, "-m", "runner.worker"],
            env=worker_env(directory, mnist_npz, model="mnist_mlp", epochs=2, **chosen),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for name, directory, chosen in (
            ("keras3", tmp_path / "on-keras3", {"keras": "keras3"}),
            ("jax", tmp_path / "on-jax", {"framework": "jax"}),
            ("auto", run, {"keras": "auto"}),
        )
    }
    clash, refused, resumed = (starts[name].communicate(timeout=300)[0] for name in ("keras3", "jax", "auto"))
    assert starts["keras3"].returncode == 2, clash[-3000:]
    assert "written by tf_keras, which keras3 cannot read" in clash
    assert "Traceback" not in clash
    assert starts["jax"].returncode == 2, refused[-3000:]
    assert "was written by tf_keras (Keras 2, TensorFlow only)" in refused
    assert "set training.framework: tensorflow to continue it" in refused
    assert "Traceback" not in refused
    assert starts["auto"].returncode == 0, resumed[-3000:]
    assert "resumed from ckpt-000001.keras" in resumed


def test_data_the_model_cannot_take_is_refused_before_training(tmp_path: Path, mnist_npz: Path) -> None:
    """The Dense guide's (N, 784) input given to the built-in CNN, and labels of a model of yours that has too few
    outputs: each is one message naming the array, its shape and the fix, before a step is trained."""
    from runner import datasets

    real = datasets.load_npz(mnist_npz)
    flat = tmp_path / "flat.npz"
    np.savez(flat, x_train=real.x_train[:256].reshape(-1, 784), y_train=real.y_train[:256],
             x_test=real.x_test[:64].reshape(-1, 784), y_test=real.y_test[:64])  # fmt: skip
    (tmp_path / "narrow.py").write_text(
        "def build(input_shape, keras):\n"
        "    return keras.Sequential([keras.Input(input_shape), keras.layers.Flatten(), keras.layers.Dense(5)])\n"
    )
    cnn = subprocess.Popen(
        [sys.executable, "-m", "runner.worker"], env=worker_env(tmp_path / "cnn", mnist_npz, data=str(flat)),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    narrow = subprocess.Popen(
        [sys.executable, "-m", "runner.worker"], env=worker_env(tmp_path / "narrow", mnist_npz, model="narrow:build"),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
    )  # fmt: skip
    out = cnn.communicate(timeout=300)[0]
    assert cnn.returncode == 2, out[-3000:]
    assert "x_train has shape (256, 784), but mnist_cnn takes images" in out
    assert "Epoch" not in out and "Traceback" not in out
    out = narrow.communicate(timeout=300)[0]
    assert narrow.returncode == 2, out[-3000:]
    assert "the labels name 10 classes, but the model's output has 5 units" in out
    assert "Epoch" not in out and "Traceback" not in out


def test_bad_data_file_is_a_clear_error(tmp_path: Path, mnist_npz: Path) -> None:
    bogus = tmp_path / "bogus.npz"
    bogus.write_bytes(b"not a zip")
    result = train(tmp_path / "run", mnist_npz, data=str(bogus))
    assert result.returncode == 2
    assert "not a .npz with x_train, y_train, x_test, y_test" in result.stdout
    assert json.loads((tmp_path / "run" / "exit" / "worker-0.json").read_text())["state"] == "failed"


# --- Stops and resumes ------------------------------------------------------------------------------------------

# Many short steps, so an epoch is still running well after progress.json shows it started.
EXACT = {"model": "mnist_mlp", "batch_size": 8, "max_train_examples": 2048, "max_test_examples": 1024, "epochs": 3}
STEPS = 2048 // 8
SAVED_ON_SIGTERM = re.compile(
    r"^\[trainer\] SIGTERM: saved (ckpt-(\d{6})-s(\d{6})\.keras) at epoch (\d+) step (\d+) of (\d+) "
    r"\(global step (\d+)\)$",
    re.MULTILINE,
)


ENGINES = {"keras3": {"keras": "keras3"}, "tf_keras": {"keras": "tf_keras"}, "jax": {"framework": "jax"}}


@pytest.mark.parametrize("engine", list(ENGINES))
def test_sigterm_mid_epoch_saves_exactly_and_the_resume_trains_the_same_steps(
    tmp_path: Path, mnist_npz: Path, engine: str
) -> None:
    chosen = ENGINES[engine]
    # The uninterrupted run, for comparison, trains meanwhile.
    plain_dir = tmp_path / "plain"
    plain = subprocess.Popen(
        [sys.executable, "-m", "runner.worker"],
        env=worker_env(plain_dir, mnist_npz, **chosen, **EXACT),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    run = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "runner.worker"],
        env=worker_env(run, mnist_npz, **chosen, **EXACT),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    pid = wait_for(lambda: job_pid(run), "the trainer to start")
    # Frozen mid-epoch (tests/stops), so the SIGTERM lands there however loaded this machine is; the supervisor
    # forwards it as it would a preemption's, and the trainer acts on it at its next step end.
    seen = freeze_mid_epoch(
        run / contract.PROGRESS,
        pid,
        lambda: None if proc.poll() is None else proc.communicate()[0][-3000:],
        "the trainer",
        after_epoch=1,
    )
    proc.send_signal(signal.SIGTERM)
    wait_for(lambda: sigterm_pending(pid), "the supervisor to forward SIGTERM", timeout=30)
    os.kill(pid, signal.SIGCONT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 143, out[-3000:]
    match = SAVED_ON_SIGTERM.search(out)
    assert match, out[-3000:]
    name, epochs_done, step, epoch, step_shown, steps, global_step = match.groups()
    epochs_done, step, epoch, global_step = int(epochs_done), int(step), int(epoch), int(global_step)
    assert (epoch, int(step_shown), int(steps)) == (seen["epoch"], step, STEPS)
    assert epochs_done == epoch - 1 and seen["step"] <= step < STEPS
    assert global_step == epochs_done * STEPS + step
    # No end-of-epoch work for the cut epoch: no metrics row, and the newest checkpoint is the exact one.
    assert [r["epoch"] for r in rows(run / contract.METRICS)] == list(range(1, epoch))
    newest = read_manifest(run / contract.CHECKPOINTS)[0]
    assert (newest.file, newest.position, newest.global_step) == (name, (epochs_done, step), global_step)
    progress = json.loads((run / contract.PROGRESS).read_text())
    assert (progress["epoch"], progress["step"], progress["global_step"]) == (epoch, step, global_step)
    record = json.loads((run / contract.exit_key(0)).read_text())
    assert (record["state"], record["exit_code"]) == ("cancelled", 143)

    resumed = train(run, mnist_npz, **chosen, **EXACT)
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    assert f"[trainer] resumed from {name}: epoch {epoch} step {step} of {STEPS} (global step {global_step})" in (
        resumed.stdout
    )
    metrics = rows(run / contract.METRICS)
    assert [r["epoch"] for r in metrics] == [1, 2, 3]  # one line per real epoch
    assert [r.get("resumed_at_step") for r in metrics] == [step if r["epoch"] == epoch else None for r in metrics]
    summary = json.loads((run / contract.SUMMARY).read_text())
    # Together the two attempts trained exactly the uninterrupted run's optimizer steps: none lost, none twice.
    assert summary["global_step"] == 3 * STEPS
    assert summary["steps_this_attempt"] == 3 * STEPS - global_step
    assert summary["optimizer_iterations"] == 3 * STEPS  # the restored optimizer's own count agrees (no loss scaling)
    assert summary["resumed_from"] == {"checkpoint": name, "epoch": epochs_done, "step": step}

    assert plain.wait(timeout=300) == 0
    reference = json.loads((plain_dir / contract.SUMMARY).read_text())
    assert (reference["global_step"], reference["steps_this_attempt"]) == (3 * STEPS, 3 * STEPS)
    # Same seed, same per-epoch data order, weights and Adam moments restored exactly: the two runs differ at most
    # by floating-point reduction order in multi-threaded kernels (on the development machine they agreed to all
    # 6 printed digits). 0.005 is 5 of the 1024 test images, a third of the 0.018 spread between seeds 0-2 there;
    # the loss, a continuous measure, must agree within 1%. A resume that re-shuffled or lost steps moves both more.
    assert abs(summary["test_accuracy"] - reference["test_accuracy"]) <= 0.005
    assert abs(summary["test_loss"] - reference["test_loss"]) <= 0.01 * reference["test_loss"]


def corrupt_crc(path: Path) -> None:
    """Flip bytes inside the weights: the size stays, the crc32c and the member's zip CRC change."""
    offset = weights_offset(path)
    data = bytearray(path.read_bytes())
    data[offset : offset + 8] = bytes(b ^ 0xFF for b in data[offset : offset + 8])
    path.write_bytes(bytes(data))


def make_unloadable(directory: Path, name: str) -> None:
    """An intact archive (it verifies: the manifest is updated to match) that is not this model's: its weights
    file lacks a layer's kernel, as another model's would."""
    import io

    import h5py

    path = directory / name
    with zipfile.ZipFile(path) as archive:
        members = {m: archive.read(m) for m in archive.namelist()}
    buffer = io.BytesIO(members["model.weights.h5"])
    with h5py.File(buffer, "r+") as weights:
        kernels: list[str] = []
        weights.visititems(lambda key, obj: kernels.append(key) if isinstance(obj, h5py.Dataset) else None)
        del weights[kernels[0]]
    members["model.weights.h5"] = buffer.getvalue()
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        for member, data in members.items():
            archive.writestr(member, data)
    doc = json.loads((directory / "latest.json").read_text())
    for entry in doc["checkpoints"]:
        if entry["file"] == name:
            entry["size"], entry["crc32c"] = path.stat().st_size, file_crc32c(path)
    (directory / "latest.json").write_text(json.dumps(doc))


def test_resume_skips_checkpoints_that_do_not_verify_or_load(tmp_path: Path, mnist_npz: Path) -> None:
    base = tmp_path / "base"
    first = train(base, mnist_npz, model="mnist_mlp", epochs=3, checkpoint_keep=3)
    assert first.returncode == 0, first.stdout[-3000:]
    more = {"model": "mnist_mlp", "epochs": 4, "checkpoint_keep": 3}

    # Three copies of that run directory, each damaged its own way; their resumes are independent, so they run at
    # once (each trainer start imports TensorFlow: the expensive part).
    # 1. Newest torn, the next one intact but unloadable: the oldest is taken, loudly, and the run completes.
    torn = tmp_path / "torn"
    shutil.copytree(base, torn)
    ckpts = torn / contract.CHECKPOINTS
    listed = {c.file: c for c in read_manifest(ckpts)}
    corrupt_crc(ckpts / "ckpt-000003.keras")
    torn_crc = file_crc32c(ckpts / "ckpt-000003.keras")
    make_unloadable(ckpts, "ckpt-000002.keras")
    # 2. An unreadable manifest: the directory scan finds the newest by the positions in the names.
    scanned = tmp_path / "scanned"
    shutil.copytree(base, scanned)
    (scanned / "checkpoints" / "latest.json").write_text('{"checkpoints": [{"file": ')
    # 3. Nothing verifies: starting over is the only way on, and it is said.
    lost = tmp_path / "lost"
    shutil.copytree(base, lost)
    for path in (lost / "checkpoints").glob("ckpt-*.keras"):
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    torn_run, scanned_run, lost_run = (
        subprocess.Popen(
            [sys.executable, "-m", "runner.worker"],
            env=worker_env(run, mnist_npz, **more),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for run in (torn, scanned, lost)
    )

    out = torn_run.communicate(timeout=300)[0]
    assert torn_run.returncode == 0, out[-3000:]
    assert (
        f"[trainer] skipping ckpt-000003.keras: crc32c mismatch (manifest {listed['ckpt-000003.keras'].crc32c}, "
        f"file {torn_crc})"
    ) in out
    assert re.search(r"\[trainer\] skipping ckpt-000002\.keras: (failed to load|it holds)", out), out[-3000:]
    assert "[trainer] resumed from ckpt-000001.keras: epoch 1 done, optimizer step 4" in out
    assert "[trainer] resumed from step 4 (Keras, checkpoints/ckpt-000001.keras); 8 steps redone" in out
    assert "Traceback" not in out
    summary = json.loads((torn / contract.SUMMARY).read_text())
    assert (summary["global_step"], summary["steps_this_attempt"]) == (16, 12)
    assert [r["epoch"] for r in rows(torn / contract.METRICS)] == [1, 2, 3, 4]
    # The bad files were replaced by this timeline's own saves, and everything listed now verifies.
    for entry in read_manifest(ckpts):
        assert (entry.size, entry.crc32c) == ((ckpts / entry.file).stat().st_size, file_crc32c(ckpts / entry.file))

    out = scanned_run.communicate(timeout=300)[0]
    assert scanned_run.returncode == 0, out[-3000:]
    assert "[trainer] checkpoints/latest.json is unreadable: not JSON" in out
    assert "[trainer] resumed from ckpt-000003.keras: epoch 3 done, optimizer step 12" in out
    assert "[trainer] resumed from step 12 (Keras, checkpoints/ckpt-000003.keras); 0 steps redone" in out
    summary = json.loads((scanned / contract.SUMMARY).read_text())
    assert (summary["global_step"], summary["steps_this_attempt"]) == (16, 4)

    out = lost_run.communicate(timeout=300)[0]
    assert lost_run.returncode == 0, out[-3000:]
    assert out.count("[trainer] skipping ckpt-") == 3
    assert "[trainer] no checkpoint verifies (3 skipped): starting over from epoch 1" in out
    assert "[trainer] started over from step 0: no usable checkpoint; 12 steps redone" in out  # 3 epochs of 4 lost
    assert "Epoch 1/4 4/4" in out
    summary = json.loads((lost / contract.SUMMARY).read_text())
    assert (summary["global_step"], summary["steps_this_attempt"], summary["resumed_from"]) == (16, 16, None)


def prepare_here(monkeypatch: pytest.MonkeyPatch, mnist_npz: Path, out: Path, **training: object) -> Any:
    """trainer.prepare in this process (Keras 3), for tests that inject a clock or a signal."""
    # What prepare() sets for TensorFlow's import, undone after the test.
    monkeypatch.setenv("TF_USE_LEGACY_KERAS", "0")
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", os.environ.get("TF_ENABLE_ONEDNN_OPTS", "1"))
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", os.environ.get("TF_CPP_MIN_LOG_LEVEL", "1"))
    monkeypatch.setenv(contract.DATA_DIR, str(mnist_npz.parent))
    from runner.train import trainer

    cfg = TrainingSpec.model_validate(
        {"model": "mnist_mlp", "batch_size": 32, "max_train_examples": 512, "max_test_examples": 256, **training}
    )
    ctx = contract.JobContext.from_env({contract.OUTPUT_DIR: str(out), contract.RUN_ID: "t", contract.STRATEGY: "cpu"})
    return trainer.prepare(cfg, ctx)


# Keras 3's own numpy conversions warn under numpy 2; not this code's.
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_wall_clock_checkpoints_land_mid_epoch(
    tmp_path: Path, mnist_npz: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In this process, with the clock injected: each step "takes" 4 s, checkpoint_every is 10 s."""
    from runner.train import trainer

    out = tmp_path / "run"
    run = prepare_here(monkeypatch, mnist_npz, out, epochs=2, checkpoint_every="10s", checkpoint_keep=100)
    cfg = run.cfg
    now = [0.0]

    class SlowSteps(run.keras.callbacks.Callback):  # type: ignore[misc, name-defined]
        def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
            now[0] += 4.0

    callbacks, stop = trainer.make_callbacks(run, clock=lambda: now[0])
    try:
        trainer.fit(run, [SlowSteps(), *callbacks], cfg.epochs)
    finally:
        stop.uninstall()
    entries = read_manifest(out / contract.CHECKPOINTS)
    # 16 steps per epoch; a save once 10 s have passed since the last (every 3rd step), never on an epoch's last
    # step (its end decides, after validation: 4 s after the save at step 15, not yet due), and at the final epoch.
    assert sorted(e.position for e in entries) == [
        (0, 3), (0, 6), (0, 9), (0, 12), (0, 15), (1, 2), (1, 5), (1, 8), (1, 11), (1, 14), (2, 0),
    ]  # fmt: skip
    assert all(e.global_step == e.epochs_done * 16 + e.step for e in entries)
    assert sorted(p.name for p in (out / contract.CHECKPOINTS).glob("*.keras")) == sorted(e.file for e in entries)
    assert [r["epoch"] for r in rows(out / contract.METRICS)] == [1, 2]


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_a_stop_during_validation_lets_that_epoch_end_normally(
    tmp_path: Path, mnist_npz: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from runner.train import trainer

    out = tmp_path / "run"
    # checkpoint_every 2: epoch 1's checkpoint is written only because of the stop.
    run = prepare_here(monkeypatch, mnist_npz, out, epochs=3, checkpoint_every=2)

    class SigtermInValidation(run.keras.callbacks.Callback):  # type: ignore[misc, name-defined]
        def on_test_begin(self, logs: dict | None = None) -> None:
            os.kill(os.getpid(), signal.SIGTERM)  # handled by the trainer's StopSignal, installed below

    callbacks, stop = trainer.make_callbacks(run)
    try:
        trainer.fit(run, [SigtermInValidation(), *callbacks], run.cfg.epochs)
        trainer.fit(run, callbacks, run.cfg.epochs)  # called again: the stop holds, and nothing is saved twice
    finally:
        stop.uninstall()
    assert stop.signum == signal.SIGTERM
    printed = capsys.readouterr().out
    assert "[trainer] SIGTERM: saved ckpt-000001.keras at epoch 1 step 16 of 16 (global step 16)" in printed
    assert "[trainer] SIGTERM: ckpt-000001.keras already holds epoch 1 step 16 of 16 (global step 16)" in printed
    assert "Epoch 2/3" not in printed
    (row,) = rows(out / contract.METRICS)
    assert row["epoch"] == 1 and "val_accuracy" in row and "resumed_at_step" not in row
    assert [(c.file, c.global_step) for c in read_manifest(out / contract.CHECKPOINTS)] == [("ckpt-000001.keras", 16)]
