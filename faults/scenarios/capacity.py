"""No capacity: the runner goes through the zones in order, and waits for capacity when the spec says so; a queued
resource that FAILED is deleted and the next zone queued."""

from __future__ import annotations

from faults import checks
from faults.scenario import THIRD_ZONE, ZONES, Scenario

CASES = (
    Scenario(
        "stockout-first-zone",
        "stockout in the first zone",
        "succeeded",
        0,
        setup=(lambda ctx: ctx.emulator.stockout(ZONES[0]),),
        checks=(checks.ran_in(ZONES[1]),),
        fast=True,
    ),
    Scenario(
        "stockout-two-zones",
        "stockout in the first two of three zones",
        "succeeded",
        0,
        zones=(*ZONES, THIRD_ZONE),
        setup=(lambda ctx: ctx.emulator.stockout(ZONES[0]), lambda ctx: ctx.emulator.stockout(ZONES[1])),
        checks=(checks.ran_in(THIRD_ZONE),),
    ),
    Scenario(
        "capacity-wait",
        "stockout everywhere, then capacity (capacity_wait)",
        "succeeded",
        0,
        retries={"capacity_wait": "2m"},
        setup=(lambda ctx: ctx.emulator.stockout(None, count=2),),
        checks=(checks.ran_in(ZONES[0]),),
    ),
    Scenario(
        "queued-failed-first-zone",
        "queued resource FAILED in the first zone",
        "succeeded",
        0,
        provisioning="queued",
        setup=(
            lambda ctx: ctx.emulator.queued_fails(
                ZONES[0], count=1, status="RESOURCE_EXHAUSTED", message="No capacity for v2-8 in this zone."
            ),
        ),
        checks=(checks.queued_ran_in(ZONES[1]),),
        fast=True,
    ),
)
