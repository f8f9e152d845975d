"""`runner status`, `runner logs` and `runner list`: a run's state, output and results, from any shell, even after
its submitting runner died (everything is read from the run directory; the backend only says if a machine lives)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any

import typer

from runner.cli.output import console, echo, print_rows, say, warn, when, write_output
from runner.cli.typer_app import RunArg, app

if TYPE_CHECKING:
    from runner.backends.base import Backend
    from runner.collect.facts import RunFacts
    from runner.watch.events import Event
    from runner.watch.rundir import Progress, Snapshot
    from runner.watch.runs import RunRecord


@app.command()
def status(
    run: RunArg, as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False
) -> None:
    """Show a run's state, progress and results (works from any shell, even after the submitter died)."""
    import json

    from runner import contract
    from runner.backends import run_state
    from runner.collect.progress import standing
    from runner.collect.summary import failure_tail, summary_rows
    from runner.collect.timeline import startup
    from runner.watch.logtext import one_line
    from runner.watch.lookup import resolve

    record = resolve(run)
    warnings: list[str] = []
    view = _view(record, warnings)
    snapshot, events, facts = view.snapshot, view.events, view.facts
    metrics = facts.metrics if facts else snapshot.metrics  # metrics.jsonl, else Keras' lines in the log
    where = standing(view.progress, metrics)
    state = run_state(record, snapshot, warnings)
    if as_json:
        echo(
            json.dumps(
                {
                    "run_id": record.run_id,
                    "state": str(state),
                    "run_dir": record.run_dir,
                    "backend": record.backend,
                    "metrics": metrics,
                    "metrics_from": facts.metrics_from if facts else None,
                    **where.to_json(),
                    "summary": facts.summary.to_json() if facts and facts.summary else None,
                    "heartbeat": snapshot.heartbeat.to_json() if snapshot.heartbeat else None,
                    "exits": [e.to_json() for e in snapshot.exits],
                    "artifacts": {key: f"{record.run_dir.rstrip('/')}/{key}" for key in sorted(view.present)},
                    "checkpoints": [c.to_json() for c in facts.checkpoints] if facts else [],
                    "resumed": facts.resumed.to_json() if facts and facts.resumed else None,
                    "cost": facts.cost.to_json() if facts and facts.cost is not None else None,
                    "still_billing": record.still_billing,
                    "startup": (facts.startup if facts else startup([], [], ready="")).to_json(),
                    "goodput": facts.goodput.to_json() if facts and facts.goodput is not None else None,
                    "attempts": [a.model_dump(mode="json") for a in record.attempts],
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
        ("created", when(record.created_at, "%Y-%m-%d %H:%M:%S")),
        *(
            [
                (
                    "attempts",
                    f"{len(record.attempts) + 1}: "
                    + ", ".join(
                        f"{a.state} {when(a.finished_at or a.started_at, '%m-%d %H:%M')}" for a in record.attempts
                    )
                    + ", then `runner resume`",
                )
            ]
            if record.attempts
            else []
        ),
    ]
    if snapshot.heartbeat_age_s is not None and not state.is_terminal():
        rows.append(("heartbeat", f"{snapshot.heartbeat_age_s:.0f}s ago"))
    rows += [row for row in where.rows() if not state.is_terminal() or row[0] == "last metrics"]
    if facts is not None and facts.metrics_from == contract.log_key(0) and not state.is_terminal():
        rows.append(("metrics from", f"Keras' epoch lines in {contract.log_key(0)} (the job writes no metrics.jsonl)"))
    if events:
        last = events[-1]
        rows.append(
            ("last event", f"{one_line(last.event, 60)} ({one_line(last.source, 40)}, {when(last.time, '%H:%M:%S')})")
        )
    if facts is not None:
        rows += facts.rows()
    else:
        rows.append(("cost", "unknown: the run directory cannot be read"))
        rows += [("billing", record.still_billing)] if record.still_billing else []
    print_rows(rows, title=f"Run {record.run_id}")
    print_rows(
        summary_rows(
            record.run_dir,
            state,
            snapshot,
            view.present,
            summary=facts.summary if facts else None,
            checkpoints=facts.checkpoints if facts else None,
        )
    )
    for line in failure_tail(snapshot) if state.is_terminal() else []:
        echo(f"  {line}")
    for warning in warnings:
        warn(warning)


@dataclass
class _View:
    """What `status` shows of a run directory; empty, with a warning, when it cannot be read."""

    snapshot: Snapshot
    progress: Progress | None = None
    events: list[Event] = field(default_factory=list)
    facts: RunFacts | None = None
    present: set[str] = field(default_factory=set)


def _view(record: RunRecord, warnings: list[str]) -> _View:
    from runner import contract
    from runner.collect.facts import gather
    from runner.collect.summary import existing_artifacts
    from runner.errors import StorageError
    from runner.storage import open_storage
    from runner.timings import Timings
    from runner.watch.events import read_events
    from runner.watch.rundir import Progress, Snapshot, read_record, read_snapshot

    storage = open_storage(record.run_dir, patience_s=Timings.from_env().storage_patience_s)
    try:
        snapshot = read_snapshot(storage)
        warnings += snapshot.problems
        events = read_events(storage, warnings, one_clock=True)
        # cost, startup, metrics (metrics.jsonl, else Keras' lines in the log), summary, checkpoints
        facts = gather(record, storage, snapshot=snapshot, events=events, checkpoints=True)
        warnings += facts.warnings
        # progress.json itself is fresher than the copy in the heartbeat (every 10 s); a job that writes none: its log
        progress = (
            read_record(storage, contract.PROGRESS, Progress.from_json, warnings)
            or snapshot.progress
            or facts.log_progress
        )
        return _View(snapshot, progress, events, facts, existing_artifacts(storage))
    except StorageError as exc:
        warnings.append(f"{exc.message}: what follows is what this machine recorded of the run")
        return _View(Snapshot([], None, [], None))


@app.command()
def logs(
    run: RunArg,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing until the run ends.")] = False,
    worker: Annotated[
        int | None,
        typer.Option(min=0, help="Only this worker's log (default: every worker's, each line prefixed on a slice)."),
    ] = None,
) -> None:
    """Print a run's log (the container's output); --follow streams it until the run ends."""
    from runner import contract
    from runner.backends import backend_named, run_state, usable
    from runner.errors import RunnerError, UsageError
    from runner.storage import open_storage
    from runner.watch.follow import LogTail, Sight, tail_for, whole_logs
    from runner.watch.follow import follow as follow_run
    from runner.watch.logtext import LogCleaner, clean_log
    from runner.watch.lookup import resolve

    record = resolve(run)
    workers = max(record.num_workers, 1)
    if worker is not None and worker >= workers:  # the upper bound is the run's, so typer's max= cannot say it
        has = f"{workers} workers, 0 to {workers - 1}" if workers > 1 else "1 worker, worker 0"
        raise UsageError(f"--worker {worker}: run {record.run_id} has {has}")
    storage = open_storage(record.run_dir)
    # What is printed from storage is cleaned like what the supervisor stores (a log written before it did that,
    # or by someone else, holds Keras' redraws and escape sequences): runner.watch.logtext.
    if not follow:
        if worker is None and workers > 1:
            write_output(clean_log(whole_logs(storage, workers)))
        else:
            write_output(clean_log(storage.read_bytes(contract.log_key(worker or 0)) or b""))
        return
    cleaner = LogCleaner()

    warnings: list[str] = []
    record = usable(record, warnings)
    for warning in warnings:
        warn(warning)
    try:
        backend: Backend | None = backend_named(record.backend, say)  # one API client for every read
    except RunnerError:
        backend = None  # its state is then judged from the run directory alone
    interval = 0.5 if storage.is_local else 2.0
    snapshot = follow_run(
        storage,
        lambda chunk: write_output(cleaner.feed(chunk)),
        num_workers=record.num_workers,
        interval_s=interval,
        sight=Sight(say, interval),  # a run directory out of reach is said, and waited for: never an end
        tail=LogTail(storage, worker) if worker is not None else tail_for(storage, workers),
        stop=lambda snapshot: run_state(record, snapshot, backend=backend).is_terminal(),
    )
    write_output(cleaner.flush())
    # The log above already holds any traceback: the end says only how the run ended, and where to read more.
    import contextlib

    from runner.collect.summary import ending

    with contextlib.suppress(RunnerError):
        record = resolve(run)  # the submitter records why the run ended once it has
    say(ending(record.run_id, run_state(record, snapshot, backend=backend), snapshot, record.reason))


@app.command("list")
def list_runs(
    limit: Annotated[int, typer.Option(min=1, help="Show at most this many runs.")] = 20,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """List the runs submitted from this machine, newest first."""
    import json

    from runner.backends import backend_named, run_state
    from runner.collect.facts import gather
    from runner.errors import RunnerError
    from runner.storage import open_storage
    from runner.watch import runs
    from runner.watch.rundir import read_snapshot

    warnings: list[str] = []
    found = runs.list_records(warnings)[:limit]
    backends: dict[str, Backend] = {}
    entries: list[dict[str, Any]] = []
    for record in found:
        entry: dict[str, Any] = {
            "run_id": record.run_id,
            "job": record.job,
            "backend": record.backend,
            "state": "?",
            "created_at": record.created_at,
            "run_dir": record.run_dir,
            "test_accuracy": None,
            "last_metrics": None,
            "metrics_from": None,
            "cost": None,
            "cost_cell": "?+" if record.still_billing else "?",
            "still_billing": record.still_billing,
            "goodput": None,
            "goodput_cell": "?",
        }
        try:
            storage = open_storage(record.run_dir)
            snapshot = read_snapshot(storage)
            if record.backend not in backends:
                backends[record.backend] = backend_named(record.backend, say)
            state = run_state(record, snapshot, warnings, backends[record.backend])
            entry["state"] = str(state)
            facts = gather(record, storage, snapshot=snapshot)  # metrics: metrics.jsonl, else Keras' lines in the log
            entry["test_accuracy"] = facts.summary.test_accuracy if facts.summary else None
            entry["last_metrics"] = facts.last_metrics
            entry["metrics_from"] = facts.metrics_from
            entry["cost"] = facts.cost.to_json() if facts.cost is not None else None
            entry["cost_cell"] = facts.cost_cell()
            entry["goodput"] = facts.goodput.to_json() if facts.goodput is not None else None
            entry["goodput_cell"] = facts.goodput.cell() if facts.goodput is not None else "-"
            warnings += [f"{record.run_id}: {problem}" for problem in [*snapshot.problems, *facts.warnings]]
        except Exception as exc:  # one unreachable run directory must not hide the others
            reason = exc.message if isinstance(exc, RunnerError) else f"{type(exc).__name__}: {exc}"
            warnings.append(f"{record.run_id}: {reason}")
        entries.append(entry)
    if as_json:
        echo(json.dumps({"runs": entries, "warnings": warnings}, default=str, indent=1))
        return
    _print_runs(entries)
    if not found and not warnings:
        say("no runs yet; start one with `runner submit jobs/mnist.yaml --local`")
    for warning in warnings:
        warn(warning)


def _unplaced(line: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in line.items() if k not in ("epoch", "step")}


def _print_runs(entries: list[dict[str, Any]]) -> None:
    from rich.table import Table

    if not entries:
        return
    from runner.collect.figures import metrics_text, rounded

    table = Table("run", "job", "backend", "state", "created", "result", "cost", "goodput", box=None, pad_edge=False)
    table.columns[0].no_wrap = table.columns[5].no_wrap = True  # a run id is what a user copies
    # The state is what a look at the list is for: never cut to "st…" on a narrow terminal (the date wraps instead).
    table.columns[3].min_width = max(len(str(entry["state"])) for entry in entries)
    table.columns[6].min_width, table.columns[7].min_width = len("cost"), len("goodput")
    for entry in entries:
        accuracy, last = entry["test_accuracy"], entry["last_metrics"]
        # the test accuracy (the trainer's, or a command's evaluate()); else a command's last metrics (its
        # RUNNER_METRICS_FILE, or the epoch Keras printed last)
        result = (
            f"test acc. {rounded(accuracy)}"
            if accuracy is not None
            else metrics_text(_unplaced(last), 2, say_more=False)
            if last
            else "-"
        )
        table.add_row(
            entry["run_id"],
            entry["job"],
            entry["backend"],
            entry["state"],
            when(entry["created_at"], "%Y-%m-%d %H:%M"),
            result,
            entry["cost_cell"],
            entry["goodput_cell"],
        )
    console().print(table)
    for entry in entries:  # `+`: what may still bill, by name, and how to delete it
        if entry["still_billing"]:
            echo(f"+ {entry['run_id']}: {entry['still_billing']}")
