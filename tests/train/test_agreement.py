"""Stop and save decisions taken alike by every process of a multi-process run (runner.train.agreement): the logic
with processes played by threads, then two real trainer processes that one SIGTERM reaches on only one of them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from runner import contract
from runner.backends.local.backend import worker_envs
from runner.train.agreement import TARGET_S, Agreement
from runner.train.callbacks import StopSignal
from runner.train.checkpoints import read_manifest
from tests.stops import freeze_mid_epoch, job_pid, sigterm_pending
from tests.train.test_trainer import SAVED_ON_SIGTERM, rows, worker_env
from tests.waiting import wait_for


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Signal:
    """A StopSignal without a handler: what a process has been told."""

    def __init__(self, signum: int | None = None) -> None:
        self.signum = signum

    def adopt(self, signum: int) -> None:
        self.signum = signum


def test_one_process_signalled_stops_every_process_with_its_signal() -> None:
    sums = [[1, 1, 0, 300], [1, 1, 0, 300]]  # what the collective returns: the sum of both processes' lists
    quiet = Signal()
    stop, save = Agreement(lambda mine: sums.pop(), 2).decide(quiet, save_due=False)
    assert (stop, save, quiet.signum) == (True, False, signal.SIGTERM)
    interrupted = Signal()
    stop, _ = Agreement(lambda mine: [1, 0, 0, 10], 2).decide(interrupted, save_due=False)
    assert stop and interrupted.signum == signal.SIGINT  # Ctrl-C on another host: SIGINT here too
    nothing = Signal()
    assert Agreement(lambda mine: [0, 0, 1, 10], 2).decide(nothing, save_due=False) == (False, True)
    assert nothing.signum is None  # a save due elsewhere is a save here, and no stop


def settle(agreement: Agreement, clock: Clock, step_s: float, points: int = 12) -> list[int]:
    """`points` agreement points of steps lasting `step_s` each: the `every` chosen at each."""
    chosen = []
    for _ in range(points):
        for _ in range(agreement.every - 1):
            clock.now += step_s
            assert not agreement.step()
        clock.now += step_s
        assert agreement.step()
        agreement.decide(Signal(), False, mid_epoch=True)
        chosen.append(agreement.every)
    return chosen


def test_points_come_about_once_a_second_from_the_mean_step_time() -> None:
    clock = Clock()
    agreement = Agreement(lambda mine: [v * 2 for v in mine], 2, clock)  # two processes, the same numbers
    assert agreement.every == 1
    clock.now += 0.5  # the first step compiles: slow
    assert agreement.step()
    agreement.decide(Signal(), False, mid_epoch=True)
    assert agreement.every == int(TARGET_S / 0.5)
    chosen = settle(agreement, clock, 0.01)  # 10 ms steps: the points grow apart, twofold at most, to a second's worth
    assert chosen[:5] == [4, 8, 16, 32, 64] and chosen[-1] == pytest.approx(TARGET_S / 0.01, abs=1)
    clock.now += 3600  # an epoch end (validation, a long save): counts as no step time
    agreement.decide(Signal(), False)
    assert agreement.every == pytest.approx(TARGET_S / 0.01, abs=1)
    for _ in range(agreement.every):
        clock.now += 1e-9
        agreement.step()
    agreement.decide(Signal(), False, mid_epoch=True)
    assert agreement.every == pytest.approx(2 * TARGET_S / 0.01, abs=2)  # fast steps: twofold, not at once to the cap
    clock.now += 5.0  # a slow interval: the next point is nearer at once
    for _ in range(agreement.every):
        agreement.step()
    agreement.decide(Signal(), False, mid_epoch=True)
    assert agreement.every == pytest.approx(2 * TARGET_S / 0.01 * TARGET_S / 5.0, abs=1)


@pytest.mark.parametrize("slow_s", [0.5, 4.0])
def test_a_stop_is_agreed_within_a_preemption_notice_when_some_steps_are_slow(slow_s: float) -> None:
    """A hand-written loop's steps: 5 ms each, and every 20th evaluates and saves for `slow_s`. Wherever a signal
    lands, the next point comes within two target times and the slow steps of one interval: never 200 fast steps on
    (the choice made from a run of fast steps alone), which here would be ten slow steps, past a 30 s notice."""
    clock = Clock()
    agreement = Agreement(lambda mine: mine, 1, clock)
    points, step_ends = [], []
    for step in range(1, 3001):
        clock.now += 0.005 + (slow_s if step % 20 == 0 else 0.0)
        step_ends.append(clock.now)
        if agreement.step():
            agreement.decide(Signal(), False, mid_epoch=True)
            points.append(clock.now)
    waits = [next(p for p in points if p >= t) - t for t in step_ends if t <= points[-1]]
    worst = max(waits)
    assert worst <= 2 * TARGET_S + 2 * slow_s, (worst, points[-10:])
    assert len(points) < len(step_ends) / 3  # and not a collective every step


def test_the_aim_between_points_follows_the_job_s_cadence(monkeypatch: pytest.MonkeyPatch) -> None:
    """$RUNNER_AGREE_S (runner.timings' job_agree_s, through the plan's job environment) sets the aim; a value that
    is not a positive number leaves the default."""
    from runner.timings import Timings

    assert Timings.from_env({"RUNNER_TIMINGS": "job_agree_s=0.05"}).job_env() == {contract.AGREE_S: "0.05"}
    assert contract.AGREE_S not in Timings().job_env()
    for raw, aim in (("0.05", 0.05), ("nonsense", TARGET_S), ("-1", TARGET_S)):
        monkeypatch.setenv(contract.AGREE_S, raw)
        clock = Clock()
        assert settle(Agreement(lambda mine: mine, 1, clock), clock, 0.01)[-1] == pytest.approx(aim / 0.01, abs=1)


def test_threads_as_processes_stop_at_the_same_step_whichever_is_signalled() -> None:
    """Two processes in lockstep (a barrier per step, as a training step's collective makes them), a signal reaching
    process 1 alone at step 37: both stop, at the same step, soon after."""
    processes, signalled_at = 2, 37
    barrier = threading.Barrier(processes)
    slots: list[list[int]] = [[], []]
    lock = threading.Lock()
    stopped_at: dict[int, int] = {}

    def run(rank: int) -> None:
        def reduce_sum(mine: list[int]) -> list[int]:
            slots[rank] = mine
            barrier.wait()
            with lock:
                total = [sum(v) for v in zip(*slots, strict=True)]
            barrier.wait()
            return total

        clock = Clock()
        stop = Signal()
        agreement = Agreement(reduce_sum, processes, clock)
        for step in range(1, 10_000):
            barrier.wait()  # the step's own collective
            clock.now += 0.05
            if rank == 1 and step == signalled_at:
                stop.signum = signal.SIGTERM
            if agreement.step() and agreement.decide(stop, False, mid_epoch=True)[0]:
                stopped_at[rank] = step
                return

    threads = [threading.Thread(target=run, args=(rank,)) for rank in range(processes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert stopped_at[0] == stopped_at[1]
    assert signalled_at <= stopped_at[0] <= signalled_at + TARGET_S / 0.05


def test_one_process_has_no_agreement() -> None:
    from runner.train.agreement import for_run

    class One:
        processes = 1

    assert for_run("jax", One()) is None


def test_stop_signal_adopts_once() -> None:
    stop = StopSignal(signums=())
    stop.adopt(signal.SIGTERM)
    stop.adopt(signal.SIGINT)
    assert stop.signum == signal.SIGTERM and stop.exit_code == 143


# --- two real trainer processes ---------------------------------------------------------------------------------

# Many short steps, so that an epoch is still running well after it is seen to have started (2 processes x 8).
SPLIT = {"model": "mnist_mlp", "batch_size": 16, "max_train_examples": 4096, "max_test_examples": 512, "epochs": 1}
STEPS = 4096 // 16


def start_workers(run: Path, mnist_npz: Path, framework: str) -> list[subprocess.Popen[str]]:
    extra = {"keras": "tf_keras"} if framework == "tensorflow" else {}
    procs = []
    for cluster in worker_envs(2):
        env = worker_env(run, mnist_npz, framework=framework, **extra, **SPLIT) | cluster
        env[contract.STRATEGY] = "cpu"
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "runner.worker"],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    return procs


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["jax", "tensorflow"])
def test_a_sigterm_on_one_worker_stops_both_at_one_step_and_the_resume_loses_none(
    tmp_path: Path, mnist_npz: Path, framework: str
) -> None:
    """A preemption notice reaches one host first: its worker and the other stop at the same step, the chief saves
    that exact step, and two workers started again train exactly the steps left."""
    run = tmp_path / "run"
    procs = start_workers(run, mnist_npz, framework)
    pid = wait_for(lambda: job_pid(run, 1), "worker 1's trainer to start", timeout=240)
    # worker 1 (and so worker 0, in the step's collective) held mid-epoch, where worker 0's progress.json shows it
    freeze_mid_epoch(
        run / contract.PROGRESS,
        pid,
        lambda: next((p.communicate()[0][-3000:] for p in procs if p.poll() is not None), None),
        "the two workers",
    )
    procs[1].send_signal(signal.SIGTERM)  # to worker 1's supervisor only, which forwards it
    wait_for(lambda: sigterm_pending(pid), "the supervisor to forward SIGTERM", timeout=30)
    os.kill(pid, signal.SIGCONT)
    outs = [p.communicate(timeout=180)[0] for p in procs]
    assert [p.returncode for p in procs] == [143, 143], outs[0][-2000:] + outs[1][-2000:]
    assert "another worker got SIGTERM" in outs[0]
    saved = [SAVED_ON_SIGTERM.search(out) for out in outs]
    assert all(saved), outs[0][-2000:] + outs[1][-2000:]
    positions = [m.groups()[1:] for m in saved if m]
    assert positions[0] == positions[1]  # the same step on both
    name, epochs_done, step, _epoch, _shown, _steps, global_step = saved[0].groups()  # type: ignore[union-attr]
    assert (int(epochs_done), 0 < int(step) < STEPS) == (0, True)
    newest = read_manifest(run / contract.CHECKPOINTS)[0]
    assert (newest.file, newest.global_step) == (name, int(global_step))  # the chief's, in the run directory

    again = start_workers(run, mnist_npz, framework)
    outs = [p.communicate(timeout=240)[0] for p in again]
    assert [p.returncode for p in again] == [0, 0], outs[0][-2000:] + outs[1][-2000:]
    summary = json.loads((run / contract.SUMMARY).read_text())
    assert summary["global_step"] == STEPS
    assert summary["steps_this_attempt"] == STEPS - int(global_step)
    assert [r["epoch"] for r in rows(run / contract.METRICS)] == [1]
    assert summary["resumed_from"] == {"checkpoint": name, "epoch": 0, "step": int(step)}
