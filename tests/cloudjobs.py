"""Jobs on the two emulators, driven the way a user drives them: helpers shared by the TPU VM test files (their
fixtures, `cloud`, `bucket_url` and `gcs_mnist`, are in conftest.py)."""

from __future__ import annotations

import json
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from faults import scenario as faults_scenario
from runner.cli import app
from runner.storage import Storage, open_storage

IMAGE = "us-central1-docker.pkg.dev/test-project/runner/trainer:test"
# faults' UNTIL_PREEMPTED as a `python -c` argument inside a YAML double-quoted string
UNTIL_PREEMPTED = faults_scenario.UNTIL_PREEMPTED.replace("\n", "\\n")


def job(tmp_path: Path, bucket_url: str, body: str, name: str = "e2e", accelerator: str = "") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        textwrap.dedent(f"""\
        name: {name}
        image: {IMAGE}
        accelerator: {{type: v2-8, zones: [us-central1-b, us-central1-c], project: test-project{accelerator}}}
        storage: {bucket_url}
        """)
        + textwrap.dedent(body)
    )
    return path


def submit(*args: str) -> Any:
    return CliRunner().invoke(app, ["submit", *args], catch_exceptions=False)


def run_id_of(output: str) -> str:
    return next(line.split()[1] for line in output.splitlines() if line.startswith("Run "))


def events(run_dir: str) -> list[dict[str, Any]]:
    store = open_storage(run_dir)
    out = []
    for info in store.list("events/"):
        out += [json.loads(line) for line in (store.read_bytes(info.key) or b"").splitlines()]
    return sorted(out, key=lambda e: e["time"])


def preempt_when(
    cloud: Any, ready: Callable[[Any, Storage], bool], timeout_s: float, poll_s: float = 0.2, times: int = 1
) -> tuple[threading.Thread, list[Any]]:
    """Start a thread that preempts the first READY node whose VM has its run directory and for which
    `ready(node, run_dir_storage)` holds, `times` times (a preempted node is not READY again until it is recreated),
    within timeout_s; returns the thread and the list it appends each preemption's result to (empty: no node was
    ever ready)."""
    preempted: list[Any] = []

    def watch() -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and len(preempted) < times:
            for node in cloud.nodes():
                run_dir = node.metadata.get("tpu-runner-run-dir")
                if node.state == "READY" and run_dir and ready(node, open_storage(run_dir)):
                    preempted.append(cloud.preempt(node.node_id))
                    break
            time.sleep(poll_s)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread, preempted
