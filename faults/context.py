"""Ctx: what a case's hooks see while it runs, and what the recorder notes of the run directory over time."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from faults.measure import ApiOperation, Attempt, Idle, Observed, Request
from runner.storage import Storage, open_storage
from runner.train.checkpoints import Position, parse_name

if TYPE_CHECKING:
    from faults.cluster import Ground
    from faults.scenario import Scenario
    from tpu_emulator import TpuEmulator
    from tpu_emulator.flaky_proxy import FlakyProxy
    from tpu_emulator.gcs import StorageServer


class Ctx:
    """One run of one case: its emulator, proxy, runner home and run directory, the runner process, and what was
    seen and injected. Hooks run in threads: notes and problems are appended under a lock."""

    def __init__(
        self,
        case: Scenario,
        emulator: TpuEmulator,
        proxy: FlakyProxy | None,
        home: Path,
        storage_url: str,
        env: dict[str, str],
    ) -> None:
        self.case, self.emulator, self.proxy, self.home, self.storage_url = case, emulator, proxy, home, storage_url
        self.env = env  # the runner's environment: every `runner` command of the case runs with it
        self.storage_server: StorageServer | None = None  # the storage emulator, to make runners race (hold_writes)
        self.cluster: Ground | None = None  # a gke case's cluster (faults/cluster.py), and the run's namespace there
        self.namespace = ""
        self.proc: subprocess.Popen[bytes] | None = None
        self.done = threading.Event()
        self.killed_at: float | None = None
        self.preemptions: list[dict[str, Any]] = []
        self.destroyed: set[Position] = set()  # checkpoints the case tore on purpose: not the runner's loss
        self.problems: list[str] = []
        self.notes: list[str] = []
        self.numbers: dict[str, Any] = {}  # the case's own measurements, for the notes and --json
        self.first_seen: dict[Position, float] = {}  # checkpoint position -> first time seen in the bucket
        self.observed: list[Observed] = []  # global steps seen in the bucket over time
        self.bootstrap_seen: dict[str, dict[tuple[float, str], dict[str, Any]]] = {}  # source -> events
        self.reference: dict[str, Any] | None = None  # the reference run's summary.json (Scenario.reference)
        self.clock_skew_s = 0  # how far the case set the VMs' clocks off: their events are read back on the true one
        self.status: dict[str, Any] | None = None  # `runner status RUN --json` after the run
        # Filled when the run is measured, for the checks:
        self.events: list[dict[str, Any]] = []
        self.exit_records: list[dict[str, Any]] = []
        self.attempts: list[Attempt] = []
        self.requests: list[Request] = []
        self.idle: list[Idle] = []
        self.operations: list[ApiOperation] = []  # the TPU API's own, with its timestamps
        self.final_manifest: dict[str, Any] | None = None
        self._run_id: str | None = None
        self._storage: Storage | None = None
        self._lock = threading.Lock()

    def note(self, text: str) -> None:
        with self._lock:
            self.notes.append(text)

    def problem(self, text: str) -> None:
        with self._lock:
            self.problems.append(text)

    # -- the run --------------------------------------------------------------------------------------------------

    @property
    def run_id(self) -> str | None:
        if self._run_id is None:
            records = sorted((self.home / "runs").glob("*.json"))
            if records:
                self._run_id = json.loads(records[0].read_text())["run_id"]
        return self._run_id

    def run_record(self) -> dict[str, Any]:
        """The runner's local record of the run (state, reason, handle): what `runner status` starts from."""
        return json.loads((self.home / "runs" / f"{self.run_id}.json").read_text()) if self.run_id else {}

    @property
    def run_dir(self) -> str | None:
        return f"{self.storage_url}/runs/{self.run_id}" if self.run_id else None

    def storage(self) -> Storage | None:
        """The run directory, opened once (one Cloud Storage client for every probe of the run)."""
        if self._storage is None and self.run_dir:
            self._storage = open_storage(self.run_dir)
        return self._storage

    def read_json(self, key: str) -> Any:
        """An object of the run directory as JSON; None when it is missing or not JSON."""
        store = self.storage()
        raw = store.read_bytes(key) if store else None
        try:
            return json.loads(raw) if raw else None
        except ValueError:
            return None

    def cli(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        """`runner ARGS` as the user would type it, in the case's environment (its RUNNER_HOME, the emulators)."""
        return subprocess.run(
            [sys.executable, "-m", "runner.cli", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def kill_runner(self, why: str) -> None:
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGKILL)
        self.killed_at = time.time()
        self.note(f"runner SIGKILLed {why}")

    def wait_for(self, probe: Callable[[], Any], *, timeout: float, interval: float = 0.3) -> Any:
        """probe() until it returns something truthy (returned), the case ends, or `timeout` passes (None)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self.done.is_set():
            with contextlib.suppress(Exception):
                value = probe()
                if value:
                    return value
            time.sleep(interval)
        return None

    # -- what the bucket and the emulator show ----------------------------------------------------------------------

    def checkpoints(self) -> dict[Position, str]:
        """The checkpoint objects in the bucket now: position -> key."""
        store = self.storage()
        if store is None:
            return {}
        found = {}
        for info in store.list("checkpoints/"):
            position = parse_name(info.key.rsplit("/", 1)[-1])
            if position is not None:
                found[position] = info.key
        return found

    def manifest(self) -> dict[str, Any] | None:
        doc = self.read_json("checkpoints/latest.json")
        return doc if isinstance(doc, dict) else None

    def manifest_epoch(self) -> int | None:
        doc = self.manifest()
        return int(doc["epoch"]) if doc and doc.get("epoch") is not None else None

    def own_nodes(self) -> list[Any]:
        """This run's nodes: what the runner created (another run's label, or none, is not ours)."""
        return [n for n in self.emulator.nodes() if n.labels.get("tpu-runner-run") == self.run_id]

    def own_instances(self) -> list[Any]:
        """This run's Compute Engine instances (its own, or its slice group's: they carry the run's label)."""
        return [i for i in self.emulator.compute.instances() if i.labels.get("tpu-runner-run") == self.run_id]

    def own_compute_resources(self) -> list[str]:
        """Everything of this run Compute Engine still holds: instances, and a slice's group, instance template and
        workload policy (named after the run), as 'kind name'."""
        if self.run_id is None:
            return []
        cloud = self.emulator.compute.cloud
        with cloud.lock:
            held = [("instance group", p) for p in cloud.groups.items]
            held += [("instance template", p) for p in cloud.templates]
            held += [("workload policy", p) for p in cloud.policies]
        found = [f"instance {i.name}" for i in self.own_instances()]
        return found + [f"{kind} {p.rsplit('/', 1)[-1]}" for kind, p in held if self.run_id in p.rsplit("/", 1)[-1]]

    def running_instance(self) -> str | None:
        """This run's RUNNING instance while its job has not ended, or None."""
        store = self.storage()
        running = [i for i in self.own_instances() if i.status == "RUNNING"]
        if not running or store is None or store.list("exit/"):
            return None
        return str(running[0].name)

    def others_nodes(self) -> list[Any]:
        return [n for n in self.emulator.nodes() if n.labels.get("tpu-runner-run") != self.run_id]

    def ready_node(self) -> str | None:
        """This run's READY node while its job has not ended, or None."""
        store = self.storage()
        nodes = [n for n in self.own_nodes() if n.state == "READY"]
        if not nodes or store is None or store.list("exit/"):
            return None
        return str(nodes[0].node_id)

    def accepted_creates(self) -> int:
        return sum(
            1 for r in self.emulator.requests if r.method == "POST" and r.path.endswith("/nodes") and r.status < 300
        )

    def preempt(self, node: str, **facts: Any) -> None:
        self.emulator.preempt(node, wait=False)
        self.preemptions.append({"time": time.time(), **facts})

    # -- the recorder: the run directory over time (a recreated VM starts its event file anew, checkpoints rotate) --

    def recorder(self) -> None:
        while not self.done.wait(0.5):
            with contextlib.suppress(Exception):
                self.record_once()

    def record_once(self) -> None:
        store = self.storage()
        if store is None:
            return
        now = time.time()
        for position in self.checkpoints():
            self.first_seen.setdefault(position, now)
        if self.case.trains:
            progress = self.read_json("progress.json")
            if isinstance(progress, dict) and progress.get("global_step") is not None:
                self.observed.append(Observed(now, int(progress["global_step"])))
            for entry in (self.manifest() or {}).get("checkpoints") or []:
                if isinstance(entry, dict) and entry.get("global_step") is not None:
                    self.observed.append(Observed(now, int(entry["global_step"])))
        for info in store.list("events/"):
            source = info.key.rsplit("/", 1)[-1].removesuffix(".jsonl")
            if not source.startswith("bootstrap-"):
                continue
            for line in (store.read_bytes(info.key) or b"").splitlines():
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    e = json.loads(line)
                    self.bootstrap_seen.setdefault(source, {})[(float(e["time"]), str(e["event"]))] = e
