"""Spot preemptions: whenever they come, the run resumes from its newest checkpoint and loses no training."""

from __future__ import annotations

from faults import actions, checks
from faults.scenario import MULTI_HOST_ZONE, UNTIL_PREEMPTED, ZONES, Command, Scenario, Train

CASES = (
    # Epochs of 1536 steps (a few seconds each, longer than the 5 s the bucket lags behind the trainer), so that
    # each preemption lands near the checkpoint it waited for, and the second one well before the end.
    Scenario(
        "preemption-x2",
        "preemption mid-training, twice (spot)",
        "succeeded",
        0,
        job=Train(epochs=8, examples=24576, batch_size=16),
        spot=True,
        during=(actions.preempt_at_checkpoints(2, 5),),
        checks=(checks.preemptions(2), checks.lost_work),
    ),
    Scenario(
        "preempt-at-boot",
        "spot preemption as the node turns READY",
        "succeeded",
        0,
        spot=True,
        during=(actions.preempt_when_ready,),
        checks=(checks.boot_preemption, checks.lost_work),
    ),
    Scenario(
        "preempt-at-boot-1zone",
        "spot preemption as the node turns READY, one zone",
        "succeeded",
        0,
        spot=True,
        zones=(ZONES[0],),
        during=(actions.preempt_when_ready,),
        checks=(checks.boot_preemption, checks.lost_work),
        fast=True,
    ),
    # Full-size epochs at batch 16 (3120 steps, several seconds each), preempted when the bucket's progress.json
    # shows the first half of an epoch before the last: that copy is up to a sync interval (5 s) behind the
    # trainer, which is then still inside that epoch. An uninterrupted run of the same job goes first.
    Scenario(
        "preempt-mid-epoch",
        "spot preemption in the middle of an epoch",
        "succeeded",
        0,
        job=Train(epochs=3, examples=49920, batch_size=16, test_examples=10000),
        spot=True,
        during=(actions.preempt_mid_epoch,),
        checks=(checks.preemptions(1), checks.same_training_as_uninterrupted, checks.lost_work),
        reference=True,
    ),
    # The same, with the real image: each VM pulls it from a registry on loopback (the startup breakdown's "image
    # pull" is that pull) and the trainer runs in the container, where the preemption's SIGTERM reaches it.
    Scenario(
        "preempt-mid-epoch-container",
        "spot preemption in the middle of an epoch, real container",
        "succeeded",
        0,
        job=Train(epochs=3, examples=49920, batch_size=16, test_examples=10000),
        spot=True,
        during=(actions.preempt_mid_epoch,),
        checks=(checks.preemptions(1), checks.same_training_as_uninterrupted, checks.image_pulled, checks.lost_work),
        reference=True,
        container=True,
        timeout_s=900.0,
    ),
    # Two v4-16 slices (2 hosts each) through one queued resource: one slice preempted, every slice recreated.
    Scenario(
        "multislice-preempt-one-slice",
        "one slice of a 2-slice multislice preempted (spot)",
        "succeeded",
        0,
        job=Command(("python", "-c", UNTIL_PREEMPTED)),
        spot=True,
        accelerator="v4-16",
        slices=2,
        zones=(MULTI_HOST_ZONE,),
        during=(actions.preempt_one_slice,),
        checks=(checks.preemptions(1), checks.queued_ran_in(MULTI_HOST_ZONE), checks.lost_work),
    ),
)
