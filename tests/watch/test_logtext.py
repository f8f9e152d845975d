"""Stored logs as a terminal would leave them: Keras' redraws and escape sequences cleaned, chunk by chunk."""

from __future__ import annotations

import json
import time
from pathlib import Path

from typer.testing import CliRunner

from runner import contract
from runner.cli import app
from runner.watch.logtext import LogCleaner, clean_log

# What Keras 3's progress bar writes to a terminal for one short epoch: colours, backspaces, carriage returns.
KERAS_EPOCH = (
    b"Epoch 1/2\n"
    b"\x1b[1m1/3\x1b[0m \x1b[32m\xe2\x94\x81\xe2\x94\x81\x1b[0m \x1b[1m0s\x1b[0m - loss: 2.30"
    + b"\b" * 30
    + b"\r\x1b[1m2/3\x1b[0m \x1b[32m\xe2\x94\x81\xe2\x94\x81\x1b[0m \x1b[1m0s\x1b[0m - loss: 1.90"
    + b"\b" * 30
    + b"\r\x1b[1m3/3\x1b[0m \x1b[32m\xe2\x94\x81\xe2\x94\x81\x1b[0m \x1b[1m1s\x1b[0m - loss: 1.50\n"
)


def test_keras_redraws_and_colours_become_one_plain_line() -> None:
    assert clean_log(KERAS_EPOCH).decode() == "Epoch 1/2\n3/3 ━━ 1s - loss: 1.50\n"


def test_the_same_bytes_split_anywhere_give_the_same_log() -> None:
    whole = clean_log(KERAS_EPOCH + b"done\r\n")
    for size in (1, 2, 3, 7, 64):
        cleaner = LogCleaner(redraw_every_s=float("inf"))
        pieces = [cleaner.feed(KERAS_EPOCH[i : i + size]) for i in range(0, len(KERAS_EPOCH), size)]
        assert b"".join(pieces) + cleaner.feed(b"done\r\n") + cleaner.flush() == whole


def test_carriage_return_overwrites_like_a_terminal_and_crlf_is_a_newline() -> None:
    assert clean_log(b"50%\r100%\nabcdef\rXY\x1b[K\nwin\r\nlast") == b"100%\nXY\nwin\nlast\n"


def test_a_line_redrawn_for_long_is_stored_now_and_then() -> None:
    now = [0.0]
    cleaner = LogCleaner(redraw_every_s=30, clock=lambda: now[0])
    out = b""
    for step in range(1, 8):
        now[0] = step * 10.0
        out += cleaner.feed(f"\rstep {step}".encode())
    assert out == b"step 4\nstep 7\n"  # every 30 s, not every redraw
    assert cleaner.feed(b"\rstep 8 done\n") == b"step 8 done\n"


def test_plain_output_passes_unchanged() -> None:
    text = 'Traceback (most recent call last):\n  File "x.py", line 1\n\tValueError: bad\n'
    assert clean_log(text.encode()) == text.encode()


def test_runner_logs_prints_a_raw_stored_log_clean(tmp_path: Path) -> None:
    """A log stored before the supervisor cleaned it (or by other code) prints clean, with or without -f."""
    run_dir = tmp_path / "runs" / "old-1"
    (run_dir / "exit").mkdir(parents=True)
    info = {"run_id": "old-1", "job": "old", "backend": "local", "run_dir": str(run_dir), "created_at": time.time()}
    (run_dir / contract.RUN_INFO).write_text(json.dumps({**info, "state": "succeeded"}))
    (run_dir / contract.exit_key(0)).write_text(
        json.dumps({"worker": 0, "state": "succeeded", "exit_code": 0, "finished_at": time.time()})
    )
    (run_dir / contract.log_key(0)).parent.mkdir()
    (run_dir / contract.log_key(0)).write_bytes(KERAS_EPOCH)
    expected = "Epoch 1/2\n3/3 ━━ 1s - loss: 1.50\n"
    assert CliRunner().invoke(app, ["logs", str(run_dir)]).output == expected
    follow = CliRunner().invoke(app, ["logs", str(run_dir), "-f"]).output
    assert follow.startswith(expected) and "run old-1 succeeded" in follow
