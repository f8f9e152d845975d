"""What every process of a multi-process run decides together: to stop, and to save a checkpoint.

A preemption notice (SIGTERM), `runner down` or Ctrl-C reaches each host on its own, a step or more apart, and a
wall-clock checkpoint falls due on each host's own clock. But saving is collective on both engines (every process
saves; MultiWorkerMirroredStrategy's variables and JAX's sharded arrays are read by all of them), and so is every
training step: a process that stopped or saved alone would leave the others waiting in a collective until the
runner kills them, and the stop would save nothing. So the processes agree: at agreed points each one says what it
knows (a signal came, a save is due, how long since the last point) and all take the sum, the same answer on every
process, by one small collective of the engine (Agreement.decide).

The points are counted in steps, which every process takes alike, never by a clock: one at every epoch end and
before every epoch, and mid-epoch every `every` steps, where `every` is re-chosen at each point from the processes'
mean time since the last one (the same numbers on every process, so the same choice), aiming at one point a second,
while the collective (4-9 ms over the CPU's gloo or ring, measured on two local processes) costs under 1% of the
time. `every` shrinks at once after a slow interval but at most doubles after a fast one: steps are not alike (a
loop that evaluates and saves every 20 steps spends seconds on those and milliseconds on the rest), and a choice
made from a run of fast steps alone put the next point 200 steps on, past ten evaluations and saves and a Spot VM's
30-second notice (the emulated v4-16 stop of tests/test_flax_example.py, once on a loaded machine). So a stop waits
at most about two target times past the signal, plus the slow steps of one interval that grew from one without
them.

One process (no TF_CONFIG cluster, one JAX process) decides alone: no collective, nothing counted.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from typing import Any

from runner import contract

TARGET_S = contract.CADENCES[contract.AGREE_S]  # aimed-at time between two mid-epoch agreement points (default)
MAX_EVERY = 10_000  # steps
GROWTH = 2  # the most `every` grows by from one point to the next (module docstring)


class Agreement:
    """Stop and save decisions taken alike by `processes` processes; `reduce_sum` is the engine's collective: the
    element-wise sum of every process's list of ints, returned to each."""

    def __init__(
        self,
        reduce_sum: Callable[[list[int]], list[int]],
        processes: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.reduce_sum, self.processes, self.clock = reduce_sum, processes, clock
        # $RUNNER_AGREE_S (runner.timings' job_agree_s): a rehearsal whose epochs last about a second sets it lower,
        # so that a stop in an epoch's first half is agreed within that epoch
        self.target_s = contract.cadence(contract.AGREE_S)
        self.every = 1  # steps between mid-epoch points; the first point comes after the first step
        self._since = 0
        self._last = clock()

    def step(self) -> bool:
        """Count one step (a batch end mid-epoch); True when this step is an agreement point."""
        self._since += 1
        return self._since >= self.every

    def decide(self, stop: Any, save_due: bool, mid_epoch: bool = False) -> tuple[bool, bool]:
        """(stop, save) as every process decides them now. `stop` is this process's StopSignal: when another
        process got a signal and this one did not, it takes the same one (SIGTERM before SIGINT), and says so.
        At a mid-epoch point (`mid_epoch`, after `step` said so) the next point is chosen too."""
        now = self.clock()
        elapsed_ms = int((now - self._last) * 1000)
        mine = [int(stop.signum is not None), int(stop.signum == signal.SIGTERM), int(save_due), elapsed_ms]
        stops, terms, saves, elapsed_sum = self.reduce_sum(mine)
        if stops and stop.signum is None:
            stop.adopt(signal.SIGTERM if terms else signal.SIGINT)
        if mid_epoch and self._since:  # aim the next point at target_s from the processes' mean step time
            mean_s = elapsed_sum / 1000 / self.processes
            per_step = max(mean_s / self._since, 1e-6)
            self.every = max(1, min(MAX_EVERY, GROWTH * self.every, int(self.target_s / per_step)))
        self._since, self._last = 0, now
        return bool(stops), bool(saves)


def broadcast(
    values: list[int], reduce_sum: Callable[[list[int]], list[int]], chief: bool, copies: int = 1
) -> list[int]:
    """The chief's `values` (non-negative integers) on every process: the others add zeros to one reduce_sum.
    `copies`: how many times each process's list enters the sum (MultiWorkerMirroredStrategy adds one per local
    replica)."""
    total = reduce_sum(list(values) if chief else [0] * len(values))
    return [v // copies for v in total]


def jax_sum(values: list[int]) -> list[int]:
    """The sum over JAX processes (an all-gather of a few int32s through jax.distributed's collectives)."""
    import numpy as np
    from jax.experimental import multihost_utils

    gathered = multihost_utils.process_allgather(np.asarray(values, dtype=np.int32))
    return [int(v) for v in np.asarray(gathered).reshape(-1, len(values)).sum(axis=0)]


def tensorflow_sum(strategy: Any) -> Callable[[list[int]], list[int]]:
    """The sum over the workers of a MultiWorkerMirroredStrategy (one all-reduce of a few int64s)."""
    import tensorflow as tf

    def reduce_sum(values: list[int]) -> list[int]:
        per_replica = strategy.run(lambda: tf.constant(values, tf.int64))
        return [int(v) for v in strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None).numpy()]

    return reduce_sum


def collective(framework: str, resolved: Any) -> tuple[Callable[[list[int]], list[int]], int, int] | None:
    """(reduce_sum, processes, copies) of a multi-process run (JAX processes, or MultiWorkerMirroredStrategy
    workers); None for one process. MultiWorkerMirroredStrategy sums over replicas: a worker with several counts
    as that many (`copies`), alike on every worker."""
    if framework == "jax":
        return (jax_sum, resolved.processes, 1) if resolved.processes > 1 else None
    from runner.train.strategy import multi_worker

    if not multi_worker() or resolved.name != "MultiWorkerMirroredStrategy":
        return None
    workers = max(1, int(os.environ.get(contract.NUM_WORKERS) or 1))
    return tensorflow_sum(resolved.strategy), resolved.replicas, max(1, resolved.replicas // workers)


def for_run(framework: str, resolved: Any) -> Agreement | None:
    """The Agreement of a multi-process run; None for one process."""
    found = collective(framework, resolved)
    return Agreement(found[0], found[1]) if found else None
