"""The built-in trainer's engines: what differs between TensorFlow and Keras 3 on JAX, behind one interface.

The trainer's core (runner.train.trainer) does everything else once, for both: the data and its checks, the model
(built-in or yours), the compile, the restore from the newest checkpoint, the contract's callbacks, the fit loop
and the summary. An engine answers, in this order:

    start(cfg, resume_keras)     choose Keras and import the framework (what a checkpoint to resume needs first)
    resolve(ctx)                 the devices: a tf.distribute strategy, or a keras.distribution over JAX's devices
    chief(resolved)              whether this process writes the run directory
    plan(...)                    the speed choices for this device (perf.py, jaxperf.py)
    feeds(inputs, ...)           the training and test input, an epoch at a time
    scope(resolved)              where the model is built
    before_build(keras, seed)    the random state the model is built with
    after_build(model, plan)     what the plan changes on a built model (the fused dropout kernel)

`engine_for(framework)` gives the one training.framework names. Nothing here imports a framework.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from contextlib import AbstractContextManager
from typing import Any

from runner import contract
from runner.spec import TrainingSpec


class Engine(ABC):
    framework: str  # training.framework, and the manifest's "framework"
    shuffle: str  # how its feed draws an epoch's order (checkpoints.DataOrder.shuffle)
    keras_impl: str = "keras3"  # set by start(): keras3 or tf_keras

    @abstractmethod
    def start(self, cfg: TrainingSpec, resume_keras: str | None) -> Any:
        """Choose the Keras to train with (`resume_keras`: the one that wrote the checkpoint to resume, which the
        other cannot read) and import the framework. Returns that Keras."""

    @abstractmethod
    def resolve(self, ctx: contract.JobContext) -> Any:
        """The devices (a ResolvedStrategy or ResolvedDistribution). Raises StrategyError when the ones asked for
        are not there."""

    @abstractmethod
    def chief(self, resolved: Any) -> bool:
        """Whether this process writes the run directory (all do the same work)."""

    @abstractmethod
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
        """The speed choices for the device, for `model` at the run's batch on examples like `inputs`' (model None:
        this process does not measure). `defer`: a choice that needs timing is left for later (perf.plan_for)."""

    @abstractmethod
    def feeds(self, inputs: Any, cfg: TrainingSpec, resolved: Any) -> tuple[Any, Any]:
        """(training data with .epoch(index, skip), test data) of the run's arrays or datasets."""

    def scope(self, resolved: Any) -> AbstractContextManager[Any]:
        import contextlib

        return contextlib.nullcontext()

    def before_build(self, keras: Any, seed: int) -> None:
        """Seed Keras' random state (weights, dropout) for the model about to be built."""
        keras.utils.set_random_seed(seed)

    def after_build(self, model: Any, plan: Any) -> None:  # noqa: B027  (most engines change nothing)
        """What the plan changes on a model once it is built."""

    @abstractmethod
    def versions(self) -> dict[str, str]:
        """summary.json's "versions": the framework's (under its training.framework name) and Keras'."""

    def runtime(self) -> str:
        """The framework and Keras, for the trainer's strategy line."""
        names = {"tensorflow": "TensorFlow", "jax": "JAX"}
        return ", ".join(f"{names.get(k, k)} {v}" if k in names else v for k, v in self.versions().items())


def engine_for(framework: str) -> Engine:
    if framework == "jax":
        from runner.train.engines.jax import JaxEngine

        return JaxEngine()
    from runner.train.engines.tensorflow import TensorFlowEngine

    return TensorFlowEngine()
