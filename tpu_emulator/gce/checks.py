"""What Compute Engine refuses beyond its schema: the semantic checks of an instance's (or template's) properties.

The schema (compute.v1.json, through tpu_emulator.discovery) already refused unknown fields, wrong types and enums.
These are the rules between fields and against what exists. Compute Engine answers one problem at a time, so each
check raises the first it finds (a ComputeError, 400 unless said). Sources, where a rule has one:
- machineType: an instance names it by full or partial URL "zones/ZONE/machineTypes/TYPE", a template by name only
  (compute.v1.json, Instance.machineType and InstanceProperties.machineType); a type the zone does not offer:
  "Machine type with name 'T' does not exist in zone 'Z'." (wording unconfirmed).
- Spot: provisioningModel SPOT, with onHostMaintenance TERMINATE and automaticRestart false
  (cloud.google.com/compute/docs/instances/spot); accelerator (TPU) VMs cannot live-migrate, so onHostMaintenance is
  TERMINATE for them (as for GPU VMs; for TPU machine types unconfirmed).
- instanceTerminationAction (STOP, DELETE) applies to Spot and Flex-start VMs and to VMs with a maxRunDuration
  (compute.v1.json Scheduling: "If specified, the instance termination action will be performed at the end of the
  run duration"); that it is refused on a standard VM without one: unconfirmed.
- Flex-start: run up to seven days and are deleted at the end of their run duration, and cannot be stopped
  (cloud.google.com/compute/docs/instance-groups/about-resize-requests-mig); that a standalone FLEX_START instance
  needs maxRunDuration (a template's VMs get theirs from the resize request) and instanceTerminationAction DELETE:
  unconfirmed. maxRunDuration bounds of other VMs
  (30 s to 120 days): unconfirmed.
- RESERVATION_BOUND consumes a specific reservation (reservationAffinity SPECIFIC_RESERVATION, key
  compute.googleapis.com/reservation-name): unconfirmed in detail; reservations themselves are not emulated.
- labels: the same rules as Cloud TPU's (tpu_emulator.validate.check_labels;
  cloud.google.com/compute/docs/labeling-resources).
- metadata: keys [a-zA-Z0-9-_]{1,128}, a value at most 256 KiB, all of it under 512 KB (compute.v1.json, Metadata).
- one service account at most (Compute Engine allows one per instance).
- a compact placement policy is refused for TPU7x: "Use workload policy instead" (the project's notes,
  /work/shared/DESIGN.md, from cloud.google.com/tpu/docs/tpus-and-migs).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tpu_emulator import validate
from tpu_emulator.gce import machines
from tpu_emulator.gce.errors import ComputeError, invalid, invalid_field
from tpu_emulator.gce.machines import MachineType
from tpu_emulator.gce.resources import NAME_RE, Policy, parse_link

MIN_RUN_S, MAX_RUN_S = 30, 120 * 24 * 3600
FLEX_MAX_RUN_S = 7 * 24 * 3600
RESERVATION_KEY = "compute.googleapis.com/reservation-name"


def check_name(name: Any, field: str) -> str:
    if not isinstance(name, str) or not name:
        raise invalid(f"Required field '{field}' not specified")
    if not NAME_RE.match(name):
        raise invalid_field(field, name, f"Must be a match of regex '{NAME_RE.pattern[1:-1]}'")
    return name


def seconds(duration: Any, field: str) -> int:
    """A Duration {seconds, nanos} as whole seconds."""
    if not isinstance(duration, dict) or "seconds" not in duration:
        raise invalid(f"Required field '{field}.seconds' not specified")
    try:
        return int(duration["seconds"])
    except (TypeError, ValueError):
        raise invalid_field(f"{field}.seconds", duration["seconds"], "Must be a number of seconds.") from None


def machine_of(value: Any, project: str, zone: str | None, field: str) -> MachineType:
    """The machine type a request names: by URL in an instance (`zone` given), by name in a template."""
    if not isinstance(value, str) or not value:
        raise invalid(f"Required field '{field}' not specified")
    if zone is None:
        if "/" in value:
            raise invalid_field(field, value, "An instance template takes a machine type name, not a URL.")
        name = value
    else:
        parts = parse_link(value, project).split("/")
        if len(parts) != 6 or parts[2] != "zones" or parts[4] != "machineTypes" or "/" not in value:
            raise invalid_field(field, value, "Must be a URL to a machine type: zones/ZONE/machineTypes/TYPE.")
        if parts[3] != zone:
            raise invalid_field(field, value, f"The machine type's zone must be the instance's, {zone}.")
        name = parts[5]
    machine = machines.MACHINE_TYPES.get(name)
    if machine is not None and not machine.offered:
        raise invalid_field(field, value, f"Machine type {name} is not offered on Compute Engine: {machine.why_not}.")
    if machine is None or (zone is not None and machines.offered_in(name, zone) is None):
        where = f"zone '{zone}'" if zone else "any zone"
        raise invalid_field(field, value, f"Machine type with name '{name}' does not exist in {where}.")
    return machine


def instance_properties(
    props: dict[str, Any],
    project: str,
    zone: str | None,
    where: str,
    policy: Callable[[str], Policy],
) -> MachineType:
    """Check an instance's properties (`zone` None: a template's); returns its machine type. `policy` finds a
    resource policy by path (raising 404)."""
    machine = machine_of(props.get("machineType"), project, zone, f"{where}.machineType")
    _disks(props.get("disks") or [], f"{where}.disks")
    _scheduling(props.get("scheduling") or {}, props.get("reservationAffinity") or {}, machine, where, zone is not None)
    _labels_and_metadata(props, where)
    accounts = props.get("serviceAccounts") or []
    if len(accounts) > 1:
        raise invalid_field(f"{where}.serviceAccounts", len(accounts), "At most one service account is allowed.")
    for link in props.get("resourcePolicies") or []:
        found = policy(parse_link(link, project))
        if found.compact and machine.generation.name == "tpu7x":
            raise invalid_field(
                f"{where}.resourcePolicies",
                link,
                f"A compact placement policy is not supported for {machine.name}. Use workload policy instead.",
            )
        if found.workload is not None:
            raise invalid_field(
                f"{where}.resourcePolicies", link, "A workload policy applies to a managed instance group only."
            )
    return machine


def _disks(disks: list[dict[str, Any]], field: str) -> None:
    boots = [d for d in disks if d.get("boot")]
    if len(boots) != 1:
        raise invalid_field(field, len(boots), "Exactly one boot disk must be specified.")
    boot = boots[0]
    params = boot.get("initializeParams") or {}
    if not boot.get("source") and not params.get("sourceImage") and not params.get("sourceSnapshot"):
        raise invalid(f"Required field '{field}[{disks.index(boot)}].initializeParams.sourceImage' not specified")


def _scheduling(s: dict[str, Any], affinity: dict[str, Any], machine: MachineType, where: str, alone: bool) -> None:
    """`alone`: a standalone instance (not a template: a resize request gives its VMs their run duration)."""
    field = f"{where}.scheduling"
    model = s.get("provisioningModel", "STANDARD")
    action = s.get("instanceTerminationAction")
    run_s = seconds(s["maxRunDuration"], f"{field}.maxRunDuration") if "maxRunDuration" in s else None
    if s.get("onHostMaintenance", "TERMINATE") != "TERMINATE":
        raise invalid_field(
            f"{field}.onHostMaintenance",
            s["onHostMaintenance"],
            f"Instances with TPUs ({machine.name}) cannot live-migrate: onHostMaintenance must be TERMINATE.",
        )
    if model in ("SPOT", "FLEX_START") and s.get("automaticRestart"):
        raise invalid_field(f"{field}.automaticRestart", True, f"{model} instances cannot be restarted automatically.")
    if model == "SPOT" and s.get("preemptible") is False:
        raise invalid_field(f"{field}.preemptible", False, "A Spot VM is preemptible.")
    if model != "SPOT" and s.get("preemptible"):
        raise invalid_field(f"{field}.preemptible", True, "Use provisioningModel SPOT for a preemptible VM.")
    if action and model not in ("SPOT", "FLEX_START") and run_s is None:
        raise invalid_field(
            f"{field}.instanceTerminationAction",
            action,
            "A termination action applies to Spot and Flex-start VMs and to VMs with a maxRunDuration.",
        )
    if run_s is not None:
        top = FLEX_MAX_RUN_S if model == "FLEX_START" else MAX_RUN_S
        if not MIN_RUN_S <= run_s <= top:
            raise invalid_field(f"{field}.maxRunDuration.seconds", run_s, f"Must be from {MIN_RUN_S} to {top}.")
        if model == "STANDARD" and not action:
            raise invalid(f"Required field '{field}.instanceTerminationAction' not specified (with maxRunDuration)")
    if model == "FLEX_START":
        if run_s is None and alone:
            raise invalid(f"Required field '{field}.maxRunDuration' not specified (Flex-start VMs run up to 7 days)")
        if action != "DELETE":
            raise invalid_field(
                f"{field}.instanceTerminationAction", action or "", "Flex-start VMs are deleted at their end: DELETE."
            )
    kind = affinity.get("consumeReservationType")
    if model == "RESERVATION_BOUND":
        if kind != "SPECIFIC_RESERVATION" or affinity.get("key") != RESERVATION_KEY or not affinity.get("values"):
            raise invalid_field(
                f"{where}.reservationAffinity",
                kind or "",
                f"A RESERVATION_BOUND VM consumes a specific reservation: consumeReservationType "
                f"SPECIFIC_RESERVATION, key {RESERVATION_KEY}, values [the reservation's name].",
            )
    elif kind == "SPECIFIC_RESERVATION" and (affinity.get("key") != RESERVATION_KEY or not affinity.get("values")):
        raise invalid_field(
            f"{where}.reservationAffinity.key", affinity.get("key", ""), f"Must be {RESERVATION_KEY}, with values."
        )


def _labels_and_metadata(props: dict[str, Any], where: str) -> None:
    problems = validate.check_labels(props.get("labels") or {}, where)
    items = (props.get("metadata") or {}).get("items") or []
    keys = [str(i.get("key", "")) for i in items]
    duplicated = sorted({k for k in keys if keys.count(k) > 1})
    if duplicated:
        problems.append((f"{where}.metadata.items", f"Duplicate metadata key(s): {', '.join(duplicated)}."))
    problems += validate.check_metadata({str(i.get("key", "")): str(i.get("value", "")) for i in items}, where)
    if problems:
        field, description = problems[0]
        raise ComputeError("INVALID_ARGUMENT", f"Invalid value for field '{field}': {description}", "invalid")
