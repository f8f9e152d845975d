"""The one runner of every case: the emulators, the real `runner submit` subprocess, the recorder, the measurements.

Cloud Storage is gcp-storage-emulator in this process (unless given one), with real MNIST in its bucket. Each run
gets its own TPU API emulator, runner home and run directory. The job goes through the real command line,
`python -m runner.cli submit job.yaml`, as a subprocess whose environment points it at the emulators. What happened
is read afterwards from the run directory (events, exit records, summary.json, the log) and from the emulator
(nodes left, every request with its time, the operations' outcomes).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from faults.context import Ctx
from faults.measure import (
    ApiOperation,
    Request,
    checkpoints_lost,
    epochs_redone,
    idle_intervals,
    parse_attempts,
    partial_epochs,
    reached_per_attempt,
    recovered_from,
    steps_lost,
)
from faults.result import RunResult
from faults.scenario import IMAGE, PROJECT, Scenario, Train
from faults.table import IDLE_GOAL_S
from runner.errors import StorageError
from runner.storage import Storage, open_storage

if TYPE_CHECKING:
    from faults.cluster import Ground
    from runner.launch.engine import Engine
    from tpu_emulator.gcs import StorageServer
    from tpu_emulator.registry import LocalRegistry

REPO = Path(__file__).resolve().parent.parent
BUCKET = "runner-faults"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rfc3339(text: str) -> float:
    """Seconds since the epoch from the API's timestamps (nanoseconds and a Z, which fromisoformat of 3.10 refuses)."""
    stamp, _, frac = text.rstrip("Z").partition(".")
    base = datetime.datetime.fromisoformat(stamp).replace(tzinfo=datetime.timezone.utc).timestamp()
    return base + (float(f"0.{frac}") if frac else 0.0)


def operations(endpoint: str, zones: tuple[str, ...]) -> list[ApiOperation]:
    """Every operation of the TPU API in `zones`, as its own list says (the API's clock, not a VM's)."""
    out = []
    for zone in zones:
        url = f"{endpoint}/v2/projects/{PROJECT}/locations/{zone}/operations?pageSize=1000"
        with contextlib.suppress(OSError, ValueError), urllib.request.urlopen(url, timeout=10) as answer:
            for op in json.load(answer).get("operations", []):
                meta = op.get("metadata") or {}
                start = _rfc3339(meta["createTime"])
                end = _rfc3339(meta["endTime"]) if meta.get("endTime") else None
                out.append(
                    ApiOperation(str(meta.get("verb")), str(meta.get("target")), start, end, bool(op.get("error")))
                )
    return out


def failed_deletes(endpoint: str, zones: tuple[str, ...]) -> list[tuple[float, str]]:
    """(start time, node) of every deletion that failed, from the TPU API's own operations list. A DELETE sent while
    the node is already DELETING joins that deletion, and its operation fails with it: failed operations of one node
    that ended within a second of each other are one failed deletion (its earliest start)."""
    failed: list[tuple[str, float, float]] = []  # (node, end, start)
    for op in operations(endpoint, zones):
        if op.verb == "delete" and op.failed:
            failed.append((op.target, op.end if op.end is not None else op.start, op.start))
    out: list[tuple[float, str]] = []
    last: tuple[str, float] | None = None
    for node, end, start in sorted(failed):
        if last is not None and last[0] == node and end - last[1] < 1.0:
            out[-1] = (min(out[-1][0], start), node)
        else:
            out.append((start, node))
        last = (node, end)
    return sorted(out)


class Suite:
    """Cloud Storage with real MNIST in its bucket, shared by every case; `run_case` runs one."""

    def __init__(
        self,
        workdir: Path,
        *,
        gcs_endpoint: str | None = None,
        bucket: str = BUCKET,
        mnist: Path | None = None,
        say: Callable[[str], None] = print,
        vm_grace_s: float = 10.0,
        timings: str | None = None,
        storage_server: StorageServer | None = None,
        cluster: Ground | None = None,
    ) -> None:
        self.workdir = Path(workdir).absolute()
        self._ground = cluster  # the gke cases' (faults/cluster.py): given, or started on first need
        # The storage emulator, when this suite has it (its own, or the one behind gcs_endpoint): the cases that
        # make two runners race hold its writes (tpu_emulator.gcs.StorageServer.hold_writes).
        self.storage_server = storage_server
        self.timings = timings  # $RUNNER_TIMINGS for the runner; None: production polls (the honest idle figures)
        self.bucket = bucket
        self.say = say
        self.vm_grace_s = vm_grace_s
        self._gcs_endpoint = gcs_endpoint
        self._gcs_server: Any = None
        self._mnist = mnist
        self._env_before: str | None = None
        self.data_url: str | None = None
        self._containers: tuple[Engine, LocalRegistry, str] | None = None  # for cases with container=True

    @property
    def gcs(self) -> str:
        assert self._gcs_endpoint is not None
        return self._gcs_endpoint

    def __enter__(self) -> Suite:
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self._gcs_endpoint is None:
            from tpu_emulator.gcs import StorageServer

            self._gcs_server = StorageServer("127.0.0.1", _free_port(), bucket=self.bucket).start()
            self._gcs_endpoint = self._gcs_server.endpoint
            self.storage_server = self._gcs_server
        self._env_before = os.environ.get("STORAGE_EMULATOR_HOST")
        os.environ["STORAGE_EMULATOR_HOST"] = self.gcs  # this process reads the run directories directly
        return self

    def __exit__(self, *exc: object) -> None:
        if self._containers is not None:
            self._containers[1].stop()
        if self._ground is not None and self._ground.owned:
            self._ground.stop()
        if self._env_before is None:
            os.environ.pop("STORAGE_EMULATOR_HOST", None)
        else:
            os.environ["STORAGE_EMULATOR_HOST"] = self._env_before
        if self._gcs_server is not None:
            self._gcs_server.stop()

    def mnist_url(self) -> str:
        """Real MNIST in the bucket, uploaded once: on a VM the trainer reads its data from Cloud Storage."""
        if self.data_url is None:
            from runner import datasets

            path = self._mnist or datasets.fetch_mnist()
            store = open_storage(f"gs://{self.bucket}/data")
            if store.read_bytes("mnist.npz", start=path.stat().st_size - 1) is None:
                store.upload_file(path, "mnist.npz")
            self.data_url = f"gs://{self.bucket}/data/mnist.npz"
        return self.data_url

    def own_bucket(self) -> str:
        """A new bucket for one case (the shared one holds the data set, which no case may lose)."""
        from google.cloud import storage  # type: ignore[attr-defined]

        name = f"{self.bucket}-{uuid.uuid4().hex[:8]}"
        storage.Client().create_bucket(name)
        return name

    def containers(self) -> tuple[Engine, LocalRegistry, str]:
        """For cases that run the real image: the engine, a registry on loopback and the image pushed to it (this
        checkout's cpu image, built if needed: tpu_emulator.registry.trainer_image). Set up once, on first need;
        RuntimeError, saying why, where there is no engine."""
        if self._containers is None:
            from runner.launch import engine as engines
            from tpu_emulator.registry import LocalRegistry, trainer_image

            found = engines.detect()
            if found.engine is None:
                raise RuntimeError(f"the case runs the real image: {found.why} (`make containers` sets Podman up)")
            registry = LocalRegistry().start()
            try:
                self.say(f"[faults] building and pushing the trainer image ({found.engine.title}, {registry.host})")
                image = trainer_image(registry, found.engine, say=lambda line: self.say(f"[faults]   {line}"))
            except BaseException:
                registry.stop()
                raise
            self._containers = (found.engine, registry, image)
        return self._containers

    def ground(self) -> Ground:
        """For the gke cases: the Kubernetes rehearsal and the GKE emulator (faults/cluster.py), started once, on
        first need; RuntimeError, saying why, where the control plane is not built."""
        if self._ground is None:
            from faults.cluster import Ground

            self.say("[faults] starting the Kubernetes rehearsal (API server, etcd, scheduler, controllers)")
            self._ground = Ground.start(self.workdir / "kube")
        return self._ground

    def runner_env(self, case: Scenario, emulator_endpoint: str, home: Path, proxy_url: str | None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RUNNER_") and k != "STORAGE_EMULATOR_HOST"}
        registry = self.containers()[1].endpoint if case.container else None
        env.update(
            RUNNER_TPU_ENDPOINT=emulator_endpoint,
            RUNNER_COMPUTE_ENDPOINT=emulator_endpoint,  # the emulator serves Compute Engine's API on the same port
            RUNNER_SECRETMANAGER_ENDPOINT=emulator_endpoint,  # and Secret Manager's
            # The emulator doubles as the registry, unless the case runs the real image from a real one.
            RUNNER_REGISTRY_ENDPOINT=case.registry or registry or emulator_endpoint,
            STORAGE_EMULATOR_HOST=proxy_url if case.runner_via_proxy and proxy_url else self.gcs,
            RUNNER_HOME=str(home),
            CLOUDSDK_CONFIG="/nonexistent",
            PYTHONUNBUFFERED="1",
            PYTHONPATH=str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""),
        )
        if self.timings or case.timings:
            env["RUNNER_TIMINGS"] = ",".join(filter(None, (self.timings, case.timings)))
        if case.on_cluster:
            env.update(self.ground().env())
        return env

    # -- one run ----------------------------------------------------------------------------------------------------

    def run_case(self, case: Scenario, index: int = 1) -> RunResult:
        """Run the case once (after its reference run, when it has one) and measure it."""
        if case.container or case.on_cluster:
            try:
                if case.container:
                    self.containers()
                if case.on_cluster:
                    self.ground()
            except (RuntimeError, OSError) as exc:
                return RunResult(
                    case=case.name,
                    fault=case.fault,
                    expected=case.expect or "rejected",
                    got="not run",
                    exit_code=None,
                    expected_exit=case.exit,
                    as_expected=False,
                    nodes_leaked=0,
                    checkpoints_lost=None,
                    epochs_redone=None,
                    partial_epochs=None,
                    problems=[str(exc)],
                )
        reference: dict[str, Any] | None = None
        if case.reference:
            self.say(f"[faults] {case.name}: the same job without the fault first (reference)")
            ref_case = case.without_fault()
            ref = self._run(ref_case, index)
            reference = ref.numbers.get("summary") or {}
            self.say(
                f"[faults] {ref_case.name}: {ref.got}, global step {reference.get('global_step')}, test accuracy "
                f"{reference.get('test_accuracy')}, {ref.wall_s:.0f}s wall"
            )
            if not ref.as_expected:
                reference = {"problems": ref.problems, **reference}
        return self._run(case, index, reference)

    def _run(self, case: Scenario, index: int, reference: dict[str, Any] | None = None) -> RunResult:
        from tpu_emulator import TpuEmulator
        from tpu_emulator.flaky_proxy import FlakyProxy

        t0 = time.time()
        where = self.workdir / f"{case.name}-{index}"
        shutil.rmtree(where, ignore_errors=True)  # a kept --workdir's earlier run record would be taken for this one
        where.mkdir(parents=True)
        proxy = FlakyProxy(self.gcs).start() if case.gcs_faults or case.proxy else None
        if proxy is not None and case.gcs_faults:
            proxy.fail_uploads(r"(^|/)checkpoints/", case.gcs_faults, per_object=True)
        engine, _, image = self.containers() if case.container else (None, None, IMAGE)
        emulator = TpuEmulator(
            workdir=where / "emulator",
            gcs_endpoint=proxy.url if proxy else self.gcs,
            vm_grace_s=self.vm_grace_s,
            engine=engine,
        ).start()
        bucket = self.own_bucket() if case.own_bucket else self.bucket
        storage_url = f"gs://{bucket}/{case.name}-{uuid.uuid4().hex[:8]}"
        home = where / "runner-home"
        env = self.runner_env(case, emulator.endpoint, home, proxy.url if proxy else None)
        ctx = Ctx(case, emulator, proxy, home, storage_url, env)
        ctx.storage_server = self.storage_server
        ctx.reference = reference
        if case.on_cluster:
            ctx.cluster = self.ground()
            ctx.namespace = ctx.cluster.new_run()
        try:
            spec = where / "job.yaml"
            data = self.mnist_url() if case.trains else None
            spec.write_text(case.spec_yaml(storage_url, data, image, namespace=ctx.namespace or "faults"))
            for hook in case.setup:
                hook(ctx)
            with (where / "runner.out").open("wb") as out:
                ctx.proc = subprocess.Popen(
                    [sys.executable, "-m", "runner.cli", "submit", str(spec)],
                    env=env,
                    cwd=where,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
                threads = [threading.Thread(target=ctx.recorder, daemon=True)]
                threads += [threading.Thread(target=hook, args=(ctx,), daemon=True) for hook in case.during]
                for t in threads:
                    t.start()
                exit_code = self._wait_runner(ctx)
            for hook in case.after:
                hook(ctx)
            leaked = self._settle(ctx)
            with contextlib.suppress(StorageError):  # a case may have deleted the bucket
                ctx.record_once()
            ctx.done.set()
            for t in threads:
                t.join(10)
            return self._measure(ctx, exit_code, leaked, t0)
        finally:
            ctx.done.set()
            if ctx.proc is not None and ctx.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(ctx.proc.pid, signal.SIGKILL)
                ctx.proc.wait()
            emulator.stop()
            if proxy is not None:
                proxy.stop()

    def _wait_runner(self, ctx: Ctx) -> int | None:
        assert ctx.proc is not None
        try:
            return ctx.proc.wait(ctx.case.timeout_s)
        except subprocess.TimeoutExpired:
            ctx.problem(f"the runner was still running after {ctx.case.timeout_s:.0f}s: killed")
            with contextlib.suppress(ProcessLookupError):
                os.killpg(ctx.proc.pid, signal.SIGKILL)
            ctx.proc.wait()
            return None

    def _settle(self, ctx: Ctx) -> int:
        """This run's machines left once it is over, after a short settle (a VM deleting itself, a delete going
        on): TPU nodes, on Compute Engine its instances, group, template and workload policy, and on a GKE cluster
        its node pools, JobSet and pods. On a cluster the settle outlasts the pod garbage collector's round (up to
        60 s), which alone removes a pod whose node went before its deletion was confirmed: as on GKE."""

        def on_cluster() -> list[str]:
            return ctx.cluster.left_of(ctx.namespace, ctx.run_id) if ctx.cluster is not None else []

        ctx.wait_for(
            lambda: not ctx.own_nodes() and not ctx.own_compute_resources() and not on_cluster(),
            timeout=30.0 if ctx.cluster is None else 90.0,
        )
        left = ctx.own_compute_resources()
        if left:
            ctx.problem(f"left on Compute Engine: {', '.join(left)}")
        held = on_cluster()
        if held and ctx.cluster is not None:  # on_cluster() holds nothing without a cluster
            ctx.problem(f"left on the GKE cluster: {', '.join(held)}")
            for pod in ctx.cluster.pods_described(ctx.namespace):
                ctx.note(pod)
        return len(ctx.own_nodes()) + len(left) + len(held)

    def _status(self, ctx: Ctx) -> str:
        if ctx.run_id is None:
            return "rejected" if ctx.proc and ctx.proc.returncode == 2 else "no run"
        proc = ctx.cli("status", ctx.run_id, "--json", timeout=120)
        try:
            ctx.status = json.loads(proc.stdout)
            return str(ctx.status["state"])
        except (ValueError, KeyError, TypeError):
            return f"status error ({proc.returncode})"

    # -- measuring ------------------------------------------------------------------------------------------------

    def _read_run(self, ctx: Ctx) -> tuple[list[dict[str, Any]], str]:
        """The run directory's events (with the bootstrap's the recorder saw over the run) and the worker log."""
        store = ctx.storage()
        if store is None:
            return [], ""
        try:
            return self._read_run_dir(ctx, store)
        except StorageError as exc:  # the case deleted the bucket: what the recorder saw is all there is
            ctx.note(f"the run directory could not be read at the end: {exc.message}")
            ctx.events = sorted(
                (e for source in ctx.bootstrap_seen.values() for e in source.values()), key=lambda e: float(e["time"])
            )
            return [], ""

    def _read_run_dir(self, ctx: Ctx, store: Storage) -> tuple[list[dict[str, Any]], str]:
        from runner.watch.events import read_events

        run_events = [{"time": e.time, "source": e.source, "event": e.event, **e.fields} for e in read_events(store)]
        log = (store.read_bytes("logs/worker-0.log") or b"").decode(errors="replace")
        for info in store.list("exit/"):
            with contextlib.suppress(ValueError):
                ctx.exit_records.append(json.loads(store.read_bytes(info.key) or b"{}"))
        ctx.final_manifest = ctx.manifest()
        # A recreated VM's bootstrap must carry the earlier VMs' events on: a missing one is a problem.
        seen = {k: e for source in ctx.bootstrap_seen.values() for k, e in source.items()}
        final = {
            (float(e["time"]), str(e["event"])): e for e in run_events if str(e["source"]).startswith("bootstrap-")
        }
        if set(seen) - set(final):
            ctx.problem(
                f"{len(set(seen) - set(final))} bootstrap event(s) of an earlier VM are no longer in the run "
                "directory's events/bootstrap-0.jsonl (the recreated VM's bootstrap overwrote the file)"
            )
        ctx.events = sorted(run_events + [e for k, e in seen.items() if k not in final], key=lambda e: float(e["time"]))
        return run_events, log

    def _measure(self, ctx: Ctx, exit_code: int | None, leaked: int, t0: float) -> RunResult:
        case = ctx.case
        got = self._status(ctx)
        run_events, log = self._read_run(ctx)
        bootstrap = [e for e in ctx.events if str(e.get("source", "")).startswith("bootstrap-")]
        ctx.requests = [
            Request(
                r.time,
                r.method,
                r.path,
                r.status,
                r.query.get("nodeId"),
                "vm" if (r.authorization or "").startswith("Bearer ") else "runner",
            )
            for r in ctx.emulator.requests
            if r.path.startswith("/v2/")
        ]
        ctx.numbers["failed_deletes"] = failed_deletes(ctx.emulator.endpoint, case.zones)
        ctx.operations = operations(ctx.emulator.endpoint, case.zones)
        # The job's end by the true clock: the case may have set the VM's clock off (the bootstrap writes with it).
        ends = [
            {**e, "time": float(e["time"]) - ctx.clock_skew_s}
            for e in bootstrap
            if e.get("event") in ("container_exited", "image_pull_failed")
        ]
        preempted_at = [p["time"] for p in ctx.preemptions]
        # Each failed delete operation, one by one: the request that started it did not end the idle time.
        failed = [(op.start, op.target) for op in ctx.operations if op.verb == "delete" and op.failed]
        ctx.idle = idle_intervals(ends, ctx.requests, preempted_at, failed)
        if ctx.cluster is not None:  # a node pool, from the job's end to its delete
            from faults.cluster import pool_idle

            ctx.idle = pool_idle(ctx)
        expected = case.expect or "rejected"
        if case.expect is None and exit_code == 2 and ctx.run_id is None:
            got = "rejected"
        result = RunResult(
            case=case.name,
            fault=case.fault,
            expected=expected,
            got=got,
            exit_code=exit_code,
            expected_exit=case.exit,
            as_expected=False,
            nodes_leaked=leaked,
            checkpoints_lost=None,
            epochs_redone=None,
            partial_epochs=None,
            idle_s=[None if i.seconds is None else round(i.seconds, 2) for i in ctx.idle if not i.preempted],
            idle_preempted_s=[None if i.seconds is None else round(i.seconds, 2) for i in ctx.idle if i.preempted],
            others_nodes=len(ctx.others_nodes()),
            run_id=ctx.run_id,
            idle_goal=case.idle_goal,
        )
        if isinstance(case.job, Train):
            self._measure_training(ctx, case.job, result, run_events, log)
        for check in case.checks:
            check(ctx, result)
        self._common_checks(ctx, result, exit_code)
        result.problems = ctx.problems + result.problems
        result.notes = ctx.notes + result.notes
        result.numbers = {k: v for k, v in ctx.numbers.items() if k not in ("gc_output",) and v not in (None, [])}
        result.as_expected = got == expected and not result.problems and leaked == 0
        result.wall_s = round(time.time() - t0, 1)
        (ctx.home.parent / "result.json").write_text(json.dumps(asdict(result), indent=1, default=str))
        return result

    def _measure_training(
        self, ctx: Ctx, job: Train, result: RunResult, run_events: list[dict[str, Any]], log: str
    ) -> None:
        ctx.attempts = parse_attempts(log)
        restarts = sorted(
            float(e["time"]) for e in run_events if e["source"] == "worker-0" and e["event"] == "worker_started"
        )[1:]
        manifest = ctx.final_manifest or {}
        listed = [str(c.get("file")) for c in manifest.get("checkpoints") or [] if isinstance(c, dict)]
        have = {key.rsplit("/", 1)[-1] for key in ctx.checkpoints().values()}
        manifest_ok = all(name in have for name in listed or [str(manifest.get("path") or "")] if name)
        final_epoch = ctx.manifest_epoch() if result.got == "succeeded" else None
        result.checkpoints_lost = checkpoints_lost(
            ctx.attempts,
            restarts,
            ctx.first_seen,
            final_epoch=final_epoch,
            final_ok=manifest_ok or not manifest,
            destroyed=ctx.destroyed,
        )
        result.epochs_redone = epochs_redone(ctx.attempts)
        result.partial_epochs = partial_epochs(ctx.attempts, job.epochs)
        result.steps_lost = steps_lost(ctx.attempts, reached_per_attempt(ctx.observed, restarts))
        result.recovered = [recovered_from(a) for a in ctx.attempts[1:]]
        summary = ctx.read_json("summary.json")
        if isinstance(summary, dict):
            ctx.numbers["summary"] = {
                k: summary.get(k)
                for k in ("global_step", "optimizer_iterations", "steps_per_epoch", "test_accuracy", "resumed_from")
            }
            # The last attempt's resume as the trainer recorded it must be what its log said.
            said = ctx.attempts[-1].resumed_from if ctx.attempts else None
            recorded = (summary.get("resumed_from") or {}).get("checkpoint")
            if recorded != said:
                result.problems.append(f"summary.json resumed_from {recorded}, the log says {said}")
        if result.got == "succeeded" and ctx.manifest_epoch() != job.epochs:
            result.problems.append(f"the bucket's newest checkpoint is epoch {ctx.manifest_epoch()}")
        if ctx.destroyed:
            result.notes.append(f"checkpoints torn by the case (not counted as lost): {sorted(ctx.destroyed)}")

    def _common_checks(self, ctx: Ctx, result: RunResult, exit_code: int | None) -> None:
        """What holds for every case: the exit code, every VM's node deleted soon after its job ended."""
        worker = [e for e in ctx.events if e.get("source") == "worker-0"]
        starts = [i for i, e in enumerate(worker) if e["event"] == "worker_started"]
        if ctx.exit_records and starts and not any(e["event"] == "worker_exited" for e in worker[starts[-1] :]):
            result.notes.append(
                "exit/worker-0.json is in the run directory but the worker_exited event after it is not "
                "(the node was deleted during the supervisor's last upload)"
            )
        said = (ctx.home.parent / "runner.out").read_text(errors="replace").splitlines()
        errors = [line for line in said if line.startswith("error: ")]
        if errors and result.got != result.expected:
            result.notes.append(f"the runner said: {errors[-1]}")
        if exit_code != ctx.case.exit:
            result.problems.append(f"runner exit code {exit_code}, expected {ctx.case.exit}")
        for idle in ctx.idle:
            if idle.seconds is None:
                result.problems.append(f"{idle.node} was never deleted after its job ended")
            elif idle.seconds > IDLE_GOAL_S and ctx.case.idle_goal:
                result.problems.append(
                    f"{idle.node.rsplit('/', 3)[0].rsplit('/', 1)[-1]}: idle {idle.seconds:.1f}s after the job ended "
                    f"({'preempted VM' if idle.preempted else idle.by}; goal <= {IDLE_GOAL_S:.0f}s)"
                )
        if ctx.idle:
            result.notes.append(
                "idle per VM: "
                + ", ".join(
                    ("never" if i.seconds is None else f"{i.seconds:.2f}s")
                    + (" (preempted)" if i.preempted else "")
                    + (" (deleted before the container had exited)" if i.shutdown and not i.preempted else "")
                    + (f" deleted by the {i.deleted_by}" if i.deleted_by else "")
                    for i in ctx.idle
                )
            )
        if ctx.reference and ctx.reference.get("problems"):
            result.problems.append(f"the reference run was not as expected: {ctx.reference['problems']}")
