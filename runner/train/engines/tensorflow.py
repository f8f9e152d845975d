"""The TensorFlow engine (training.framework: tensorflow): tf.distribute, a tf.data feed, tf_keras or Keras 3.

The strategy is the Colab guides' (runner.train.strategy: TPUStrategy, else MirroredStrategy, else the default;
MultiWorkerMirroredStrategy for several local workers); the feed is runner.train.data; the speed choices are
runner.train.perf's, calibrated on CPUs by the chief alone.
"""

from __future__ import annotations

import os
from contextlib import AbstractContextManager
from typing import Any

from runner import contract
from runner.spec import TrainingSpec
from runner.train import perf
from runner.train.checkpoints import TF_SHUFFLE
from runner.train.engines import Engine
from runner.train.restore import TrainerError


def select_keras(choice: str, checkpoint_keras: str | None) -> str:
    """Choose Keras 3 or tf_keras before TensorFlow is imported (TF reads TF_USE_LEGACY_KERAS once, at import).

    auto: the implementation that wrote the checkpoint being resumed (the two cannot read each other's files);
    else $TF_USE_LEGACY_KERAS if set; else tf_keras on TPU, where Keras 3 under TPUStrategy has an open bug
    (keras-team/keras#19448) and Google's own TPU CI uses tf_keras; else Keras 3. On CPU, tf_keras measured 0.94x
    the examples/s of Keras 3 with oneDNN on (14 interleaved epoch pairs, within noise): no reason to switch."""
    from runner.train.strategy import multi_worker, tpu_present

    if choice == "auto":
        if checkpoint_keras:
            impl = checkpoint_keras
        elif contract.LEGACY_KERAS in os.environ:
            impl = "tf_keras" if contract.legacy_keras() else "keras3"
        else:
            impl = "tf_keras" if tpu_present() or multi_worker() else "keras3"
    else:
        impl = choice
    if impl == "keras3" and multi_worker():
        raise TrainerError(
            "Keras 3 cannot train under MultiWorkerMirroredStrategy (keras 3.15: fit fails converting the "
            "distributed batches, PerReplica values); set training.keras to tf_keras or auto"
        )
    if checkpoint_keras and impl != checkpoint_keras:
        raise TrainerError(
            f"the checkpoint to resume from was written by {checkpoint_keras}, which {impl} cannot "
            f"read; set training.keras to {checkpoint_keras} or auto"
        )
    os.environ[contract.LEGACY_KERAS] = "1" if impl == "tf_keras" else "0"
    os.environ["KERAS_BACKEND"] = "tensorflow"  # Keras 3 under tf.keras: not JAX, whatever the environment says
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # TensorFlow's C++ INFO lines drown the job's own output
    return impl


def keras_version() -> str:
    """The Keras that tf.keras is in this process."""
    if contract.legacy_keras():
        import tf_keras

        return f"tf_keras {tf_keras.__version__}"
    import keras as keras3

    return f"keras {keras3.__version__}"


class TensorFlowEngine(Engine):
    framework = "tensorflow"
    shuffle = TF_SHUFFLE

    def __init__(self) -> None:
        self.tf: Any = None
        self.env: dict[str, str] = {}
        self.threads: dict[str, int] = {}

    def start(self, cfg: TrainingSpec, resume_keras: str | None) -> Any:
        self.keras_impl = select_keras(cfg.keras, resume_keras)
        self.env = perf.process_environment()
        tf = self.tf = perf.import_tensorflow()
        self.threads = perf.configure_threads(tf)
        return tf.keras

    def resolve(self, ctx: contract.JobContext) -> Any:
        from runner.train.strategy import resolve_strategy

        return resolve_strategy(ctx.strategy_hint, ctx.tpu_name)

    def chief(self, resolved: Any) -> bool:
        from runner.train.strategy import is_chief

        return is_chief(resolved)

    def plan(
        self,
        resolved: Any,
        steps: int,
        cfg: TrainingSpec,
        *,
        model: str | None,
        jit_compile: bool | None,
        inputs: Any,
        defer: bool = False,
    ) -> Any:
        return perf.plan_for(
            resolved.kind,
            steps,
            tf=self.tf,
            requested_precision=cfg.precision,
            requested_steps=cfg.steps_per_execution,
            requested_jit=jit_compile,
            env=self.env,
            threads=self.threads,
            model=model,
            batch_size=cfg.batch_size,
            input_shape=inputs.example_shape,
            classes=inputs.classes,
            defer=defer,
        )

    def feeds(self, inputs: Any, cfg: TrainingSpec, resolved: Any) -> tuple[Any, Any]:
        from runner.train.data import DatasetFeed, TrainData, eval_dataset

        if inputs.datasets:
            return DatasetFeed(inputs.train_ds), inputs.test_ds
        shape = {"scale": inputs.scale, "expand": inputs.expand}
        train = TrainData(inputs.x_train, inputs.y_train, cfg.batch_size, cfg.seed, **shape)
        return train, eval_dataset(inputs.x_test, inputs.y_test, cfg.batch_size, **shape)

    def scope(self, resolved: Any) -> AbstractContextManager[Any]:
        return resolved.strategy.scope()

    def after_build(self, model: Any, plan: Any) -> None:
        if plan.dropout == "xla":  # on the model built: the choice is this run's, not a checkpoint's
            from runner.train.fused_dropout import fuse_dropout

            fuse_dropout(model, self.tf)

    def versions(self) -> dict[str, str]:
        return {"tensorflow": self.tf.__version__, "keras": keras_version()}
