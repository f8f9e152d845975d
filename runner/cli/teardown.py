"""`runner down` and `runner gc`: delete what a run created, or what every run left behind."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

import typer

from runner.cli.output import print_rows, say
from runner.cli.typer_app import RunArg, app


@app.command()
def down(run: RunArg) -> None:
    """Stop a run and delete what it created, now, in any phase (an attached node is left running).

    Exit 5 while what it created is not confirmed gone; 4 when it is gone but the run directory could not be told."""
    from runner.teardown.down import down as take_down
    from runner.watch.lookup import resolve

    record = resolve(run)
    done = take_down(record, say=say)
    if not done.created:
        say(f"{record.run_id} created nothing that could still run")
        return
    if done.storage_error is not None:
        from runner.errors import StorageError

        raise StorageError(
            f"{record.run_id} is down, but its run directory could not be told so: {done.storage_error.message}",
            hint=f"`runner status {record.run_id}` shows the run as this machine recorded it",
        )
    say(f"{record.run_id} is down")


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
    even when another fails, and every zone even when another cannot be listed; the exit code is 5 if a zone was
    skipped, a resource could not be judged, or a deletion failed."""
    from runner.backends.sweep import ZONE
    from runner.errors import BackendError
    from runner.teardown.sweeper import sweeper_for

    sweeper = sweeper_for(project, {ZONE: zone} if zone else None, everywhere=all_zones, say=say)
    listed = sweeper.swept
    found = sweeper.scan()
    where = ", ".join(listed) if len(listed) <= 4 else _count(listed, sweeper.kind_of)
    for skipped, why in sorted(sweeper.skipped.items()):
        say(f"could not list {skipped}: {why}; skipped it, swept the others")
    rows = [
        (
            f"{f.kind} {f.short_name}",
            f"{f.location}  {f.state}  run {f.run_id or '?'}  "
            + (f"{f.age_s / 3600:.1f} h old  " if f.age_s is not None else "")
            + (
                f"ORPHANED: {f.orphaned_because}"
                if f.orphaned_because
                else f"UNKNOWN: kept ({f.unknown})"
                if f.unknown
                else "in use: kept"
            ),
        )
        for f in found
    ]
    if rows:
        print_rows(rows, title=f"Runner resources in {sweeper.project} ({where})")
    else:
        say(f"nothing labelled managed-by=tpu-runner in {where}")
    orphans = [f for f in found if f.orphaned_because]
    results = [] if dry_run else sweeper.delete(orphans)
    if dry_run and orphans:
        say(f"{len(orphans)} orphaned; run without --dry-run to delete them")
    for swept in results:
        what = f"{swept.leftover.kind} {swept.leftover.short_name} in {swept.leftover.location}"
        if swept.outcome == "failed":
            say(f"could not delete {what}: {swept.error}")
        elif swept.outcome == "delete requested":
            say(f"delete requested: {what} (still being deleted; `runner gc --dry-run` shows when it is gone)")
        else:
            say(f"deleted {what}")
    failed = [s for s in results if s.outcome == "failed"]
    unjudged = [f for f in found if f.unknown]
    problems = [f"{len(failed)} of {len(results)} deletion(s) failed"] if failed else []
    if sweeper.skipped:
        unlisted = sorted(sweeper.skipped)
        problems.append(f"{_count(unlisted, sweeper.kind_of, '(s)')} could not be listed ({', '.join(unlisted)})")
    if unjudged:
        problems.append(f"{len(unjudged)} resource(s) could not be judged (their run directories cannot be read)")
    if problems:
        raise BackendError(
            "; ".join(problems),
            hint="each is listed above with its reason; fix the cause (often a permission) and run `runner gc` again",
        )


def _count(locations: list[str], kind_of: Callable[[str], str], suffix: str | None = None) -> str:
    """'12 zones', '3 clusters, 1 zone' (or with `suffix`, '1 zone(s)'): how many locations of each kind."""
    kinds: dict[str, int] = {}
    for location in locations:
        kinds[kind_of(location)] = kinds.get(kind_of(location), 0) + 1
    plural = (lambda n: suffix) if suffix is not None else (lambda n: "" if n == 1 else "s")
    return ", ".join(f"{n} {kind}{plural(n)}" for kind, n in kinds.items())
