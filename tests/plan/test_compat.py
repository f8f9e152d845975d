"""The compatibility rules the plan enforces (runner.plan.compat, from runner/plan/tpu_catalog.yaml), table-driven:
framework x generation x runtime version x hosts, what an unknown type suggests, and TPU7x. The same checks run
offline in `runner validate`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from runner.cli import app
from runner.plan import catalog, compat
from runner.spec import JobSpec

BASE_ZONE = {"v2": "us-central1-b", "v3": "europe-west4-a", "v4": "us-central2-b", "v5litepod": "us-central1-a"}
BASE_ZONE |= {"v5p": "us-east5-a", "v6e": "us-east1-d", "tpu7x": "us-central1-c", "v5e": "us-central1-a"}


def spec(accelerator: str, framework: str | None = "tensorflow", runtime: str | None = None) -> JobSpec:
    acc: dict[str, Any] = {"type": accelerator, "zone": BASE_ZONE.get(accelerator.split("-")[0], "us-central1-a")}
    if runtime:
        acc["runtime_version"] = runtime
    doc: dict[str, Any] = {"name": "j", "image": "i", "accelerator": acc}
    doc |= {"training": {"framework": framework}} if framework else {"command": ["python", "x.py"]}
    return JobSpec.model_validate(doc)


# (type, framework (None: a custom command), runtime, expected errors, expected warnings): each a substring.
RULES: list[tuple[str, str | None, str | None, list[str], list[str]]] = [
    ("v5litepod-8", "tensorflow", None, [], []),
    ("v5litepod-8", "jax", None, [], []),
    ("v6e-8", "jax", None, [], []),
    ("v6e-8", "tensorflow", None, ["framework tensorflow on v6e", "TensorFlow isn't supported for training"], []),
    ("v6e-8", None, None, [], []),  # a custom command: the framework is the user's
    ("v4-8", "tensorflow", "tpu-vm-tf-2.17.0-pjrt", [], []),
    ("v4-8", "tensorflow", "tpu-vm-tf-2.18.0-pjrt-v5p-and-below", [], []),
    ("v4-8", "tensorflow", "tpu-vm-tf-2.18.0-pjrt", ["name the chip family"], []),
    ("v4-8", "tensorflow", "tpu-vm-tf-2.18.0-pjrt-v5e-and-v6", ["does not run on v4-8"], []),
    ("v5litepod-8", "tensorflow", "tpu-vm-tf-2.18.0-pjrt-v5e-and-v6", [], []),
    ("v5litepod-8", "tensorflow", "tpu-vm-tf-2.16.1-pjrt-v5e-and-v6", ["only exist from TensorFlow 2.18"], []),
    ("v4-32", "tensorflow", None, ["TensorFlow needs a tpu-vm-tf-X.Y.Z-pod-pjrt"], []),
    ("v4-32", "tensorflow", "tpu-vm-tf-2.17.0-pod-pjrt", [], []),
    ("v4-32", "tensorflow", "tpu-vm-tf-2.18.0-pod-pjrt-v5p-and-below", [], ["tensorflow#82208"]),
    ("v4-32", "tensorflow", "tpu-vm-tf-2.19.0-pod-pjrt-v5p-and-below", [], ["tensorflow#93618"]),
    ("v4-32", "tensorflow", "tpu-vm-tf-2.17.0-pjrt", ["needs a -pod- TensorFlow runtime"], []),
    ("v4-32", "jax", None, [], []),  # JAX runs on every host of the slice's base runtime
    ("v4-8", "jax", "tpu-vm-tf-2.17.0-pjrt", [], ["is a TensorFlow image"]),
    ("v5e-8", "jax", None, ["names v5e v5litepod", "did you mean v5litepod-8"], []),
    ("v4-9", "jax", None, ["v4 comes in sizes", "did you mean v4-8 or v4-16"], []),
    ("tpu7x-8", "jax", None, ["TPU7x (Ironwood) cannot be created here", "GKE"], []),
    ("v9-8", "jax", None, ["unknown TPU type"], []),
]


@pytest.mark.parametrize(("accelerator", "framework", "runtime", "errors", "warnings"), RULES)
def test_compatibility_rules(
    accelerator: str, framework: str | None, runtime: str | None, errors: list[str], warnings: list[str]
) -> None:
    _, findings = compat.check(spec(accelerator, framework, runtime))
    said_errors = " | ".join(f"{f.message} ({f.hint})" for f in findings if f.error)
    said_warnings = " | ".join(f"{f.message} ({f.hint})" for f in findings if not f.error)
    assert all(e in said_errors for e in errors) and (said_errors == "") == (not errors), said_errors
    assert all(w in said_warnings for w in warnings) and (said_warnings == "") == (not warnings), said_warnings


def test_every_framework_fact_names_its_source() -> None:
    for generation in catalog.generations().values():
        for framework, refused in generation.frameworks.items():
            assert refused is None or "cloud.google.com" in refused, (generation.name, framework)
    far = catalog.unreachable("tpu7x")
    assert far is not None and "cloud.google.com/tpu/docs" in far.why


def test_validate_runs_the_catalog_checks_offline(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("name: j\nimage: i\naccelerator: {type: v5e-8, zone: us-nowhere1-a}\ntraining: {}\n")
    result = CliRunner().invoke(app, ["validate", str(path)])
    assert result.exit_code == 2
    assert "did you mean v5litepod-8?" in result.output
    path.write_text("name: j\nimage: i\naccelerator: {type: v5litepod-8, zone: us-nowhere1-a}\ntraining: {}\n")
    result = CliRunner().invoke(app, ["validate", str(path)])
    assert result.exit_code == 2 and "v5litepod-8 is not offered in us-nowhere1-a" in result.output
