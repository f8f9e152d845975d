"""The fault-injection suite (the `faults` package): its measurements on hand-made inputs, the table, the flaky
Cloud Storage proxy, and the quick cases end to end through the real `runner submit` on the two emulators."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from faults import measure, table
from faults.__main__ import main as faults_main
from faults.measure import Attempt, Observed, Request, StepsLost
from faults.result import RunResult
from faults.scenarios import CASES, case_named
from faults.suite import Suite
from runner.spec.loader import load_spec
from runner.storage import open_storage
from tests.conftest import FAST_TIMINGS
from tpu_emulator.flaky_proxy import FlakyProxy, upload_object_name

# Three attempts, as the trainer logs them: the first stopped mid-epoch 3 (an exact checkpoint); the second, given a
# torn newest checkpoint, skipped it and resumed from the epoch-2 one, then was killed without a word; the third
# found latest.json unreadable and resumed from the newest file by scanning.
LOG = """\
[trainer] strategy: DefaultStrategy on CPU, 1 replica
[trainer] data: gs://b/mnist.npz: 2048 train, 256 test; global batch 128 = 128 per replica x 1; 16 steps/epoch
Epoch 1/5 16/16 - 1.8s - loss: 1.0 - 1107 ex/s
Epoch 2/5 8/16 [==============>...............] loss: 0.4 - 900 ex/s
Epoch 2/5 16/16 - 0.2s - loss: 0.3 - 8593 ex/s
Epoch 3/5 5/16 [====>.........................] loss: 0.3 - 900 ex/s
[trainer] SIGTERM: saving a checkpoint at the next step end
[trainer] SIGTERM: saved ckpt-000002-s000005.keras at epoch 3 step 5 of 16 (global step 37)
[trainer] stopped before the end; the newest checkpoint is kept for a resume
[trainer] skipping ckpt-000002-s000005.keras: size mismatch (manifest 900 bytes, file 450 bytes)
[trainer] strategy: DefaultStrategy on CPU, 1 replica
[trainer] data: gs://b/mnist.npz: 2048 train, 256 test; global batch 128 = 128 per replica x 1; 16 steps/epoch
[trainer] resumed from ckpt-000002.keras: epoch 2 done, optimizer step 32
Epoch 3/5 16/16 - 0.2s - loss: 0.2 - 8267 ex/s
Epoch 4/5 16/16 - 0.2s - loss: 0.2 - 8267 ex/s
[trainer] checkpoints/latest.json is unreadable: not JSON (Expecting value); scanning checkpoints/ instead
[trainer] strategy: DefaultStrategy on CPU, 1 replica
[trainer] data: gs://b/mnist.npz: 2048 train, 256 test; global batch 128 = 128 per replica x 1; 16 steps/epoch
[trainer] resumed from ckpt-000004-s000003.keras: epoch 5 step 3 of 16 (global step 67)
Epoch 5/5 16/16 - 0.2s - loss: 0.1 - 8267 ex/s - resumed at step 3
[trainer] done: test accuracy 0.9492
"""


# -- measurements ------------------------------------------------------------------------------------------------


def test_attempts_are_split_where_the_trainer_starts_with_what_each_resumed_from() -> None:
    attempts = measure.parse_attempts(LOG)
    assert attempts == [
        Attempt(None, (1, 2), 0, 37, True, 16),
        Attempt("ckpt-000002.keras", (3, 4), 32, None, False, 16,
                (("ckpt-000002-s000005.keras", "size mismatch (manifest 900 bytes, file 450 bytes)"),)),
        Attempt("ckpt-000004-s000003.keras", (5,), 67, None, False, 16, (), "unreadable"),
    ]  # fmt: skip
    assert [a.position for a in attempts] == [(0, 0), (2, 0), (4, 3)]
    assert measure.epochs_redone(attempts) == 0
    assert measure.partial_epochs(attempts, epochs=5) == 2
    assert measure.parse_attempts("no trainer here\nEpoch 1/1 1/1 - 0.1s\n") == []
    assert [measure.recovered_from(a) for a in attempts[1:]] == [
        "ckpt-000002 (skipped ckpt-000002-s000005: size mismatch)",
        "ckpt-000004-s000003 (latest.json unreadable: scanned)",
    ]
    assert measure.recovered_from(Attempt()) == "scratch"


def test_steps_lost_from_the_stop_lines_else_a_lower_bound_from_the_bucket() -> None:
    attempts = measure.parse_attempts(LOG)
    # 1 -> 2: stopped at global step 37, the next went on from 32 (the torn checkpoint's 5 steps again). 2 -> 3:
    # killed without a word; the bucket showed step 70 at most, the next went on from 67: at least 3.
    assert measure.steps_lost(attempts, [37, 70, None]) == [StepsLost(5, True), StepsLost(3, False)]
    assert [str(s) for s in measure.steps_lost(attempts, [37, None])] == ["5", ">=0"]  # epoch 4 ended at 64 < 67
    # A stop between two epochs' fits has no step line: the attempt stopped where its last epoch ended.
    quiet = [Attempt(None, (1, 2), 0, None, True, 16), Attempt("ckpt-000002.keras", (3,), 32)]
    assert measure.steps_lost(quiet, [40]) == [StepsLost(0, True)]
    seen = [Observed(1.0, 10), Observed(4.0, 30), Observed(6.0, 35), Observed(9.0, 50)]
    assert measure.reached_per_attempt(seen, [5.0]) == [30, 50]


def test_a_checkpoint_in_the_bucket_that_the_restart_skipped_is_lost() -> None:
    attempts = measure.parse_attempts(LOG)
    # Positions as first seen in the bucket; restarts (worker_started) at t=10 and t=20.
    first_seen = {(1, 0): 3.0, (2, 0): 5.0, (2, 5): 9.0, (3, 0): 14.0, (4, 0): 17.0, (4, 3): 19.0}
    # Restart 1 resumed from (2, 0) though (2, 5) was there: lost. Restart 2 resumed from (4, 3): nothing newer.
    assert measure.checkpoints_lost(attempts, [10.0, 20.0], first_seen) == 1
    # ... unless the case tore (2, 5) itself: then the skip is right.
    assert measure.checkpoints_lost(attempts, [10.0, 20.0], first_seen, destroyed={(2, 5)}) == 0
    # Had (4, 3) arrived after the second restart, only the torn one counts.
    assert measure.checkpoints_lost(attempts, [10.0, 20.0], {**first_seen, (4, 5): 25.0}, destroyed={(2, 5)}) == 0
    # At the end: the bucket's manifest must name the last epoch trained, and the file it names must be there.
    assert measure.checkpoints_lost(attempts, [10.0, 20.0], {}, final_epoch=4) == 1
    assert measure.checkpoints_lost(attempts, [], {}, final_epoch=5, final_ok=False) == 1


def _req(t: float, method: str, path: str, status: int = 200, node_id: str | None = None, caller: str = "runner"):  # type: ignore[no-untyped-def]
    return Request(t, method, path, status, node_id, caller)


NODES = "/v2/projects/p/locations/us-central1-b/nodes"
NODE = "projects/p/locations/us-central1-b/nodes/run"


def test_idle_runs_from_the_job_end_to_the_first_delete_of_that_node_that_went_through() -> None:
    requests = [
        _req(0.0, "POST", NODES, 429, "run"),  # refused: not a node
        _req(1.0, "POST", NODES, 200, "run"),
        _req(5.5, "DELETE", f"{NODES}/run", 503, caller="vm"),
        _req(6.5, "DELETE", f"{NODES}/run", 200, caller="vm"),
        _req(7.0, "DELETE", f"{NODES}/run", 404),
        _req(10.0, "POST", NODES, 200, "run"),
        _req(22.0, "DELETE", f"{NODES}/run", 200),
        _req(30.0, "POST", NODES, 200, "run"),
    ]
    ends = [
        {"time": 5.0, "event": "container_exited", "exit_code": 143, "shutdown": True},
        {"time": 20.0, "event": "container_exited", "exit_code": 0},
        {"time": 35.0, "event": "image_pull_failed"},
    ]
    idle = measure.idle_intervals(ends, requests, preemptions=[4.0])
    assert [(i.seconds, i.preempted, i.deleted_by) for i in idle] == [
        (1.5, True, "vm"),
        (2.0, False, "runner"),
        (None, False, None),
    ]
    assert idle[2].by == "image_pull_failed"
    assert measure.node_lifetimes(requests) == [(t, NODE) for t in (1.0, 10.0, 30.0)]
    # A delete whose operation failed (the node came back, billing) does not end the idle time; the next one does.
    retried = [*requests[:5], _req(9.0, "DELETE", f"{NODES}/run", 200)]
    assert measure.idle_intervals(ends[:1], retried, failed_deletes=[(6.6, NODE)])[0].seconds == 4.0


def test_idle_from_the_run_directory_events_alone() -> None:
    events = [
        {"time": 1.0, "event": "container_started"},
        {"time": 4.0, "event": "container_exited"},
        {"time": 4.5, "event": "delete_requested"},
        {"time": 9.0, "event": "container_exited"},
        {"time": 12.0, "event": "teardown_requested"},
    ]
    assert measure.idle_from_events(events) == [0.5, 3.0]


# -- the table ---------------------------------------------------------------------------------------------------


def _result(**kw: Any) -> RunResult:
    base: dict[str, Any] = dict(
        case="c",
        fault="a fault",
        expected="succeeded",
        got="succeeded",
        exit_code=0,
        expected_exit=0,
        as_expected=True,
        nodes_leaked=0,
        checkpoints_lost=None,
        epochs_redone=None,
        partial_epochs=None,
    )
    return RunResult(**{**base, **kw})


def test_the_table_folds_repeated_runs_of_a_case_into_one_row() -> None:
    trained = dict(case="p", fault="preempt", checkpoints_lost=0, partial_epochs=2, recovered=["ckpt-000002"])
    results = [
        _result(**trained, epochs_redone=0, idle_s=[0.4], idle_preempted_s=[1.2], run_id="r1",
                steps_lost=[StepsLost(0, True), StepsLost(3, False)]),
        _result(**trained, epochs_redone=1, idle_s=[0.3], run_id="r2", steps_lost=[StepsLost(0, True)]),
        _result(case="x", fault="crash", expected="failed", got="succeeded", as_expected=False, idle_s=[None],
                run_id="r3"),
        _result(case="r", fault="refused", expected="rejected", got="rejected", others_nodes=1),
    ]  # fmt: skip
    rows = table.summarize(results)
    assert rows[0]["runs"] == "2" and rows[0]["as expected"] == "yes"
    assert rows[0]["epochs re-done"] == "1 (+4 partial)" and rows[0]["ckpts lost"] == "0"
    assert rows[0]["steps lost"] == "0, >=3 | 0" and rows[0]["recovered from"] == "ckpt-000002"
    assert rows[0]["idle billable s"] == "max 1.2, 1.2 0.3"
    assert rows[1]["terminal state (expected)"] == "succeeded (failed)" and rows[1]["as expected"] == "NO (0/1)"
    assert rows[1]["idle billable s"] == "never (1 never deleted)" and rows[1]["ckpts lost"] == "-"
    assert rows[1]["steps lost"] == "-" and rows[1]["recovered from"] == "-"
    assert rows[2]["idle billable s"] == "-" and rows[2]["nodes leaked"] == "0 (+1 not ours)"
    text = table.render_table(rows)
    lines = text.splitlines()
    assert lines[0].startswith("fault") and set(lines[1]) <= {"-", " "}
    assert lines[0].index("runs") == lines[1].index(" ") + 2  # columns line up
    assert "NO (0/1)" in text
    assert table.longest_idle(results) == (1.2, "p (preempted VM), run r1")
    assert "longest idle billable time: 1.2s" in table.report(results)
    assert [r.ok for r in results] == [True, True, False, True]


def test_every_case_is_a_valid_job_spec(tmp_path: Path) -> None:
    names = [c.name for c in CASES]
    assert len(names) == len(set(names))
    for case in CASES:
        path = tmp_path / f"{case.name}.yaml"
        path.write_text(case.spec_yaml("gs://runner-test/x", "gs://runner-test/data/mnist.npz"))
        spec = load_spec(path)
        assert (spec.training is not None) == case.trains, case.name
    assert case_named("503-burst").fast and case_named("preempt-mid-epoch").reference
    with pytest.raises(KeyError):
        case_named("nope")


def test_the_command_line_lists_the_cases(capsys: pytest.CaptureFixture[str]) -> None:
    assert faults_main(["--list"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in listed] == [c.name for c in CASES]
    assert sum(line.endswith("(fast)") for line in listed) == sum(c.fast for c in CASES)
    with pytest.raises(SystemExit):
        faults_main(["--only", "nope"])


# -- the flaky proxy ---------------------------------------------------------------------------------------------


def test_the_object_name_of_each_kind_of_upload() -> None:
    multipart = b'--b\r\ncontent-type: application/json\r\n\r\n{"name": "run/checkpoints/ckpt-000001.keras"}\r\n--b\r\n'
    assert upload_object_name("POST", "/upload/storage/v1/b/x/o?uploadType=multipart", multipart) == (
        "run/checkpoints/ckpt-000001.keras"
    )
    assert upload_object_name("POST", "/upload/storage/v1/b/x/o?uploadType=media&name=a%2Fb", b"data") == "a/b"
    assert upload_object_name("POST", "/upload/storage/v1/b/x/o?uploadType=resumable", b'{"name": "r"}') == "r"
    assert upload_object_name("GET", "/storage/v1/b/x/o/a", b"") is None
    assert upload_object_name("POST", "/storage/v1/b/x/o/a/rewriteTo/b/x/o/c", b"{}") is None


def test_the_proxy_fails_the_next_matching_uploads_and_the_client_retries(
    gcs_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with FlakyProxy(gcs_server) as proxy:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
        proxy.fail_uploads(r"/checkpoints/", count=2)
        store = open_storage("gs://runner-test/proxy-test")
        blob = tmp_path / "ckpt.keras"
        blob.write_bytes(os.urandom(300_000))
        store.upload_file(blob, "checkpoints/ckpt-000001.keras")  # google-cloud-storage retries the 503s
        store.write_bytes("events/runner.jsonl", b"{}\n")  # not a checkpoint: passes at once
        assert store.read_bytes("checkpoints/ckpt-000001.keras") == blob.read_bytes()
        injected = proxy.injected
        assert [(r.status, Path(r.object_name or "").name) for r in injected] == [(503, "ckpt-000001.keras")] * 2
        assert sum(1 for r in proxy.requests if r.object_name and r.object_name.endswith("runner.jsonl")) == 1
        # Any request, by method and path: one 503 to a read, which the client retries too.
        proxy.fail_requests(r"/o/proxy-test/events/runner\.jsonl", 1, method="GET")
        assert store.read_bytes("events/runner.jsonl") == b"{}\n"
        assert [r.method for r in proxy.injected][-1] == "GET" and len(proxy.injected) == 3
        # Held-back answers: what the caller learns is what was true when it asked.
        proxy.slow_answers(r"prefix=proxy-test/exit/", 0.3)
        assert store.list("exit/") == []
    with pytest.raises(ValueError):
        FlakyProxy("https://example.com")


# -- end to end: the quick cases ----------------------------------------------------------------------------------


# Cases that are quick when they pass but that the runner does not pass yet (docs/faults.md, "Open findings").
@pytest.fixture
def suite(storage_emulator, tmp_path: Path, mnist_npz: Path):  # type: ignore[no-untyped-def]
    with Suite(
        tmp_path / "faults",
        gcs_endpoint=storage_emulator.endpoint,
        bucket="runner-test",
        mnist=mnist_npz,
        timings=FAST_TIMINGS,
        storage_server=storage_emulator,
    ) as s:
        yield s


@pytest.mark.parametrize(
    "name",
    [c.name for c in CASES if c.fast and not c.on_cluster],  # the gke rows: tests/backends/gke/test_fault_rows.py
)
def test_quick_case_ends_as_expected_and_leaks_nothing(suite, name: str) -> None:  # type: ignore[no-untyped-def]
    result = run_quick_case(suite, name)
    assert all(v is not None for v in result.idle_s), "a node was never deleted"


def run_quick_case(suite: Suite, name: str) -> RunResult:
    """The case once, held to what every quick case is (its state and exit code, no problem, nothing leaked)."""
    case = case_named(name)
    result = suite.run_case(case)
    print(table.report([result]))
    # The idle billable time is reported, not asserted: this machine is shared. Everything else is.
    problems = [p for p in result.problems if f"goal <= {table.IDLE_GOAL_S:.0f}s" not in p]
    assert (result.got, result.exit_code, problems) == (case.expect or "rejected", case.exit, [])
    assert result.nodes_leaked == 0
    assert json.loads((suite.workdir / f"{name}-1" / "result.json").read_text())["case"] == name
    return result


# `preemption-x2` (two spot preemptions: no checkpoint lost, no step or epoch trained twice) runs only in
# `python -m faults`: its full-size epochs take over a minute and a half. The suite keeps the same promise, measured
# with the same faults.measure on the trainer log, in tests/backends/test_tpu_vm.py::
# test_preemptions_recreate_the_node_and_training_resumes_losing_nothing, on epochs small enough for a test.


def test_the_proxy_makes_cloud_storage_unreachable_and_counts_what_is_sent(gcs_server: str) -> None:
    import requests

    with FlakyProxy(gcs_server) as proxy:
        health = f"{proxy.url}/storage/v1/b/runner-test"
        assert requests.get(health, timeout=5).status_code == 200
        proxy.outage("reset")
        with pytest.raises(requests.ConnectionError):
            requests.get(health, timeout=5)
        proxy.heal()
        proxy.outage("blackhole", seconds=1.0)
        t0 = time.monotonic()
        with pytest.raises(requests.ConnectionError) as dropped:  # no answer: dropped once the black hole closes,
            requests.get(health, timeout=60)  # long before the client would give up (that would be a Timeout)
        assert time.monotonic() - t0 > 0.9 and not isinstance(dropped.value, requests.Timeout)
        assert requests.get(health, timeout=5).status_code == 200  # over by itself
        requests.post(
            f"{proxy.url}/upload/storage/v1/b/runner-test/o?uploadType=media&name=x", data=b"12345", timeout=5
        )
    assert [r.status for r in proxy.requests] == [200, 0, 0, 200, 200]
    assert proxy.requests[-1].size == 5 and proxy.requests[-1].object_name == "x"


def test_billed_spans_come_from_the_api_s_own_timestamps() -> None:
    node = "projects/p/locations/z/nodes/n"
    ops = [
        measure.ApiOperation("create", node, 100.0, 130.0, failed=False),
        measure.ApiOperation("delete", node, 150.0, 153.0, failed=True),  # back READY: still billing
        measure.ApiOperation("delete", node, 160.0, 170.0, failed=False),
        measure.ApiOperation("create", node, 200.0, 230.0, failed=False),  # a recreated node, never deleted
    ]
    assert measure.billed_spans(ops, node) == [(130.0, 160.0), (230.0, None)]
