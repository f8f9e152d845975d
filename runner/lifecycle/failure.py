"""What `runner submit` says when it fails on its own: an error that no storage or API answer explains (a fault of
the runner's, met while a job rewrites its run directory, say). A healthy job is not taken down without a word: the
user learns what happened, what became of the job, and how to go on."""

from __future__ import annotations

from runner.errors import RunnerError


def runner_failed(run_id: str, what: str, *, left_running: bool) -> RunnerError:
    """`what`: the error and where it was raised (runner.watch.follow.fault). `left_running`: it came while the run
    was followed, and the job was left as it was; otherwise the run was stopped and what it created deleted."""
    if left_running:
        job = "the job is left running, and its run directory records it as before"
        hint = f"follow it: `runner logs {run_id} -f`; stop it: `runner down {run_id}`"
    else:
        job = "the run was stopped and what it created deleted"
        hint = f"`runner resume {run_id}` continues it from its newest checkpoint"
    return RunnerError(
        f"this runner failed on run {run_id} ({what}). That is the runner's fault, not the job's: {job}",
        hint=f"{hint}; its state: `runner status {run_id}`. RUNNER_DEBUG=1 shows the runner's traceback",
    )
