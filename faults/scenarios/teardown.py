"""Deletion going wrong: the VM's job exits and its node must still go, however the deletes are answered."""

from __future__ import annotations

from faults import actions, checks
from faults.scenario import Command, Scenario

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
)
