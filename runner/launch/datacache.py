"""This machine's data cache beside the run directory, for a TPU VM's job (runner.datasets reads it from there)."""

from __future__ import annotations

from collections.abc import Callable

from runner import contract
from runner.errors import RunnerError
from runner.plan.planner import Plan
from runner.storage import open_storage


def share_data(plan: Plan, say: Callable[[str], None]) -> None:
    """This machine's data cache beside the run directory, where a TPU VM's job finds it ($RUNNER_DATA_URL:
    runner.datasets reads it into the job's own cache), copied once per storage: `load_dataset("mnist")` then works
    on the VM as it does here, with no download from a host the VM may not reach."""
    url = plan.env.get(contract.DATA_URL)
    from runner import datasets

    local = datasets.mnist_path(fetch=False) if url else None
    if url is None or local is None:
        return
    target = open_storage(url)
    try:
        present = {o.key: o.size for o in target.list(datasets.MNIST_NPZ)}
        if present.get(datasets.MNIST_NPZ) != local.stat().st_size:
            target.upload_file(local, datasets.MNIST_NPZ)
            say(f"copied the data cache's {datasets.MNIST_NPZ} to {url}/ for the job")
    except (RunnerError, OSError) as exc:  # the job can still download it itself, or read its own data
        say(f"warning: could not copy the data cache to {url}: {exc}")
