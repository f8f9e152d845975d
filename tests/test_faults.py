"""The fault-injection suite (scripts/faults.py): its measurements on hand-made inputs, the flaky Cloud Storage
proxy, and the quick cases end to end through the real `runner submit` on the two emulators."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

from runner.emulator.flaky_proxy import FlakyProxy, upload_object_name
from runner.specfile import load_spec
from runner.storage import open_storage

REPO = Path(__file__).resolve().parent.parent


def _load_faults():  # type: ignore[no-untyped-def]
    name = "runner_faults_script"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / "faults.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


faults = _load_faults()

LOG = """\
[trainer] strategy: DefaultStrategy on CPU, 1 replica
[trainer] data: gs://b/mnist.npz: 2048 train
Epoch 1/5 16/16 - 1.8s - loss: 1.0 - 1107 ex/s
Epoch 2/5 8/16 [==============>...............] loss: 0.4 - 900 ex/s
Epoch 2/5 16/16 - 0.2s - loss: 0.3 - 8593 ex/s
Epoch 3/5 5/16 [====>.........................] loss: 0.3 - 900 ex/s
[trainer] SIGTERM: stopping after this step
[trainer] strategy: DefaultStrategy on CPU, 1 replica
[trainer] resumed from ckpt-000002.keras: epoch 2 done, optimizer step 32
Epoch 3/5 16/16 - 0.2s - loss: 0.2 - 8267 ex/s
Epoch 4/5 16/16 - 0.2s - loss: 0.2 - 8267 ex/s
[trainer] strategy: DefaultStrategy on CPU, 1 replica
[trainer] resumed from ckpt-000003.keras: epoch 3 done, optimizer step 48
Epoch 4/5 16/16 - 0.2s - loss: 0.2 - 8267 ex/s
Epoch 5/5 16/16 - 0.2s - loss: 0.1 - 8267 ex/s
[trainer] done: test accuracy 0.9492
"""


# -- measurements ------------------------------------------------------------------------------------------------


def test_attempts_are_split_where_the_trainer_starts_and_epoch_ends_counted() -> None:
    attempts = faults.parse_attempts(LOG)
    assert attempts == [
        faults.Attempt(None, (1, 2)),
        faults.Attempt(2, (3, 4)),
        faults.Attempt(3, (4, 5)),
    ]
    assert faults.epochs_redone(attempts) == 1  # epoch 4 twice: the third attempt resumed from 3, not 4
    assert faults.partial_epochs(attempts, epochs=5) == 2
    assert faults.parse_attempts("no trainer here\nEpoch 1/1 1/1 - 0.1s\n") == []


def test_a_checkpoint_in_the_bucket_that_the_restart_skipped_is_lost() -> None:
    attempts = faults.parse_attempts(LOG)
    # ckpt 4 reached the bucket (t=19) before the third attempt started (t=20), which resumed from 3: lost.
    first_seen = {1: 3.0, 2: 5.0, 3: 14.0, 4: 19.0, 5: 30.0}
    assert faults.checkpoints_lost(attempts, [10.0, 20.0], first_seen) == 1
    # Had ckpt 4 arrived only after the restart, nothing was lost.
    assert faults.checkpoints_lost(attempts, [10.0, 20.0], {**first_seen, 4: 25.0}) == 0
    # At the end: the bucket's manifest must name the last epoch trained, and the file it names must be there.
    assert faults.checkpoints_lost(attempts, [10.0, 20.0], {**first_seen, 4: 25.0}, final_epoch=4) == 1
    assert faults.checkpoints_lost(attempts, [], {}, final_epoch=5, final_ok=False) == 1


def _req(t: float, method: str, path: str, status: int = 200, node_id: str | None = None, caller: str = "runner"):  # type: ignore[no-untyped-def]
    return faults.Request(t, method, path, status, node_id, caller)


NODES = "/v2/projects/p/locations/us-central1-b/nodes"


def test_idle_runs_from_the_job_end_to_the_first_accepted_delete_of_that_node() -> None:
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
    idle = faults.idle_intervals(ends, requests, preemptions=[4.0])
    assert [(i.seconds, i.preempted, i.deleted_by) for i in idle] == [
        (1.5, True, "vm"),
        (2.0, False, "runner"),
        (None, False, None),
    ]
    assert idle[2].by == "image_pull_failed"
    assert faults.node_lifetimes(requests) == [
        (t, "projects/p/locations/us-central1-b/nodes/run") for t in (1.0, 10.0, 30.0)
    ]


def test_idle_from_the_run_directory_events_alone() -> None:
    events = [
        {"time": 1.0, "event": "container_started"},
        {"time": 4.0, "event": "container_exited"},
        {"time": 4.5, "event": "delete_requested"},
        {"time": 9.0, "event": "container_exited"},
        {"time": 12.0, "event": "teardown_requested"},
    ]
    assert faults.idle_from_events(events) == [0.5, 3.0]


def _result(**kw):  # type: ignore[no-untyped-def]
    base = dict(
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
    return faults.RunResult(**{**base, **kw})


def test_the_table_folds_repeated_runs_of_a_case_into_one_row() -> None:
    results = [
        _result(
            case="p",
            fault="preempt",
            checkpoints_lost=0,
            epochs_redone=0,
            partial_epochs=2,
            idle_s=[0.4],
            idle_preempted_s=[1.2],
            run_id="r1",
        ),
        _result(
            case="p", fault="preempt", checkpoints_lost=0, epochs_redone=1, partial_epochs=2, idle_s=[0.3], run_id="r2"
        ),
        _result(
            case="x", fault="crash", expected="failed", got="succeeded", as_expected=False, idle_s=[None], run_id="r3"
        ),
        _result(case="r", fault="refused", expected="rejected", got="rejected"),
    ]
    rows = faults.summarize(results)
    assert rows[0]["runs"] == "2" and rows[0]["as expected"] == "yes"
    assert rows[0]["epochs re-done"] == "1 (+4 partial)" and rows[0]["ckpts lost"] == "0"
    assert rows[0]["idle billable s"] == "max 1.2, 1.2 0.3"
    assert rows[1]["terminal state (expected)"] == "succeeded (failed)" and rows[1]["as expected"] == "NO (0/1)"
    assert rows[1]["idle billable s"] == "never (1 never deleted)" and rows[1]["ckpts lost"] == "-"
    assert rows[2]["idle billable s"] == "-"
    text = faults.render_table(rows)
    lines = text.splitlines()
    assert lines[0].startswith("fault") and set(lines[1]) <= {"-", " "}
    assert lines[0].index("runs") == lines[1].index(" ") + 2  # columns line up
    assert "NO (0/1)" in text
    assert faults.longest_idle(results) == (1.2, "p (preempted VM), run r1")
    report = faults.report(results)
    assert "longest idle billable time: 1.2s" in report


def test_every_case_is_a_valid_job_spec(tmp_path: Path) -> None:
    names = [c.name for c in faults.CASES]
    assert len(names) == len(set(names))
    for case in faults.CASES:
        path = tmp_path / f"{case.name}.yaml"
        path.write_text(case.spec_yaml("gs://runner-test/x", "gs://runner-test/data/mnist.npz"))
        spec = load_spec(path)
        assert (spec.training is not None) == case.train, case.name
    assert faults.case_named("503-burst").fast
    with pytest.raises(KeyError):
        faults.case_named("nope")


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


@pytest.fixture
def suite(gcs_server: str, tmp_path: Path, mnist_npz: Path):  # type: ignore[no-untyped-def]
    with faults.Suite(tmp_path / "faults", gcs_endpoint=gcs_server, bucket="runner-test", mnist=mnist_npz) as s:
        yield s


@pytest.mark.parametrize("name", [c.name for c in faults.CASES if c.fast])
def test_quick_case_ends_as_expected_and_leaks_nothing(suite, name: str) -> None:  # type: ignore[no-untyped-def]
    case = faults.case_named(name)
    result = suite.run_case(case)
    print(faults.report([result]))  # the idle billable time is reported, not asserted: this machine is shared
    assert result.got == case.expect, result.problems
    assert result.exit_code == case.expect_exit
    assert result.nodes_leaked == 0
    assert result.idle_s and all(v is not None for v in result.idle_s), "a node was never deleted"
    assert json.loads((suite.workdir / f"{name}-1" / "result.json").read_text())["case"] == name


@pytest.mark.slow
def test_two_preemptions_lose_no_checkpoint_and_redo_no_epoch(suite) -> None:  # type: ignore[no-untyped-def]
    case = faults.case_named("preemption-x2")
    result = suite.run_case(case)
    print(faults.report([result]))
    assert result.got == "succeeded", result.problems
    assert result.nodes_leaked == 0
    assert result.checkpoints_lost == 0
    assert result.epochs_redone == 0
