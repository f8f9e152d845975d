"""The Cloud TPU API answering errors: bursts to retry, an image that is not there, a name already taken."""

from __future__ import annotations

from faults import checks
from faults.scenario import IMAGE, UNREACHABLE, Scenario

CASES = (
    Scenario(
        "429-burst",
        "429 burst (3 requests)",
        "succeeded",
        0,
        setup=(lambda ctx: ctx.emulator.http_errors(429, count=3),),
        checks=(checks.http_burst(429, 3),),
    ),
    Scenario(
        "503-burst",
        "503 burst (3 requests)",
        "succeeded",
        0,
        setup=(lambda ctx: ctx.emulator.http_errors(503, count=3),),
        checks=(checks.http_burst(503, 3),),
        fast=True,
    ),
    Scenario(
        "image-missing",
        "image not in the registry (pre-flight)",
        None,
        2,
        setup=(lambda ctx: ctx.emulator.missing_image(IMAGE),),
        checks=(checks.nothing_created,),
    ),
    Scenario(
        "image-pull-on-vm",
        "image pull failure on the VM",
        "failed",
        6,
        registry=UNREACHABLE,
        setup=(lambda ctx: ctx.emulator.missing_image(IMAGE),),
        checks=(checks.vm_recorded_pull_failure,),
    ),
    # The create finds its name taken by another run's READY node (409): a new name, never a delete of theirs.
    Scenario(
        "name-collision",
        "409 on create: the name is another run's",
        "succeeded",
        0,
        setup=(lambda ctx: ctx.emulator.collision(count=1),),
        checks=(checks.collision_left_alone,),
        fast=True,
    ),
)
