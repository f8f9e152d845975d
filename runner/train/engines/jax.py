"""The JAX engine (training.framework: jax): Keras 3 on JAX, keras.distribution, a numpy feed, no TensorFlow.

* no TensorFlow in the process: `keep_tensorflow_out()` makes `import tensorflow` fail in the built-in trainer's
  process, so Keras' optional probes (keras.utils.set_random_seed and the saving code ask whether TensorFlow is
  installed, and import it when it is) find none. A TensorFlow TPU build loaded beside JAX could take the TPU.
* devices: runner.train.distribution (DataParallel over every device; keras.distribution.initialize() first on
  a multi-host slice), which is also the device probe: a RUNNER_STRATEGY of tpu or gpu that JAX cannot see is
  the trainer's exit 2 before any data is read;
* data: runner.train.npdata (numpy through keras.utils.PyDataset; each process feeds its share of a batch);
* speed: runner.train.jaxperf;
* multi-host: every process trains, process 0 alone writes the run directory.
"""

from __future__ import annotations

import importlib.abc
import logging
import os
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from runner import contract
from runner.spec import TrainingSpec
from runner.train import jaxperf, npdata
from runner.train.engines import Engine
from runner.train.restore import TrainerError

_KEPT_OUT = ("tensorflow", "tf_keras")


class _NoTensorFlow(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None) -> None:
        if fullname.partition(".")[0] in _KEPT_OUT:
            raise ModuleNotFoundError(
                f"No module named {fullname!r} (the JAX engine keeps TensorFlow out)", name=fullname
            )
        return None


def keep_tensorflow_out() -> None:
    """From here on, importing TensorFlow (or tf_keras) in this process fails as if it were not installed, and
    Keras, when first imported, runs on JAX."""
    if any(m in sys.modules for m in _KEPT_OUT):
        raise TrainerError("TensorFlow is already imported in this process; the JAX engine runs without it")
    if not any(isinstance(f, _NoTensorFlow) for f in sys.meta_path):
        sys.meta_path.insert(0, _NoTensorFlow())
    os.environ["KERAS_BACKEND"] = "jax"
    os.environ.pop(contract.LEGACY_KERAS, None)
    # etils.epath (JAX's compilation cache, Orbax) asks importlib whether TensorFlow is there unless told not to;
    # the question itself would fail here.
    os.environ["EPATH_USE_TF"] = "false"


class JaxEngine(Engine):
    framework = "jax"
    shuffle = npdata.SHUFFLE
    keras_impl = "keras3"

    def __init__(self) -> None:
        self.keras: Any = None
        self.hint = "auto"

    def start(self, cfg: TrainingSpec, resume_keras: str | None) -> Any:
        from runner.train.distribution import expect, keras_on_jax

        if resume_keras == "tf_keras":
            raise TrainerError(
                "the checkpoint to resume from was written by tf_keras (Keras 2, TensorFlow only), which Keras 3 on "
                "JAX cannot read; set training.framework: tensorflow to continue it"
            )
        os.environ.pop(contract.LEGACY_KERAS, None)  # tf_keras is TensorFlow's; the callbacks take Keras 3
        self.hint = expect(os.environ.get(contract.STRATEGY))  # before JAX is imported
        # JAX logs at INFO each platform it cannot start ("Unable to initialize backend 'tpu'"), which the trainer's
        # INFO logging would print on every CPU run; what matters reaches the strategy line (its note) or the error.
        logging.getLogger("jax._src.xla_bridge").setLevel(logging.WARNING)
        cache = jaxperf.compile_cache()  # before JAX compiles anything: a later run here reuses the programs
        self.keras = keras_on_jax(force=True)
        if cache is not None:
            import jax

            jaxperf.say_cache_hits(jax, cache)
        # Before initialize(): with a seed set, Keras does not agree on one across hosts with a collective.
        self.keras.utils.set_random_seed(cfg.seed)
        return self.keras

    def resolve(self, ctx: contract.JobContext) -> Any:
        from runner.train.distribution import resolve_distribution

        return resolve_distribution(ctx.strategy_hint, num_workers=ctx.num_workers, force_backend=True)

    def chief(self, resolved: Any) -> bool:
        return bool(resolved.is_chief)

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
        # Nothing is timed, so nothing to defer: XLA's CPU backend measured no gain from bfloat16 (jaxperf.py).
        if jit_compile is False:
            raise TrainerError("the JAX engine always compiles with XLA: jit_compile cannot be turned off")
        import jax

        return jaxperf.plan_for(
            resolved.kind,
            steps,
            device=jax.devices()[0],
            requested_precision=cfg.precision,
            requested_steps=cfg.steps_per_execution,
        )

    def feeds(self, inputs: Any, cfg: TrainingSpec, resolved: Any) -> tuple[Any, Any]:
        if inputs.datasets:
            raise TrainerError(
                "training.data returned tf.data.Datasets, which the JAX engine does not read (it keeps TensorFlow "
                "out): return numpy arrays, or set training.framework: tensorflow"
            )
        share = {"process": resolved.process_index, "processes": resolved.processes}
        shape = {"scale": inputs.scale, "expand": inputs.expand}
        keras = self.keras
        train = npdata.TrainData(keras, inputs.x_train, inputs.y_train, cfg.batch_size, cfg.seed, **share, **shape)
        return train, npdata.eval_data(keras, inputs.x_test, inputs.y_test, cfg.batch_size, **share, **shape)

    def before_build(self, keras: Any, seed: int) -> None:
        """Seeded in start(), before keras.distribution.initialize(): again now would not add anything."""

    def versions(self) -> dict[str, str]:
        import jax

        return {"jax": jax.__version__, "keras": f"keras {self.keras.__version__}"}
