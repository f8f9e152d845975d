"""Keras' epoch lines read back from real logs (tests/watch/keras_logs: real fits of mnist_fit.py on Keras 3 and
tf_keras, verbose 1 and 2, stored by the real supervisor; make_fixtures.py regenerates them), and the cases a log
of a running, resumed or unusual job adds."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from runner.watch.keraslog import parse_keras_log, parse_step_line

LOGS = Path(__file__).parent / "keras_logs"
FITS = ["keras3-verbose1", "keras3-verbose2", "tf_keras-verbose1", "tf_keras-verbose2"]


def log(name: str) -> str:
    return (LOGS / f"{name}.log").read_text()


def without_times(rows: list[dict[str, float]]) -> list[dict[str, float]]:
    return [{k: v for k, v in row.items() if k != "epoch_time_s"} for row in rows]


@pytest.mark.parametrize("name", FITS)
def test_every_epoch_and_the_evaluation_of_a_real_fit(name: str) -> None:
    parsed = parse_keras_log(log(name))
    assert [row["epoch"] for row in parsed.epochs] == [1, 2, 3]
    for row in parsed.epochs:
        assert set(row) == {"epoch", "loss", "accuracy", "val_loss", "val_accuracy", "epoch_time_s"}, row
        assert row["epoch_time_s"] >= 0
    assert set(parsed.test) == {"loss", "accuracy"}
    assert parsed.progress() == {"epoch": 3, "epochs": 3, "step": 29, "steps_per_epoch": 29}
    # What the log says, to the digit: the last epoch line and the evaluate() line, as Keras printed them.
    lines = log(name).splitlines()
    last_epoch, evaluation = lines[-2], lines[-1]
    assert f"loss: {parsed.epochs[-1]['loss']:.4f}" in last_epoch
    assert f"val_accuracy: {parsed.epochs[-1]['val_accuracy']:.4f}" in last_epoch
    assert f"accuracy: {parsed.test['accuracy']:.4f}" in evaluation and "val_" not in evaluation


@pytest.mark.parametrize("engine", ["keras3", "tf_keras"])
def test_verbose_1_and_2_of_the_same_seeded_fit_read_the_same(engine: str) -> None:
    """Both verbosities of one engine ran the same seeded fit: only the layout of the lines differs."""
    one, two = parse_keras_log(log(f"{engine}-verbose1")), parse_keras_log(log(f"{engine}-verbose2"))
    assert without_times(one.epochs) == without_times(two.epochs) and one.test == two.test


def test_tf_keras_verbose_2_gives_the_epoch_time_to_the_millisecond() -> None:
    """Its "266ms/epoch" is the epoch's time; the other forms print whole seconds ("3s")."""
    printed = re.findall(r" - (\d+)(s|ms)/epoch", log("tf_keras-verbose2"))[:3]  # the 4th is evaluate()'s
    times = [row["epoch_time_s"] for row in parse_keras_log(log("tf_keras-verbose2")).epochs]
    assert times == [int(n) / (1000 if unit == "ms" else 1) for n, unit in printed]


@pytest.mark.parametrize("name", ["keras3-redraws", "tf_keras-redraws"])
def test_a_bar_stored_mid_epoch_is_progress_not_an_epoch(name: str) -> None:
    """The supervisor stores a redrawn bar's state every interval: those lines show an ETA and the metrics so far.
    The finished run reads as two epochs; cut after a mid-epoch line, the log says where the epoch stands."""
    text = log(name)
    parsed = parse_keras_log(text)
    assert [row["epoch"] for row in parsed.epochs] == [1, 2] and set(parsed.test) == {"loss", "accuracy"}
    lines = text.splitlines()
    second = lines.index("Epoch 2/2")
    running = parse_keras_log("\n".join(lines[: second + 2]))  # the header and one mid-epoch line
    mid = parse_step_line(lines[second + 1])
    assert mid is not None and not mid.complete and mid.seconds is None  # an ETA is not the epoch's time
    assert [row["epoch"] for row in running.epochs] == [1] and running.test == {}
    assert running.progress() == {"epoch": 2, "epochs": 2, "step": mid.step, "steps_per_epoch": 422}


def test_a_resumed_run_keeps_the_newest_of_each_epoch() -> None:
    """A run resumed after a preemption appends to its log: epoch 2 is printed twice, the later one counts."""
    first = "Epoch 1/3\n10/10 - 1s - loss: 0.9000 - accuracy: 0.5000\nEpoch 2/3\n4/10 - ETA: 1s - loss: 0.7000\n"
    again = (
        "Epoch 2/3\n10/10 - 1s - loss: 0.6000 - accuracy: 0.7000\n"
        "Epoch 3/3\n10/10 - 1s - loss: 0.5000 - accuracy: 0.8000\n"
    )
    parsed = parse_keras_log(first + again)
    assert [(r["epoch"], r["loss"]) for r in parsed.epochs] == [(1, 0.9), (2, 0.6), (3, 0.5)]


def test_data_of_unknown_size_and_what_is_not_a_keras_line() -> None:
    text = "\n".join(
        [
            "2026/12/03 loading 3/4 of the shards",  # not a bar: no time, no metric
            "Epoch 1/2",
            "     12/Unknown 2s 9ms/step - loss: 1.2000",
            "     50/Unknown 5s 8ms/step - loss: 0.9000 - val_loss: 0.8000",
            "Epoch 2/2",
            "50/50 ━━━━━━━━━━━━━━━━━━━━ 3s 7ms/step - loss: 0.5000 - val_loss: 0.4000",
            "13/13 ━━━━━━━━━━━━━━━━━━━━ 0s 2ms/step",  # predict(): no metrics, no test
        ]
    )
    parsed = parse_keras_log(text)
    assert parsed.epochs == [
        {"epoch": 1, "loss": 0.9, "val_loss": 0.8, "epoch_time_s": 5.0},
        {"epoch": 2, "loss": 0.5, "val_loss": 0.4, "epoch_time_s": 3.0},
    ]
    assert parsed.test == {}
    assert parse_step_line("2026/12/03 loading 3/4 of the shards") is None
    assert parse_keras_log("Epoch 1/1\n      7/Unknown 1s 9ms/step - loss: 1.2000\n").epochs == []  # may go on


def test_a_printed_test_accuracy_counts_when_no_evaluation_bar_says_it() -> None:
    """How the TensorFlow guides end: evaluate(verbose=0), then print('Test accuracy:', acc)."""
    text = "Epoch 1/1\n5/5 - 1s - loss: 0.5000 - accuracy: 0.9000\n\nTest accuracy: 0.9123\ntest_loss=0.31\n"
    assert parse_keras_log(text).test == {"accuracy": 0.9123, "loss": 0.31}
    assert parse_keras_log("nothing here\n").progress() is None


def test_numbers_keras_prints_in_scientific_notation() -> None:
    line = parse_step_line("29/29 ━━━━━━━━━━━━━━━━━━━━ 1s 18ms/step - loss: 8.1234e-04 - accuracy: 1.0000")
    assert line is not None and line.metrics == {"loss": 8.1234e-04, "accuracy": 1.0} and line.seconds == 1.0
