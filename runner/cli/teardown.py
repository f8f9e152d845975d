"""`runner down` and `runner gc`: delete what a run created, or what every run left behind."""

from __future__ import annotations

from typing import Annotated

import typer

from runner.cli.output import print_rows, say
from runner.cli.typer_app import RunArg, app


@app.command()
def down(run: RunArg) -> None:
    """Stop a run and delete what it created, now, in any phase (an attached node is left running)."""
    from runner.teardown.down import down as take_down
    from runner.watch.lookup import resolve

    record = resolve(run)
    if take_down(record, say=say):
        say(f"{record.run_id} is down")
    else:
        say(f"{record.run_id} created nothing that could still run")


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
    from runner.errors import BackendError
    from runner.teardown.sweeper import sweeper_for

    sweeper = sweeper_for(project, zone, all_zones=all_zones, say=say)
    zones = sweeper.zones
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
        print_rows(rows, title=f"Runner resources in {sweeper.project} ({where})")
    else:
        say(f"nothing labelled managed-by=tpu-runner in {where}")
    orphans = [f for f in found if f.orphaned_because]
    if dry_run or not orphans:
        if orphans:
            say(f"{len(orphans)} orphaned; run without --dry-run to delete them")
        return
    results = sweeper.delete(orphans)
    for swept in results:
        what = f"{swept.leftover.kind} {swept.leftover.short_name} in {swept.leftover.zone}"
        if swept.outcome == "failed":
            say(f"could not delete {what}: {swept.error}")
        elif swept.outcome == "delete requested":
            say(f"delete requested: {what} (still being deleted; `runner gc --dry-run` shows when it is gone)")
        else:
            say(f"deleted {what}")
    failed = [s for s in results if s.outcome == "failed"]
    if failed:
        raise BackendError(
            f"{len(failed)} of {len(results)} deletion(s) failed",
            hint="each failure is listed above; fix the cause (often a permission) and run `runner gc` again",
        )
