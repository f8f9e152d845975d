"""TensorBoard scalars written without TensorFlow (runner.train.tbevents), read back with TensorBoard's own reader
(which checks every record's CRC when TensorFlow is installed, as here)."""

from __future__ import annotations

from pathlib import Path

from runner.train.tbevents import EventFile


def read_scalars(directory: Path) -> list[tuple[int, str, float]]:
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    (path,) = directory.glob("events.out.tfevents.*")
    out = []
    for event in EventFileLoader(str(path)).Load():
        for value in event.summary.value:
            # TensorBoard's loader migrates simple_value into a scalar tensor as it reads.
            scalar = value.simple_value if value.HasField("simple_value") else value.tensor.float_val[0]
            out.append((event.step, value.tag, scalar))
    return out


def test_event_file_is_read_by_tensorboard(tmp_path: Path) -> None:
    events = EventFile(tmp_path / "train")
    events.write(0, {"epoch_loss": 2.5, "epoch_accuracy": 0.25})
    events.write(1, {"epoch_loss": 1.25})
    events.close()
    assert read_scalars(tmp_path / "train") == [
        (0, "epoch_loss", 2.5),
        (0, "epoch_accuracy", 0.25),
        (1, "epoch_loss", 1.25),
    ]
