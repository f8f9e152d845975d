"""Deletion going wrong: the VM's job exits and its node must still go, however the deletes are answered."""

from __future__ import annotations

from faults import actions, checks
from faults.scenario import THIRD_ZONE, ZONES, Command, Scenario

_GC_ZONES = (*ZONES, THIRD_ZONE)

CASES = (
    Scenario(
        "503-on-delete",
        "503 burst on the VM's self-delete (3)",
        "succeeded",
        0,
        setup=(lambda ctx: ctx.emulator.http_errors(503, count=3, method="DELETE"),),
        checks=(checks.delete_answers,),
    ),
    Scenario(
        "container-crash",
        "container crash (exit 3)",
        "failed",
        6,
        job=Command(("python", "-c", "import sys; print('about to crash', flush=True); sys.exit(3)")),
        fast=True,
    ),
    # The first delete operation fails after 3 s of DELETING, and the node is back READY, still billing.
    Scenario(
        "delete-fails",
        "a delete operation that fails (INTERNAL)",
        "succeeded",
        0,
        setup=(lambda ctx: ctx.emulator.delete_fails(count=1, seconds=3),),
        checks=(checks.failed_delete_retried,),
        fast=True,
        timeout_s=45,  # done in seconds when it works
    ),
    # Three orphaned runner nodes (runs long past their deadline); `runner gc` after a run, its first delete 403.
    Scenario(
        "gc-403",
        "403 on one of three `runner gc` deletes",
        "succeeded",
        0,
        setup=(actions.plant_orphans(3),),
        after=(actions.gc_with_one_denied_delete,),
        checks=(checks.gc_reported_each,),
        fast=True,
    ),
    # Every delete operation fails PERMISSION_DENIED (the VM's own and the runner's): the node bills on, and the run
    # must say so until `runner down` (the refusal lifted) deletes it.
    Scenario(
        "delete-denied",
        "every delete fails PERMISSION_DENIED",
        "succeeded",
        5,
        setup=(lambda ctx: ctx.emulator.delete_fails(status="PERMISSION_DENIED"),),
        after=(actions.billing_shown_then_down,),
        checks=(checks.still_billing_shown,),
        fast=True,
        idle_goal=False,  # the node idles until `runner down` once the refusal is lifted: a person's time
    ),
    # An orphan in each of three zones; listing the second zone is refused (403): the other two are swept.
    Scenario(
        "gc-zone-refused",
        "`runner gc` with one zone of three refused (403)",
        "succeeded",
        0,
        setup=(actions.plant_orphan_per_zone(_GC_ZONES),),
        after=(actions.gc_with_zone_refused(_GC_ZONES, _GC_ZONES[1]),),
        checks=(checks.gc_swept_around_refused_zone,),
        fast=True,
    ),
)
