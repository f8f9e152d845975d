"""Where an attempt of a run went on from, said once per attempt: in the job's log, as an event (status, the
report), and in summary.json.

    resumed from step 640 (Orbax, checkpoints/640); 12 steps redone
    resumed from step 180 (Keras, checkpoints/ckpt-000003-s000020.keras); 0 steps redone
    started over from step 0: no usable checkpoint; 652 steps redone

The steps redone are the furthest training step the earlier attempts reached (their progress.json and
metrics.jsonl) less the step training goes on from; unknown (not said) when the job reports no steps. A first
attempt says nothing of the sort. The built-in trainer and keras_callbacks() decide and say it for the runner's own
checkpoints (runner.train.resume); for a command job whose checkpoints the runner can read (Orbax, TensorFlow,
BackupAndRestore), its supervisor does, from the newest committed one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner import contract
from runner.watch.events import Event
from runner.watch.rundir import Progress, loads, number, parse_jsonl

EVENT = "resumed_from_checkpoint"
# What a checkpoint's save and restore took, each said as it ends with its `seconds` (the run's goodput,
# runner.collect.goodput): the trainer's saves; the supervisor's download onto a new machine, the trainer's verify and
# load (`stage`).
SAVED = "checkpoint_saved"
RESTORED = "checkpoint_restored"


@dataclass(frozen=True)
class Resumed:
    """`checkpoint`: what training went on from (a path in the run directory), None when no checkpoint was usable
    and it started over; `step`: the training step it holds (0 when it started over; None when its format keeps
    none: a TensorFlow save count, a backup's epoch); `redone`: steps the earlier attempts trained past it (None:
    not known)."""

    checkpoint: str | None
    step: int | None
    redone: int | None
    format: str | None = None
    epoch: int | None = None  # the epochs it holds, when its format says that but no step (BackupAndRestore)

    def text(self) -> str:
        if self.checkpoint is None:
            said = "started over from step 0: no usable checkpoint"
        else:
            what = ", ".join(p for p in (self.format, self.checkpoint) if p)
            where = (
                f"step {self.step}"
                if self.step is not None
                else f"epoch {self.epoch}"
                if self.epoch is not None
                else self.checkpoint.rpartition("/")[2]
            )
            said = f"resumed from {where} ({what})"
        if self.redone is not None:
            said += f"; {self.redone} step{'' if self.redone == 1 else 's'} redone"
        return said

    def row(self) -> str:
        """The text for a 'resumed' row: 'from step 640 (Orbax, checkpoints/640); 12 steps redone', 'no: started
        over from step 0 ...'."""
        text = self.text()
        return text.removeprefix("resumed ") if self.checkpoint is not None else f"no: {text}"

    def to_json(self) -> dict[str, Any]:
        return {
            "checkpoint": self.checkpoint,
            "step": self.step,
            "redone": self.redone,
            "format": self.format,
            "epoch": self.epoch,
            "text": self.text(),
        }

    @classmethod
    def from_json(cls, raw: Any) -> Resumed | None:
        """None for what is not one (user code's summary.json may hold anything under that name)."""
        if not isinstance(raw, dict):
            return None

        def whole(key: str) -> int | None:
            value = number(raw.get(key))
            return int(value) if value is not None and float(value).is_integer() else None

        checkpoint, fmt = raw.get("checkpoint"), raw.get("format")
        return cls(
            checkpoint=checkpoint if isinstance(checkpoint, str) else None,
            step=whole("step"),
            redone=whole("redone"),
            format=fmt if isinstance(fmt, str) else None,
            epoch=whole("epoch"),
        )


def redone(previous: int | None, goes_on_from: int | None) -> int | None:
    if previous is None or goes_on_from is None:
        return None
    return max(0, previous - goes_on_from)


def furthest_step(output_dir: Path) -> int | None:
    """The furthest training step the run's earlier attempts reached, from what they left in `output_dir`:
    progress.json's global step (or its step, for a job that writes no epochs), and metrics.jsonl's rows' global
    step (or step, in rows without an epoch). None when they say no step (a first attempt, a job that reports none).
    Read before this attempt writes either."""
    steps: list[int] = []
    try:
        progress: Progress | None = Progress.from_json(loads((output_dir / contract.PROGRESS).read_bytes()))
    except (OSError, ValueError, TypeError):
        progress = None
    if progress is not None:
        step = progress.global_step
        if step is None and progress.epoch is None:
            step = progress.step
        steps += [step] if step is not None else []
    try:
        rows = parse_jsonl((output_dir / contract.METRICS).read_bytes(), contract.METRICS, None, lambda r: r)
    except OSError:
        rows = []
    for row in rows:
        value = number(row.get("global_step"))
        if value is None and "epoch" not in row:
            value = number(row.get("step"))
        if value is not None and float(value).is_integer():
            steps.append(int(value))
    return max(steps) if steps else None


def latest(events: list[Event]) -> Resumed | None:
    """What the current attempt said of where it went on from: the newest such event after worker 0's last start
    (a machine recreated after a preemption starts anew), None when it said nothing (a first attempt)."""
    starts = [e.time for e in events if e.source == "worker-0" and e.event == "worker_started"]
    since = max(starts) if starts else float("-inf")
    said = [e for e in events if e.event == EVENT and e.time >= since and e.source in ("worker-0", "trainer-0")]
    return Resumed.from_json(said[-1].fields) if said else None
