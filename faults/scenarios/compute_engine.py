"""The compute-engine backend's faults (TPU7x as Compute Engine instances; a 2x2x2 slice as a managed instance
group with its template and workload policy), rehearsed on the emulator's Compute Engine API like the TPU VM ones:
preemption of a Spot VM mid-epoch, a stockout, the runner killed while creating (then `runner gc`), deletes that
fail, and a killed runner's slice swept by `runner gc`."""

from __future__ import annotations

from faults import actions, checks
from faults.scenario import Command, Scenario, Train

ZONE = "us-central1-c"  # TPU7x's one zone in the backend's catalog slice (runner/backends/compute_engine/catalog.yaml)
ONE_CHIP = "tpu7x-2"  # one tpu7x-standard-1t instance
SLICE = "tpu7x-16"  # 2x2x2: a group of two tpu7x-standard-4t VMs
# A stockout needs a second zone: v6e, which Compute Engine offers in several (and the Cloud TPU API too: the
# backend is named, not left to auto, whose default for v6e is tpu-vm).
V6E, V6E_ZONES = "v6e-4", ("us-central1-b", "us-east1-d")  # one ct6e-standard-4t instance

CASES = (
    # Epochs of 15000 steps (all of MNIST at batch 4): long enough for the bucket's progress.json, up to a sync
    # interval (5 s) behind, to show one mid-way. Keras 3 on JAX (TPU7x runs no TensorFlow: the plan refuses it)
    # trains the MLP in about a millisecond a step on an idle 2-core machine: epochs of 1536 steps ended between two
    # syncs, and the case found no epoch to preempt in the middle of.
    Scenario(
        "ce-preempt-mid-epoch",
        "Compute Engine: Spot VM preempted mid-epoch (tpu7x-2)",
        "succeeded",
        0,
        job=Train(epochs=3, examples=60000, batch_size=4, framework="jax"),
        spot=True,
        accelerator=ONE_CHIP,
        zones=(ZONE,),
        during=(actions.ce_preempt_mid_epoch,),
        checks=(checks.preemptions(1),),
    ),
    Scenario(
        "ce-stockout-first-zone",
        "Compute Engine: stockout in the first zone (v6e-4)",
        "succeeded",
        0,
        accelerator=V6E,
        backend="compute-engine",
        zones=V6E_ZONES,
        setup=(lambda ctx: ctx.emulator.compute.stockout(V6E_ZONES[0], count=1),),
        checks=(checks.ce_created_in(V6E_ZONES[1]),),
        fast=True,
    ),
    # The instance stays PROVISIONING for 30 s; the runner dies in it; `runner gc` later deletes it.
    Scenario(
        "ce-runner-kill-creating",
        "Compute Engine: runner SIGKILL while creating, then `runner gc`",
        "lost",
        -9,
        accelerator=ONE_CHIP,
        zones=(ZONE,),
        setup=(lambda ctx: ctx.emulator.compute.slow_create(30, count=1),),
        during=(actions.kill_runner_after("the instance being created", actions.ce_creating),),
        after=(actions.ce_gc((ZONE,)),),
        checks=(checks.ce_gc_swept("instance"),),
        fast=True,
    ),
    # Every delete fails (the VM's own and each of the runner's): the run must say what bills and how to delete it.
    Scenario(
        "ce-delete-fails",
        "Compute Engine: every delete fails (INTERNAL)",
        "succeeded",
        5,
        accelerator=ONE_CHIP,
        zones=(ZONE,),
        setup=(lambda ctx: ctx.emulator.compute.delete_fails(count=10),),
        after=(actions.ce_delete_refused_then_down,),
        checks=(checks.ce_left_and_how_to_delete,),
        idle_goal=False,  # the instance bills until `runner down` once the refusal is lifted: a person's time
        fast=True,
    ),
    # A 2x2x2 slice whose runner was killed while its group was being created: `runner gc` deletes the group, then
    # its instance template and workload policy.
    Scenario(
        "ce-gc-killed-slice",
        "Compute Engine: `runner gc` of a killed runner's 2x2x2 slice",
        "lost",
        -9,
        job=Command(),
        accelerator=SLICE,
        zones=(ZONE,),
        setup=(lambda ctx: ctx.emulator.compute.slow_create(30),),
        during=(actions.kill_runner_after("the slice being created", actions.ce_creating),),
        after=(actions.ce_gc((ZONE,)),),
        checks=(checks.ce_gc_swept("instance group", "instance template", "workload policy"),),
        fast=True,
    ),
)
