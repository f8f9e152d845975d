"""Code that runs inside the container: the built-in trainer and the helpers a custom command can import.

    from runner.train import JobContext, resolve_strategy

    ctx = JobContext.from_env()          # run dir, checkpoint/TensorBoard dirs, worker id (RUNNER_* variables)
    resolved = resolve_strategy()        # TPUStrategy, else MirroredStrategy, else the default strategy
    with resolved.strategy.scope():
        model = ...

Importing this package does not import TensorFlow; resolve_strategy does, when called.
"""

from runner.contract import JobContext
from runner.train.strategy import ResolvedStrategy, StrategyError, resolve_strategy, tpu_present

__all__ = ["JobContext", "ResolvedStrategy", "StrategyError", "resolve_strategy", "tpu_present"]
