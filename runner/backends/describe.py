"""What the cloud backends' plans and dry runs share: the rows every cloud run shows (where, what, what it costs),
and the end of a dry run (what the job runs, and the startup script every VM runs at boot)."""

from __future__ import annotations

from pathlib import Path

from runner.launch import job
from runner.plan import catalog, storage_ops
from runner.plan.planner import Plan
from runner.plan.target import Target


def capacity(plan: Plan) -> str:
    acc = plan.spec.accelerator
    return "Spot" if acc.spot else "reserved" if acc.reserved else "on-demand"


def shape(target: Target, kind: str) -> str:
    """'v5p-8: 4 chips (8 TensorCores, 4 JAX devices) on 1 host(s), on-demand', or a multislice's whole."""
    accel, slices = target.accelerator, target.slices
    cores = f"{accel.tensorcores * slices} TensorCores, {accel.jax_devices * slices} JAX devices"
    if slices > 1:
        return (
            f"{slices} slices of {accel.name} (multislice): {accel.chips * slices} chips ({cores}) on "
            f"{accel.hosts * slices} host(s), {kind}"
        )
    return f"{accel.name}: {accel.chips} chips ({cores}) on {accel.hosts} host(s), {kind}"


def zones_row(target: Target) -> tuple[str, str]:
    return "zones", " -> ".join(target.zones) + ("  (tried in order)" if len(target.zones) > 1 else "")


def workers_row(target: Target) -> tuple[str, str]:
    return "job runs on", "every worker" if target.trainer_workers == "all" else f"worker {target.trainer_workers}"


def cost_row(plan: Plan, target: Target) -> tuple[str, str]:
    """The estimate: the catalog's list price per chip-hour x chips, with the date the prices were read."""
    hours = plan.spec.teardown.max_runtime / 3600
    prices = catalog.prices_info()
    if not target.accelerator.generation.priced:
        return "est. cost", f"unknown: the catalog has no price for {target.accelerator.generation.title}"
    return (
        "est. cost",
        f"${target.price_per_hour:.2f}/hour; at most ${target.price_per_hour * hours:.2f} for max_runtime {hours:g} h  "
        f"({prices['currency']} list prices per {prices['unit']} read {prices['read_on']})",
    )


def storage_rows(target: Target) -> list[tuple[str, str]]:
    """On a multi-host slice, what following it asks of Cloud Storage (runner.plan.storage_ops), beside its price:
    every host that runs the job writes its log and heartbeat."""
    hosts = target.accelerator.hosts * target.slices
    if hosts < 2:
        return []
    writers = hosts if target.trainer_workers == "all" else 1
    price = target.price_per_hour if target.accelerator.generation.priced else None
    return [storage_ops.plan_row(writers, price)]


def job_rows(plan: Plan) -> list[tuple[str, str]]:
    return job.plan_rows(plan, process=False)


def dry_run_tail(plan: Plan, script: str, *, per_worker: str, runs: str) -> list[str]:
    """What the job runs (command, working directory, environment in plain text) and the startup script."""
    workdir = job.working_directory(plan.spec.image, process=False, cwd=Path.cwd())
    return [
        "\n" + job.job_text(plan.spec.command, plan.env, workdir, per_worker=per_worker, secrets=plan.secrets),
        f"\nstartup-script ({runs}; JOB_ENV_B64 is the environment above):",
        script.rstrip(),
    ]
