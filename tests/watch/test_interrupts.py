"""Ctrl-C while the runner follows a run stops it, wherever the signal lands: most often in the middle of a poll of the
run directory, which is slow on a loaded machine or a far bucket. It was once taken there for a read that failed,
said as a warning and swallowed, and the run went on (with a frozen worker, until JAX declared it dead)."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import pytest

from runner.interrupts import Interrupted, signals_raise
from runner.storage import open_storage
from runner.watch import view
from runner.watch.follow import Sight, follow
from runner.watch.rundir import Snapshot


def test_a_ctrl_c_during_a_poll_stops_the_follow(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    polling, sent = threading.Event(), threading.Event()
    polls: list[int] = []
    real_poll = view.RunDirView.poll

    def poll(self: view.RunDirView, **kwargs: bool) -> Snapshot:
        polls.append(1)
        polling.set()
        sent.wait(60)  # this poll lasts until the signal has been sent: the main thread waits on it meanwhile
        return real_poll(self, **kwargs)

    monkeypatch.setattr(view.RunDirView, "poll", poll)

    def interrupt() -> None:
        polling.wait(60)
        os.kill(os.getpid(), signal.SIGINT)
        sent.set()

    said: list[str] = []
    threading.Thread(target=interrupt, daemon=True).start()
    # Without the signal the follow would end at its third poll; a signal taken for a failed read lets it get there.
    with pytest.raises(Interrupted, match="SIGINT"), signals_raise():
        follow(
            open_storage(str(tmp_path)),
            lambda _: None,
            interval_s=0.05,
            stop=lambda _: len(polls) >= 3,
            sight=Sight(said.append, 0.05),
        )
    assert len(polls) == 1 and not said
