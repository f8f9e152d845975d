"""The compatibility rules the plan enforces (runner.plan.compat, from runner/plan/tpu_catalog.yaml), table-driven:
framework x generation x runtime version x hosts through the Cloud TPU API, what an unknown type suggests, which
backend creates a generation (TPU7x only through compute-engine), and what the catalog says of chips, TensorCores
and JAX devices. The same checks run offline in `runner validate`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from runner import backends
from runner.cli import app
from runner.plan import catalog, compat
from runner.spec import JobSpec

BASE_ZONE = {"v2": "us-central1-b", "v3": "europe-west4-a", "v4": "us-central2-b", "v5litepod": "us-central1-a"}
BASE_ZONE |= {"v5p": "us-east5-a", "v6e": "us-east1-d", "tpu7x": "us-central1-c", "v5e": "us-central1-a"}


def spec(
    accelerator: str, framework: str | None = "tensorflow", runtime: str | None = None, backend: str = "auto"
) -> JobSpec:
    acc: dict[str, Any] = {"type": accelerator, "zone": BASE_ZONE.get(accelerator.split("-")[0], "us-central1-a")}
    acc["backend"] = backend
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
    ("v7x-8", "jax", None, ["the catalog names v7x tpu7x", "did you mean tpu7x-8?"], []),
    ("v9-8", "jax", None, ["unknown TPU type"], []),
]


@pytest.mark.parametrize(("accelerator", "framework", "runtime", "errors", "warnings"), RULES)
def test_compatibility_rules(
    accelerator: str, framework: str | None, runtime: str | None, errors: list[str], warnings: list[str]
) -> None:
    _, findings = compat.check(spec(accelerator, framework, runtime), "tpu-vm")
    said_errors = " | ".join(f"{f.message} ({f.hint})" for f in findings if f.error)
    said_warnings = " | ".join(f"{f.message} ({f.hint})" for f in findings if not f.error)
    assert all(e in said_errors for e in errors) and (said_errors == "") == (not errors), said_errors
    assert all(w in said_warnings for w in warnings) and (said_warnings == "") == (not warnings), said_warnings


def test_every_framework_fact_names_its_source() -> None:
    for generation in catalog.generations().values():
        for framework, refused in generation.frameworks.items():
            assert refused is None or "cloud.google.com" in refused, (generation.name, framework)
    for generation in catalog.generations().values():
        assert set(generation.backends) <= set(backends.CLOUD), generation.name
        assert generation.backends_note == "" or "cloud.google.com" in generation.backends_note


# (type, backend asked for, framework, expected errors): what holds whichever backend creates the machine.
COMMON: list[tuple[str, str, str | None, list[str]]] = [
    ("tpu7x-8", "tpu-vm", "jax", ["TPU7x (Ironwood) is not created through it", "not supported on TPU7x and later"]),
    ("tpu7x-8", "compute-engine", "jax", []),
    ("tpu7x-8", "compute-engine", "tensorflow", ["TensorFlow is not supported on TPU7x", "training.framework: jax"]),
    ("tpu7x-8", "compute-engine", None, []),  # a command: the framework is the user's
    ("v6e-8", "compute-engine", "jax", []),
    ("v5p-8", "compute-engine", "jax", []),
    ("v5litepod-8", "compute-engine", "jax", ["TPU v5e is not created through it", "accelerator.backend: tpu-vm"]),
]


@pytest.mark.parametrize(("accelerator", "backend", "framework", "errors"), COMMON)
def test_what_holds_on_every_backend(accelerator: str, backend: str, framework: str | None, errors: list[str]) -> None:
    _, findings = compat.common(spec(accelerator, framework), backend)
    said = " | ".join(f"{f.message} ({f.hint})" for f in findings if f.error)
    assert all(e in said for e in errors) and (said == "") == (not errors), said


@pytest.mark.parametrize(
    ("accelerator", "chips", "tensorcores", "jax_devices", "hosts", "topology"),
    [
        ("tpu7x-8", 4, 8, 8, 1, "2x2x1"),  # two JAX devices per TPU7x chip
        ("tpu7x-16", 8, 16, 16, 2, "2x2x2"),
        ("tpu7x-2", 1, 2, 2, 1, "1x1x1"),
        ("v5p-8", 4, 8, 4, 1, None),  # megacore: one JAX device per chip
        ("v4-32", 16, 32, 16, 4, None),
        ("v3-8", 4, 8, 8, 1, None),
        ("v6e-8", 8, 8, 8, 1, None),
    ],
)
def test_chips_tensorcores_devices_and_hosts(
    accelerator: str, chips: int, tensorcores: int, jax_devices: int, hosts: int, topology: str | None
) -> None:
    accel = catalog.accelerator(accelerator)
    assert (accel.chips, accel.tensorcores, accel.jax_devices, accel.hosts) == (chips, tensorcores, jax_devices, hosts)
    assert accel.topology == topology


@pytest.mark.parametrize(
    ("accelerator", "asked", "backend", "why"),
    [
        ("tpu7x-8", "auto", "compute-engine", "TPU7x (Ironwood) is created only through compute-engine"),
        ("v6e-8", "auto", "tpu-vm", "TPU v6e (Trillium) can go through tpu-vm or compute-engine; auto picks tpu-vm"),
        ("v5litepod-8", "auto", "tpu-vm", "TPU v5e is created only through tpu-vm"),
        ("v6e-8", "compute-engine", "compute-engine", "accelerator.backend"),
    ],
)
def test_auto_picks_the_catalogs_default_backend(accelerator: str, asked: str, backend: str, why: str) -> None:
    assert backends.chosen(spec(accelerator, "jax", backend=asked)) == (
        backend,
        f"auto: {why}" if asked == "auto" else why,
    )


def test_a_backend_that_is_not_installed_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Exit 2 with what is wrong, at validate and at submit --dry-run, never an ImportError's traceback."""
    monkeypatch.setitem(backends._REGISTRY, "compute-engine", backends.Registered("runner.backends.not_there"))
    path = tmp_path / "job.yaml"
    path.write_text(
        "name: j\nimage: us-docker.pkg.dev/proj-1/r/t:1\nstorage: gs://my-bucket/p\n"
        "accelerator: {type: tpu7x-8, zone: us-central1-c, project: proj-1}\ntraining: {framework: tensorflow}\n"
    )
    result = CliRunner().invoke(app, ["validate", str(path)])
    assert result.exit_code == 2, result.output
    assert "the compute-engine backend is not installed in this runner" in result.output
    assert "TensorFlow is not supported on TPU7x" in result.output
    result = CliRunner().invoke(app, ["submit", str(path), "--dry-run"])
    assert result.exit_code == 2, result.output
    assert "the compute-engine backend is not installed in this runner" in result.output
    assert "Traceback" not in result.output


def test_a_budget_needs_a_price() -> None:
    assert not catalog.accelerator("tpu7x-8").generation.priced
    assert all(g.priced for g in catalog.generations().values() if g.name != "tpu7x")


def test_validate_runs_the_catalog_checks_offline(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("name: j\nimage: i\naccelerator: {type: v5e-8, zone: us-nowhere1-a}\ntraining: {}\n")
    result = CliRunner().invoke(app, ["validate", str(path)])
    assert result.exit_code == 2
    assert "did you mean v5litepod-8?" in result.output
    path.write_text("name: j\nimage: i\naccelerator: {type: v5litepod-8, zone: us-nowhere1-a}\ntraining: {}\n")
    result = CliRunner().invoke(app, ["validate", str(path)])
    assert result.exit_code == 2 and "v5litepod-8 is not offered in us-nowhere1-a" in result.output
