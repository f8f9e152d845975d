"""Plans for the compute-engine backend, made by the planner itself with this backend's resolution (no registry,
no network): what its tests render, validate and provision."""

from __future__ import annotations

import textwrap
from typing import Any

from runner.backends.compute_engine import resolve
from runner.plan.planner import Plan, plan_cloud
from runner.spec.loader import load_spec_text

PROJECT = "rehearsal"
IMAGE = f"us-central1-docker.pkg.dev/{PROJECT}/runner/trainer:test"
COMMAND = "command: [python, -c, 'print(\"hi\")']\n"


def spec_text(
    accelerator: str, *, name: str = "ce", storage: str = "gs://bucket/runs", body: str = COMMAND, extra: str = ""
) -> str:
    return (
        textwrap.dedent(f"""\
        name: {name}
        image: {IMAGE}
        accelerator: {{{accelerator}, project: {PROJECT}}}
        storage: {storage}
        """)
        + extra
        + body
    )


def plan(accelerator: str = "type: tpu7x-8, zone: us-central1-c", **kwargs: Any) -> Plan:
    """A plan of `accelerator` (the spec's flow mapping, without its project), pinned like the golden tests'."""
    spec = load_spec_text(spec_text(accelerator, **kwargs))
    return plan_cloud(spec, None, resolve=resolve, now=1_800_000_000.0, run_suffix="abcd", nonce="0123abcd")
