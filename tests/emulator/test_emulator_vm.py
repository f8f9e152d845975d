"""The emulator's VMs: a READY node's startup-script runs on every worker as a local process, with a metadata
server, a `docker` that runs containers as processes, and the emulator as its TPU API. Nodes are created and
deleted through the real google-cloud-tpu client.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from google.api_core import exceptions as gexc
from google.api_core.future import polling
from google.auth.credentials import AnonymousCredentials
from google.cloud import tpu_v2

from runner import contract
from runner.storage import open_storage
from runner.worker import processes
from tests.environ import child_env
from tests.waiting import wait_for
from tpu_emulator import TpuEmulator
from tpu_emulator.vm import marked_pids

PROJECT = "rehearsal"
ZONE = "us-central2-b"
PARENT = f"projects/{PROJECT}/locations/{ZONE}"
RUNTIME = "tpu-ubuntu2204-base"
IMAGE = "us-docker.pkg.dev/rehearsal/runner/trainer:test"
FAST = polling.DEFAULT_POLLING.with_delay(initial=0.05, maximum=0.2, multiplier=1.5).with_timeout(30)
MD = 'md() { curl -sf -H "Metadata-Flavor: Google" "$RUNNER_METADATA_URL/$1"; }\n'
SHIM = [sys.executable, "-m", "tpu_emulator.docker_shim"]
TOKEN_SED = 'sed -n \'s/.*"access_token" *: *"\\([^"]*\\)".*/\\1/p\''


def tpu_client(emulator: TpuEmulator) -> tpu_v2.TpuClient:
    return tpu_v2.TpuClient(
        transport="rest", credentials=AnonymousCredentials(), client_options={"api_endpoint": emulator.endpoint}
    )


@pytest.fixture
def client(tpu_emulator: TpuEmulator) -> tpu_v2.TpuClient:
    return tpu_client(tpu_emulator)


@pytest.fixture
def quick_emulator(tmp_path: Path) -> Iterator[TpuEmulator]:
    """An emulator whose VMs get only 0.5 s between SIGTERM and SIGKILL."""
    with TpuEmulator(workdir=tmp_path / "quick", vm_grace_s=0.5, create_delay_s=0.2, delete_delay_s=0.1) as emulator:
        yield emulator


def boot(
    client: tpu_v2.TpuClient,
    node_id: str,
    script: str,
    accelerator: str = "v4-8",
    runtime: str = RUNTIME,
    **fields: Any,
) -> str:
    """Create a node running `script` and wait until READY; returns its name."""
    metadata = {"startup-script": script, **fields.pop("metadata", {})}
    node = tpu_v2.Node(accelerator_type=accelerator, runtime_version=runtime, metadata=metadata, **fields)
    return client.create_node(parent=PARENT, node_id=node_id, node=node).result(polling=FAST).name


def wait_file(path: Path, timeout_s: float = 30.0, ready: Callable[[str], bool] = bool) -> str:
    """The file's text once `ready` holds for it (by default: once it has any; a script's `> file` creates it
    empty before the command writes), however long a loaded machine takes."""

    def text() -> str | None:
        try:
            read = path.read_text()
        except FileNotFoundError:
            return None
        return read if ready(read) else None

    found = text()
    deadline = time.monotonic() + timeout_s
    while found is None:
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} did not appear; console: {console(path.parent)}")
        time.sleep(0.05)
        found = text()
    return found


def console(directory: Path) -> str:
    log = directory / "console.log"
    return log.read_text() if log.exists() else "<no console.log>"


def wait_gone(client: tpu_v2.TpuClient, name: str, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            client.get_node(name=name)
        except gexc.NotFound:
            return
        time.sleep(0.05)
    raise AssertionError(f"{name} still exists")


def test_the_vm_reads_its_metadata_server(client: tpu_v2.TpuClient, tpu_emulator: TpuEmulator) -> None:
    script = MD + (
        "md instance/attributes/agent-worker-number > worker\n"
        "md instance/service-accounts/default/token > token\n"
        "md instance/service-accounts/default/email > email\n"
        "md project/project-id > project\n"
        "md project/numeric-project-id > number\n"
        "md instance/zone > zone\n"
        "md instance/attributes/instance-id > instance-id\n"
        "md instance/attributes/tpu-env > tpu-env\n"
        "md instance/attributes/tpu-runner-run-dir > run-dir\n"
        "md instance/attributes/ > attributes\n"
        'curl -s -o /dev/null -w "%{http_code}" "$RUNNER_METADATA_URL/project/project-id" > no-flavor\n'
        'env > env; echo "$PWD" > pwd; touch done\n'
    )
    name = boot(client, "meta", script, metadata={"tpu-runner-run-dir": "gs://bucket/runs/r1"})
    vm = tpu_emulator.node(name).vms[0]  # type: ignore[union-attr]
    wait_file(vm.directory / "done", ready=lambda _: True)
    read = lambda f: (vm.directory / f).read_text()  # noqa: E731
    assert read("worker") == "0"
    token = json.loads(read("token"))
    assert token["token_type"] == "Bearer" and token["access_token"] and token["expires_in"] > 0
    assert read("email").endswith("-compute@developer.gserviceaccount.com")
    assert read("project") == PROJECT
    assert read("number").isdigit()
    assert read("zone") == f"projects/{read('number')}/zones/{ZONE}"
    assert read("instance-id") == "meta"
    assert "WORKER_ID: '0'\n" in read("tpu-env") and "ACCELERATOR_TYPE: 'v4-8'\n" in read("tpu-env")
    assert read("run-dir") == "gs://bucket/runs/r1"
    assert {"startup-script", "agent-worker-number", "tpu-env"} <= set(read("attributes").split())
    assert read("no-flavor") == "403"
    env = dict(line.split("=", 1) for line in read("env").splitlines() if "=" in line)
    endpoint = tpu_emulator.endpoint
    assert env["RUNNER_METADATA_URL"] == f"{endpoint}/_vm/{PROJECT}/{ZONE}/meta/0/computeMetadata/v1"
    assert env["RUNNER_TPU_API"] == endpoint
    assert env["RUNNER_STORAGE_API"] == env["STORAGE_EMULATOR_HOST"] == tpu_emulator.gcs_endpoint
    assert env["PATH"].split(os.pathsep)[0] == str(tpu_emulator.launcher.shim_dir)
    assert env["HOME"].startswith(str(vm.directory)) and env["TMPDIR"].startswith(str(vm.directory))
    assert read("pwd").strip() == str(vm.directory) == str(tpu_emulator.workdir / PROJECT / ZONE / "meta" / "worker-0")


def test_docker_run_of_a_worker_job_writes_its_run_directory_to_the_bucket(
    client: tpu_v2.TpuClient, tpu_emulator: TpuEmulator, gcs: str
) -> None:
    run_dir = f"gs://runner-test/{uuid.uuid4().hex[:8]}/runs/r1"
    job = "import os, pathlib; p = pathlib.Path(os.environ['RUNNER_OUTPUT_DIR'], 'hello.txt'); "
    job += "p.write_text('hello from worker ' + os.environ['RUNNER_WORKER_ID']); print('job ran')"
    script = MD + (
        "set -uo pipefail\n"
        "WORKER=$(md instance/attributes/agent-worker-number)\n"
        f"md instance/service-accounts/default/token | {TOKEN_SED} |\n"
        "  docker login -u oauth2accesstoken --password-stdin https://us-docker.pkg.dev\n"
        f"docker pull {IMAGE}\n"
        f"docker run --rm --name job --privileged --net=host -e RUNNER_RUN_DIR={run_dir} -e RUNNER_RUN_ID=r1 \\\n"
        f'  -e RUNNER_WORKER_ID="$WORKER" -e RUNNER_COMMAND={shlex.quote(json.dumps(["python", "-c", job]))} \\\n'
        f"  -e RUNNER_SYNC_S=0.5 -e RUNNER_HEARTBEAT_S=0.5 {IMAGE}\n"
        'echo "$?" > exit-code\n'
    )
    name = boot(client, "job", script)
    vm = tpu_emulator.node(name).vms[0]  # type: ignore[union-attr]
    assert wait_file(vm.directory / "exit-code", 60).strip() == "0", console(vm.directory)
    log = console(vm.directory)
    assert "Login Succeeded" in log and f"Status: Downloaded newer image for {IMAGE}" in log and "job ran" in log
    store = open_storage(run_dir)
    keys = {o.key for o in store.list()}
    assert {"hello.txt", contract.exit_key(0), contract.log_key(0), "events/worker-0.jsonl"} <= keys
    assert store.read_bytes("hello.txt") == b"hello from worker 0"
    assert json.loads(store.read_bytes(contract.exit_key(0)) or b"{}")["state"] == "succeeded"


def test_multi_host_runs_the_script_on_every_worker(client: tpu_v2.TpuClient, tpu_emulator: TpuEmulator) -> None:
    script = MD + "md instance/attributes/agent-worker-number > worker\nmd instance/attributes/tpu-env > tpu-env\n"
    name = boot(client, "pod", script, accelerator="v4-32", runtime="tpu-vm-tf-2.16.1-pod-pjrt")
    node = tpu_emulator.node(name)
    assert node is not None and node.hosts == 4 and len(node.vms) == 4
    assert len(client.get_node(name=name).network_endpoints) == 4
    workers = sorted(int(wait_file(vm.directory / "worker")) for vm in node.vms)
    assert workers == [0, 1, 2, 3]
    for vm in node.vms:
        assert vm.directory.name == f"worker-{vm.worker}"
        assert wait_file(vm.directory / "worker") == str(vm.worker)
        assert f"WORKER_ID: '{vm.worker}'" in wait_file(vm.directory / "tpu-env")
    assert len({vm.pid for vm in node.vms}) == 4


def test_a_recreated_slice_never_gets_the_old_jax_coordinator(quick_emulator: TpuEmulator) -> None:
    """The hosts of one boot share the coordinator address the docker shim gives JAX (RUNNER_COORDINATOR_ADDRESS);
    the same node recreated (after a preemption) gets another one."""
    client = tpu_client(quick_emulator)
    script = 'echo "$RUNNER_EMULATOR_COORDINATOR" > coordinator\nsleep 600\n'
    seen = []
    for _boot in range(2):
        name = boot(client, "pod", script, accelerator="v4-16")
        node = quick_emulator.node(name)
        assert node is not None and len(node.vms) == 2
        (coordinator,) = {wait_file(vm.directory / "coordinator").strip() for vm in node.vms}
        seen.append(coordinator)
        client.delete_node(name=name).result(polling=FAST)
    assert seen[0].startswith("127.0.0.1:") and seen[1] != seen[0]


def test_a_vm_deletes_its_own_node(client: tpu_v2.TpuClient, tpu_emulator: TpuEmulator) -> None:
    script = MD + (
        "until [ -e go ]; do sleep 0.05; done\n"  # until the test has looked at the VM
        f"TOKEN=$(md instance/service-accounts/default/token | {TOKEN_SED})\n"
        # The deletion's SIGTERM follows the answer at once: the curl that asked ignores it, so that what it read
        # reaches delete.json (stdio's buffer, lost to a process ended by a signal).
        "(trap '' TERM\n"
        'curl -sf -X DELETE -H "Authorization: Bearer $TOKEN" \\\n'
        f'  "$RUNNER_TPU_API/v2/projects/{PROJECT}/locations/{ZONE}/nodes/selfdel" > delete.json)\n'
        "sleep 300\n"
    )
    tpu_emulator.vm_grace_s = 60.0  # the VM is gone once that curl has ended; this only bounds how long it may take
    name = boot(client, "selfdel", script)
    vm = tpu_emulator.node(name).vms[0]  # type: ignore[union-attr]
    (vm.directory / "go").touch()
    wait_gone(client, name)
    answer = json.loads((vm.directory / "delete.json").read_text())  # it came before the VM was killed
    assert answer["metadata"]["verb"] == "delete" and answer["metadata"]["target"] == name
    delete = [r for r in tpu_emulator.requests if r.method == "DELETE"]
    assert [(d.status, (d.authorization or "").startswith("Bearer ya29.")) for d in delete] == [(200, True)]
    assert not processes.process_alive(vm.pid)
    assert marked_pids(f"{tpu_emulator.id}:") == []


def test_deleting_a_node_kills_everything_its_vm_started(quick_emulator: TpuEmulator, tmp_path: Path) -> None:
    client = tpu_client(quick_emulator)
    # A script that ignores SIGTERM, with a child in its process group and one that left it (setsid).
    script = "trap '' TERM\nsleep 600 & echo $! > child.pid\nsetsid sleep 600 & echo $! > escaped.pid\nwait\n"
    name = boot(client, "long", script)
    vm = quick_emulator.node(name).vms[0]  # type: ignore[union-attr]
    pids = [int(wait_file(vm.directory / f)) for f in ("child.pid", "escaped.pid")] + [vm.pid]
    assert all(processes.process_alive(pid) for pid in pids)
    started = time.monotonic()
    client.delete_node(name=name).result(polling=FAST)
    assert time.monotonic() - started >= 0.5  # SIGTERM was ignored: SIGKILL came after the grace
    assert not any(processes.process_alive(pid) for pid in pids)
    assert marked_pids(f"{quick_emulator.id}:") == []
    with pytest.raises(gexc.NotFound):
        client.get_node(name=name)


def test_preemption_terms_the_vm(quick_emulator: TpuEmulator) -> None:
    client = tpu_client(quick_emulator)
    script = "trap 'echo got SIGTERM > term; exit 0' TERM\necho up > up\nwhile true; do sleep 0.1; done\n"
    name = boot(client, "spot", script, scheduling_config={"spot": True})
    vm = quick_emulator.node(name).vms[0]  # type: ignore[union-attr]
    wait_file(vm.directory / "up")
    quick_emulator.preempt("spot")
    assert client.get_node(name=name).state == tpu_v2.Node.State.PREEMPTED
    assert (vm.directory / "term").read_text().strip() == "got SIGTERM"
    assert not processes.process_alive(vm.pid)
    assert quick_emulator.node(name).vms == ()  # type: ignore[union-attr]


def test_a_preemption_says_so_on_the_metadata_server_before_the_soft_off(quick_emulator: TpuEmulator) -> None:
    """instance/preempted turns TRUE before the VM's processes get SIGTERM, as on Compute Engine: what a VM reads
    in its SIGTERM trap already says why."""
    client = tpu_client(quick_emulator)
    script = MD + (
        "trap 'md instance/preempted > at-term; exit 0' TERM\n"
        "md instance/preempted > before; md instance/maintenance-event > maintenance\n"
        "echo up > up\nwhile true; do sleep 0.1; done\n"
    )
    name = boot(client, "spot", script, scheduling_config={"spot": True})
    vm = quick_emulator.node(name).vms[0]  # type: ignore[union-attr]
    wait_file(vm.directory / "up")
    assert (vm.directory / "before").read_text() == "FALSE"
    assert (vm.directory / "maintenance").read_text() == "NONE"
    quick_emulator.preempt("spot")
    assert (vm.directory / "at-term").read_text() == "TRUE"


def metadata_get(url: str, query: str = "") -> tuple[str, str]:
    """(value, ETag) of one metadata request, as a VM makes it."""
    request = urllib.request.Request(url + query, headers={"Metadata-Flavor": "Google"})
    with urllib.request.urlopen(request, timeout=60) as answer:
        return answer.read().decode(), answer.headers["ETag"]


def test_a_wait_for_change_request_is_answered_when_the_value_changes(quick_emulator: TpuEmulator) -> None:
    """?wait_for_change=true as the real server holds it: until the value (and its ETag) changes; at once when
    last_etag names an ETag the value no longer has; with timeout_sec, the value as it is once that has passed."""
    client = tpu_client(quick_emulator)
    boot(client, "maint", "sleep 600\n")
    url = f"{quick_emulator.endpoint}/_vm/{PROJECT}/{ZONE}/maint/0/computeMetadata/v1/instance/maintenance-event"
    value, tag = metadata_get(url)
    assert value == "NONE" and tag
    assert metadata_get(url, "?wait_for_change=true&last_etag=older") == (value, tag)  # a change not yet seen
    assert metadata_get(url, f"?wait_for_change=true&last_etag={tag}&timeout_sec=0.2") == (value, tag)
    answers: list[tuple[str, str]] = []
    waiting = threading.Thread(
        target=lambda: answers.append(metadata_get(url, f"?wait_for_change=true&last_etag={tag}"))
    )
    waiting.start()  # held, or, if it comes after the notice, answered at once: its last_etag is the old value's
    quick_emulator.maintenance_notice("maint")
    waiting.join(60)
    ((changed, new_tag),) = answers
    assert changed == "TERMINATE_ON_HOST_MAINTENANCE" and new_tag != tag


def test_missing_image_makes_pull_and_run_fail(client: tpu_v2.TpuClient, tpu_emulator: TpuEmulator) -> None:
    tpu_emulator.missing_image("us-docker.pkg.dev/rehearsal/*")
    script = f'docker pull {IMAGE}; echo "pull=$?" > result\ndocker run --rm {IMAGE}; echo "run=$?" >> result\n'
    name = boot(client, "noimage", script)
    vm = tpu_emulator.node(name).vms[0]  # type: ignore[union-attr]
    assert wait_file(vm.directory / "result", ready=lambda t: "run=" in t).split() == ["pull=1", "run=125"]
    log = console(vm.directory)
    assert f"Error response from daemon: manifest for {IMAGE} not found: manifest unknown" in log
    assert f"Unable to find image '{IMAGE}' locally" in log


def test_stop_leaves_no_vm_process(tmp_path: Path) -> None:
    emulator = TpuEmulator(workdir=tmp_path, vm_grace_s=0.5, create_delay_s=0.1)
    emulator.start()
    try:
        client = tpu_client(emulator)
        name = boot(client, "a", "sleep 600 & wait", accelerator="v4-16")
        pids = [vm.pid for vm in emulator.node(name).vms]  # type: ignore[union-attr]
        assert len(pids) == 2 and all(processes.process_alive(p) for p in pids)
    finally:
        emulator.stop()
    assert not any(processes.process_alive(p) for p in pids)
    assert marked_pids(f"{emulator.id}:") == []


def test_a_node_without_a_startup_script_runs_nothing(client: tpu_v2.TpuClient, tpu_emulator: TpuEmulator) -> None:
    node = tpu_v2.Node(accelerator_type="v4-8", runtime_version=RUNTIME)
    name = client.create_node(parent=PARENT, node_id="bare", node=node).result(polling=FAST).name
    assert tpu_emulator.node(name).vms == ()  # type: ignore[union-attr]


def test_a_ready_node_whose_startup_script_never_starts(quick_emulator: TpuEmulator) -> None:
    client = tpu_client(quick_emulator)
    quick_emulator.boot_hang(ZONE, count=1)
    name = boot(client, "hung", "touch started\n")
    node = client.get_node(name=name)
    assert (node.state, node.health) == (tpu_v2.Node.State.READY, tpu_v2.Node.Health.HEALTHY)  # all looks well...
    info = quick_emulator.node(name)
    assert info is not None and info.vms == ()  # ...but nothing runs
    log = info.console_logs[0].read_text()
    assert "the startup-script never started" in log and "boot_hang" in log
    time.sleep(0.3)
    assert not (info.console_logs[0].parent / "started").exists()
    # The fault is used up: the next node runs its script.
    other = boot(client, "fine", "touch started\n")
    assert wait_file(quick_emulator.node(other).console_logs[0].parent / "started", 10, lambda _: True) == ""  # type: ignore[union-attr]


def test_a_failed_deletion_leaves_the_vms_running(quick_emulator: TpuEmulator) -> None:
    client = tpu_client(quick_emulator)
    name = boot(client, "stays", "echo up > up\nsleep 600\n")
    vm = quick_emulator.node(name).vms[0]  # type: ignore[union-attr]
    wait_file(vm.directory / "up")
    quick_emulator.delete_fails(ZONE, count=1)
    with pytest.raises(gexc.InternalServerError):
        client.delete_node(name=name).result(polling=FAST)
    assert client.get_node(name=name).state == tpu_v2.Node.State.READY
    assert processes.process_alive(vm.pid) and quick_emulator.node(name).vms[0].pid == vm.pid  # type: ignore[union-attr]
    client.delete_node(name=name).result(polling=FAST)
    assert not processes.process_alive(vm.pid)


# -- the docker shim on its own ---------------------------------------------------------------------------------


def shim(args: list[str], tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    base = child_env()
    return subprocess.run(
        [*SHIM, *args], env={**base, "TMPDIR": str(tmp_path), **env}, capture_output=True, text=True, timeout=60
    )


def test_docker_run_flags_and_environment(tmp_path: Path) -> None:
    show = (
        "import json, os; print(json.dumps({k: os.environ.get(k) for k in ('FOO', 'FROM_ENV', 'FILE', 'HOST_ONLY')}))"
    )
    env_file = tmp_path / "job.env"
    env_file.write_text(f"# comment\n\nFILE=from file\nRUNNER_RUN_DIR={tmp_path / 'run'}\n")
    result = shim(
        [
            "run", "--rm", "--name", "t1", "--privileged", "--net=host", "-it", "--init", "--shm-size=1g",
            "-v", "/tmp:/tmp:ro", "--env-file", str(env_file), "-e", "FOO=bar", "-e", "FROM_ENV", "-e", "UNSET_VAR",
            "-e", f"RUNNER_COMMAND={json.dumps([sys.executable, '-c', show])}", "--user", "1000:1000",
            "--ulimit", "memlock=-1", "--log-driver", "none", IMAGE,
        ],
        tmp_path,
        FROM_ENV="inherited",
        HOST_ONLY="not for the container",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout.splitlines()[-1])
    assert seen == {"FOO": "bar", "FROM_ENV": "inherited", "FILE": "from file", "HOST_ONLY": None}
    assert f"Unable to find image '{IMAGE}' locally" in result.stderr  # run pulls what is not there


def test_drop_env_keeps_variables_out_of_the_container(quick_emulator: TpuEmulator, tmp_path: Path) -> None:
    """The drop-env fault: the job never learns its deadline, whatever the bootstrap passes (-e, --env-file)."""
    names = (contract.MAX_RUNTIME_S, contract.DEADLINE, "KEEP")
    show = f"import json, os; print(json.dumps({{k: os.environ.get(k) for k in {names!r}}}))"
    env_file = tmp_path / "job.env"
    env_file.write_text(f"{contract.DEADLINE}=1900000000\n{contract.RUN_DIR}={tmp_path / 'run'}\n")
    args = [
        "run", "--rm", "--env-file", str(env_file), "-e", f"{contract.MAX_RUNTIME_S}=60", "-e", "KEEP=1",
        "-e", f"{contract.COMMAND}={json.dumps([sys.executable, '-c', show])}", IMAGE,
    ]  # fmt: skip
    fault = quick_emulator.drop_env("RUNNER_MAX_*", contract.DEADLINE, image="us-docker.pkg.dev/rehearsal/*", count=1)
    assert fault.env == ("RUNNER_MAX_*", contract.DEADLINE)
    dropped = shim(args, tmp_path, RUNNER_TPU_API=quick_emulator.endpoint)
    assert dropped.returncode == 0, dropped.stderr
    assert json.loads(dropped.stdout.splitlines()[-1]) == {
        contract.MAX_RUNTIME_S: None,
        contract.DEADLINE: None,
        "KEEP": "1",
    }
    assert f"without {contract.DEADLINE}, {contract.MAX_RUNTIME_S}" in dropped.stderr  # on the VM's console
    # Its count is used up: the next container gets everything again. The admin API adds the same fault.
    again = shim(args, tmp_path, RUNNER_TPU_API=quick_emulator.endpoint)
    assert json.loads(again.stdout.splitlines()[-1])[contract.DEADLINE] == "1900000000"
    request = urllib.request.Request(
        f"{quick_emulator.endpoint}/_emulator/faults/drop-env",
        data=json.dumps({"env": ["KEEP"]}).encode(),
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert json.load(answer)["env"] == ["KEEP"]
    other = shim(args, tmp_path, RUNNER_TPU_API=quick_emulator.endpoint)
    assert json.loads(other.stdout.splitlines()[-1])["KEEP"] is None
    with pytest.raises(ValueError):
        quick_emulator.drop_env()


def test_docker_run_exit_codes(tmp_path: Path) -> None:
    bad = shim(["run", "--bogus", IMAGE], tmp_path)
    assert bad.returncode == 125 and "unknown flag: --bogus" in bad.stderr
    assert shim(["run", "-z", IMAGE], tmp_path).returncode == 125
    assert shim(["run", "--entrypoint", "sh", IMAGE], tmp_path).returncode == 125
    assert shim(["run"], tmp_path).returncode == 125
    no_run_dir = shim(["run", "--rm", IMAGE], tmp_path)  # the image's entrypoint itself refuses: exit status 2
    assert no_run_dir.returncode == 2 and "RUNNER_RUN_DIR is not set" in no_run_dir.stderr
    failing = ["-e", f"RUNNER_RUN_DIR={tmp_path / 'r'}", "-e", 'RUNNER_COMMAND=["false"]', IMAGE]
    assert shim(["run", "--rm", *failing], tmp_path).returncode == 1
    assert shim(["frobnicate"], tmp_path).returncode == 1
    login = subprocess.run(
        [*SHIM, "login", "-u", "oauth2accesstoken", "--password-stdin", "https://gcr.io"],
        input="token\n",
        env={**os.environ, "TMPDIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert login.returncode == 0 and "Login Succeeded" in login.stdout


def test_docker_stop_ends_a_running_container(tmp_path: Path) -> None:
    env = child_env() | {"TMPDIR": str(tmp_path)}
    run_dir = tmp_path / "run"
    job = json.dumps([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"])
    proc = subprocess.Popen(
        [
            *SHIM,
            "run",
            "--rm",
            "--name",
            "job",
            "-e",
            f"RUNNER_RUN_DIR={run_dir}",
            "-e",
            f"RUNNER_COMMAND={job}",
            IMAGE,
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # "Unable to find image ..." first, then the job's own output
            if line.strip() == "up":
                break
        conflict = shim(["run", "--name", "job", IMAGE], tmp_path)
        assert conflict.returncode == 125 and 'The container name "/job" is already in use' in conflict.stderr
        assert "job" in shim(["ps"], tmp_path).stdout
        stopped = shim(["stop", "--time", "10", "job"], tmp_path)
        assert stopped.returncode == 0 and stopped.stdout.strip() == "job"
        assert proc.wait(15) == 143  # the supervisor stopped its job on SIGTERM: 128 + 15
        record = json.loads((run_dir / contract.exit_key(0)).read_text())
        assert record["state"] == "cancelled"
        assert shim(["rm", "-f", "job"], tmp_path).returncode == 0
        assert shim(["stop", "nothing"], tmp_path).returncode == 1
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_clock_skew_fault_gives_the_vm_its_own_clock_and_leaves_the_api_s(quick_emulator: TpuEmulator) -> None:
    """What the VM writes carries its clock (`date` in its startup script, time.time() in its containers); the API's
    timestamps (createTime) stay on the emulator's."""
    quick_emulator.clock_skew(3600, count=1)
    client = tpu_client(quick_emulator)
    script = (  # the VM's date, then a container's supervisor, which stamps its exit record with time.time()
        "date +%s > vm-date.tmp && mv vm-date.tmp vm-date\n"
        f'docker run --rm -e RUNNER_RUN_DIR="$PWD/run" -e \'RUNNER_COMMAND=["true"]\' {IMAGE} && touch ran\n'
    )
    before = time.time()
    name = boot(client, "skewed", script)
    vm = quick_emulator.node(name).vms[0]  # type: ignore[union-attr]
    vm_date = int(wait_file(vm.directory / "vm-date"))
    wait_file(vm.directory / "ran", ready=lambda _: True)
    written = json.loads((vm.directory / "run" / contract.exit_key(0)).read_text())["finished_at"]
    assert 3590 < vm_date - before < 3660 and 3590 < written - before < 3660
    created = client.get_node(name=name).create_time.timestamp()
    assert before - 2 < created < time.time() + 2


def test_a_node_can_be_stopped_or_shown_in_a_maintenance_state(quick_emulator: TpuEmulator) -> None:
    client = tpu_client(quick_emulator)
    name = boot(client, "maintained", "echo up > up\nwhile true; do sleep 0.1; done\n")
    vm = quick_emulator.node(name).vms[0]  # type: ignore[union-attr]
    wait_file(vm.directory / "up")
    quick_emulator.maintain("maintained", "REPAIRING", seconds=None)  # until it is ended
    assert client.get_node(name=name).state == tpu_v2.Node.State.REPAIRING
    quick_emulator.end_maintenance("maintained")
    assert client.get_node(name=name).state == tpu_v2.Node.State.READY and processes.process_alive(vm.pid)
    with quick_emulator.frozen():  # the states hold, however slow this machine is between the calls
        quick_emulator.maintain("maintained", "HIDDEN", seconds=0.5)
        assert client.get_node(name=name).state == tpu_v2.Node.State.HIDDEN
    wait_for(lambda: client.get_node(name=name).state == tpu_v2.Node.State.READY, "READY after 0.5 s of HIDDEN")
    assert processes.process_alive(vm.pid)
    with quick_emulator.frozen():
        quick_emulator.stop_node("maintained")
        assert client.get_node(name=name).state == tpu_v2.Node.State.STOPPING
    deadline = time.monotonic() + 10
    while client.get_node(name=name).state != tpu_v2.Node.State.STOPPED:
        assert time.monotonic() < deadline, "never STOPPED"
        time.sleep(0.1)
    deadline = time.monotonic() + 10
    while processes.process_alive(vm.pid):
        assert time.monotonic() < deadline, "the stopped node's VM still runs"
        time.sleep(0.1)
    client.delete_node(name=name).result(polling=FAST)
