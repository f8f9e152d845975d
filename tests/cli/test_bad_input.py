"""Bad input of every kind, through the real CLI: one clear message naming the file or value, the documented exit
code, never a traceback, and nothing lost (the other runs keep working).

Exit codes (runner.errors): 2 a bad spec, flag or argument; 3 no such run; 4 a stored file that cannot be read.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from runner import contract
from runner.cli import app
from runner.collect.figures import metrics_text
from runner.collect.summary import summary_rows
from runner.errors import PlanError, SpecError, UsageError
from runner.plan.planner import resolve_storage
from runner.spec import JobSpec
from runner.spec.loader import MAX_SPEC_BYTES, load_spec_text
from runner.storage import open_storage
from runner.watch import runs
from runner.watch.rundir import ExitRecord, Snapshot, Summary, read_snapshot
from runner.watch.runs import RunRecord
from runner.watch.state import RunState
from tests.conftest import REPO

JOB = "name: demo\nimage: trainer:test\ncommand: [echo, hi]\n"
RUN_ID = "demo-20260101-000000-abcd"
OTHER_ID = "demo-20260101-000001-beef"


def invoke(*args: str) -> Result:
    return CliRunner().invoke(app, list(args))


def assert_clean(result: Result, code: int, *expected: str) -> None:
    """The exit code, every expected text in the output, and no traceback (neither printed nor escaped)."""
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    for text in expected:
        assert text in result.output, (text, result.output)


# -- spec files ------------------------------------------------------------------------------------------------


def _write(tmp_path: Path, name: str, data: bytes | str) -> Path:
    path = tmp_path / name
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return path


SPEC_FILES: list[tuple[str, bytes | str, str]] = [
    ("flow-lists.yaml", "[" * 10_000 + "\n", "nested more than 32 levels deep"),
    ("flow-maps.yaml", "a: " + "{a: " * 3_000 + "1" + "}" * 3_000 + "\n", "nested more than 32 levels deep"),
    ("block-maps.yaml", "".join(" " * i + "a:\n" for i in range(1_000)) + " " * 1_000 + "1\n", "nested more than"),
    ("deep-env.yaml", JOB + "env: " + "[" * 200 + "]" * 200 + "\n", "line 4: nested more than 32 levels deep"),
    ("empty.yaml", "", "the file is empty"),
    ("comments.yaml", "# nothing here\n\n", "the file is empty"),
    ("binary.yaml", b"\x7fELF\x02\x01\x01\x00\xff\xfe", "not UTF-8 text (byte 8)"),
    ("nul.yaml", "name: a\x00\n", "the control character U+0000 is not allowed"),
    ("list.yaml", "- a\n- b\n", "not a list"),
    ("big.yaml", "a: " + "x" * MAX_SPEC_BYTES + "\n", "larger than 1024 KiB"),
    # Values the bootstrap could not render (a Docker env file holds one variable per line): refused where read.
    (
        "env-newline.yaml",
        JOB + 'env:\n  A: ok\n  GREETING: "hello\\nworld"\n',
        "line 6: env.GREETING: an environment value",
    ),
    (
        "env-block.yaml",
        JOB + "env:\n  NOTE: |\n    two\n    lines\n",
        "line 5: env.NOTE: an environment value cannot hold",
    ),
    ("env-nul.yaml", JOB + 'env: {X: "a\\0b"}\n', "env.X: an environment value cannot hold a line break or a NUL"),
]


@pytest.mark.parametrize(("name", "data", "expected"), SPEC_FILES, ids=[c[0] for c in SPEC_FILES])
def test_bad_spec_files_are_one_spec_error(tmp_path: Path, name: str, data: bytes | str, expected: str) -> None:
    path = _write(tmp_path, name, data)
    assert_clean(invoke("validate", str(path)), 2, f"{path}:", expected)


def test_recursion_anywhere_in_loading_is_a_spec_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """MAX_DEPTH stops deep YAML first; should anything still recurse too deep, it is a SpecError, not a crash."""
    import runner.spec.loader

    def too_deep(*args: object) -> object:
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(runner.spec.loader, "_positions", too_deep)
    with pytest.raises(SpecError, match=r"job\.yaml: nested too deeply"):
        load_spec_text(JOB, "job.yaml")
    monkeypatch.setattr(JobSpec, "model_validate", too_deep)
    with pytest.raises(SpecError, match="nested too deeply"):
        runner.spec.loader.validate_data({"name": "a"}, {}, "job.yaml")


def test_not_a_regular_file(tmp_path: Path) -> None:
    assert_clean(invoke("validate", str(tmp_path)), 2, f"{tmp_path}: is a directory")
    assert_clean(invoke("validate", "/dev/zero"), 2, "/dev/zero: is a character device, not a job spec file")
    sock_path = tmp_path / "s.yaml"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(sock_path))
        assert_clean(invoke("validate", str(sock_path)), 2, f"{sock_path}: is a socket")
    missing_parent = _write(tmp_path, "file", "x") / "job.yaml"
    assert_clean(invoke("validate", str(missing_parent)), 2, f"{missing_parent}: no such file")


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    """Reading a FIFO with no writer blocks forever: a subprocess with a timeout fails the test instead of hanging."""
    fifo = tmp_path / "job.yaml"
    os.mkfifo(fifo)
    for command in ("validate", "submit"):
        done = subprocess.run(
            [sys.executable, "-m", "runner", command, str(fifo)], capture_output=True, text=True, timeout=60, cwd=REPO
        )
        assert done.returncode == 2, done.stderr
        assert f"{fifo}: is a named pipe (FIFO), not a job spec file" in done.stderr
        assert "Traceback" not in done.stderr + done.stdout


def test_a_huge_file_is_refused_without_reading_it(tmp_path: Path) -> None:
    huge = tmp_path / "huge.yaml"
    with huge.open("wb") as f:
        f.truncate(8 << 30)  # sparse: 8 GiB that would take seconds and memory to read
    started = time.monotonic()
    assert_clean(invoke("validate", str(huge)), 2, "larger than 1024 KiB")
    assert time.monotonic() - started < 10


def test_a_file_larger_than_it_says_is_read_only_up_to_the_limit() -> None:
    """/proc/self/pagemap is a regular file of size 0 that reads as 8 bytes per page of the address space (far
    more than memory): only a read bounded by MAX_SPEC_BYTES, not by what stat() says, returns."""
    pagemap = Path("/proc/self/pagemap")
    if not os.access(pagemap, os.R_OK):
        pytest.skip("no readable /proc/self/pagemap here")
    assert pagemap.stat().st_size == 0
    assert_clean(invoke("validate", str(pagemap)), 2, f"{pagemap}: the file is larger than 1024 KiB")


def test_awkward_spec_paths(tmp_path: Path) -> None:
    newline = tmp_path / "a\nb.yaml"
    result = invoke("validate", str(newline))
    assert_clean(result, 2, "no such file")
    assert [line for line in result.output.splitlines() if "error" in line] == [
        f"error: {str(newline)!a}: no such file"
    ]  # one line: the newline cannot split the message or forge a second one
    undecodable = os.fsdecode(b"\xff.yaml")  # what Python makes of a file name that is not UTF-8
    assert_clean(invoke("validate", undecodable), 2, "'\\udcff.yaml': no such file")
    assert_clean(invoke("validate"), 2, "Missing argument")


# -- storage: one validator for `storage:` and `--storage` -----------------------------------------------------

BAD_STORAGE = [
    ("gs://", "'gs://' is not gs://BUCKET[/PREFIX] with a valid bucket name"),
    ("gs://Bad_Bucket/x", "'gs://Bad_Bucket/x' is not gs://BUCKET[/PREFIX] with a valid bucket name"),
    ("gs:/bucket/x", "'gs:/bucket/x' is not gs://BUCKET[/PREFIX]"),
    ("gs:runs", "'gs:runs' is not gs://BUCKET[/PREFIX]"),
    ("GS://bucket/x", "'GS://bucket/x' is not gs://BUCKET[/PREFIX]"),
    ("gs://ab", "'gs://ab' is not gs://BUCKET[/PREFIX]"),
    ("s3://bucket/x", "'s3://bucket/x': storage must be gs://BUCKET/PREFIX or a local path"),
    ("  ", "storage is empty"),
    ("runs\nmore", "'runs\\nmore': storage cannot contain control characters"),
]


@pytest.mark.parametrize(("value", "message"), BAD_STORAGE, ids=[v for v, _ in BAD_STORAGE])
def test_storage_flag_and_spec_field_say_the_same(value: str, message: str) -> None:
    with pytest.raises(SpecError) as in_spec:
        load_spec_text(JOB + f"storage: {json.dumps(value)}\n", "job.yaml")
    (problem,) = in_spec.value.problems
    said = problem.removeprefix("line 4: storage: ")
    assert message in said and said != problem
    spec = load_spec_text(JOB)
    for cloud in (False, True):
        with pytest.raises(UsageError) as on_flag:
            resolve_storage(spec, value, cloud=cloud)
        assert on_flag.value.exit_code == 2
        assert str(on_flag.value) == f"--storage: {said}"  # word for word what the spec field says


@pytest.mark.parametrize(("value", "message"), BAD_STORAGE[:3], ids=[v for v, _ in BAD_STORAGE[:3]])
def test_bad_storage_flag_creates_nothing(
    tmp_path: Path, runner_home: Path, monkeypatch: pytest.MonkeyPatch, value: str, message: str
) -> None:
    monkeypatch.chdir(tmp_path)  # `--storage gs://` once made a local folder named 'gs:' here
    job = _write(tmp_path, "job.yaml", JOB)
    assert_clean(invoke("submit", str(job), "--local", "--storage", value), 2, f"--storage: {message}")
    assert_clean(invoke("submit", str(job), "--dry-run", "--project", "my-project", "--storage", value), 2, message)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.yaml"]
    assert not runner_home.exists()


def test_good_storage_is_normalised_the_same_way(tmp_path: Path) -> None:
    spec = load_spec_text(JOB + "storage: gs://my-bucket/runs/\n")
    assert spec.storage == "gs://my-bucket/runs"
    assert resolve_storage(spec, None, cloud=True) == resolve_storage(spec, " gs://my-bucket/runs/ ", cloud=True)
    assert resolve_storage(spec, str(tmp_path) + "/", cloud=False) == str(tmp_path)
    assert resolve_storage(spec, "/", cloud=False) == "/"  # not '' (the current directory)


def test_storage_under_an_unknown_home_is_a_plan_error() -> None:
    with pytest.raises(PlanError, match="no home directory") as info:
        resolve_storage(load_spec_text(JOB), "~no-such-user-here/runs", cloud=False)
    assert info.value.exit_code == 2


# -- run directories and run records ---------------------------------------------------------------------------


def make_run(tmp_path: Path, run_id: str = RUN_ID, files: dict[str, str] | None = None) -> Path:
    """A finished local run, as `submit --local` leaves it: a record here, a run directory under tmp_path."""
    run_dir = tmp_path / "store" / "runs" / run_id
    record = RunRecord(
        run_id=run_id,
        job="demo",
        backend="local",
        run_dir=str(run_dir),
        created_at=time.time(),
        state=RunState.SUCCEEDED,
        finished_at=time.time(),
    )
    runs.save(record)
    now = time.time()
    contents: dict[str, bytes | str] = {
        contract.RUN_INFO: runs.run_info(record),
        "exit/worker-0.json": json.dumps({"worker": 0, "state": "succeeded", "exit_code": 0, "finished_at": now}),
        contract.HEARTBEAT: json.dumps({"time": now, "phase": "exited"}),
        contract.log_key(0): "hello from the job\n",
        "events/runner.jsonl": json.dumps({"time": now, "source": "runner", "event": "finished"}) + "\n",
        **(files or {}),
    }
    for key, value in contents.items():
        path = run_dir / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(value.encode() if isinstance(value, str) else value)
    return run_dir


RUN_FILES: list[tuple[str, str, str, str | None]] = [
    # (file, contents, what `status` shows, the warning that names the file; None: none, all is well)
    (contract.SUMMARY, '{"loss": 0.1, "note": "custom"}', "loss           0.1", None),
    (contract.SUMMARY, '{"test_accuracy": "high", "strategy": "x", "checkpoint": 5}', "state", None),
    (contract.SUMMARY, '{"test_accuracy": 0.9, "versions": [], "epoch_times_s": {}}', "0.9000", None),
    (contract.SUMMARY, "[1, 2]", "succeeded", "summary.json is corrupt: a JSON array, not an object"),
    (contract.SUMMARY, '"done"', "succeeded", "summary.json is corrupt: a JSON string, not an object"),
    (contract.SUMMARY, "garbage{", "succeeded", "summary.json is corrupt: not JSON (Expecting value"),
    (contract.SUMMARY, "", "succeeded", "summary.json is corrupt: not JSON"),
    (contract.SUMMARY, "[" * 100_000, "succeeded", "summary.json is corrupt: not JSON (nested too deeply)"),
    (contract.METRICS, '{"epoch": 1}\n', "epoch 1", None),
    (contract.METRICS, '{"loss": 0.25, "step": 7}\n', "step 7: loss 0.2500", None),
    (contract.METRICS, '{"epoch": 1, "accuracy": 0.5}\n{"epoch": 2, "acc', "epoch 1: accuracy 0.5000", None),
    (contract.METRICS, "[1]\n", "succeeded", "metrics.jsonl is corrupt: not one line is a valid JSON record"),
    (contract.METRICS, "xx\nyy\n", "succeeded", "metrics.jsonl is corrupt"),
    (contract.METRICS, 'garbage\n{"epoch": 3}\n', "epoch 3", "metrics.jsonl: skipped 1 corrupt line(s)"),
    ("events/runner.jsonl", "garbage\n", "succeeded", "events/runner.jsonl is corrupt"),
    ("events/worker-0.jsonl", '{"time": 1800000000, "source": "w", "event": "x"}\n{"ti', "succeeded", None),
    ("events/worker-0.jsonl", '{"no": "event"}\n', "succeeded", "events/worker-0.jsonl is corrupt"),
    (
        "events/worker-0.jsonl",
        '{"time": 1800000000, "source": "w", "event": "late\\u001b[2J"}\n',
        "late?[2J (w, ",
        None,
    ),
    # A time no clock reads (1e300, or 1970): a warning saying so, never a date, a span or an infinite cost.
    ("events/worker-0.jsonl", '{"time": 1e300, "source": "w", "event": "x"}\n', "succeeded", "not a date between 2000"),
    ("events/worker-0.jsonl", '{"time": 1, "source": "w", "event": "x"}\n', "succeeded", "time 1 is not a date"),
    ("exit/worker-0.json", "\x00\xff", "run directory", "exit/worker-0.json is corrupt: not JSON"),
    ("exit/worker-0.json", '{"worker": 0}', "run directory", "exit/worker-0.json is corrupt: 'state' is missing"),
    ("exit/worker-0.json", '{"worker": 0, "state": "odd", "exit_code": 0, "finished_at": 1}', "state", "odd"),
    ("exit/worker-0.json", '{"worker": 1e999, "state": "failed", "exit_code": 0, "finished_at": 1}', "state", "int"),
    (contract.HEARTBEAT, "[", "succeeded", "heartbeat is corrupt: not JSON"),
    (contract.HEARTBEAT, '{"time": "soon"}', "succeeded", "heartbeat is corrupt: its time is 'soon', not a number"),
]


@pytest.mark.parametrize(("key", "data", "shown", "warning"), RUN_FILES)
def test_corrupt_run_files_cost_a_warning_not_the_status(
    tmp_path: Path, key: str, data: str, shown: str, warning: str | None
) -> None:
    run_dir = make_run(tmp_path)
    (run_dir / key).write_bytes(data.encode("utf-8", errors="surrogateescape"))
    make_run(tmp_path, OTHER_ID)
    result = invoke("status", RUN_ID)
    assert_clean(result, 0, f"Run {RUN_ID}", shown)
    warnings = [line for line in result.output.splitlines() if line.startswith("warning:")]
    if warning is None:
        assert warnings == []
    else:
        assert len(warnings) == 1 and str(run_dir / key.split("/")[0]) in warnings[0] and warning in warnings[0]
    as_json = invoke("status", RUN_ID, "--json")
    assert as_json.exit_code == 0
    assert len(json.loads(as_json.stdout)["warnings"]) == (warning is not None)
    listing = invoke("list")
    assert_clean(listing, 0, RUN_ID, OTHER_ID)
    assert_clean(invoke("logs", RUN_ID), 0, "hello from the job")
    assert_clean(invoke("logs", OTHER_ID, "--follow"), 0, "hello from the job")


def test_summary_rows_take_any_shape() -> None:
    shapes: list[Any] = [
        {"loss": 0.1},
        {"test_accuracy": 0.9},
        {"test_accuracy": None, "strategy": {"name": 1}, "versions": "x", "model": ["m"]},
        {"test_accuracy": 10**400, "examples_per_s": "fast", "epoch_times_s": [1, "x", None], "checkpoint": 3},
        {"test_accuracy": 0.9, "strategy": {"kind": None, "note": "\x1b[2Jboo"}, "resumed_from_epoch": 2},
        {f"k{i}": i for i in range(100)},
        {"a\nb": "c\rd", "nested": {"x": 1}},
        [1, 2],
        "text",
        None,
    ]
    for raw in shapes:
        summary = Summary.from_json(raw) if isinstance(raw, dict) else None  # read_snapshot refuses the others
        snapshot = Snapshot([ExitRecord(0, RunState.FAILED, 1, 0.0, error="x\x1b[31m")], None, [], summary)
        rows = summary_rows("/runs/r", RunState.FAILED, snapshot)
        assert rows[0] == ("state", "failed") and rows[-1][0] == "logs"
        assert all("\n" not in f"{k}{v}" and "\x1b" not in f"{k}{v}" for k, v in rows), rows
    for line in [{}, {"epoch": "x", "accuracy": "high"}, {"epoch_time_s": True}, {"a": [1]}]:
        assert isinstance(metrics_text(line), str)


def test_a_gone_run_directory_still_has_a_status(tmp_path: Path) -> None:
    import shutil

    shutil.rmtree(make_run(tmp_path))
    assert_clean(invoke("status", RUN_ID), 0, "succeeded")
    assert_clean(invoke("list"), 0, RUN_ID)


RUN_INFOS: list[tuple[str, str]] = [
    ("nope", "run.json is corrupt: Expecting value"),
    ("[]", "run.json is corrupt: a JSON array, not an object"),
    ("{}", "run.json is corrupt: run_id: Field required"),
    ('{"run_id": "x", "job": "j", "backend": "local", "created_at": "yesterday"}', "created_at"),
    ('{"run_id": "../../escape", "job": "j", "backend": "local", "created_at": 1}', "'../../escape' is not a run id"),
    ("[" * 100_000, "run.json is corrupt"),
]


@pytest.mark.parametrize(("data", "message"), RUN_INFOS)
def test_corrupt_run_json_names_it(tmp_path: Path, data: str, message: str) -> None:
    run_dir = make_run(tmp_path)
    (run_dir / contract.RUN_INFO).write_text(data)
    for command in ("status", "logs", "down"):
        assert_clean(invoke(command, str(run_dir)), 4, str(run_dir / contract.RUN_INFO), message)
    assert_clean(invoke("status", RUN_ID), 0, "succeeded")  # the local record still has what it needs


RECORDS: list[tuple[str, bytes | None, str]] = [
    ("torn", b'{"run_id": "demo', "is corrupt: Invalid JSON: EOF while parsing"),
    ("empty", b"", "is corrupt: Invalid JSON"),
    ("object", b"{}", "is corrupt: run_id: Field required"),
    ("array", b"[1]", "is corrupt: record: Input should be an object"),
    ("binary", b"\xff\xfe\x00garbage", "is corrupt"),
    (
        "wrong type",
        b'{"run_id": "x", "job": "j", "backend": "l", "run_dir": "/", "created_at": []}',
        "is corrupt: created_at:",
    ),
    ("directory", None, "cannot be read: Is a directory"),
    (
        "path in id",
        b'{"run_id": "../x", "job": "j", "backend": "l", "run_dir": "/", "created_at": 1}',
        "is corrupt: '../x' is not a run id",
    ),
]


@pytest.mark.parametrize(("data", "message"), [r[1:] for r in RECORDS], ids=[r[0] for r in RECORDS])
def test_corrupt_run_record_names_it_and_hides_nothing_else(
    tmp_path: Path, runner_home: Path, data: bytes | None, message: str
) -> None:
    """Exit 4 (a stored file cannot be read), not 3 (no such run): the run exists, and may still be running."""
    make_run(tmp_path)
    make_run(tmp_path, OTHER_ID)
    record_file = runner_home / "runs" / f"{RUN_ID}.json"
    record_file.unlink()
    if data is None:
        record_file.mkdir()
    else:
        record_file.write_bytes(data)
    expected = f"run record {record_file} {message}"
    for command in ("status", "logs", "down"):
        assert_clean(invoke(command, RUN_ID), 4, expected)
    assert_clean(invoke("status", RUN_ID[:-2]), 4, expected)  # a prefix that names only the corrupt one
    listing = invoke("list")
    assert_clean(listing, 0, OTHER_ID, f"warning: {expected}")
    assert RUN_ID not in listing.output.replace(str(record_file), "")
    assert_clean(invoke("status", OTHER_ID), 0, "succeeded")
    assert_clean(invoke("logs", OTHER_ID), 0, "hello from the job")
    assert_clean(invoke("down", OTHER_ID), 0, "created nothing")
    assert [r.run_id for r in runs.list_records()] == [OTHER_ID]  # what `runner gc` reads


# -- run ids and out-of-range options --------------------------------------------------------------------------

ARGUMENTS: list[tuple[list[str], int, str]] = [
    (["status", ""], 2, "the run id is empty"),
    (["logs", "  "], 2, "the run id is empty"),
    (["status", ".."], 3, "..: not a run directory (no run.json)"),
    (["status", "a/b"], 3, "a/b: no such directory"),
    (["status", "../"], 3, "../: not a run directory"),
    (["status", "foo bar"], 3, "'foo bar' is not a run id"),
    (["status", "x\ny"], 3, "'x\\ny' is not a run id"),
    (["status", "*"], 3, "'*' is not a run id"),
    (["status", "nope-123"], 3, "no run 'nope-123'"),
    (["status", "a" * 5_000], 3, "is not a run id"),
    (["status", "/" + "a" * 5_000], 3, ": File name too long; give a run id or a run directory"),
    (["validate", "a" * 5_000], 2, ": cannot be read (File name too long)"),
    (["status", "gs://"], 2, "'gs://' is not gs://BUCKET[/PREFIX]"),
    (["status", "gs://Bad_Bucket/runs/x"], 2, "'gs://Bad_Bucket/runs/x' is not gs://BUCKET[/PREFIX]"),
    (["logs", RUN_ID, "--worker", "99"], 2, f"--worker 99: run {RUN_ID} has 1 worker, worker 0"),
    (["logs", RUN_ID, "--worker", "1", "-f"], 2, "--worker 1: run"),
    (["logs", RUN_ID, "--worker", "-1"], 2, "Invalid value for '--worker'"),
    (["logs", RUN_ID, "--worker", "x"], 2, "Invalid value for '--worker'"),
    (["list", "--limit", "-5"], 2, "Invalid value for '--limit'"),
    (["list", "--limit", "0"], 2, "Invalid value for '--limit'"),
]


@pytest.mark.parametrize(("args", "code", "message"), ARGUMENTS, ids=[" ".join(a)[:40] for a, _, _ in ARGUMENTS])
def test_bad_arguments(tmp_path: Path, args: list[str], code: int, message: str) -> None:
    make_run(tmp_path)
    assert_clean(invoke(*args), code, message)


def test_a_run_directory_path_that_is_a_file(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path)
    log = run_dir / contract.log_key(0)
    for command in ("status", "logs", "down"):
        assert_clean(invoke(command, str(log)), 3, f"{log}: is not a directory")


def test_times_no_clock_can_show(tmp_path: Path, runner_home: Path) -> None:
    make_run(tmp_path)
    path = runner_home / "runs" / f"{RUN_ID}.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "created_at": 1e300}))
    assert_clean(invoke("status", RUN_ID), 0, "created     ?")
    assert_clean(invoke("list"), 0, RUN_ID)


def test_a_handle_the_backend_cannot_read(tmp_path: Path, runner_home: Path) -> None:
    """A record of a running run whose handle does not fit its backend: the state comes from the run directory."""
    make_run(tmp_path)
    path = runner_home / "runs" / f"{RUN_ID}.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "state": "running", "handle": {"bogus": 1}}))
    warning = f"warning: {path}: its local machine handle cannot be read"
    assert_clean(invoke("status", RUN_ID), 0, "succeeded", warning)  # the exit record settles it
    assert_clean(invoke("list"), 0, RUN_ID, "succeeded", warning)
    assert_clean(invoke("logs", RUN_ID, "--follow"), 0, "hello from the job", warning)


def test_worker_range_follows_the_run(tmp_path: Path, runner_home: Path) -> None:
    make_run(tmp_path)
    path = runner_home / "runs" / f"{RUN_ID}.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "num_workers": 4}))
    assert_clean(invoke("logs", RUN_ID, "--worker", "3"), 0)
    assert_clean(invoke("logs", RUN_ID, "--worker", "4"), 2, "has 4 workers, 0 to 3")


def test_read_snapshot_names_each_bad_file(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, files={"summary.json": "[]", "heartbeat": "{", "exit/worker-1.json": "{}"})
    snapshot = read_snapshot(open_storage(str(run_dir)))
    assert snapshot.summary is None and snapshot.heartbeat is None and snapshot.exits
    named: Callable[[str], bool] = lambda key: any(str(run_dir / key) in p for p in snapshot.problems)  # noqa: E731
    assert named("summary.json") and named("heartbeat") and named("exit/worker-1.json")


@pytest.mark.skipif(os.geteuid() != 0, reason="a full disk is a small tmpfs mounted for the test, which takes root")
def test_a_full_disk_under_runner_home_is_one_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    full = tmp_path / "full"
    full.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(full)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        fd = os.open(full / "fill", os.O_WRONLY | os.O_CREAT)
        try:  # every last block: the disk is full
            while os.write(fd, b"\0" * 4096):
                pass
        except OSError:
            pass
        finally:
            os.close(fd)
        monkeypatch.setenv("RUNNER_HOME", str(full / "home"))
        job = _write(tmp_path, "job.yaml", JOB + f"storage: {tmp_path / 'store'}\n")
        done = subprocess.run(
            [sys.executable, "-m", "runner.cli", "submit", str(job), "--local"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        said = done.stdout + done.stderr
        assert done.returncode == 4, said
        assert "Traceback" not in said
        assert said.count("error: ") == 1 and "No space left on device" in said
        assert "point $RUNNER_HOME at another one" in said
    finally:
        subprocess.run(["umount", str(full)], check=False)
