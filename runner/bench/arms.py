"""The two trainers the bench compares, each running one epoch when asked, so the harness can interleave them.

    baseline   the notebook's loop: float32 numpy arrays, `model.fit(x, y, batch_size=B)`, Keras defaults, in a
               TensorFlow process with TensorFlow's defaults (the variables the trainer sets are removed first)
    ours       runner.train.trainer itself: prepare() (device choices of perf.py, the tf.data pipeline, the compiled
               model), the contract's callbacks (metrics, checkpoints, TensorBoard), validation after each epoch

Both build runner.train.models.mnist_cnn with the same optimizer, learning rate, loss and seed, on the engine the
spec names: TensorFlow (tf.keras), or Keras 3 on JAX (`framework` "jax": the plain fit on Keras 3's JAX backend, ours
the trainer's JAX engine), where no TensorFlow is imported, so that arm runs where only numpy, jax and keras are
installed. The engine is imported when an arm is made, after its process's environment is set: importing this
module stays cheap.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NamedTuple

# What the trainer sets before TensorFlow's import; the baseline process runs without them (TensorFlow's defaults).
TRAINER_ENV = ("TF_ENABLE_ONEDNN_OPTS", "TF_USE_LEGACY_KERAS")


@dataclass(frozen=True)
class ArmSpec:
    trainer: str  # "ours" or "baseline"
    batch_size: int
    epochs: int
    examples: int | None = None  # first N training examples; None: all
    test_examples: int | None = None
    learning_rate: float = 3e-3
    seed: int = 0
    precision: str = "auto"  # ours only: choices.device_precision override
    steps_per_execution: int | None = None  # ours only
    jit_compile: bool | None = None  # ours only: None is perf.jit_compile's choice
    data: str | None = None  # an MNIST .npz; None: the trainer's search order
    framework: str = "tensorflow"  # or "jax": Keras 3 on JAX, for both trainers

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class EpochTime(NamedTuple):
    epoch_s: float  # the whole epoch, validation included
    train_s: float  # the training part


def _timer(keras: Any) -> Any:
    class EpochTimer(keras.callbacks.Callback):
        """Epoch begin -> first validation batch (training time), and -> epoch end (epoch time)."""

        def __init__(self) -> None:
            super().__init__()
            self.times: list[EpochTime] = []
            self._t0 = self._train_end = 0.0

        def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
            self._t0, self._train_end = time.perf_counter(), 0.0

        def on_test_begin(self, logs: dict[str, Any] | None = None) -> None:
            if not self._train_end:
                self._train_end = time.perf_counter()

        def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
            end = time.perf_counter()
            self.times.append(EpochTime(end - self._t0, (self._train_end or end) - self._t0))

    return EpochTimer()


class BaselineArm:
    """The plain fit. `strategy` is the one our arm resolved, when both share a process (a TPU); else the default."""

    def __init__(self, spec: ArmSpec, strategy: Any = None) -> None:
        import numpy as np

        from runner.bench.effective import effective_settings
        from runner.datasets import find_arrays
        from runner.train.models import build_model, make_optimizer

        tf, keras, versions = _engine(spec.framework)
        data, _ = find_arrays(spec.data, keras)
        train, test = slice(spec.examples), slice(spec.test_examples)
        # The notebook's preprocessing: float32 in [0, 1], a channel axis, integer labels.
        self.x = (data.x_train[train].astype(np.float32) / 255.0)[..., np.newaxis]
        self.y = data.y_train[train].astype(np.int32)
        self.x_test = (data.x_test[test].astype(np.float32) / 255.0)[..., np.newaxis]
        self.y_test = data.y_test[test].astype(np.int32)
        self.spec, self.epoch_index = spec, 0
        keras.utils.set_random_seed(spec.seed)
        keras.mixed_precision.set_global_policy("float32")
        with strategy.scope() if strategy is not None else contextlib.nullcontext():
            self.model = build_model("mnist_cnn", keras)
            self.model.compile(
                optimizer=make_optimizer("adam", spec.learning_rate, keras),
                loss="sparse_categorical_crossentropy",
                metrics=["accuracy"],
            )
        self.timer = _timer(keras)
        self.info = {
            "trainer": "baseline",
            "examples_per_epoch": len(self.x),
            "test_examples": len(self.x_test),
            **versions,
            # Keras' and TensorFlow's defaults, as they resolve here (e.g. oneDNN is on by default on CPUs with
            # AVX512-VNNI/BF16 or AMX, off on AVX2-only ones): read back, not assumed.
            "settings": {"input": "numpy float32 arrays", "effective": effective_settings(tf, self.model)},
        }

    def epoch(self) -> EpochTime:
        e = self.epoch_index
        self.model.fit(
            self.x, self.y, batch_size=self.spec.batch_size, epochs=e + 1, initial_epoch=e, verbose=0,
            callbacks=[self.timer],
        )  # fmt: skip
        self.epoch_index += 1
        return self.timer.times[-1]

    def finish(self) -> float:
        result = self.model.evaluate(
            self.x_test, self.y_test, batch_size=self.spec.batch_size, verbose=0, return_dict=True
        )
        return round(float(result["accuracy"]), 6)


class TrainerArm:
    """runner.train.trainer, driven one epoch per fit() call; its run directory is a temporary one."""

    def __init__(self, spec: ArmSpec) -> None:
        from runner import contract
        from runner.bench.effective import effective_settings
        from runner.spec import TrainingSpec
        from runner.train import trainer

        self.spec, self.epoch_index = spec, 0
        self.tmp = Path(tempfile.mkdtemp(prefix="runner-bench-"))
        cfg = TrainingSpec(
            model="mnist_cnn",
            epochs=spec.epochs,
            batch_size=spec.batch_size,
            learning_rate=spec.learning_rate,
            optimizer="adam",
            data=spec.data,
            max_train_examples=spec.examples,
            max_test_examples=spec.test_examples,
            seed=spec.seed,
            steps_per_execution=spec.steps_per_execution,
            precision=spec.precision,
            framework=spec.framework,
        )
        env = {k: v for k, v in os.environ.items() if k in (contract.STRATEGY, contract.TPU_NAME)}
        ctx = contract.JobContext.from_env({**env, contract.OUTPUT_DIR: str(self.tmp), contract.RUN_ID: "bench"})
        self.run = trainer.prepare(cfg, ctx, jit_compile=spec.jit_compile)
        self.callbacks, _ = trainer.make_callbacks(self.run)
        self.timer = _timer(self.run.keras)
        self._trainer = trainer
        tf, _, versions = _engine(spec.framework)
        resolved = self.run.resolved
        self.info = {
            "trainer": "ours",
            "examples_per_epoch": self.run.steps * spec.batch_size,
            "test_examples": self.run.test_examples,
            **versions,
            "settings": {
                "input": "numpy through keras.utils.PyDataset (runner.train.npdata)"
                if tf is None
                else "tf.data (runner.train.data)",
                **self.run.perf.as_dict(),
                "effective": effective_settings(tf, self.run.model),
            },
            "device": describe_device(tf, resolved.kind, resolved.devices, self.run.perf.cpu),
        }

    @property
    def strategy(self) -> Any:
        """The tf.distribute strategy the baseline shares in one process; None on JAX, whose distribution is
        global (keras.distribution.set_distribution) and so the baseline's too."""
        return getattr(self.run.resolved, "strategy", None)

    def epoch(self) -> EpochTime:
        e = self.epoch_index
        self._trainer.fit(self.run, [*self.callbacks, self.timer], until_epoch=e + 1, from_epoch=e)
        self.epoch_index += 1
        return self.timer.times[-1]

    def finish(self) -> float:
        result = self.run.model.evaluate(self.run.test_ds, verbose=0, return_dict=True)
        shutil.rmtree(self.tmp, ignore_errors=True)
        return round(float(result["accuracy"]), 6)


def describe_device(tf: Any, kind: str, devices: list[str], cpu: str) -> dict[str, Any]:
    from runner.train.cpu import usable_cpus

    cpus = usable_cpus()
    out: dict[str, Any] = {"kind": kind, "devices": devices, "cpu": cpu, "cpus": cpus}
    if kind == "gpu" and tf is None:
        import jax

        out["name"] = getattr(jax.devices("gpu")[0], "device_kind", "GPU")
    elif kind == "gpu":
        gpus = tf.config.list_physical_devices("GPU")
        out["name"] = tf.config.experimental.get_device_details(gpus[0]).get("device_name", "GPU") if gpus else "GPU"
    elif kind == "tpu":
        out["name"] = os.environ.get("TPU_ACCELERATOR_TYPE") or f"TPU, {len(devices)} cores"
    else:
        out["name"] = f"{cpu} ({cpus} CPUs)"
    out["label"] = f"{kind}: {out['name']}"
    return out


def _engine(framework: str) -> tuple[Any, Any, dict[str, str]]:
    """(tensorflow or None, the Keras to build with, the versions to report) for the arm's engine."""
    if framework == "jax":
        import jax

        from runner.train.distribution import keras_on_jax

        keras = keras_on_jax(force=True)
        return None, keras, {"engine": f"JAX {jax.__version__}", "keras": f"keras {keras.__version__}"}
    os.environ["KERAS_BACKEND"] = "tensorflow"  # tf.keras under Keras 3 follows it: never JAX in this arm
    from runner.train.engines.tensorflow import keras_version
    from runner.train.perf import import_tensorflow

    tf = import_tensorflow()

    return tf, tf.keras, {"engine": f"TensorFlow {tf.__version__}", "keras": keras_version()}


def make_arm(spec: ArmSpec, strategy: Any = None) -> BaselineArm | TrainerArm:
    return TrainerArm(spec) if spec.trainer == "ours" else BaselineArm(spec, strategy)


def serve(conn: Any, spec: dict[str, Any], log_path: str) -> None:
    """Worker process: build the arm, then answer "epoch" and "finish" over the pipe. Its output goes to log_path,
    so the bench's own output stays readable."""
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    arm_spec = ArmSpec(**spec)
    if arm_spec.trainer == "baseline":
        for key in TRAINER_ENV:
            os.environ.pop(key, None)
    if arm_spec.framework == "jax":  # as the trainer's own process runs (Keras' optional TensorFlow probes find none)
        from runner.train.engines.jax import keep_tensorflow_out

        keep_tensorflow_out()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    # Two worker processes share a GPU (one runs at a time); TensorFlow would otherwise give all of its memory to
    # whichever starts first.
    os.environ.setdefault("TF_FORCE_GPU_ALLOW_GROWTH", "true")
    try:
        arm = make_arm(arm_spec)
        conn.send(("ready", arm.info))
        while True:
            message = conn.recv()
            if message == "epoch":
                conn.send(("epoch", tuple(arm.epoch())))
            elif message == "finish":
                conn.send(("done", arm.finish()))
                return
    except BaseException:
        text = traceback.format_exc()
        print(text, file=sys.stderr, flush=True)
        conn.send(("error", text))
