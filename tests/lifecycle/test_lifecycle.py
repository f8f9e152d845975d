"""The runner's own deadlines and verdicts: the Watchdog on hand-made run-directory snapshots (pure logic), and the
hang and deadline paths end to end through `runner submit --local`."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from runner.backends import plan_local
from runner.backends.base import MachineState
from runner.backends.tpu_vm.backend import STATE_NOTES, TpuVmBackend
from runner.contract import HANG_DEFAULT_S
from runner.lifecycle.ending import should_delete
from runner.lifecycle.watchdog import HANG_SLACK_S, Verdict, Watchdog, machine_end
from runner.spec.loader import load_spec_text
from runner.watch.events import Event
from runner.watch.rundir import ExitRecord, Heartbeat, Snapshot
from runner.watch.state import RunState

RUNNER = [sys.executable, "-m", "runner.cli"]


class Machine:
    """A backend whose machine is in whatever state the test says (the Watchdog only asks for it, and for the
    provider's own name of it, to show). It speaks of its machine as the tpu-vm backend does: the Watchdog takes the
    words (ready, stopped, what a state means) from the backend."""

    ephemeral = False
    ready_state = TpuVmBackend.ready_state
    stop_command = TpuVmBackend.stop_command
    stopped_states = TpuVmBackend.stopped_states

    def __init__(self, state: MachineState = MachineState.RUNNING, native: str | None = None) -> None:
        self.state = state
        self.native = native
        self.asked = 0

    def status(self, handle: Any) -> MachineState:
        self.asked += 1
        return self.state

    def observe(self, handle: Any) -> tuple[MachineState, str | None]:
        return self.status(handle), self.native

    def describe_handle(self, handle: Any) -> str:
        return "the test's machine"

    def state_note(self, native: str) -> str | None:
        return STATE_NOTES.get(native)


def plan_with(tmp_path: Path, teardown: str) -> Any:
    spec = load_spec_text(
        f"name: w\nimage: trainer:test\ncommand: [python, -c, '1']\nstorage: {tmp_path}\nteardown: {{{teardown}}}\n"
    )
    return plan_local(spec, None)


def snapshot(*, exits: int = 0, beat: dict[str, Any] | None = None) -> Snapshot:
    records = [ExitRecord(w, RunState.SUCCEEDED, 0, time.time()) for w in range(exits)]
    return Snapshot(records, Heartbeat.from_json(beat) if beat else None, [], None)


def event(source: str, name: str) -> Event:
    return Event(time.time(), source, name)


def test_exit_records_end_the_watch_before_anything_else(tmp_path: Path) -> None:
    dog = Watchdog(plan_with(tmp_path, "max_runtime: 60"), Machine(MachineState.GONE), None, status_every_s=0)
    dog.plan = dataclasses.replace(dog.plan, deadline=time.time() - 1)
    assert dog.check(snapshot(exits=1)) == Verdict.FINISHED


def test_the_runner_enforces_max_runtime_itself(tmp_path: Path) -> None:
    plan = plan_with(tmp_path, "max_runtime: 60")
    dog = Watchdog(plan, Machine(), None, status_every_s=0)
    dog.on_event(event("bootstrap-0", "bootstrap_started"))
    assert dog.check(snapshot()) is None
    dog.plan = dataclasses.replace(plan, deadline=time.time() - 1)
    assert dog.check(snapshot()) == Verdict.DEADLINE  # whatever the machine does: it still says RUNNING


def test_a_machine_that_never_reports_in_is_silent_after_boot_timeout(tmp_path: Path) -> None:
    dog = Watchdog(plan_with(tmp_path, "boot_timeout: 10"), Machine(), None, status_every_s=0)
    assert dog.check(snapshot()) is None
    dog.ready_at -= 11
    assert dog.check(snapshot()) == Verdict.SILENT
    dog.on_event(event("runner", "provisioned"))  # the runner's own events are not the machine's word
    assert dog.check(snapshot()) == Verdict.SILENT
    dog.on_event(event("bootstrap-0", "bootstrap_started"))
    assert dog.check(snapshot()) is None


def test_stalled_progress_is_hung_only_past_the_slack(tmp_path: Path) -> None:
    dog = Watchdog(plan_with(tmp_path, "hang_timeout: 60"), Machine(), None, status_every_s=0)
    dog.on_event(event("worker-0", "worker_started"))
    now = time.time()
    fresh = {"time": now, "phase": "running", "progress_at": now - 30}
    assert dog.check(snapshot(beat=fresh)) is None
    just_past = {"time": now, "phase": "running", "progress_at": now - 61}
    assert dog.check(snapshot(beat=just_past)) is None  # the job's own supervisor stops it: no race with it
    stuck = {"time": now, "phase": "running", "progress_at": now - 61 - HANG_SLACK_S}
    assert dog.check(snapshot(beat=stuck)) == Verdict.HUNG
    off = Watchdog(plan_with(tmp_path, "max_runtime: 600"), Machine(), None, status_every_s=0)
    off.on_event(event("worker-0", "worker_started"))
    assert off.check(snapshot(beat=stuck)) is None  # hang_timeout is opt-in


def test_a_pod_slices_default_hang_limit_counts_only_workers_that_report_progress(tmp_path: Path) -> None:
    plan = plan_with(tmp_path, "max_runtime: 600")
    dog = Watchdog(dataclasses.replace(plan, env={**plan.env, HANG_DEFAULT_S: "60"}), Machine(), None, status_every_s=0)
    dog.on_event(event("worker-0", "worker_started"))
    now = time.time()
    silent = {"time": now, "phase": "running", "progress_at": now - 61 - HANG_SLACK_S}  # output only: no progress
    assert dog.check(snapshot(beat=silent)) is None
    stuck = {**silent, "progress": {"step": 40, "time": now - 61 - HANG_SLACK_S}}
    assert dog.check(snapshot(beat=stuck)) == Verdict.HUNG


def test_down_from_another_shell_and_a_vanished_machine(tmp_path: Path) -> None:
    machine = Machine()
    dog = Watchdog(plan_with(tmp_path, "max_runtime: 600"), machine, None, status_every_s=3600)
    dog.on_event(event("worker-0", "worker_started"))
    assert dog.check(snapshot()) is None and machine.asked == 1
    machine.state = MachineState.PREEMPTED
    assert dog.check(snapshot()) is None and machine.asked == 1  # the API is asked at most every status_every_s
    dog._asked_at = float("-inf")
    assert dog.check(snapshot()) == Verdict.MACHINE_GONE
    dog.on_event(event("runner-down", "down_requested"))
    assert dog.check(snapshot()) == Verdict.DOWN


def pod(tmp_path: Path, teardown: str = "boot_timeout: 10", workers: int = 4, **kwargs: Any) -> Watchdog:
    """A Watchdog of a slice of `workers` hosts that all run the job."""
    plan = dataclasses.replace(plan_with(tmp_path, teardown), num_workers=workers)
    return Watchdog(plan, Machine(), None, status_every_s=3600, **kwargs)


def beats(*workers: int, at: float | None = None, phase: str = "running") -> dict[int, Heartbeat]:
    stamp = time.time() if at is None else at
    return {w: Heartbeat(time=stamp, phase=phase, worker=w) for w in workers}


def test_a_slice_runs_once_every_worker_beats_and_finishes_only_when_all_exit(tmp_path: Path) -> None:
    dog = pod(tmp_path)
    dog.on_event(event("bootstrap-0", "bootstrap_started"))
    three = Snapshot([], None, [], None, heartbeats=beats(0, 1, 2))
    assert not dog.running(three) and dog.check(three) is None
    four = dataclasses.replace(three, heartbeats=beats(0, 1, 2, 3))
    assert dog.running(four)
    done = [ExitRecord(w, RunState.SUCCEEDED, 0, time.time()) for w in range(3)]
    assert dog.check(dataclasses.replace(four, exits=done)) is None  # worker 3 still works
    all_done = [*done, ExitRecord(3, RunState.SUCCEEDED, 0, time.time())]
    assert dog.check(dataclasses.replace(four, exits=all_done)) == Verdict.FINISHED


def test_the_first_worker_to_fail_ends_the_slice_and_is_named(tmp_path: Path) -> None:
    dog = pod(tmp_path)
    now = time.time()
    exits = [
        ExitRecord(3, RunState.FAILED, 1, now - 1, error="collective timed out"),  # a consequence...
        ExitRecord(1, RunState.FAILED, 137, now - 5, error="killed (out of memory?)"),  # ...of this one
        ExitRecord(0, RunState.SUCCEEDED, 0, now - 9),
    ]
    assert dog.check(Snapshot(exits, None, [], None)) == Verdict.WORKER_FAILED
    assert dog.reason == "worker 1 failed first (exit code 137): killed (out of memory?)"
    single = Watchdog(plan_with(tmp_path, "boot_timeout: 10"), Machine(), None, status_every_s=3600)
    one = [ExitRecord(0, RunState.FAILED, 1, now)]
    assert single.check(Snapshot(one, None, [], None)) == Verdict.FINISHED  # one host: its exit is the end
    # Every record seen in one poll (worker 0's job died of worker 1's kill within it): the same reason.
    pair = pod(tmp_path, workers=2)
    both = [ExitRecord(0, RunState.FAILED, 1, now - 0.4), ExitRecord(1, RunState.FAILED, 137, now - 0.8)]
    assert pair.check(Snapshot(both, None, [], None)) == Verdict.WORKER_FAILED
    assert pair.reason == "worker 1 failed first (exit code 137)"
    stopped = pod(tmp_path, workers=2)  # a stop ended one: the machine's end decides, as for a finished run
    ended = [ExitRecord(0, RunState.FAILED, 1, now - 0.4), ExitRecord(1, RunState.CANCELLED, 143, now - 0.8)]
    assert stopped.check(Snapshot(ended, None, [], None)) == Verdict.FINISHED and stopped.reason is None


def test_a_worker_stopped_by_its_peers_is_no_failure_while_the_run_is_being_stopped(tmp_path: Path) -> None:
    """Worker 1's job exits 143 (JAX's preemption sync told it) before its supervisor hears of the stop; worker 0
    is still saving. Once a worker's supervisor said it is stopping, worker 1 waits for the others, and the run
    ends when every record is in; without any word of a stop, the same exit waits the run's stop grace (on the
    runner's clock), then ends the slice as a failure."""
    now = time.time()
    peer = ExitRecord(1, RunState.CANCELLED, 143, now, error="a stop its supervisor did not send", peer_stop=True)
    stopping = pod(tmp_path, workers=2)
    stopping.on_event(event("worker-0", "stopping"))
    assert stopping.check(Snapshot([peer], None, [], None)) is None
    saved = ExitRecord(0, RunState.CANCELLED, 143, now + 2)
    assert stopping.check(Snapshot([peer, saved], None, [], None)) == Verdict.FINISHED
    noticed = pod(tmp_path, workers=2)  # a notice the bootstrap passed on is word of a stop too
    noticed.on_event(event("bootstrap-0", "preemption_notice"))
    assert noticed.check(Snapshot([peer], None, [], None)) is None and noticed.notice == "preemption_notice"
    clock = [100.0]
    unexplained = pod(tmp_path, workers=2, stop_grace_s=30)
    unexplained.clock = lambda: clock[0]
    assert unexplained.check(Snapshot([peer], None, [], None)) is None
    clock[0] += 31
    assert unexplained.check(Snapshot([peer], None, [], None)) == Verdict.WORKER_FAILED
    assert unexplained.reason is not None and unexplained.reason.startswith("worker 1 failed first (exit code 143)")
    crashed = pod(tmp_path, workers=2)  # a failure is one at once, stop or not
    crashed.on_event(event("worker-0", "stopping"))
    failure = ExitRecord(1, RunState.FAILED, 1, now)
    assert crashed.check(Snapshot([failure], None, [], None)) == Verdict.WORKER_FAILED


def test_a_notice_takes_the_machine_back_unless_every_worker_had_succeeded(tmp_path: Path) -> None:
    """The bootstrap stopped the job at a preemption or maintenance notice, while the API may still call the machine
    READY: the job saved and stopped for the machine's end, so the machine is recreated and the job goes on."""
    now = time.time()
    stopped = Snapshot([ExitRecord(0, RunState.CANCELLED, 0, now)], None, [], None)
    machine = Machine(MachineState.RUNNING, "READY")
    assert not machine_end(machine, None, Verdict.FINISHED, stopped, 1).taken_back  # type: ignore[arg-type]
    noticed = machine_end(machine, None, Verdict.FINISHED, stopped, 1, "maintenance_notice")  # type: ignore[arg-type]
    assert noticed.taken_back and noticed.notice == "maintenance_notice"
    done = Snapshot([ExitRecord(0, RunState.SUCCEEDED, 0, now)], None, [], None)
    assert not machine_end(machine, None, Verdict.FINISHED, done, 1, "preemption_notice").taken_back  # type: ignore[arg-type]
    preempted = Machine(MachineState.PREEMPTED, "PREEMPTED")  # the API's word, when it has one, says what happened
    said = machine_end(preempted, None, Verdict.FINISHED, stopped, 1, "preemption_notice")  # type: ignore[arg-type]
    assert said.taken_back and said.notice is None


def test_a_worker_that_never_reports_is_lost_after_boot_timeout(tmp_path: Path) -> None:
    dog = pod(tmp_path)
    for w in (0, 1, 3):
        dog.on_event(event(f"bootstrap-{w}", "bootstrap_started"))
    snap = Snapshot([], None, [], None, heartbeats=beats(0, 1, 3))
    assert dog.check(snap) is None
    dog.ready_at -= 11
    assert dog.check(snap) == Verdict.WORKER_LOST
    assert dog.reason == "worker 2 sent no word within teardown.boot_timeout (10s) of the slice being up"
    silent = pod(tmp_path)  # no worker at all: the whole slice is silent (replaced once), not one worker lost
    silent.ready_at -= 11
    assert silent.check(Snapshot([], None, [], None)) == Verdict.SILENT


def test_a_worker_whose_heartbeat_stops_is_lost_by_the_runners_clock(tmp_path: Path) -> None:
    dog = pod(tmp_path, workers=2, stale_s=60)
    dog.on_event(event("worker-0", "worker_started"))
    frozen = beats(1, at=time.time() - 3600)[1]  # the VM's clock may be anything: only change counts
    assert dog.check(Snapshot([], None, [], None, heartbeats={**beats(0), 1: frozen})) is None
    dog._beats = {w: (t, seen - 61) for w, (t, seen) in dog._beats.items()}  # 61 s later, by the runner's clock
    later = beats(0, at=time.time() + 10)
    moving = Snapshot([], None, [], None, heartbeats={**later, 1: frozen})  # worker 0's changed, 1's did not
    assert dog.check(moving) == Verdict.WORKER_LOST
    assert dog.reason is not None and dog.reason.startswith("worker 1's heartbeat stopped")
    exited = Snapshot([ExitRecord(1, RunState.SUCCEEDED, 0, time.time())], None, [], None, heartbeats=moving.heartbeats)
    assert dog.check(exited) is None  # a worker that finished is not lost


@pytest.mark.parametrize(
    ("policy", "state", "delete"),
    [
        ("always", RunState.FAILED, True),
        ("on_success", RunState.FAILED, False),  # kept to debug
        ("on_success", RunState.TIMED_OUT, True),  # a safety stop never keeps a machine
        ("on_success", RunState.HUNG, True),
        ("on_success", RunState.CANCELLED, True),
        ("never", RunState.SUCCEEDED, False),
    ],
)
def test_teardown_policy(policy: str, state: RunState, delete: bool) -> None:
    assert should_delete(policy, state, attached=False) is delete
    assert should_delete(policy, state, attached=True) is False


def local_job(tmp_path: Path, script: str, teardown: str) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(
        textwrap.dedent(f"""\
        name: hang
        image: trainer:test
        command: [{json.dumps(sys.executable)}, "-c", {json.dumps(script)}]
        storage: {tmp_path / "store"}
        teardown: {{{teardown}}}
        """)
    )
    return path


def test_a_job_without_progress_is_stopped_as_hung(tmp_path: Path, runner_home: Path) -> None:
    """Output counts as progress for a command; once it stops for hang_timeout, the job is stopped as hung."""
    script = "import time\nfor i in range(3):\n    print('step', i, flush=True); time.sleep(1)\ntime.sleep(300)"
    t0 = time.monotonic()
    done = subprocess.run(
        [*RUNNER, "submit", str(local_job(tmp_path, script, "hang_timeout: 10")), "--local"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    took = time.monotonic() - t0
    assert done.returncode == 6, done.stdout + done.stderr
    assert "hung" in done.stdout and "no progress for" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr
    assert took < 60, f"the hung job was stopped only after {took:.0f}s"
    (record_path,) = (runner_home / "runs").glob("*.json")
    assert json.loads(record_path.read_text())["state"] == "hung"


def test_time_out_of_sight_of_the_run_directory_is_no_evidence(tmp_path: Path) -> None:
    """While the run directory cannot be read, the judgements that hang on it (a silent boot, a heartbeat that
    stopped changing) do not advance: their clock stands still. The runner's own deadline does not wait."""
    from runner.errors import StorageUnreachable
    from runner.watch.follow import Sight

    said: list[str] = []
    sight = Sight(said.append, 0.1)
    plan = plan_with(tmp_path, "boot_timeout: 10, max_runtime: 600")
    dog = Watchdog(plan, Machine(), None, status_every_s=3600, sight=sight)
    sight.lost(StorageUnreachable("no answer"))
    dog.ready_at -= 5
    blind_at = sight.clock()
    time.sleep(0.3)
    assert sight.clock() == pytest.approx(blind_at, abs=0.01)  # stands still while blind
    assert dog.check(snapshot()) is None
    sight.back()
    assert "The run's state is unknown, not over" in said[0] and said[-1].startswith("the run directory can be read")
    dog.ready_at -= 6  # 11 s of sight in all: now it is silent
    assert dog.check(snapshot()) == Verdict.SILENT
    dog.plan = dataclasses.replace(plan, deadline=time.time() - 1)
    sight.lost(StorageUnreachable("no answer"))
    assert dog.check(snapshot()) == Verdict.DEADLINE


def test_the_api_s_word_on_the_machine_is_shown_as_it_changes(tmp_path: Path) -> None:
    machine = Machine(native="READY")
    said: list[str] = []
    dog = Watchdog(plan_with(tmp_path, "max_runtime: 600"), machine, None, status_every_s=0, say=said.append)
    dog.on_event(event("worker-0", "worker_started"))
    for native in ("READY", "REPAIRING", "REPAIRING", "HIDDEN", "UNKNOWN", "READY"):
        machine.native = native
        assert dog.check(snapshot()) is None  # none of them is gone: the job may well go on
    assert said == [
        "the test's machine: REPAIRING (Cloud TPU is repairing it; the job may be restarted on it)",
        "the test's machine: HIDDEN (hidden by Cloud TPU; the job does not run while it is)",
        "the test's machine: UNKNOWN (the API does not say what it is doing)",
        "the test's machine: READY (back)",
    ]
    machine.state, machine.native = MachineState.STOPPED, "STOPPED"
    assert dog.check(snapshot()) == Verdict.MACHINE_GONE
    assert "was STOPPED before its job ended" in dog.gone_reason()
