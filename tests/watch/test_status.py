"""How a run's state is derived from its exit records, the runner's record and the heartbeat (pure logic), and
how a run directory is read whatever its files hold."""

from __future__ import annotations

import dataclasses
import json
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runner import contract
from runner.collect.figures import metrics_text
from runner.collect.summary import summary_rows
from runner.storage import open_storage
from runner.watch.events import read_events
from runner.watch.rundir import ExitRecord, Heartbeat, Snapshot, read_snapshot
from runner.watch.state import RunState, derive_state

_FILES = [contract.SUMMARY, contract.METRICS, contract.HEARTBEAT, "exit/worker-0.json", "events/worker-0.jsonl"]
# The fields the readers look for, so that the fuzzer reaches past "missing key" into "wrong type".
_KEYS = [
    "worker",
    "state",
    "exit_code",
    "finished_at",
    "tail",
    "error",
    "time",
    "phase",
    "source",
    "event",
    "epoch",
    "accuracy",
    "val_accuracy",
    "epoch_time_s",
    "test_accuracy",
    "test_loss",
    "strategy",
    "name",
    "kind",
    "versions",
    "keras",
    "checkpoint",
    "epoch_times_s",
    "examples_per_s",
    "model",
    "resumed_from_epoch",
]


def snap(*states: str, heartbeat_age: float | None = None, phase: str = "running") -> Snapshot:
    exits = [ExitRecord(i, RunState(s), 0 if s == "succeeded" else 1, time.time()) for i, s in enumerate(states)]
    beat = None if heartbeat_age is None else Heartbeat(time.time() - heartbeat_age, phase=phase)
    return Snapshot(exits, beat, [], None)


def state(s: Snapshot, workers: int = 1, recorded: RunState = RunState.STARTING, alive: bool | None = None) -> RunState:
    return derive_state(s, workers, recorded, machine_alive=alive, heartbeat_timeout_s=30)


def test_exit_records_decide() -> None:
    assert state(snap("succeeded")) == RunState.SUCCEEDED
    assert state(snap("failed")) == RunState.FAILED


def test_worst_worker_names_the_run() -> None:
    assert state(snap("succeeded", "failed"), workers=2) == RunState.FAILED
    assert state(snap("succeeded", "cancelled", "timed_out"), workers=3) == RunState.CANCELLED


def test_a_worker_stopped_by_its_peers_is_stopped_with_the_others_and_failed_alone() -> None:
    """JAX's preemption sync: worker 1 learns of the stop from its peer and exits 143 before its own supervisor is
    told (a peer_stop record). While another worker was stopped, it counts as stopped with it; with no other stop
    it is a failure (a job that stopped alone), and a real failure stays one."""
    now = time.time()
    cancelled = ExitRecord(0, RunState.CANCELLED, 143, now)
    peer = ExitRecord(1, RunState.CANCELLED, 143, now, peer_stop=True)
    assert state(Snapshot([cancelled, peer], None, [], None), workers=2) == RunState.CANCELLED
    hung = ExitRecord(0, RunState.HUNG, 124, now)
    assert state(Snapshot([hung, peer], None, [], None), workers=2) == RunState.HUNG
    alone = ExitRecord(0, RunState.SUCCEEDED, 0, now)
    assert state(Snapshot([alone, peer], None, [], None), workers=2) == RunState.FAILED
    assert state(Snapshot([peer, dataclasses.replace(peer, worker=0)], None, [], None), workers=2) == RunState.FAILED
    crashed = ExitRecord(1, RunState.FAILED, 1, now)
    assert state(Snapshot([cancelled, crashed], None, [], None), workers=2) == RunState.FAILED
    raw = json.loads(json.dumps(peer.to_json()))
    assert ExitRecord.from_json(raw) == peer and not ExitRecord.from_json({**raw, "peer_stop": "yes"}).peer_stop


def test_one_failed_worker_ends_a_multi_worker_run_early() -> None:
    assert state(snap("failed", heartbeat_age=1), workers=4) == RunState.FAILED
    assert state(snap("succeeded", heartbeat_age=1), workers=4) == RunState.RUNNING


def test_recorded_terminal_state_without_exit_records() -> None:
    assert state(snap(), recorded=RunState.CANCELLED) == RunState.CANCELLED


def test_the_runners_verdict_stands_but_lost_can_be_overturned() -> None:
    # Given up after its last preemption: the workers recorded `cancelled` as the VM shut down.
    assert state(snap("cancelled"), recorded=RunState.FAILED) == RunState.FAILED
    assert state(snap("failed"), recorded=RunState.CANCELLED) == RunState.CANCELLED
    # Declared lost, then the machine's records arrived after all.
    assert state(snap("succeeded"), recorded=RunState.LOST) == RunState.SUCCEEDED


@pytest.mark.parametrize(
    ("age", "alive", "expected"),
    [
        (1, None, RunState.RUNNING),
        (300, None, RunState.STARTING),
        (None, True, RunState.STARTING),
        (300, True, RunState.RUNNING),
        (300, False, RunState.LOST),
        (None, False, RunState.LOST),
    ],
)
def test_heartbeat_and_machine(age: float | None, alive: bool | None, expected: RunState) -> None:
    assert state(snap(heartbeat_age=age), alive=alive) == expected


def test_exited_heartbeat_is_not_alive() -> None:
    assert state(snap(heartbeat_age=1, phase="exited"), alive=False) == RunState.LOST


def test_terminal_states() -> None:
    assert {s for s in RunState if s.is_terminal()} == {
        RunState.SUCCEEDED,
        RunState.FAILED,
        RunState.CANCELLED,
        RunState.TIMED_OUT,
        RunState.HUNG,
        RunState.LOST,
    }


# -- reading a run directory whatever its files hold --------------------------------------------------------------

_JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(_KEYS) | st.text(max_size=5), inner),
    max_leaves=8,
)
_CONTENT = st.one_of(
    st.binary(max_size=60),
    _JSONISH.map(lambda v: json.dumps(v).encode()),
    st.lists(_JSONISH.map(json.dumps), max_size=4).map(lambda lines: "\n".join(lines).encode()),
)


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(_FILES), _CONTENT)
def test_any_file_content_reads_as_a_snapshot_or_a_named_problem(key: str, data: bytes) -> None:
    """Whatever bytes a run file holds, reading and showing the run never raises; a problem names its file."""
    with tempfile.TemporaryDirectory() as tmp:  # one per example: tmp_path would carry files from one to the next
        _read_and_show(Path(tmp) / "run", key, data)


def _read_and_show(run_dir: Path, key: str, data: bytes) -> None:
    path = run_dir / key
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    storage = open_storage(str(run_dir))
    problems: list[str] = []
    snapshot = read_snapshot(storage)
    events = read_events(storage, problems)
    assert all(str(path) in p for p in [*snapshot.problems, *problems])
    state(snapshot, recorded=RunState.RUNNING)  # derive_state copes with what read_snapshot kept
    summary_rows(str(run_dir), RunState.SUCCEEDED, snapshot)
    for line in snapshot.metrics:
        metrics_text(line)
    assert all(isinstance(e.time, float) for e in events)


def test_a_slices_logs_are_read_line_by_line_with_a_worker_prefix(tmp_path: Path) -> None:
    from runner.watch.follow import LogTail, LogTails, tail_for, whole_logs

    store = open_storage(str(tmp_path / "run"))
    store.write_bytes(contract.log_key(0), b"zero a\nzero b (half")
    store.write_bytes(contract.log_key(1), b"one a\n")
    tails = tail_for(store, 2)
    assert isinstance(tails, LogTails) and isinstance(tail_for(store, 1), LogTail)
    assert tails.read_new() == b"[worker 0] zero a\n[worker 1] one a\n"  # a half-written line waits for its end
    store.write_bytes(contract.log_key(0), b"zero a\nzero b (half), whole\n")
    assert tails.read_new() == b"[worker 0] zero b (half), whole\n"
    store.write_bytes(contract.log_key(1), b"one a\nlast words, no newline")
    assert tails.read_new(flush=True) == b"[worker 1] last words, no newline\n"
    assert whole_logs(store, 2).splitlines() == [
        b"[worker 0] zero a",
        b"[worker 0] zero b (half), whole",
        b"[worker 1] one a",
        b"[worker 1] last words, no newline",
    ]


def test_each_workers_heartbeat_is_read_from_its_own_file(tmp_path: Path) -> None:
    store = open_storage(str(tmp_path / "run"))
    for worker in (0, 2):
        beat = {"time": 100.0 + worker, "phase": "running", "worker": worker}
        store.write_bytes(contract.heartbeat_key(worker), json.dumps(beat).encode())
    store.write_bytes("heartbeats/worker-x.json", b"{}")  # not a worker's: ignored
    store.write_bytes(contract.heartbeat_key(3), b"not json")  # a problem, reported, not an exception
    snapshot = read_snapshot(store)
    assert {w: b.time for w, b in snapshot.heartbeats.items()} == {0: 100.0, 2: 102.0}
    assert any("worker-3" in problem for problem in snapshot.problems)
