"""The one resume decision of the runner's two doors, the built-in trainer and keras_callbacks(): from the
checkpoint restored into the model (runner.train.restore), where training goes on, and what is said of it.

  * the global step is the manifest's; a manifest that does not say (one from an older runner) gives the
    optimizer's own count, read once the checkpoint is loaded;
  * a mid-epoch checkpoint goes on at its step only for the same data order (seed, examples, batch size, steps per
    epoch, shuffle) and a step within the epoch; otherwise its epoch starts over from step 0;
  * then, once per attempt: 'resumed from step N (Keras, checkpoints/<file>); M steps redone' (runner.checkpoints.
    resumed), or on an attempt that found no usable checkpoint, 'started over from step 0'; a first attempt says
    nothing of the sort.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from runner import contract
from runner.checkpoints.keras import DataOrder, Position, describe
from runner.checkpoints.resumed import Resumed, redone
from runner.train.checkpoints import Candidate


@dataclass(frozen=True)
class Start:
    """Where training goes on: `position` (epochs done, steps of the next epoch) and the global step there;
    `resumed`: the checkpoint it came from (None: from scratch)."""

    position: Position
    global_step: int
    resumed: Candidate | None
    found_any: bool  # there was something to resume from: a manifest (readable or not) or a checkpoint file
    dropped: int = 0  # steps of the checkpoint's epoch trained again (it starts over from step 0)
    series: str = ""  # the fit's directory under checkpoints/ ('fit-2/'; the first fit's: '')

    @property
    def checkpoint_path(self) -> str | None:
        return f"{contract.CHECKPOINTS}/{self.series}{self.resumed.name}" if self.resumed is not None else None

    def restart_epoch(self, say: Callable[[str], None], why: str) -> Start:
        """The same start at the beginning of its epoch (its input cannot be replayed from the middle), said."""
        if not self.position[1]:
            return self
        say(f"{why}: epoch {self.position[0] + 1} starts over from step 0")
        return replace(self, position=(self.position[0], 0), dropped=self.dropped + self.position[1])

    def announce(self, previous: int | None, say: Callable[[str], None], prefix: str) -> Resumed | None:
        """The attempt's resume record, said in the log; None on a first attempt (nothing there, no step reported
        before). `previous`: the furthest step earlier attempts reached (runner.checkpoints.resumed.furthest_step)."""
        if self.resumed is None:
            if not self.found_any and not previous:
                return None
            record = Resumed(checkpoint=None, step=0, redone=redone(previous, 0))
        else:
            record = Resumed(
                checkpoint=self.checkpoint_path,
                step=self.global_step,
                redone=redone(previous, self.global_step - self.dropped),
                format="Keras",
            )
        say(f"{prefix} {record.text()}")
        return record


def start_from(
    resumed: Candidate | None,
    *,
    steps: int,
    order: DataOrder,
    optimizer_step: Callable[[], int],
    found_any: bool,
    skipped: int,
    say: Callable[[str], None],
    prefix: str,
    series: str = "",
) -> Start:
    """Where training goes on from `resumed` (the checkpoint loaded into the model, or None), with `steps` steps an
    epoch in the data order `order`; says it, with `prefix` ('[trainer]', '[runner]')."""
    if resumed is None:
        if found_any:
            say(f"{prefix} no checkpoint verifies ({skipped} skipped): starting over from epoch 1")
        return Start((0, 0), 0, None, found_any, series=series)
    ckpt = resumed.checkpoint
    # Training steps taken, from the manifest when it says. The optimizer's own count can be lower: Keras 3's
    # LossScaleOptimizer (mixed_float16) does not count the steps it skips for non-finite gradients.
    global_step = optimizer_step() if ckpt.global_step is None else ckpt.global_step
    epochs_done, step = ckpt.position
    start = Start(ckpt.position, global_step, resumed, found_any, series=series)
    if step == 0:
        say(f"{prefix} resumed from {series}{resumed.name}: epoch {epochs_done} done, optimizer step {global_step}")
    else:
        where = describe(ckpt.position, steps)
        say(f"{prefix} resumed from {series}{resumed.name}: {where} (global step {global_step})")
    if step and ckpt.data is not None and ckpt.data != order:
        # The rest of that epoch would not be the batches its first part left out: start the epoch over instead.
        why = f"{prefix} {resumed.name} was saved mid-epoch with another data order ({ckpt.data}, now {order})"
        return start.restart_epoch(say, why)
    if step >= steps > 0:
        why = f"{prefix} {resumed.name} was saved at step {step} of an epoch, and an epoch now has {steps}"
        return start.restart_epoch(say, why)
    return start
