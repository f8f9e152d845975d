"""What the cloud backends put on everything they create, so that a run's resources are found, judged and deleted by
the runner alone (`runner down`, `runner gc`), and never anyone else's.

Labels where the API has them (a TPU node, a queued resource's node, a Compute Engine instance and the instances of
an instance template). Compute Engine's managed instance groups, instance templates, resource policies and resize
requests have no `labels` field (compute.v1.json): the same key=value pairs go into their description, after
DESCRIPTION_MARK, where the sweeper reads them back.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping

MANAGED = "managed-by"
MANAGED_BY = "tpu-runner"
RUN = "tpu-runner-run"
JOB = "tpu-runner-job"
DEADLINE = "tpu-runner-deadline"
NONCE = "tpu-runner-nonce"  # unique per submit: tells this run's machine from another's with the same name
DESCRIPTION_MARK = "labels:"
_PAIR = re.compile(r"([a-z][a-z0-9_-]*)=([a-z0-9_-]*)")


def run_labels(run_id: str, job: str, deadline: float, nonce: str) -> dict[str, str]:
    """The labels of everything one submit creates."""
    return {MANAGED: MANAGED_BY, RUN: run_id, JOB: job, DEADLINE: str(int(deadline)), NONCE: nonce}


def owned(labels: Mapping[str, str], nonce: str | None) -> bool:
    """Created by this submit: labelled by the runner with its nonce."""
    return labels.get(MANAGED) == MANAGED_BY and labels.get(NONCE) == nonce


def managed(labels: Mapping[str, str]) -> bool:
    return labels.get(MANAGED) == MANAGED_BY


def in_description(text: str, labels: Mapping[str, str]) -> str:
    """A description that carries `labels` for a resource that has no labels field."""
    return f"{text}; {DESCRIPTION_MARK} " + " ".join(f"{k}={v}" for k, v in labels.items())


def from_description(description: str | None) -> dict[str, str]:
    """The labels `in_description` wrote; {} for a description the runner did not write."""
    if not description or DESCRIPTION_MARK not in description:
        return {}
    return dict(_PAIR.findall(description.rsplit(DESCRIPTION_MARK, 1)[1]))


class NameTaken(Exception):
    """A machine with this run's name exists and is not this run's: the run's gets a new name, never a delete."""

    def __init__(self, name: str, owner: str, *, kind: str = "TPU node") -> None:
        super().__init__(f"{kind} {name} exists already (run {owner})")
        self.new_id = renamed(name)


def renamed(name: str) -> str:
    """Another name for a machine whose name is taken: the same, with 4 random hex digits (at most 63 characters,
    as node, instance and group names are)."""
    return f"{name[:58].rstrip('-')}-{secrets.token_hex(2)}"
