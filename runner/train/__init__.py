"""Code that runs inside the container: the built-in trainer and the helpers a custom command can import.

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

Importing this package imports neither TensorFlow nor JAX; resolve_strategy and resolve_distribution do, when
called.
"""

from runner.contract import JobContext
from runner.train.distribution import ResolvedDistribution, resolve_distribution
from runner.train.strategy import ResolvedStrategy, StrategyError, resolve_strategy, tpu_present

__all__ = [
    "JobContext",
    "ResolvedDistribution",
    "ResolvedStrategy",
    "StrategyError",
    "resolve_distribution",
    "resolve_strategy",
    "tpu_present",
]
