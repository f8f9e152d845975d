"""The `runner` command line: parse, call the lifecycle, print. RunnerError is caught once, in main().

Nothing heavy is imported at module level (no TensorFlow, no Google SDK, not even pydantic): `runner --help`
stays fast, and each command imports what it needs.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from typer.core import TyperGroup

from runner.bench.command import bench  # typer and the standard library only
from runner.image import build as image_build  # typer and the standard library only

if TYPE_CHECKING:
    from rich.console import Console

    from runner.backends.base import Backend
    from runner.errors import RunnerError
    from runner.plan import Plan
    from runner.records import RunRecord
    from runner.spec import JobSpec
    from runner.status import RunState, Snapshot


class _RunnerGroup(TyperGroup):
    """Catches the one error root once, for every command: message, hint, exit code; no traceback."""

    def invoke(self, ctx: typer.Context) -> object:
        from runner.errors import RunnerError

        try:
            return super().invoke(ctx)
        except RunnerError as exc:
            _report(exc)
            if os.environ.get("RUNNER_DEBUG"):
                raise
            ctx.exit(exc.exit_code)
        except KeyboardInterrupt:
            ctx.exit(130)


app = typer.Typer(
    name="runner",
    cls=_RunnerGroup,
    help="Run containerized training jobs on Cloud TPU VMs, or the same job locally, and never pay for an idle TPU.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Plain help: rich's help renderer imports markdown-it and ~150 ms of modules; `runner --help` must be instant.
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)

SpecArg = Annotated[Path, typer.Argument(help="Job spec file (YAML).", show_default=False)]
RunArg = Annotated[str, typer.Argument(help="Run id (or a unique prefix), or a run directory (path or gs://).")]


def _console() -> Console:
    """rich, for the one table (`runner list`); everything else is plain text through typer, so the commands a user
    runs most (validate, status, submit's messages) do not pay rich's import, and no message is read as markup."""
    from rich.console import Console

    console = Console(highlight=False, soft_wrap=True)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = 120  # logs and pipes: rich would assume 80 columns and fold every table row
    return console


def _say(text: str) -> None:
    # Colour only on a terminal: typer.echo strips ANSI codes when the output is a pipe or a file.
    typer.echo(typer.style("runner", fg="cyan", bold=True) + f": {text}")


def _write_output(chunk: bytes) -> None:
    sys.stdout.buffer.write(chunk)
    sys.stdout.flush()


def _load(path: Path) -> JobSpec:
    from runner.specfile import load_spec

    return load_spec(path)


def _rows_text(rows: list[tuple[str, str]], title: str | None = None) -> str:
    """Aligned `label  value` lines: plain text, so logs, pipes and golden files read the same as a terminal."""
    width = max((len(k) for k, _ in rows), default=0)
    lines = [title] if title else []
    lines += [f"{key:<{width}}  {value}" for key, value in rows]
    return "\n".join(lines)


def _print_rows(rows: list[tuple[str, str]], title: str | None = None) -> None:
    typer.echo(_rows_text(rows, title))


# -- validate / schema ---------------------------------------------------------------------------------------------


@app.command()
def validate(specs: Annotated[list[Path], typer.Argument(help="Job spec files.", show_default=False)]) -> None:
    """Check job spec files and report every problem, with its field path and line. Exit code 2 if any is invalid."""
    from runner.errors import SpecError
    from runner.specfile import shown

    failed: list[SpecError] = []
    for path in specs:
        try:
            spec = _load(path)
        except SpecError as exc:
            failed.append(exc)
            continue
        what = f"{spec.training.model}, {spec.training.epochs} epochs" if spec.training else f"`{spec.command_line}`"
        typer.echo(typer.style("ok", fg="green") + f" {shown(path)}: job {spec.name!r} ({what})")
    if failed:
        if len(failed) == 1:
            raise failed[0]
        for exc in failed[:-1]:
            _report(exc)
        raise failed[-1]


@app.command()
def schema() -> None:
    """Print the job spec's JSON Schema (for editor completion, e.g. with the YAML language server)."""
    import json

    from runner.spec import JobSpec

    document = JobSpec.model_json_schema()
    document["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    document["title"] = "tpu-runner job spec"
    typer.echo(json.dumps(document, indent=2))


# -- submit --------------------------------------------------------------------------------------------------------


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
        bool, typer.Option("--process", help="With --local: run the entrypoint as a process even if Docker is there.")
    ] = False,
) -> None:
    """Validate the spec, provision the machine, ship the container, train, collect, and tear down."""
    spec = _load(spec_path)
    what = (
        f"{spec.training.model} on {spec.training.dataset}, {spec.training.epochs} epochs, batch "
        f"{spec.training.batch_size}"
        if spec.training
        else f"`{spec.command_line}`"
    )
    backend: Backend
    if local:
        from runner.backends.local import LocalBackend
        from runner.plan import plan_local

        plan = plan_local(spec, str(spec_path), storage=storage)
        backend = LocalBackend(prefer="process" if process else None)
    else:
        from runner.backends.tpu_vm import TpuVmBackend
        from runner.plan import plan_cloud

        plan = plan_cloud(spec, str(spec_path), storage=storage, project=project, zone=zone)
        backend = TpuVmBackend(say=_say)
    rows = [
        ("run", plan.run_id),
        ("job", f"{spec.name}: {what}"),
        ("backend", plan.backend),
        *backend.describe(plan),
        ("run directory", plan.run_dir),
    ]
    if dry_run:
        typer.echo(dry_run_text(plan, rows))
        return
    _print_rows(rows)
    if plan.cloud is not None:
        from runner.image import require_in_registry

        # Before anything is paid for: a VM that boots and cannot pull its image is the costliest typo.
        if warning := require_in_registry(spec.image):
            _say(f"warning: {warning}")
    from runner import lifecycle

    outcome = lifecycle.submit(plan, backend, say=_say, on_output=_write_output, detach=detach)
    _finish(outcome.record, outcome.state, outcome.snapshot, detached=outcome.detached)


def dry_run_text(plan: Plan, rows: list[tuple[str, str]]) -> str:
    """What `submit --dry-run` prints: the plan, and for a TPU VM the exact request with its startup script."""
    parts = [_rows_text(rows, title="Plan (dry run: nothing is created, no API is called)")]
    if plan.cloud is None:
        parts.append(_rows_text(sorted(plan.env.items()), title="\nJob environment"))
        return "\n".join(parts)
    from runner.backends.tpu_vm import dumps_request, node_request

    zone = plan.cloud.zones[0]
    body = node_request(plan, zone)
    if plan.attach:
        parts.append(
            f"\nAttach: run the startup script below on every worker of {plan.cloud.node_id} over "
            "`gcloud compute tpus tpu-vm ssh --worker=all`; the node is never deleted."
        )
    else:
        parts.append(
            f"\nRequest: POST /v2/projects/{plan.cloud.project}/locations/{zone}/nodes?nodeId={plan.cloud.node_id}"
        )
        parts.append(dumps_request(body))
    parts.append("\nstartup-script (runs as root on every worker at boot):")
    parts.append(body["metadata"]["startup-script"].rstrip("\n"))
    return "\n".join(parts)


def _finish(record: RunRecord, state: RunState, snapshot: Snapshot | None, *, detached: bool = False) -> None:
    from runner.artifacts import failure_tail, summary_rows
    from runner.errors import RunFailed
    from runner.status import RunState

    if detached:
        _say(f"started {record.run_id} in the background")
        typer.echo(f"  runner status {record.run_id}\n  runner logs {record.run_id} --follow")
        return
    assert snapshot is not None
    typer.echo()
    rows = summary_rows(record.run_dir, state, snapshot)
    if record.reason:
        rows.insert(1, ("reason", record.reason))
    _print_rows(rows, title=f"Run {record.run_id}")
    if state == RunState.SUCCEEDED:
        return
    tail = failure_tail(snapshot)
    if tail and state == RunState.FAILED:
        typer.echo(typer.style("last output:", bold=True))
        for line in tail:
            typer.echo(f"  {line}")
    if state == RunState.CANCELLED:
        raise typer.Exit(130)
    raise RunFailed(f"run {record.run_id} ended {state}", hint=f"`runner logs {record.run_id}` shows its whole log")


# -- status / logs / list ------------------------------------------------------------------------------------------


def _warn(text: str) -> None:
    """A problem that does not stop the command (one corrupt file among many): one line on stderr."""
    typer.echo(typer.style("warning", fg="yellow", bold=True) + f": {text}", err=True)


def _when(timestamp: float, fmt: str) -> str:
    """A time read from a file as local time; '?' for one no clock can show (NaN, 1e300: a corrupt file)."""
    import time

    try:
        return time.strftime(fmt, time.localtime(timestamp))
    except (OverflowError, ValueError, OSError):
        return "?"


def _without_bad_handle(record: RunRecord, warnings: list[str]) -> RunRecord:
    """The record as `_current_state` may use it: a handle its backend cannot read (a corrupt or foreign record)
    is dropped with a warning, and the state is then judged from the run directory alone."""
    from runner import contract, records
    from runner.artifacts import one_line

    if not record.handle or record.state.is_terminal():
        return record  # _current_state asks no backend about these
    from runner.errors import StorageError

    try:
        _backend_for(record.backend).handle_from_dict(record.handle)
    except StorageError as exc:
        local = records.runner_home() / "runs" / f"{record.run_id}.json"  # else it came from run.json (_resolve)
        source = local if local.is_file() else f"{record.run_dir.rstrip('/')}/{contract.RUN_INFO}"
        warnings.append(
            f"{source}: its {one_line(record.backend, 20)} machine handle cannot be read ({exc}); "
            "the state comes from the run directory alone"
        )
        return record.updated(handle={})
    return record


def _resolve(run: str) -> RunRecord:
    """A run id from this machine's records, or a run directory read directly (a run submitted elsewhere)."""
    import json
    import stat

    from runner import records
    from runner.errors import RunNotFound, StorageError, UsageError
    from runner.specfile import shown

    if not run.strip():
        raise UsageError("the run id is empty", hint="`runner list` shows the runs submitted here")
    is_dir, not_dir = False, ""  # not_dir: why `run`, as a local path, is no run directory
    if not run.startswith("gs://"):
        try:
            is_dir = stat.S_ISDIR(os.stat(run).st_mode)
            not_dir = "" if is_dir else "is not a directory"
        except (FileNotFoundError, NotADirectoryError):
            not_dir = "no such directory"
        except OSError as exc:  # a name too long, a permission: Path.is_dir() would raise these
            not_dir = exc.strerror or str(exc)
        except ValueError:
            not_dir = "not a valid path"
    if not (run.startswith("gs://") or os.sep in run or is_dir):
        return records.load(run)

    from pydantic import ValidationError

    from runner import contract
    from runner.spec import check_storage
    from runner.status import json_kind, where
    from runner.storage import open_storage

    name = shown(run)
    if run.startswith("gs://"):
        try:
            check_storage(run)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    elif not_dir:
        raise RunNotFound(f"{name}: {not_dir}; give a run id or a run directory (<storage>/runs/<run id>)")
    storage = open_storage(run)
    raw = storage.read_bytes(contract.RUN_INFO)
    if raw is None:
        raise RunNotFound(f"{name}: not a run directory (no {contract.RUN_INFO})")
    info_path = shown(where(storage, contract.RUN_INFO))
    try:
        info = json.loads(raw)
        if not isinstance(info, dict):
            raise ValueError(f"a JSON {json_kind(info)}, not an object")
        record = records.record_from_run_dir(info, run.rstrip("/"))
    except ValidationError as exc:
        first = exc.errors()[0]
        raise StorageError(f"{info_path} is corrupt: {'.'.join(map(str, first['loc']))}: {first['msg']}") from None
    except (ValueError, RecursionError) as exc:
        raise StorageError(f"{info_path} is corrupt: {exc}") from None
    if not records.valid_run_id(record.run_id):  # `down` saves a record named after it: no path in a run id
        raise StorageError(f"{info_path} is corrupt: {record.run_id!r} is not a run id")
    return record


def _current_state(record: RunRecord, snapshot: Snapshot, backend: Backend | None = None) -> RunState:
    """The run's state now. Pass `backend` when asking repeatedly (logs -f, list): one API client for all."""
    from runner.backends.base import MachineState
    from runner.errors import RunnerError
    from runner.status import derive_state

    alive = None
    if record.handle and not record.state.is_terminal():
        backend = backend or _backend_for(record.backend)
        try:
            machine = backend.status(backend.handle_from_dict(record.handle))
            alive = (
                None if machine == MachineState.UNKNOWN else machine in (MachineState.RUNNING, MachineState.CREATING)
            )
        except RunnerError:
            alive = None  # no credentials or API unreachable: judge by the run directory alone
    return derive_state(snapshot, record.num_workers, record.state, machine_alive=alive, heartbeat_timeout_s=60)


def _backend_for(name: str) -> Backend:
    if name == "tpu-vm":
        from runner.backends.tpu_vm import TpuVmBackend

        return TpuVmBackend(say=_say)
    from runner.backends.local import LocalBackend

    return LocalBackend()


@app.command()
def status(
    run: RunArg, as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False
) -> None:
    """Show a run's state, progress and results (works from any shell, even after the submitter died)."""
    import json

    from runner.artifacts import failure_tail, one_line, progress_text, summary_rows
    from runner.events import read_events
    from runner.status import read_snapshot
    from runner.storage import open_storage

    record = _resolve(run)
    storage = open_storage(record.run_dir)
    snapshot = read_snapshot(storage)
    warnings = list(snapshot.problems)
    events = read_events(storage, warnings)
    state = _current_state(_without_bad_handle(record, warnings), snapshot)
    if as_json:
        typer.echo(
            json.dumps(
                {
                    "run_id": record.run_id,
                    "state": str(state),
                    "run_dir": record.run_dir,
                    "backend": record.backend,
                    "metrics": snapshot.metrics,
                    "summary": snapshot.summary,
                    "heartbeat": snapshot.heartbeat,
                    "exits": [e.__dict__ for e in snapshot.exits],
                    "warnings": warnings,
                },
                default=str,
                indent=1,
            )
        )
        return
    rows = [  # run.json may come from someone else's run directory: no control characters reach the terminal
        ("job", one_line(record.job, 80)),
        ("backend", one_line(record.backend, 40)),
        ("created", _when(record.created_at, "%Y-%m-%d %H:%M:%S")),
    ]
    if snapshot.heartbeat_age_s is not None and not state.is_terminal():
        rows.append(("heartbeat", f"{snapshot.heartbeat_age_s:.0f}s ago"))
    if snapshot.metrics and not snapshot.summary:
        rows.append(("progress", progress_text(snapshot.metrics[-1])))
    if events:
        last = events[-1]
        rows.append(
            ("last event", f"{one_line(last.event, 60)} ({one_line(last.source, 40)}, {_when(last.time, '%H:%M:%S')})")
        )
    _print_rows(rows, title=f"Run {record.run_id}")
    _print_rows(summary_rows(record.run_dir, state, snapshot))
    for line in failure_tail(snapshot) if state.is_terminal() else []:
        typer.echo(f"  {line}")
    for warning in warnings:
        _warn(warning)


@app.command()
def logs(
    run: RunArg,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing until the run ends.")] = False,
    worker: Annotated[int, typer.Option(min=0, help="Which worker's log (TPU pod slices have several).")] = 0,
) -> None:
    """Print a run's log (the container's output); --follow streams it until the run ends."""
    from runner import contract
    from runner.errors import UsageError
    from runner.storage import open_storage
    from runner.watch import follow as follow_run

    record = _resolve(run)
    workers = max(record.num_workers, 1)
    if worker >= workers:  # the upper bound is the run's, so typer's max= cannot say it
        has = f"{workers} workers, 0 to {workers - 1}" if workers > 1 else "1 worker, worker 0"
        raise UsageError(f"--worker {worker}: run {record.run_id} has {has}")
    storage = open_storage(record.run_dir)
    if not follow:
        _write_output(storage.read_bytes(contract.log_key(worker)) or b"")
        return

    warnings: list[str] = []
    record = _without_bad_handle(record, warnings)
    for warning in warnings:
        _warn(warning)
    backend = _backend_for(record.backend)
    follow_run(
        storage,
        _write_output,
        num_workers=record.num_workers,
        worker=worker,
        interval_s=0.5 if storage.is_local else 2.0,
        stop=lambda snapshot: _current_state(record, snapshot, backend).is_terminal(),
    )


@app.command("list")
def list_runs(limit: Annotated[int, typer.Option(min=1, help="Show at most this many runs.")] = 20) -> None:
    """List the runs submitted from this machine, newest first."""

    from rich.table import Table

    from runner import records
    from runner.artifacts import number
    from runner.errors import RunnerError
    from runner.status import read_snapshot
    from runner.storage import open_storage

    table = Table("run", "job", "backend", "state", "created", "test acc.", box=None, pad_edge=False)
    warnings: list[str] = []
    found = records.list_records(warnings)[:limit]
    backends: dict[str, Backend] = {}
    for record in found:
        try:
            snapshot = read_snapshot(open_storage(record.run_dir), with_metrics=False)
            if record.backend not in backends:
                backends[record.backend] = _backend_for(record.backend)
            state = str(_current_state(_without_bad_handle(record, warnings), snapshot, backends[record.backend]))
            accuracy = number((snapshot.summary or {}).get("test_accuracy"))
            warnings += [f"{record.run_id}: {problem}" for problem in snapshot.problems]
        except Exception as exc:  # one unreachable run directory must not hide the others
            state, accuracy = "?", None
            reason = exc.message if isinstance(exc, RunnerError) else f"{type(exc).__name__}: {exc}"
            warnings.append(f"{record.run_id}: {reason}")
        table.add_row(
            record.run_id,
            record.job,
            record.backend,
            state,
            _when(record.created_at, "%Y-%m-%d %H:%M"),
            f"{accuracy:.4f}" if accuracy is not None else "-",
        )
    if found:
        _console().print(table)
    elif not warnings:
        _say("no runs yet; start one with `runner submit jobs/mnist.yaml --local`")
    for warning in warnings:
        _warn(warning)


# -- image -------------------------------------------------------------------------------------------------------

app.command("build")(image_build)


# -- bench -------------------------------------------------------------------------------------------------------

app.command("bench")(bench)


# -- teardown --------------------------------------------------------------------------------------------------


@app.command()
def down(run: RunArg) -> None:
    """Stop a run and delete what it created, now, in any phase (an attached node is left running)."""
    import time

    from runner import records
    from runner.events import EventLog
    from runner.status import RunState, read_snapshot
    from runner.storage import open_storage

    record = _resolve(run)
    if not record.handle:
        _say(f"{record.run_id} created nothing that could still run")
        return
    backend = _backend_for(record.backend)
    storage = open_storage(record.run_dir)
    finished = _current_state(record, read_snapshot(storage, with_metrics=False), backend).is_terminal()
    events = EventLog(storage, "runner-down")  # its own file: the submitter may still be writing runner.jsonl
    events.emit("down_requested", state=str(record.state))
    if not finished:  # recorded first: what the workers write while being stopped does not change what this was
        record = records.save(record.updated(state=RunState.CANCELLED, finished_at=time.time()))
    from runner.interrupts import signals_deferred

    with signals_deferred(_say):
        backend.teardown(backend.handle_from_dict(record.handle))
    events.emit("down_done")
    _say(f"{record.run_id} is down")


@app.command()
def gc(
    project: Annotated[str | None, typer.Option(help="Project (default: gcloud's).")] = None,
    zone: Annotated[
        list[str] | None,
        typer.Option(help="Sweep only this zone; repeat for several (default: every zone that offers TPUs)."),
    ] = None,
    all_zones: Annotated[
        bool, typer.Option("--all-zones", help="Every zone that offers TPUs, also when --zone is given.")
    ] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Only list; delete nothing.")] = False,
) -> None:
    """Find runner-labelled TPU nodes and queued resources nobody needs any more, and delete them all.

    Without --zone it sweeps the zones of this machine's runs and every zone of the catalog. Each orphan is tried
    even when another fails; the exit code is 5 if any deletion failed."""
    from runner import catalog, gcloud_config, records
    from runner.backends.tpu_api import TpuApi
    from runner.errors import BackendError, UsageError
    from runner.teardown import Sweeper

    project = project or gcloud_config.default_project()
    if not project:
        raise UsageError("no project to sweep", hint="pass --project or `gcloud config set project PROJECT`")
    runs = records.list_records()
    zones = set(zone or [])
    if all_zones or not zone:
        zones |= {z for t in catalog.all_types() for z in t.zones}
        zones |= {str(r.handle["zone"]) for r in runs if r.backend == "tpu-vm" and r.handle.get("zone")}
        if default := gcloud_config.default_zone():
            zones.add(default)
    ended = {r.run_id: str(r.state) for r in runs if r.state.is_terminal()}
    sweeper = Sweeper(TpuApi(), project, sorted(zones), say=_say, ended_runs=ended)
    found = sweeper.scan()
    where = ", ".join(sorted(zones)) if len(zones) <= 4 else f"{len(zones)} zones"
    rows = [
        (
            f"{f.kind} {f.short_name}",
            f"{f.zone}  {f.state}  run {f.run_id or '?'}  {f.age_s / 3600:.1f} h old  "
            + (f"ORPHANED: {f.orphaned_because}" if f.orphaned_because else "in use: kept"),
        )
        for f in found
    ]
    if rows:
        _print_rows(rows, title=f"Runner resources in {project} ({where})")
    else:
        _say(f"nothing labelled managed-by=tpu-runner in {where}")
    orphans = [f for f in found if f.orphaned_because]
    if dry_run or not orphans:
        if orphans:
            _say(f"{len(orphans)} orphaned; run without --dry-run to delete them")
        return
    results = sweeper.delete(orphans)
    for swept in results:
        what = f"{swept.leftover.kind} {swept.leftover.short_name} in {swept.leftover.zone}"
        if swept.outcome == "failed":
            _say(f"could not delete {what}: {swept.error}")
        elif swept.outcome == "delete requested":
            _say(f"delete requested: {what} (still being deleted; `runner gc --dry-run` shows when it is gone)")
        else:
            _say(f"deleted {what}")
    failed = [s for s in results if s.outcome == "failed"]
    if failed:
        raise BackendError(
            f"{len(failed)} of {len(results)} deletion(s) failed",
            hint="each failure is listed above; fix the cause (often a permission) and run `runner gc` again",
        )


# -- entry point ---------------------------------------------------------------------------------------------------


def _report(exc: RunnerError) -> None:
    first, _, rest = str(exc).partition("\n")
    typer.echo(typer.style("error", fg="red", bold=True) + f": {first}", err=True)
    if rest:
        typer.echo(rest, err=True)
    if exc.hint:
        typer.echo(typer.style(f"hint: {exc.hint}", dim=True), err=True)


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
