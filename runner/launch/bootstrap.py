"""Render the TPU VM startup script (runner/launch/startup-script.sh) for one run.

Only the values block of the template changes; every value goes through shlex.quote, and the job's environment
travels base64-encoded, so no spec value (a name, an env var, a command) can ever be run as shell on the VM. The dry
run shows that environment in plain text beside the script (runner.launch.job).
"""

from __future__ import annotations

import base64
import re
import shlex
from pathlib import Path

from runner import contract
from runner.plan.planner import Plan

# A package file (not a link): a wheel carries it, and `runner submit` renders it from there.
TEMPLATE = Path(__file__).with_name("startup-script.sh")
# Seconds a VM has from a stop's notice to power-off: "On-demand instances: 90 seconds after you stop or delete an
# instance; Preemptible instances: 30 seconds after instance preemption begins" (cloud.google.com/compute/docs/
# shutdownscript; a Spot VM is preempted the same way: .../instances/spot). Of it, the bootstrap keeps a few seconds
# for what it does once the container is gone (its last event, the exit record's check); the container's stop
# timeout, and the supervisor's grace (RUNNER_GRACE_S), are the rest.
SPOT_GRACE_S = 30
ON_DEMAND_GRACE_S = 90
BOOTSTRAP_RESERVE_S = 3
_BLOCK = re.compile(r"(# --- values \(rendered by runner/bootstrap\.py\) ---\n)(.*?)(# --- end values ---\n)", re.S)


def env_file(env: dict[str, str]) -> str:
    """docker --env-file content: KEY=VALUE lines, values literal (Docker does no quoting or expansion). The spec
    refuses a value that cannot be one line (runner.spec's env values), with its line; this guards the format."""
    for key, value in env.items():
        if "\n" in value or "\0" in value:
            raise ValueError(f"{key}: a container environment value cannot contain a newline or NUL")
    return "".join(f"{key}={value}\n" for key, value in sorted(env.items()))


def stop_timeout_s(plan: Plan) -> int:
    """How long the job's container gets from a stop's SIGTERM to SIGKILL on this plan's VMs: the platform's grace
    (a Spot VM's 30 s, an on-demand VM's 90 s), less the bootstrap's reserve."""
    grace = SPOT_GRACE_S if plan.spec.accelerator.spot else ON_DEMAND_GRACE_S
    return grace - BOOTSTRAP_RESERVE_S


def values(plan: Plan, node_id: str | None = None) -> dict[str, str]:
    cloud = plan.cloud
    if cloud is None:
        raise ValueError(f"run {plan.run_id} is not a cloud run: no startup script")
    policy = plan.spec.teardown.policy
    return {
        "RUN_ID": plan.run_id,
        "RUN_DIR": plan.run_dir,
        "IMAGE": plan.spec.image,
        "PROJECT": cloud.project,
        "ZONE": "",  # filled per attempt: a stockout moves the node to the next zone
        "NODE": node_id or cloud.machine_id,  # a name collision gives the node another name than the plan's
        "SELF_DELETE": cloud.self_delete,  # what the VM deletes when its job is over: its node, instance or group
        "JOB_WORKERS": cloud.trainer_workers,
        "NUM_WORKERS": str(plan.num_workers),  # every slice's
        "SLICES": str(cloud.slices),
        "HOSTS": str(cloud.hosts),  # per slice
        "DELETE_ON_EXIT": "never" if plan.attach else policy,
        "DEADLINE": str(int(plan.deadline)),
        "CONTAINER": contract.JOB_CONTAINER,
        "SAFETY_STOP": str(contract.EXIT_SAFETY_STOP),
        "STOP_S": str(stop_timeout_s(plan)),  # docker's stop timeout, and the job's RUNNER_GRACE_S
        "JOB_ENV_B64": base64.b64encode(env_file(plan.env).encode()).decode(),
        # "NAME AS VERSION" lines: references only; the VM reads the values with its own service account.
        "SECRETS": "".join(f"{s.name} {s.mode} {s.source}\n" for s in plan.secrets if s.secret_manager),
    }


def render(plan: Plan, zone: str, node_id: str | None = None) -> str:
    """The startup script for `plan`'s node in `zone` (named `node_id`, by default the plan's)."""
    text = TEMPLATE.read_text()
    assignments = {**values(plan, node_id), "ZONE": zone}
    block = "".join(f"{key}={shlex.quote(value)}\n" for key, value in assignments.items())
    rendered, count = _BLOCK.subn(lambda m: m.group(1) + block + m.group(3), text)
    if count != 1:
        raise RuntimeError(f"{TEMPLATE}: the values block is missing or repeated")
    return rendered
