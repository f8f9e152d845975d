"""The one resume decision of the built-in trainer and keras_callbacks() (runner.train.resume), on the cases where
the two used to decide apart, and what each attempt says of where it went on from (runner.checkpoints.resumed)."""

from __future__ import annotations

import json
from pathlib import Path

from runner import contract
from runner.checkpoints.resumed import Resumed, furthest_step, latest
from runner.train.checkpoints import Candidate, Checkpoint, DataOrder
from runner.train.resume import Start, start_from
from runner.watch.events import Event

ORDER = DataOrder(seed=0, examples=512, batch_size=64, steps_per_epoch=8)


def candidate(epochs_done: int, step: int, global_step: int | None, data: DataOrder | None = ORDER) -> Candidate:
    name = f"ckpt-{epochs_done:06d}" + (f"-s{step:06d}" if step else "") + ".keras"
    return Candidate(Checkpoint(name, epochs_done, step, global_step=global_step, data=data), Path(name), True)


def start(
    resumed: Candidate | None, steps: int = 8, optimizer: int = 0, found_any: bool = True
) -> tuple[Start, list[str]]:
    said: list[str] = []
    begun = start_from(
        resumed,
        steps=steps,
        order=DataOrder(0, 512, 64, steps),
        optimizer_step=lambda: optimizer,
        found_any=found_any,
        skipped=0 if resumed else 2,
        say=said.append,
        prefix="[runner]",
    )
    return begun, said


def test_a_manifest_without_a_global_step_takes_the_optimizer_s_count() -> None:
    """keras_callbacks() went on from global step 0 here, the trainer from the optimizer's count: both take the
    optimizer's now (a manifest from an older runner, format 1)."""
    begun, said = start(candidate(2, 0, None, data=None), optimizer=16)
    assert (begun.position, begun.global_step) == ((2, 0), 16)
    assert said == ["[runner] resumed from ckpt-000002.keras: epoch 2 done, optimizer step 16"]


def test_a_mid_epoch_step_beyond_this_run_s_epoch_starts_that_epoch_over() -> None:
    """keras_callbacks() went on at step 12 of an 8-step epoch (an old manifest names no data order); the trainer
    started the epoch over: both do now, and say so."""
    begun, said = start(candidate(1, 12, 20, data=None), steps=8)
    assert (begun.position, begun.global_step, begun.dropped) == ((1, 0), 20, 12)
    assert said[-1] == (
        "[runner] ckpt-000001-s000012.keras was saved at step 12 of an epoch, and an epoch now has 8: epoch 2 starts "
        "over from step 0"
    )


def test_a_mid_epoch_checkpoint_of_another_data_order_starts_that_epoch_over() -> None:
    other = DataOrder(seed=1, examples=512, batch_size=64, steps_per_epoch=8)
    exact, _ = start(candidate(1, 3, 11))
    assert (exact.position, exact.dropped) == ((1, 3), 0)
    begun, said = start(candidate(1, 3, 11, data=other))
    assert (begun.position, begun.global_step, begun.dropped) == ((1, 0), 11, 3)
    assert said[-1].endswith(": epoch 2 starts over from step 0")


def test_each_attempt_says_where_it_went_on_from_and_how_many_steps_are_redone() -> None:
    said: list[str] = []
    begun, _ = start(candidate(1, 3, 11))
    record = begun.announce(14, said.append, "[trainer]")
    assert record == Resumed("checkpoints/ckpt-000001-s000003.keras", 11, 3, "Keras")
    assert said == ["[trainer] resumed from step 11 (Keras, checkpoints/ckpt-000001-s000003.keras); 3 steps redone"]
    # An epoch started over trains its first steps again.
    restarted = begun.restart_epoch(said.append, "[trainer] the training data cannot be replayed")
    assert restarted.announce(14, said.append, "[trainer]") == Resumed(begun.checkpoint_path, 11, 6, "Keras")
    assert said[-2] == "[trainer] the training data cannot be replayed: epoch 2 starts over from step 0"
    # Nothing usable, after an attempt that reached step 20: started over; a first attempt says nothing.
    nothing, _ = start(None)
    assert nothing.announce(20, said.append, "[trainer]") == Resumed(None, 0, 20)
    assert said[-1] == "[trainer] started over from step 0: no usable checkpoint; 20 steps redone"
    fresh, _ = start(None, found_any=False)
    assert fresh.announce(None, said.append, "[trainer]") is None and len(said) == 4
    # The job reported no steps before: the steps redone are not known, and not said.
    assert begun.announce(None, said.append, "[trainer]") == Resumed(begun.checkpoint_path, 11, None, "Keras")
    assert said[-1] == "[trainer] resumed from step 11 (Keras, checkpoints/ckpt-000001-s000003.keras)"


def test_the_furthest_step_comes_from_progress_and_metrics(tmp_path: Path) -> None:
    assert furthest_step(tmp_path) is None
    (tmp_path / contract.METRICS).write_text(
        "".join(json.dumps(r) + "\n" for r in [{"epoch": 1, "step": 8, "global_step": 8}, {"step": 30, "loss": 1}])
    )
    assert furthest_step(tmp_path) == 30  # a JAX loop's log_metrics(step=30): its step is the training step
    (tmp_path / contract.PROGRESS).write_text(json.dumps({"epoch": 5, "step": 3, "global_step": 35}))
    assert furthest_step(tmp_path) == 35
    (tmp_path / contract.PROGRESS).write_text("{torn")
    assert furthest_step(tmp_path) == 30


def test_status_reads_what_the_current_attempt_said() -> None:
    said = Resumed("checkpoints/640", 640, 12, "Orbax").to_json()
    events = [
        Event(1.0, "worker-0", "worker_started", {}),
        Event(2.0, "worker-0", "resumed_from_checkpoint", Resumed(None, 0, 5).to_json()),
        Event(3.0, "worker-0", "worker_started", {}),  # a recreated machine: its own word counts
        Event(4.0, "trainer-0", "resumed_from_checkpoint", said),
    ]
    assert latest(events) == Resumed("checkpoints/640", 640, 12, "Orbax")
    assert latest(events[:3]) is None
    assert Resumed.from_json(said) is not None and Resumed.from_json("x") is None
    assert said["text"] == "resumed from step 640 (Orbax, checkpoints/640); 12 steps redone"
