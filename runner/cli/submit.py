"""`runner submit`: plan, print the plan (or the whole dry run), hand the run to the lifecycle, print the end."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from runner.cli.output import echo, print_rows, rows_text, say, style, write_output
from runner.cli.typer_app import RunArg, SetOpt, SpecArg, app

if TYPE_CHECKING:
    from runner.backends.base import Backend
    from runner.collect.facts import RunFacts
    from runner.errors import PlanError
    from runner.plan.planner import Plan
    from runner.watch.rundir import Snapshot
    from runner.watch.runs import RunRecord
    from runner.watch.state import RunState


@app.command()
def submit(
    spec_path: SpecArg,
    local: Annotated[
        bool, typer.Option("--local", help="Run on this machine (CPU or GPU) instead of a TPU VM.")
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Show the plan and the exact requests; create nothing.")
    ] = False,
    detach: Annotated[bool, typer.Option("--detach", "-d", help="Return once the job has started.")] = False,
    storage: Annotated[
        str | None, typer.Option(help="Override the spec's storage (gs://BUCKET/PREFIX or a local path).")
    ] = None,
    project: Annotated[
        str | None, typer.Option(help="Google Cloud project (default: the spec, then gcloud's).")
    ] = None,
    zone: Annotated[str | None, typer.Option(help="Zone, when the spec names none (default: gcloud's).")] = None,
    process: Annotated[
        bool,
        typer.Option(
            "--process", help="With --local: run the entrypoint as a process even if a container engine is there."
        ),
    ] = False,
    budget: Annotated[
        str | None,
        typer.Option(
            "--budget",
            help="The most the run may cost in US dollars (50 or '$50'), like `budget:` in the spec: a max_runtime "
            "that could cost more is refused, a default one is cut to what the budget buys.",
        ),
    ] = None,
    workers: Annotated[
        int,
        typer.Option(
            "--workers",
            help="With --local: run N worker processes on this machine, as the hosts of a pod slice (the "
            "multi-worker rehearsal: TensorFlow's MultiWorkerMirroredStrategy or jax.distributed, on the CPU).",
        ),
    ] = 1,
    set_values: SetOpt = [],  # noqa: B006  (typer reads the default; it is never mutated)
) -> None:
    """Validate the spec, provision the machine, ship the container, train, collect, and tear down."""
    from runner.errors import UsageError
    from runner.spec.loader import load_spec
    from runner.timings import Timings

    if workers < 1:
        raise UsageError(f"--workers {workers}: give 1 or more")
    if workers > 1 and not local:
        raise UsageError(
            "--workers is for --local runs: on a TPU VM the accelerator type decides the workers (a v4-32 has 4)"
        )

    timings = Timings.from_env()
    # --budget is an override like any --set: validated (and located) like the file's own `budget:`.
    spec = load_spec(spec_path, [*set_values, *([f"budget={budget}"] if budget is not None else [])])
    problems: list[PlanError] = []
    if local:
        from runner.backends import plan_local

        plan = plan_local(spec, str(spec_path), storage=storage, workers=workers, timings=timings)
    else:
        from runner.backends import plan_cloud
        from runner.plan.target import Problems

        problems = Problems()  # every pre-flight problem, not only the first
        plan = plan_cloud(
            spec, str(spec_path), storage=storage, project=project, zone=zone, problems=problems, timings=timings
        )
        if not dry_run:
            problems.raise_all()
    launch(plan, backend_for(plan, process, timings), problems, dry_run=dry_run, detach=detach, timings=timings)


@app.command()
def resume(
    run: RunArg,
    local: Annotated[
        bool, typer.Option("--local", help="Continue it on this machine, whatever backend it ran on before.")
    ] = False,
    detach: Annotated[bool, typer.Option("--detach", "-d", help="Return once the job has started.")] = False,
    process: Annotated[
        bool, typer.Option("--process", help="With a local run: the entrypoint as a process even if Docker is there.")
    ] = False,
    set_values: SetOpt = [],  # noqa: B006  (typer reads the default; it is never mutated)
    fresh: Annotated[
        bool,
        typer.Option(
            "--fresh",
            help="Start training over: the run's checkpoints and metrics are moved aside (set-aside/ in its run "
            "directory), never deleted. Needed when --set changes the model or the data.",
        ),
    ] = False,
) -> None:
    """Continue a cancelled, failed, timed-out or hung run in its own run directory, from its newest checkpoint:
    the same run id, a new attempt in its history, the spec it recorded (with --set overrides, recorded too), on
    the backend it ran on (or this machine with --local)."""
    from runner.lifecycle.lease import Lease
    from runner.lifecycle.resume import resumable_now
    from runner.timings import Timings

    timings = Timings.from_env()
    record, _, storage = resumable_now(run, say)  # refused early: no lease is taken for a run that succeeded
    # One runner at a time: the run's lease first, then its state read again under it, so that of two resumes at
    # once exactly one goes on, and a run another runner has just resumed is not resumed twice.
    lease = Lease.take(storage, record.run_id, command="resume", timings=timings, say=say)
    try:
        previous, attempt, plan = _continued(run, local, set_values, timings, fresh)
    except BaseException:
        lease.release()
        raise
    say(f"resuming {record.run_id} ({previous.state}) as its attempt {attempt}")
    try:
        launch(
            plan,
            backend_for(plan, process, timings),
            [],
            detach=detach,
            timings=timings,
            previous=previous,
            overrides=list(set_values),
            lease=lease,
        )
    finally:
        lease.release()  # the run's end released it already; anything that stopped it before: here


def _continued(run: str, local: bool, set_values: list[str], timings: Any, fresh: bool) -> tuple[RunRecord, int, Plan]:
    """Under the run's lease: the run as it is now (resumable, with no machine of an earlier attempt still there),
    its attempt number, and the plan of its next attempt; with `fresh`, its checkpoints and metrics set aside."""
    from runner.backends import backend_named, is_cloud
    from runner.lifecycle.resume import check_meaning, no_machines_left, recorded_spec, resumable_now, set_aside
    from runner.plan.planner import Continued

    record, state, storage = resumable_now(run, lambda _: None)  # its warnings were said the first time
    if record.machines:
        no_machines_left(record, backend_named(record.backend, say, timings))
    spec = recorded_spec(storage, record.run_dir, set_values)
    check_meaning(record, storage, spec, set_values, fresh)
    continued = Continued(record.run_id, record.run_dir)
    if local or not is_cloud(record.backend):
        from runner.backends import plan_local

        workers = 1 if is_cloud(record.backend) else record.num_workers
        plan = plan_local(spec, record.spec_path, workers=workers, continued=continued, timings=timings)
    else:
        from runner.backends import plan_cloud
        from runner.plan.target import Problems

        problems = Problems()
        plan = plan_cloud(spec, record.spec_path, continued=continued, problems=problems, timings=timings)
        problems.raise_all()
    attempt = len(record.attempts) + 2
    if fresh:
        where, moved = set_aside(storage, attempt)
        say(f"--fresh: training starts over; {moved} checkpoint and metrics objects kept in {record.run_dir}/{where}/")
    return record.updated(state=state), attempt, plan


def backend_for(plan: Plan, process: bool, timings: Any) -> Backend[Any]:
    from runner.backends import backend_named

    return backend_named(plan.backend, say, timings, process=process)


def launch(
    plan: Plan,
    backend: Backend[Any],
    problems: list[PlanError],
    *,
    dry_run: bool = False,
    detach: bool = False,
    timings: Any = None,
    previous: RunRecord | None = None,
    overrides: list[str] | None = None,
    lease: Any = None,
) -> None:
    """Print the plan (or the whole dry run), hand the run to the lifecycle, print its end. `lease`: the run's,
    when the caller took it (resume)."""
    from runner.errors import PlanError

    spec = plan.spec
    what = (
        f"{spec.training.model} on {spec.training.dataset}, {spec.training.epochs} epochs, batch "
        f"{spec.training.batch_size}"
        if spec.training
        else f"`{spec.command_line}`"
    )
    rows = [
        ("run", plan.run_id),
        ("job", f"{spec.name}: {what}"),
        (
            "backend",
            plan.backend + (f"  ({plan.cloud.choice})" if plan.cloud is not None and plan.cloud.choice else ""),
        ),
        *backend.describe(plan),
        ("run directory", plan.run_dir),
    ]
    from runner import contract

    if url := plan.env.get(contract.DATA_URL):
        rows.append(("data cache", f"this machine's MNIST, copied to {url}/ once: load_dataset('mnist') on the VM"))
    from runner.plan.budget import plan_rows

    rows += plan_rows(plan.limit, local=plan.cloud is None, attached=plan.attach)
    from runner.plan.planner import hang_limit
    from runner.spec.secrets import env_warnings

    rows += [hang.row()] if (hang := hang_limit(plan)) is not None else []
    warnings = [*(plan.cloud.warnings if plan.cloud is not None else ()), *env_warnings(spec)]
    rows += [("warning", text) for text in warnings]
    if dry_run:
        if plan.cloud is not None:
            rows.append(("image check", "not done offline: `runner submit` asks the registry before creating anything"))
            if any(s.secret_manager for s in plan.secrets):
                rows.append(
                    ("secret check", "not done offline: `runner submit` asks Secret Manager before creating anything")
                )
        echo(dry_run_text(plan, backend, rows))
        if problems:
            echo()
            echo(problems_text(problems))
            raise PlanError(
                f"the dry run found {len(problems)} pre-flight problem{'s' if len(problems) > 1 else ''} (above); "
                "`runner submit` stops on them before anything is created",
                hint="fix them and dry-run again; placeholders in capitals (PROJECT, BUCKET) stand for what is missing",
            )
        return
    print_rows(rows)
    if plan.cloud is not None:
        from runner.launch.image import require_in_registry

        # Before anything is paid for: a VM that boots and cannot pull its image is the costliest typo.
        if warning := require_in_registry(spec.image):
            say(f"warning: {warning}")
        if plan.secrets:
            from runner.backends import secretmanager

            # Before anything is paid for: a VM that cannot read its secret fails only after it boots.
            for line in secretmanager.preflight(plan):
                say(line)
    from runner import lifecycle

    outcome = lifecycle.submit(
        plan,
        backend,
        say=say,
        on_output=write_output,
        detach=detach,
        timings=timings,
        previous=previous,
        overrides=overrides,
        lease=lease,
    )
    finish(outcome.record, outcome.state, outcome.snapshot, detached=outcome.detached)


def dry_run_text(plan: Plan, backend: Backend[Any], rows: list[tuple[str, str]]) -> str:
    """What `submit --dry-run` prints: the plan, then everything the backend would send or start."""
    return (
        rows_text(rows, title="Plan (dry run: nothing is created, no API is called)") + "\n\n" + backend.dry_run(plan)
    )


def problems_text(problems: list[PlanError]) -> str:
    """The pre-flight problems a dry run found, numbered, each with its hint."""
    lines = [style(f"Pre-flight problems ({len(problems)})", bold=True)]
    for number, problem in enumerate(problems, 1):
        first, *rest = problem.message.splitlines()
        lines.append(f"  {number}. {first}")
        lines += [f"     {line.strip()}" for line in rest]
        if problem.hint:
            lines.append(f"     hint: {problem.hint}")
    return "\n".join(lines)


def finish(record: RunRecord, state: RunState, snapshot: Snapshot | None, *, detached: bool = False) -> None:
    from runner.collect.summary import existing_artifacts, failure_output, summary_rows
    from runner.errors import RunFailed, RunnerError
    from runner.storage import open_storage
    from runner.watch.logtext import one_line
    from runner.watch.state import RunState

    if detached:
        say(f"started {record.run_id} in the background")
        echo(f"  runner status {record.run_id}\n  runner logs {record.run_id} --follow")
        return
    assert snapshot is not None
    echo()
    facts, unknown = run_facts(record, snapshot)
    try:
        present: set[str] | None = existing_artifacts(open_storage(record.run_dir))
    except RunnerError:
        present = None  # storage unreadable now: every path, as the contract has them
    rows = summary_rows(
        record.run_dir,
        state,
        snapshot,
        present,
        summary=facts.summary if facts else None,
        checkpoints=facts.checkpoints if facts else None,
    )
    if record.reason:
        rows.insert(1, ("reason", record.reason))
    worker, tail = failure_output(snapshot) if state == RunState.FAILED else (None, [])
    # One host: the traceback just scrolled by in the job's output; once is enough, its last line says what failed.
    # A slice's workers' lines were interleaved: the failed one's are shown again, together.
    shown = bool(tail) and record.num_workers <= 1 and was_streamed(record, worker or 0, tail)
    if shown:
        rows.insert(1, ("error", one_line(tail[-1]) + "  (its output is above)"))
    rows += end_rows(record, state, snapshot, facts) if facts else [("cost", f"unknown: {unknown}")]
    print_rows(rows, title=f"Run {record.run_id}")
    if record.still_billing:  # whatever the job did: a node that may still bill is the one thing to act on now
        from runner.errors import BackendError

        raise BackendError(f"run {record.run_id} ended {state}, but {record.still_billing}")
    if state == RunState.SUCCEEDED:
        return
    if tail and not shown:
        echo(style("last output:" if len(snapshot.exits) < 2 else f"last output of worker {worker}:", bold=True))
        for line in tail:
            echo(f"  {line}")
    if state == RunState.CANCELLED:
        raise typer.Exit(130)
    raise RunFailed(f"run {record.run_id} ended {state}", hint=f"`runner logs {record.run_id}` shows its whole log")


def run_facts(record: RunRecord, snapshot: Snapshot) -> tuple[RunFacts | None, str]:
    """The run's facts (runner.collect.facts: its summary, checkpoints, cost), or None and why they are unknown."""
    from runner.collect.facts import gather
    from runner.errors import RunnerError
    from runner.storage import open_storage

    try:
        return gather(record, open_storage(record.run_dir), snapshot=snapshot, checkpoints=True), ""
    except RunnerError as exc:
        return None, exc.message


def was_streamed(record: RunRecord, worker: int, tail: list[str]) -> bool:
    """Whether a failed worker's last lines are in its stored log, which `submit` has just printed as it came.
    (They are not when the bootstrap wrote the exit record: an image that could not be pulled, a killed container.)"""
    from runner import contract
    from runner.errors import RunnerError
    from runner.storage import open_storage

    try:
        log = (open_storage(record.run_dir).read_bytes(contract.log_key(worker)) or b"").decode(errors="replace")
    except RunnerError:
        return False
    return all(line in log for line in tail[-3:])


def end_rows(record: RunRecord, state: RunState, snapshot: Snapshot, facts: RunFacts) -> list[tuple[str, str]]:
    """The cost, the startup breakdown and the report's path, read back from the run directory. The run has ended
    whatever happens here: a report that cannot be written is a row that says why, never a changed exit code."""
    from runner.errors import RunnerError

    rows = facts.rows()
    if facts.goodput is not None:
        from runner.collect.goodput import record_in_summary

        rows += [("summary.json", why)] if (why := record_in_summary(record.run_dir, facts.goodput)) else []
    try:
        from runner.collect.report import make_report

        page = make_report(record, state, snapshot=snapshot, facts=facts)
        rows.append(("report", str(page.path) + (f"  (and {page.uploaded})" if page.uploaded else "")))
    except RunnerError as exc:
        rows.append(("report", f"not written: {exc.message}  (`runner report {record.run_id}` tries again)"))
    return rows
