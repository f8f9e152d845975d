"""Code that runs inside the container: the built-in trainer and the helpers a custom command can import.

Your own Keras fit, with the runner's resume, checkpoints, metrics and TensorBoard (runner.train.library):

    from runner.train import keras_callbacks

    model.fit(x, y, epochs=5, batch_size=64, callbacks=keras_callbacks())

Your own JAX loop, with the hosts connected, progress, metrics, the agreed stop and an Orbax CheckpointManager in
the run's checkpoint location (runner.train.jaxloop):

    from runner.train import jax_loop

    loop = jax_loop(steps=total)
    mngr = loop.checkpoint_manager(ckpt_dir, options)
    ...  mngr.save(step, args=...); loop.step(step)

TensorFlow:

    from runner.train import JobContext, resolve_strategy

    ctx = JobContext.from_env()          # run dir, checkpoint/TensorBoard dirs, worker id (RUNNER_* variables)
    resolved = resolve_strategy()        # TPUStrategy, else MirroredStrategy, else the default strategy
    with resolved.strategy.scope():
        model = ...

Keras 3 on JAX:

    from runner.train import resolve_distribution

    resolved = resolve_distribution()    # DataParallel over every device (initialize() first on a multi-host slice)
    model = ...                          # built after it: Keras places the variables by the global distribution

Importing this package imports neither TensorFlow nor JAX nor Keras; resolve_strategy, resolve_distribution,
keras_callbacks and jax_loop do, when called.
"""

from runner.contract import JobContext
from runner.train.distribution import ResolvedDistribution, resolve_distribution
from runner.train.jaxloop import JaxLoop, jax_loop
from runner.train.library import keras_callbacks
from runner.train.strategy import ResolvedStrategy, StrategyError, resolve_strategy, tpu_present

__all__ = [
    "JaxLoop",
    "JobContext",
    "ResolvedDistribution",
    "ResolvedStrategy",
    "StrategyError",
    "jax_loop",
    "keras_callbacks",
    "resolve_distribution",
    "resolve_strategy",
    "tpu_present",
]
