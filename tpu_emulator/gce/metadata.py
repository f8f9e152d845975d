"""The metadata server of an emulated Compute Engine instance, at /_gce/<project>/<zone>/<instance>/computeMetadata/v1.

It answers as Compute Engine's does (tpu_emulator.metadata.answer: Metadata-Flavor: Google, directory listings,
?recursive=true): project/project-id and numeric-project-id; instance/name, hostname, id, zone, machine-type,
network-interfaces/0/ip, scheduling/ (preemptible, automatic-restart, on-host-maintenance, provisioning-model),
preempted (TRUE once Compute Engine has begun preempting the instance, the key a Spot VM polls:
cloud.google.com/compute/docs/instances/create-use-spot#detect-preemption), maintenance-event (NONE: the emulator
schedules no maintenance), attributes/ (every metadata item, such
as startup-script, and created-by = the managed instance group for its members), and the service accounts with a
token.

For the VMs of a multi-host slice (a managed instance group with a workload policy) the attributes also carry what
a Cloud TPU VM's bootstrap reads to find its place: agent-worker-number and tpu-env (WORKER_ID, WORKER_HOSTNAMES,
ACCELERATOR_TYPE, ...), so that the same bootstrap and JAX's cluster detection run unchanged. Whether a Compute
Engine TPU VM's metadata holds these keys: unconfirmed.
"""

from __future__ import annotations

import hashlib
from typing import Any

from runner.credentials import CLOUD_PLATFORM
from tpu_emulator.gce.resources import Instance
from tpu_emulator.metadata import TOKEN
from tpu_emulator.resources import project_number


def token(instance: Instance) -> dict[str, Any]:
    digest = hashlib.sha256(f"{instance.path}/{instance.id}".encode()).hexdigest()[:40]
    return {"access_token": f"ya29.emulated-{digest}", "expires_in": 3599, "token_type": "Bearer"}


def _tpu_env(instance: Instance) -> str:
    values = {
        "ACCELERATOR_TYPE": instance.machine.accelerator,
        "CONSUMER_PROJECT_ID": instance.project,
        "CONSUMER_PROJECT_NUMBER": project_number(instance.project),
        "WORKER_HOSTNAMES": ",".join(instance.slice_hosts or (instance.name,)),
        "WORKER_ID": str(instance.worker),
        "ZONE": instance.zone,
    }
    return "".join(f"{key}: '{value}'\n" for key, value in sorted(values.items()))


def tree(instance: Instance) -> dict[str, Any]:
    number = project_number(instance.project)
    attributes = dict(instance.metadata_items())
    attributes["agent-worker-number"] = str(instance.worker)
    attributes["tpu-env"] = _tpu_env(instance)
    if instance.group:
        attributes["created-by"] = instance.group.replace(f"projects/{instance.project}/", f"projects/{number}/")
    accounts = instance.spec.get("serviceAccounts") or []
    services: dict[str, Any] = {}
    for account in accounts:
        email = account.get("email") or "default"
        if email == "default":
            email = f"{number}-compute@developer.gserviceaccount.com"
        entry = {
            "aliases": "default\n",
            "email": email,
            "scopes": "".join(f"{s}\n" for s in account.get("scopes") or [CLOUD_PLATFORM]),
            "token": TOKEN,
        }
        services["default"] = entry
        services[email] = entry
    scheduling = instance.scheduling
    model = instance.provisioning_model
    return {
        "instance": {
            "attributes": attributes,
            "hostname": f"{instance.name}.{instance.zone}.c.{instance.project}.internal",
            "id": instance.id,
            "name": instance.name,
            "zone": f"projects/{number}/zones/{instance.zone}",
            "machine-type": f"projects/{number}/machineTypes/{instance.machine.name}",
            "network-interfaces": {"0": {"ip": instance.internal_ip, "network": f"projects/{number}/networks/default"}},
            "maintenance-event": "NONE",
            "preempted": "TRUE" if instance.preempted else "FALSE",
            "scheduling": {
                "automatic-restart": str(scheduling.get("automaticRestart", model == "STANDARD")).upper(),
                "on-host-maintenance": str(scheduling.get("onHostMaintenance", "TERMINATE")),
                "preemptible": "TRUE" if model == "SPOT" or scheduling.get("preemptible") else "FALSE",
                "provisioning-model": model,
            },
            "service-accounts": services,
        },
        "project": {"attributes": {}, "numeric-project-id": number, "project-id": instance.project},
    }
