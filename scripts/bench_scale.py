"""The control plane at scale: `runner submit` following a pod slice of 1, 16, 64 and 256 hosts.

    .venv/bin/python scripts/bench_scale.py                       # `make bench-scale` (BENCH_ARGS=...)
    .venv/bin/python scripts/bench_scale.py --hosts 1,16 --latency-ms 40 --seconds 60

Each round starts a Cloud Storage emulator (gcp-storage-emulator, a process of its own), the Cloud TPU API emulator
with every node's boot hung (READY, its startup script never runs), and the real `runner submit` of a command job
on a v5p slice of that many hosts. Every storage request of the runner passes a proxy that holds its answer back
--latency-ms (real Cloud Storage answers in about 40 ms); the machine's status comes from the TPU API emulator.

When the slice is READY, one process plays its hosts with the real writers' code: per host the supervisor
(runner.worker.supervisor: its heartbeat ticker, its mirror and log sync at their real cadence, its events, its exit
record) and the bootstrap's events (runner.watch.events.EventLog, as the script uploads its file), around a job
that prints a line a second. The hosts reach storage directly (no latency); their requests are what the storage
emulator served less the runner's. What the bootstrap does besides (pulling the image, host 0 deleting its node)
is not played: the runner's own delete is what is timed.

After --warmup seconds a window of --seconds is measured: the runner's storage requests and bytes read per poll
(a poll is counted by its listing of exit/), the time between polls, the runner's CPU per minute, the hosts'
requests per minute. Then every host's job ends at once, and the time from the last exit record's arrival
(its `updated`, the storage's clock) to the runner's delete request and to its verdict (its `finished` event) is
taken. Each figure is printed with its ratio to the 1-host round's. No figure is asserted: this is a measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import unquote

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # this checkout's runner is the one measured, here and in every process it starts
BUCKET = "runner-test"
IMAGE = "us-central1-docker.pkg.dev/test-project/runner/trainer:test"
SLICES = {1: "v5p-8", 16: "v5p-128", 64: "v5p-512", 256: "v5p-2048"}  # 8 TensorCores (4 chips) a host
TICK_S = 1.0  # the job prints a line this often on every host
SERVED = "gcs-requests.log"  # the storage emulator's one line per request served (serve_gcs)
HOST_THREADS = 16  # the hosts' boot and end, this many at a time (each host's ticker is a thread of its own)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(what: str, check: Callable[[], Any], timeout_s: float, poll_s: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(poll_s)
    raise SystemExit(f"bench-scale: {what} did not happen within {timeout_s:.0f}s")


def _sleep_until(at: float) -> None:
    time.sleep(max(0.0, at - time.time()))


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a live process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- the hosts (the `play` subcommand, a process of its own) ---------------------------------------------------


class Host:
    """One host of the slice: its bootstrap's events and its real supervisor, around a job played by `say`."""

    def __init__(self, run_dir: str, run_id: str, worker: int, workers: int, root: Path) -> None:
        from runner import contract
        from runner.worker.supervisor import Supervisor

        self.worker = worker
        env = {
            contract.RUN_DIR: run_dir,
            contract.RUN_ID: run_id,
            contract.WORKER_ID: str(worker),
            contract.NUM_WORKERS: str(workers),
            contract.OUTPUT_DIR: str(root / f"host-{worker}"),
            contract.COMMAND: json.dumps(["python", "job.py"]),
        }
        self.sup = Supervisor(env)
        self.log_path = self.sup.output / contract.log_key(worker)

    def boot(self) -> None:
        from runner.watch.events import EventLog

        sup = self.sup
        self.bootstrap = EventLog(sup.storage, f"bootstrap-{self.worker}")  # reads its file first, as the script
        self.bootstrap.emit("bootstrap_started", worker=self.worker, host=f"bench-host-{self.worker}")
        self.bootstrap.emit("container_started")
        pulled = sup.restore()
        self.events = EventLog(sup.local, f"worker-{self.worker}")
        self.events.emit("worker_started", worker=self.worker, host=f"bench-host-{self.worker}", restored=pulled)
        sup.heartbeat("starting")
        sup.push()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log = self.log_path.open("ab")
        self.events.emit("job_started", pid=os.getpid())
        self.ticker = threading.Thread(target=sup._ticker, daemon=True)  # the supervisor's own: beat 10 s, sync 5 s
        self.ticker.start()

    def say(self, line: str) -> None:
        """What the supervisor's pump does with a line of the job's output."""
        data = (line + "\n").encode()
        self.log.write(data)
        self.log.flush()
        self.sup._output_bytes += len(data)
        self.sup.tail.append(line)

    def end(self) -> float:
        from runner.watch.results import write_derived_summary

        sup = self.sup
        sup._done.set()
        self.ticker.join(10)
        self.log.close()
        if self.worker == 0:
            write_derived_summary(sup.output)
        sup.finish(self.events, 0, None)
        self.bootstrap.emit("container_exited", exit_code=0)
        return time.time()


def play(args: argparse.Namespace) -> int:
    root = Path(args.root)
    hosts = [Host(args.run_dir, args.run_id, w, args.hosts, root) for w in range(args.hosts)]
    with ThreadPoolExecutor(HOST_THREADS) as pool:
        list(pool.map(Host.boot, hosts))
    booted = time.time()
    step, tick = 0, time.time()
    while tick < args.end_at:
        step += 1
        for host in hosts:
            host.say(f"step {step}: loss {1 / step:.6f}, accuracy {1 - 1 / (step + 1):.6f}, {step * 0.1:.1f} s")
        tick += TICK_S
        _sleep_until(min(tick, args.end_at))
    with ThreadPoolExecutor(HOST_THREADS) as pool:
        ended = list(pool.map(Host.end, hosts))
    Path(args.result).write_text(json.dumps({"booted": booted, "ended": max(ended)}))
    return 0


# -- one round: the emulators, the runner, the hosts ------------------------------------------------------------


def _spec(path: Path, hosts: int, storage: str) -> Path:
    path.write_text(
        f"name: bench-{hosts}\n"
        f"image: {IMAGE}\n"
        f"accelerator: {{type: {SLICES[hosts]}, zone: us-central1-a, project: test-project}}\n"
        f"storage: {storage}\n"
        'command: [python, -c, "print(1)"]\n'
    )
    return path


def serve_gcs(port: int, served: Path) -> int:
    """gcp-storage-emulator on `port`, until killed, writing the time of every request it serves to `served` (its
    own log line: everything that reaches Cloud Storage, the hosts' and the runner's).

    Two of its costs are no property of Cloud Storage, and would be what is measured at 64 hosts and more: its
    HTTPServer keeps the standard library's listen backlog of 5 (a slice's hundreds of clients overflowed it, and
    their connections waited seconds in SYN retries), and after every write it serializes every object's metadata,
    and every soft-deleted one's (each composed log part), into a file that only a restart on disk reads: a write
    cost more the longer a run went on, until it served 12 requests a second. Here the backlog is raised and, its
    store being in memory, that file is not written; every request is still answered as before."""
    import logging
    from http import server

    from gcp_storage_emulator.server import create_server
    from gcp_storage_emulator.storage import Storage

    handler = logging.FileHandler(served)
    handler.setFormatter(logging.Formatter("%(created).3f %(message)s"))
    log = logging.getLogger("gcp_storage_emulator.server")  # its RequestHandler.log_message: one line a request
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    server.HTTPServer.request_queue_size = 4096
    Storage._write_config_to_file = lambda self: None
    create_server("127.0.0.1", port, in_memory=True, default_bucket=BUCKET).start()
    threading.Event().wait()  # until SIGTERM
    return 0


def _start_gcs(work: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    argv = [sys.executable, str(Path(__file__).resolve()), "gcs", "--port", str(port), "--served", str(work / SERVED)]
    log = (work / "gcs.log").open("wb")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        import urllib.request

        try:
            with urllib.request.urlopen(f"{url}/storage/v1/b/{BUCKET}", timeout=2):
                return True
        except OSError:
            return False

    _wait("the Cloud Storage emulator's start", up, 30)
    return proc, url


def _is_exit_listing(path: str) -> bool:
    target = unquote(path)
    return "/o?" in target and "prefix=" in target and "/exit/" in target.partition("prefix=")[2].split("&")[0]


def one_round(hosts: int, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from runner.storage import open_storage
    from tpu_emulator import TpuEmulator
    from tpu_emulator.flaky_proxy import FlakyProxy

    work.mkdir(parents=True)
    gcs, gcs_url = _start_gcs(work)
    os.environ["STORAGE_EMULATOR_HOST"] = gcs_url
    runner: subprocess.Popen[bytes] | None = None
    sim: subprocess.Popen[bytes] | None = None
    try:
        with TpuEmulator(workdir=work / "tpu", gcs_endpoint=gcs_url) as tpu, FlakyProxy(gcs_url) as proxy:
            tpu.boot_hang()  # every node READY with its startup script never run: the hosts are played instead
            proxy.slow_answers(".*", args.latency_ms / 1000)
            storage = f"gs://{BUCKET}/bench-{uuid.uuid4().hex[:8]}"
            env = {
                **os.environ,
                "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
                "STORAGE_EMULATOR_HOST": proxy.url,
                "RUNNER_TPU_ENDPOINT": tpu.endpoint,
                "RUNNER_COMPUTE_ENDPOINT": tpu.endpoint,
                "RUNNER_REGISTRY_ENDPOINT": tpu.endpoint,
                "RUNNER_HOME": str(work / "home"),
                "RUNNER_TIMINGS": "api_poll_s=0.5,api_backoff_s=0.5",  # the emulator creates in 0.5 s
                "CLOUDSDK_CONFIG": "/nonexistent",
            }
            spec = _spec(work / "job.yaml", hosts, storage)
            argv = [sys.executable, "-m", "runner", "submit", str(spec)]
            runner_log = (work / "runner.log").open("wb")
            runner = subprocess.Popen(argv, env=env, stdout=runner_log, stderr=subprocess.STDOUT, cwd=work)

            def ready() -> Any:
                if runner is not None and runner.poll() is not None:
                    raise SystemExit(f"bench-scale: the runner ended early; see {work / 'runner.log'}")
                return next(
                    (n for n in tpu.nodes() if n.state == "READY" and n.metadata.get("tpu-runner-run-dir")), None
                )

            node = _wait("the slice's READY", ready, 300)
            run_dir = node.metadata["tpu-runner-run-dir"]
            start = time.time()
            window = (start + args.warmup, start + args.warmup + args.seconds)
            result_file = work / "hosts.json"
            sim_argv = [sys.executable, str(Path(__file__).resolve()), "play"]
            sim_argv += ["--run-dir", run_dir, "--run-id", run_dir.rstrip("/").rpartition("/")[2]]
            sim_argv += ["--hosts", str(hosts), "--root", str(work / "hosts"), "--result", str(result_file)]
            sim_argv += ["--end-at", str(window[1])]
            sim_env = {**env, "STORAGE_EMULATOR_HOST": gcs_url}  # the hosts reach storage without the latency
            sim_log = (work / "hosts.log").open("wb")
            sim = subprocess.Popen(sim_argv, env=sim_env, stdout=sim_log, stderr=subprocess.STDOUT)
            _sleep_until(window[0])
            cpu0 = _cpu_s(runner.pid)
            _sleep_until(window[1])
            cpu1 = _cpu_s(runner.pid)
            if sim.wait(timeout=600) != 0:
                raise SystemExit(f"bench-scale: the hosts failed; see {work / 'hosts.log'}")
            if runner.wait(timeout=args.end_timeout) not in (0, 6):
                raise SystemExit(f"bench-scale: the runner failed; see {work / 'runner.log'}")
            runner_exit = time.time()
            played = json.loads(result_file.read_text())
            store = open_storage(run_dir)
            job_end = max((o.updated or 0.0) for o in store.list("exit/"))
            finished = [
                json.loads(line)
                for line in (store.read_bytes("events/runner.jsonl") or b"").splitlines()
                if b'"finished"' in line
            ]
            deletes = [r.time for r in tpu.requests if r.method == "DELETE" and r.time >= job_end]
            state = finished[-1].get("state") if finished else "?"
            requests = proxy.requests
    finally:
        for proc in (sim, runner):
            if proc is not None and proc.poll() is None:
                proc.kill()
        os.killpg(gcs.pid, signal.SIGTERM)
        gcs.wait(10)
    t0, t1 = window
    polls = [r.time for r in requests if r.method == "GET" and _is_exit_listing(r.path) and t0 <= r.time < t1]
    between = [r for r in requests if polls and polls[0] <= r.time < polls[-1]]
    cycles = len(polls) - 1
    served = [float(line.split(" ", 1)[0]) for line in (work / SERVED).read_text().splitlines() if line[:1].isdigit()]
    runner_in_window = sum(1 for r in requests if t0 <= r.time < t1)
    return {
        "hosts": hosts,
        "state": state,
        "polls": len(polls),  # in the window: fewer than 2 leave the per-poll figures out (raise --seconds)
        "requests_per_poll": len(between) / cycles if cycles > 0 else None,
        "poll_s": (polls[-1] - polls[0]) / cycles if cycles > 0 else None,
        "cpu_s_per_min": (cpu1 - cpu0) / (t1 - t0) * 60,
        "kb_per_poll": sum(r.received for r in between) / cycles / 1000 if cycles > 0 else None,
        # what reached storage in the window, less the runner's own requests
        "host_requests_per_min": (sum(1 for t in served if t0 <= t < t1) - runner_in_window) / (t1 - t0) * 60,
        "end_to_delete_s": (min(deletes) - job_end) if deletes else None,
        "end_to_verdict_s": (finished[-1]["time"] - job_end) if finished else None,
        "end_to_exit_s": runner_exit - job_end,
        "played": played,
    }


# -- the table -------------------------------------------------------------------------------------------------

COLUMNS = [  # key, heading, format
    ("requests_per_poll", "requests/poll", "{:.1f}"),
    ("poll_s", "poll every s", "{:.2f}"),
    ("cpu_s_per_min", "runner CPU s/min", "{:.2f}"),
    ("kb_per_poll", "KB read/poll", "{:.1f}"),
    ("host_requests_per_min", "hosts' requests/min", "{:.0f}"),
    ("end_to_delete_s", "end->delete s", "{:.1f}"),
    ("end_to_verdict_s", "end->verdict s", "{:.1f}"),
]


def table(rows: list[dict[str, Any]], latency_ms: float) -> str:
    base = next((r for r in rows if r["hosts"] == 1), rows[0])
    head = ["hosts", *[c[1] for c in COLUMNS], "state"]
    lines = [f"storage latency {latency_ms:g} ms a request (the runner's); ratios to {base['hosts']} host(s)"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = [str(row["hosts"])]
        for key, _, fmt in COLUMNS:
            value, ref = row[key], base[key]
            if value is None:
                cells.append("-")
                continue
            ratio = f" ({value / ref:.1f}x)" if ref else ""
            cells.append(fmt.format(value) + ratio)
        lines.append("| " + " | ".join([*cells, str(row["state"])]) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command")
    hosts_p = sub.add_parser("play", help="(internal) play a slice's hosts")
    hosts_p.add_argument("--run-dir", required=True)
    hosts_p.add_argument("--run-id", required=True)
    hosts_p.add_argument("--hosts", type=int, required=True)
    hosts_p.add_argument("--root", required=True)
    hosts_p.add_argument("--result", required=True)
    hosts_p.add_argument("--end-at", type=float, required=True)
    gcs_p = sub.add_parser("gcs", help="(internal) serve the Cloud Storage emulator")
    gcs_p.add_argument("--port", type=int, required=True)
    gcs_p.add_argument("--served", type=Path, required=True)
    parser.add_argument("--hosts", default="1,16,64,256", help="host counts, comma-separated (1,16,64,256)")
    parser.add_argument("--latency-ms", type=float, default=40.0, help="added to each runner request (40)")
    parser.add_argument("--warmup", type=float, default=30.0, help="seconds from READY to the window (30)")
    parser.add_argument("--seconds", type=float, default=60.0, help="the measured window (60)")
    parser.add_argument("--end-timeout", type=float, default=900.0, help="longest wait for the runner's end")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs of each round)")
    args = parser.parse_args(argv)
    if args.command == "play":
        return play(args)
    if args.command == "gcs":
        return serve_gcs(args.port, args.served)
    counts = [int(h) for h in args.hosts.split(",")]
    unknown = [h for h in counts if h not in SLICES]
    if unknown:
        parser.error(f"--hosts: {unknown} not among {sorted(SLICES)}")
    work = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    rows = []
    try:
        for hosts in counts:
            print(f"bench-scale: {hosts} host(s) ...", file=sys.stderr, flush=True)
            rows.append(one_round(hosts, args, work / f"hosts-{hosts}"))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    finally:
        if args.keep:
            print(f"bench-scale: logs in {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    print(table(rows, args.latency_ms))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
