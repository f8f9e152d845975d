"""The TPU VM startup script: shellcheck-clean, and no spec value can run as shell on the VM.

The rendered script is executed for real by bash, with `docker` and `curl` replaced by recording stand-ins on
PATH (the only two programs it talks to the world through), so the test sees exactly what a VM would do.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from runner.backends import plan_cloud
from runner.launch.bootstrap import TEMPLATE, env_file, render
from runner.spec import JobSpec
from tests.conftest import REPO
from tests.waiting import wait_for

IMAGE = "us-central1-docker.pkg.dev/my-project/tpu-runner/trainer:v1"
ATTACKS = [
    "'; touch {m}; '",
    "$(touch {m})",
    "`touch {m}`",
    '"; touch {m}; "',
    "\\'$(touch {m})\\'",
    "a\\",
    "$HOME",
    "x && touch {m}",
    "|| touch {m}",
    "{{a,b}}",
]

FAKE_CURL = """#!/bin/bash
# Records every call; answers like the metadata server and Cloud Storage would.
printf '%s\\n' "$*" >> "$FAKE_LOG/curl.log"
url="${@: -1}"
case "$url" in
  *o\\?prefix=*exit%2F*)  # a listing of exit/: the pages the test left in listing-<listing>-<page>.json
    n=$(cat "$FAKE_LOG/listings" 2>/dev/null || echo 0)
    [[ "$url" == *pageToken=* ]] || echo $((n + 1)) >"$FAKE_LOG/listings"
    n=$(cat "$FAKE_LOG/listings"); page=1; [[ "$url" == *pageToken=p2* ]] && page=2
    cat "$FAKE_LOG/listing-$n-$page.json" 2>/dev/null || exit 22 ;;
  *agent-worker-number) echo 0 ;;
  *service-accounts/default/token) echo '{"access_token": "tok", "expires_in": 3599}' ;;
  *uploadType=media*)
    for ((i = 1; i <= $#; i++)); do
      if [ "${!i}" = --data-binary ]; then j=$((i + 1)); cp "${!j#@}" "$FAKE_LOG/upload.$RANDOM"; fi
    done ;;
  */storage/v1/b/*) exit 22 ;;
esac
exit 0
"""

FAKE_DOCKER = """#!/bin/bash
printf '%s\\n' "$*" >> "$FAKE_LOG/docker.log"
if [ "$1" = run ]; then
  for ((i = 1; i <= $#; i++)); do
    if [ "${!i}" = --env-file ]; then j=$((i + 1)); cp "${!j}" "$FAKE_LOG/job.env"; fi
  done
fi
exit 0
"""


def harness(tmp_path: Path, docker: str = FAKE_DOCKER) -> tuple[dict[str, str], Path]:
    """PATH with the recording `curl` and `docker` first; returns the environment and the recording folder."""
    bin_dir, log = tmp_path / "bin", tmp_path / "log"
    bin_dir.mkdir()
    log.mkdir()
    for name, body in (("curl", FAKE_CURL), ("docker", docker)):
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod((bin_dir / name).stat().st_mode | stat.S_IEXEC)
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "FAKE_LOG": str(log),
        "TMPDIR": str(tmp_path),
        "HOME": str(tmp_path),
    }
    return env, log


def run_script(script: str, tmp_path: Path, docker: str = FAKE_DOCKER) -> tuple[subprocess.CompletedProcess[str], Path]:
    env, log = harness(tmp_path, docker)
    result = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60, check=False)
    return result, log


ACCELERATOR = {"type": "v2-8", "zone": "us-central1-b", "project": "my-project"}


def cloud_spec(**fields: object) -> JobSpec:
    return JobSpec.model_validate(
        {"name": "boot", "image": IMAGE, "training": {}, "storage": "gs://my-bucket/p", "accelerator": ACCELERATOR}
        | fields
    )


def hostile_spec(marker: Path) -> JobSpec:
    attacks = [a.format(m=marker) for a in ATTACKS]
    return JobSpec.model_validate(
        {
            "name": "inj",
            "image": IMAGE,
            "command": ["sh", "-c", f"touch {marker}"],  # runs in the container, never on the VM host
            "env": {f"V{i}": a for i, a in enumerate(attacks)},
            "storage": f"gs://my-bucket/p/{attacks[0]}/{attacks[1]}",
            "accelerator": {"type": "v2-8", "zone": "us-central1-b", "project": "my-project"},
        }
    )


def shellcheck(path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("shellcheck") or str(Path(sys.executable).parent / "shellcheck")
    return subprocess.run([exe, "--severity=style", *extra, str(path)], capture_output=True, text=True, check=False)


def test_template_and_rendered_scripts_are_shellcheck_clean(tmp_path: Path) -> None:
    rendered = tmp_path / "rendered.sh"
    rendered.write_text(render(plan_cloud(cloud_spec(), None, environ={}), "us-central1-b"))
    for path in (TEMPLATE, REPO / "runner" / "launch" / "startup-script.sh", rendered):
        result = shellcheck(path)
        assert result.returncode == 0, result.stdout
    # With hostile values, shellcheck only notes (SC2016) that '$(...)' stays literal in single quotes: the point.
    rendered.write_text(render(plan_cloud(hostile_spec(tmp_path / "m"), None, environ={}), "us-central1-b"))
    result = shellcheck(rendered, "--exclude=SC2016")
    assert result.returncode == 0, result.stdout


def test_no_spec_value_runs_as_shell(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    s = hostile_spec(marker)
    p = plan_cloud(s, None, environ={})
    result, log = run_script(render(p, "us-central1-b"), tmp_path)
    assert result.returncode == 0, result.stderr
    assert not marker.exists(), "a spec value was executed by the bootstrap"
    # Every hostile value reached the container's environment byte for byte.
    job_env = (log / "job.env").read_text().splitlines()
    for key, value in s.env.items():
        assert f"{key}={value}" in job_env
    assert f"RUNNER_COMMAND={json.dumps(s.command)}" in job_env
    assert "RUNNER_WORKER_ID=0" in job_env
    assert "RUNNER_GRACE_S=87" in job_env  # an on-demand VM's 90 s, less the bootstrap's reserve
    docker = (log / "docker.log").read_text()
    assert f"pull {IMAGE}" in docker
    assert "run --rm --name tpu-runner-job --privileged --net=host --stop-timeout 87 --env-file" in docker
    # The run directory's odd prefix is percent-encoded into the upload URL, never expanded.
    curl = (log / "curl.log").read_text()
    assert "name=p%2F%27%3B%20touch%20" in curl


def test_every_value_is_quoted_in_the_values_block(tmp_path: Path) -> None:
    p = plan_cloud(hostile_spec(tmp_path / "m"), None, environ={})
    script = render(p, "us-central1-b")
    block = script.split("# --- values (rendered by runner/bootstrap.py) ---\n")[1].split("# --- end values ---")[0]
    probe = block + 'printf "%s\\n" "$RUN_DIR" "$IMAGE" "$NODE" "$JOB_ENV_B64"\n'
    out = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[0] == p.run_dir and out[1] == IMAGE and out[2] == p.run_id
    assert base64.b64decode(out[3]).decode() == env_file(p.env)


def test_image_pull_failure_is_recorded_and_the_node_deleted(tmp_path: Path) -> None:
    script = render(plan_cloud(cloud_spec(), None, environ={}), "us-central1-b").replace(
        "sleep $((attempt * 2))", "true"
    )
    failing_docker = textwrap.dedent("""\
        #!/bin/bash
        printf '%s\\n' "$*" >> "$FAKE_LOG/docker.log"
        [ "$1" = pull ] && { echo "Error response from daemon: manifest unknown" >&2; exit 1; }
        exit 0
        """)
    result, log = run_script(script, tmp_path, docker=failing_docker)
    assert result.returncode == 125
    uploads = [json.loads(p.read_text()) for p in log.glob("upload.*") if p.read_text().startswith('{"worker"')]
    assert uploads and uploads[-1]["state"] == "failed" and "docker pull" in uploads[-1]["error"]
    curl = (log / "curl.log").read_text()
    assert "-X DELETE" in curl and "/v2/projects/my-project/locations/us-central1-b/nodes/boot-" in curl
    assert (log / "docker.log").read_text().count("pull ") == 3  # retried before giving up
    assert "run " not in (log / "docker.log").read_text()


@pytest.mark.parametrize(
    ("policy", "code", "deletes"),
    [("always", 3, True), ("on_success", 3, False), ("on_success", 0, True), ("never", 0, False)],
)
def test_self_delete_follows_the_teardown_policy(tmp_path: Path, policy: str, code: int, deletes: bool) -> None:
    script = render(plan_cloud(cloud_spec(teardown={"policy": policy}), None, environ={}), "us-central1-b")
    result, log = run_script(script, tmp_path, docker=f'#!/bin/bash\n[ "$1" = run ] && exit {code}\nexit 0\n')
    assert result.returncode == code
    assert ("-X DELETE" in (log / "curl.log").read_text()) == deletes
    events = [p.read_text() for p in log.glob("upload.*") if '"source": "bootstrap-0"' in p.read_text()]
    assert f'"event": "container_exited", "exit_code": {code}' in max(events, key=len)


# A container that runs until `docker stop` (its env file kept, as FAKE_DOCKER keeps it).
BLOCKING_DOCKER = textwrap.dedent("""\
    #!/bin/bash
    printf '%s\\n' "$*" >> "$FAKE_LOG/docker.log"
    case "$1" in
      run) for ((i = 1; i <= $#; i++)); do
             if [ "${!i}" = --env-file ]; then j=$((i + 1)); cp "${!j}" "$FAKE_LOG/job.env"; fi
           done
           echo $$ > "$FAKE_LOG/run.pid"; trap 'exit 143' TERM; touch "$FAKE_LOG/running"
           while :; do sleep 0.1 & wait $!; done ;;
      stop) kill -TERM "$(cat "$FAKE_LOG/run.pid")"; exit 0 ;;
    esac
    exit 0
    """)


def test_a_shutdown_signal_stops_the_job_but_leaves_the_node_to_the_runner(tmp_path: Path) -> None:
    """Preemption or maintenance: SIGTERM to the script. The container is stopped, the node is not deleted."""
    script = render(plan_cloud(cloud_spec(), None, environ={}), "us-central1-b")
    env, log = harness(tmp_path, BLOCKING_DOCKER)
    proc = subprocess.Popen(
        ["bash", "-c", script], env=env, text=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    wait_for((log / "running").exists, "the container to run")  # the signal only once it does, however slow
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) != 0
    assert "stop --time 87 tpu-runner-job" in (log / "docker.log").read_text()  # an on-demand VM's grace
    assert "-X DELETE" not in (log / "curl.log").read_text()
    events = max((p.read_text() for p in log.glob("upload.*") if "bootstrap-0" in p.read_text()), key=len)
    assert '"shutdown": true' in events


def test_events_keep_their_time_when_the_shutdown_signal_reaches_every_process_on_the_vm(tmp_path: Path) -> None:
    """A VM shutting down (a delete, a preemption) sends SIGTERM to all its processes at once: the script traps it
    and goes on, but the subshells it has running die. The signal arriving while the time of `container_exited` is
    being read (a `date` that signals its process group, once, when asked for the time as `now` asks, with
    nanoseconds: the script's other `date`, before its trap is set, is left alone) must not leave that event without
    its time."""
    script = render(plan_cloud(cloud_spec(), None, environ={}), "us-central1-b")
    docker = FAKE_DOCKER.replace("exit 0\n", '[ "$1" = run ] && touch "$FAKE_LOG/shut-down-now"\nexit 0\n')
    env, log = harness(tmp_path, docker)
    date = tmp_path / "bin" / "date"
    date.write_text(
        "#!/bin/bash\n"
        'if [ "$1" = +%s.%N ] && [ -e "$FAKE_LOG/shut-down-now" ]; then\n'
        '  rm -f "$FAKE_LOG/shut-down-now"; kill -TERM 0\n'
        "fi\n"
        f'exec {shutil.which("date")} "$@"\n'
    )
    date.chmod(0o755)
    proc = subprocess.Popen(
        ["bash", "-c", script], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    proc.wait(60)
    assert not (log / "shut-down-now").exists(), "the script read no time after the container exited"
    lines = max((p.read_text() for p in log.glob("upload.*") if "bootstrap-0" in p.read_text()), key=len)
    events = [json.loads(line) for line in lines.splitlines()]  # every line JSON: no `"time": ,`
    assert all(isinstance(e["time"], int | float) for e in events), events
    assert events[-1]["event"] == "container_exited"


def test_the_first_host_sees_every_worker_s_exit_record_in_one_listing(tmp_path: Path) -> None:
    """Before it deletes its slice, host 0 waits for every other worker's exit record: one listing of exit/ (its
    pages followed) says how many there are, listed again a second later while some are missing; never one request
    per worker, never a fixed wait per missing one."""
    spec = JobSpec.model_validate(
        {
            "name": "slice",
            "image": IMAGE,
            "command": ["python", "train.py"],  # every worker runs it
            "storage": "gs://my-bucket/p",
            "accelerator": {"type": "v2-32", "zone": "us-central1-a", "project": "my-project"},
        }
    )
    plan = plan_cloud(spec, None, environ={})
    script = render(plan, "us-central1-a")
    env, log = harness(tmp_path, "#!/bin/bash\nexit 0\n")
    prefix = f"p/runs/{plan.run_id}/exit/worker-"

    def page(*workers: int, token: str | None = None, pretty: bool = False) -> str:
        body = {"items": [{"name": f"{prefix}{w}.json"} for w in workers]} | ({"nextPageToken": token} if token else {})
        return json.dumps(body, indent=1 if pretty else None)

    (log / "listing-1-1.json").write_text(page(0, 1, token="p2", pretty=True))  # Cloud Storage's own layout
    (log / "listing-1-2.json").write_text(page(2))
    (log / "listing-2-1.json").write_text(page(0, 1, token="p2"))
    (log / "listing-2-2.json").write_text(page(2, 3))
    result = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    calls = (log / "curl.log").read_text().splitlines()
    listings = [i for i, call in enumerate(calls) if "?prefix=" in call and "exit%2F" in call]
    assert len(listings) == 4 and (log / "listings").read_text().strip() == "2"  # two listings of two pages
    assert all("fields=items(name),nextPageToken" in calls[i] for i in listings)
    (delete,) = [i for i, call in enumerate(calls) if "-X DELETE" in call]
    assert delete > listings[-1]
    assert not [call for call in calls if "exit%2Fworker-1.json" in call or "exit%2Fworker-3.json" in call]


NOTICE_CURL = FAKE_CURL.replace(
    'case "$url" in\n',
    """case "$url" in
  */instance/preempted\\?* | */instance/maintenance-event\\?*)
    # The metadata server's notices: a file of the test's holds the value (else the normal one); a wait_for_change
    # request is held a moment, as the real server holds it until the value changes.
    key="${url##*/instance/}"; key="${key%%\\?*}"
    case "$key" in preempted) value=FALSE ;; *) value=NONE ;; esac
    [ -e "$FAKE_LOG/instance-$key" ] && value="$(cat "$FAKE_LOG/instance-$key")" || sleep 0.2
    for ((i = 1; i <= $#; i++)); do
      j=$((i + 1))
      case "${!i}" in
        -o) printf '%s' "$value" > "${!j}" ;;
        -D) printf 'HTTP/1.1 200 OK\\r\\nETag: %s\\r\\n\\r\\n' "$value" > "${!j}" ;;
      esac
    done
    printf 200
    exit 0 ;;
""",
)


@pytest.mark.parametrize(
    ("key", "value", "notice"),
    [
        ("preempted", "TRUE", "preemption_notice"),
        ("maintenance-event", "TERMINATE_ON_HOST_MAINTENANCE", "maintenance_notice"),
    ],
)
def test_a_notice_on_the_metadata_server_stops_the_job_at_once_with_the_platforms_grace(
    tmp_path: Path, key: str, value: str, notice: str
) -> None:
    """A Spot VM: the notice (instance/preempted TRUE, or a maintenance that will terminate the VM) reaches the job
    through the script's own watch of the metadata server, with no signal to the script itself: the container is
    stopped with a Spot VM's 30 s less the bootstrap's reserve, which the supervisor's grace and Docker's own stop
    timeout agree with, the notice is recorded, and the node is left to the runner."""
    script = render(
        plan_cloud(cloud_spec(accelerator={**ACCELERATOR, "spot": True}), None, environ={}), "us-central1-b"
    )
    env, log = harness(tmp_path, BLOCKING_DOCKER)
    (tmp_path / "bin" / "curl").write_text(NOTICE_CURL)
    proc = subprocess.Popen(
        ["bash", "-c", script], env=env, text=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    wait_for(lambda: (log / "running").exists(), what="the container running")
    (log / f"instance-{key}").write_text(value)
    assert proc.wait(60) != 0
    docker = (log / "docker.log").read_text()
    assert "--stop-timeout 27 " in docker and "stop --time 27 tpu-runner-job" in docker
    assert "RUNNER_GRACE_S=27" in (log / "job.env").read_text().splitlines()
    assert "-X DELETE" not in (log / "curl.log").read_text()
    events = max((p.read_text() for p in log.glob("upload.*") if "bootstrap-0" in p.read_text()), key=len)
    said = {e["event"]: e for e in map(json.loads, events.splitlines())}
    assert said[notice]["value"] == value and said[notice]["grace_s"] == 27
    assert said["container_exited"]["shutdown"] is True


def test_normal_values_on_the_metadata_server_stop_nothing(tmp_path: Path) -> None:
    """FALSE and NONE (what the metadata server says of a VM with no notice) leave the job to end on its own, and the
    watches end with it."""
    script = render(plan_cloud(cloud_spec(), None, environ={}), "us-central1-b")
    docker = BLOCKING_DOCKER.replace("while :; do", 'while [ ! -e "$FAKE_LOG/finish" ]; do')
    env, log = harness(tmp_path, docker)
    (tmp_path / "bin" / "curl").write_text(NOTICE_CURL)
    proc = subprocess.Popen(
        ["bash", "-c", script], env=env, text=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    asked = log / "curl.log"
    wait_for(
        lambda: asked.exists() and asked.read_text().count("instance/maintenance-event?wait_for_change=true") >= 2,
        what="the maintenance-event watch asking twice",
    )
    (log / "finish").touch()
    assert proc.wait(60) == 0
    assert "stop " not in (log / "docker.log").read_text()


def test_the_bootstraps_crc32c_is_the_one_secret_manager_sends(tmp_path: Path) -> None:
    """A secret's payload is checked on the VM with bash and od alone (what every TPU VM has), against the
    dataCrc32c Secret Manager sends: the same CRC32C (Castagnoli) as google-crc32c's."""
    import re

    import google_crc32c

    function = re.search(r"^crc32c\(\) \{.*?^\}\n", TEMPLATE.read_text(), re.S | re.M)
    assert function is not None
    for i, data in enumerate([b"", b"a", b"hunter2\n", bytes(range(256)), os.urandom(4096)]):
        path = tmp_path / f"payload-{i}"
        path.write_bytes(data)
        out = subprocess.run(
            ["bash", "-c", function.group(0) + 'crc32c "$1"', "crc32c", str(path)],
            capture_output=True, text=True, timeout=60, check=True,
        ).stdout  # fmt: skip
        assert out == str(google_crc32c.value(data)), data[:16]


def test_secrets_render_as_references_only_and_stay_shellcheck_clean(tmp_path: Path) -> None:
    spec = cloud_spec(
        secrets={
            "WANDB_API_KEY": "wandb/versions/latest",
            "KEY": {"ref": "projects/p-123456/secrets/k/versions/2", "as": "file"},
        }
    )
    rendered = render(plan_cloud(spec, None, environ={}), "us-central1-b")
    assert (
        "SECRETS='KEY file projects/p-123456/secrets/k/versions/2\n"
        "WANDB_API_KEY env projects/my-project/secrets/wandb/versions/latest\n'"
    ) in rendered
    path = tmp_path / "rendered.sh"
    path.write_text(rendered)
    assert shellcheck(path).returncode == 0
