"""python -m tpu_emulator: run the Cloud TPU API and Compute Engine API emulator (and optionally a Cloud Storage
emulator) until Ctrl-C."""

from __future__ import annotations

import argparse
import getpass
import signal
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _start_gcs(host: str, bucket: str) -> tuple[Any, str]:
    try:
        from tpu_emulator.gcs import StorageServer
    except ImportError:
        sys.exit("--with-gcs needs gcp-storage-emulator: pip install gcp-storage-emulator (a dev dependency)")
    server = StorageServer(host, _free_port(host), bucket=bucket).start()
    return server, server.endpoint


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tpu_emulator",
        description="Emulate the Cloud TPU API v2 and the Compute Engine API v1 (TPU VM instances, managed instance "
        "groups, resize requests) on this machine, with faults, and VMs that run each startup-script locally. "
        "See docs/emulator.md.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8470, help="port of both APIs (default 8470; 0 picks one)")
    default_workdir = Path(tempfile.gettempdir()) / f"tpu-emulator-{getpass.getuser()}"
    parser.add_argument(
        "--workdir", type=Path, default=default_workdir, help=f"VM directories (default {default_workdir})"
    )
    gcs = parser.add_mutually_exclusive_group()
    gcs.add_argument("--gcs-endpoint", metavar="URL", help="a Cloud Storage emulator the VMs should use")
    gcs.add_argument("--with-gcs", action="store_true", help="also start gcp-storage-emulator in this process")
    parser.add_argument("--bucket", default="runner-rehearsal", help="the bucket --with-gcs creates")
    parser.add_argument("--create-delay", type=float, default=2.0, metavar="S", help="seconds CREATING lasts (2)")
    parser.add_argument("--delete-delay", type=float, default=1.0, metavar="S", help="seconds DELETING lasts (1)")
    parser.add_argument("--vm-grace", type=float, default=10.0, metavar="S", help="SIGTERM->SIGKILL grace (10)")
    parser.add_argument(
        "--queue-style",
        choices=("waiting", "accepted"),
        default="waiting",
        help="where queued resources wait: WAITING_FOR_RESOURCES (current API, default) or ACCEPTED (older API)",
    )
    parser.add_argument(
        "--wait-limit",
        type=float,
        default=1.0,
        metavar="S",
        help="longest a Compute Engine operations.wait waits (1; the real API: up to 2 minutes)",
    )
    parser.add_argument(
        "--engine",
        choices=("docker", "podman"),
        help="the VMs pull and run real containers under this engine, from an image registry started on loopback "
        "(docker-registry; push your image there): see docs/emulator.md. Default: containers run as processes",
    )
    parser.add_argument("--quiet", action="store_true", help="do not print each request")
    args = parser.parse_args(argv)

    from tpu_emulator.emulator import TpuEmulator

    engine, registry = None, None
    if args.engine:
        from runner.launch import engine as engines
        from tpu_emulator.registry import LocalRegistry

        engine = engines.probe(args.engine)
        if engine is None:
            sys.exit(f"--engine {args.engine}: it does not answer (`{args.engine} version`); `make containers`")
        try:
            registry = LocalRegistry().start()
        except RuntimeError as exc:
            sys.exit(f"--engine {args.engine}: {exc}")

    gcs_server, gcs_endpoint = (None, args.gcs_endpoint)
    if args.with_gcs:
        gcs_server, gcs_endpoint = _start_gcs(args.host, args.bucket)
    emulator = TpuEmulator(
        args.host,
        args.port,
        workdir=args.workdir,
        gcs_endpoint=gcs_endpoint,
        create_delay_s=args.create_delay,
        delete_delay_s=args.delete_delay,
        vm_grace_s=args.vm_grace,
        queue_style=args.queue_style,
        compute_wait_s=args.wait_limit,
        engine=engine,
    )
    try:
        emulator.start()
    except OSError as exc:
        if gcs_server is not None:
            gcs_server.stop()
        if registry is not None:
            registry.stop()
        sys.exit(f"cannot listen on {args.host}:{args.port}: {exc.strerror} (try --port 0)")
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    print(f"Cloud TPU API emulator: {emulator.endpoint}/v2/   (admin: {emulator.endpoint}/_emulator/)")
    compute = f"{emulator.endpoint}/compute/v1/   (admin: {emulator.endpoint}/_emulator/compute/)"
    print(f"Compute Engine API emulator: {compute}")
    if gcs_endpoint:
        print(f"Cloud Storage: {gcs_endpoint}" + (f"   (bucket gs://{args.bucket})" if args.with_gcs else ""))
    print(f"VM directories and console logs: {emulator.workdir}/<project>/<zone>/<node>/worker-<n>/")
    print(f"  and for Compute Engine instances: {emulator.workdir}/compute/<project>/<zone>/<instance>/")
    print("\nPoint the runner (and your shell) at it:\n")
    print(f"  export RUNNER_TPU_ENDPOINT={emulator.endpoint}")
    print(f"  export RUNNER_COMPUTE_ENDPOINT={emulator.endpoint}")
    print(f"  export RUNNER_SECRETMANAGER_ENDPOINT={emulator.endpoint}   # Secret Manager (a spec's secrets:)")
    if registry is not None and engine is not None:
        print(f"  export RUNNER_REGISTRY_ENDPOINT={registry.endpoint}   # the registry the VMs pull from")
        print(f"\nThe VMs run containers under {engine.title}. Push an image for them, e.g.:\n")
        remote = f"{registry.host}/tpu-runner/trainer:TAG"  # the spec's image: (no variant in the name)
        if args.engine == "podman":
            print(f"  podman push --tls-verify=false trainer-cpu:TAG {remote}")
        else:  # Docker trusts a registry on loopback by itself
            print(f"  docker tag trainer-cpu:TAG {remote} && docker push {remote}")
    else:
        print(f"  export RUNNER_REGISTRY_ENDPOINT={emulator.endpoint}   # it also answers as the image registry")
    if gcs_endpoint:
        print(f"  export STORAGE_EMULATOR_HOST={gcs_endpoint}")
    print(
        "\nInject a fault, e.g.:\n\n"
        f'  curl -X POST {emulator.endpoint}/_emulator/faults/stockout -d \'{{"zone": "us-central2-b", "count": 1}}\'\n'
        "\nCtrl-C stops it and every emulated VM.\n",
        flush=True,
    )
    seen = 0
    try:
        while not done.wait(0.25):
            if args.quiet:
                continue
            recorded = emulator.requests
            seen = 0 if len(recorded) < seen else seen  # after a reset
            for r in recorded[seen:]:
                stamp = time.strftime("%H:%M:%S", time.localtime(r.time))
                print(f"{stamp} {r.status} {r.method} {r.path}", flush=True)
            seen = len(recorded)
    finally:
        print("stopping: the server, then every VM", flush=True)
        emulator.stop()
        if gcs_server is not None:
            gcs_server.stop()
        if registry is not None:
            registry.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
