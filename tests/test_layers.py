"""The layer order docs/architecture.md documents, held on the source: every import in `runner` (at module level,
inside functions, under TYPE_CHECKING) points down the order, never up or sideways; what tpu_emulator and faults
take from the runner is what the document lists for each; typer is the CLI's; and the in-container supervisor
loads no pydantic.

A `__main__` module is an entry point: it runs a program, nothing imports it (held below), so it may use any layer.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO

RUNNER = REPO / "runner"

# Top to bottom, as docs/architecture.md draws it. A unit (a package of runner, a top-level module, or a module
# named on its own) imports only units on lower lines; units on the same line do not import each other.
LAYERS: list[tuple[str, ...]] = [
    ("cli",),
    ("bench",),
    ("lifecycle", "teardown", "collect"),
    ("backends",),
    ("launch",),
    ("worker",),
    ("train",),
    ("checkpoints",),
    ("plan",),
    ("watch",),
    ("spec",),
    ("datasets", "metrics"),
    ("storage",),
    ("launch.deps",),
    ("launch.variants",),
    ("launch.imageref",),
    ("credentials", "interrupts", "timings", "redact", "__version__"),
    ("contract", "errors", "environ"),
]
RANK = {unit: rank for rank, line in enumerate(LAYERS) for unit in line}


def unit_of(module: str) -> str | None:
    """The layer unit a module of runner belongs to (runner.launch.imageref -> launch.imageref, runner.plan.x ->
    plan); None for the package itself."""
    parts = module.split(".")[1:]
    if not parts:
        return None
    if ".".join(parts[:2]) in RANK:
        return ".".join(parts[:2])
    return parts[0]


def module_of(path: Path, root: Path = RUNNER) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, root: Path = RUNNER) -> Iterator[tuple[int, str]]:
    """(line, module) of every import in `path`, wherever it stands; `from a import b` as a.b (b may be a module:
    `from runner.launch import variants` imports launch.variants, not the rest of launch)."""
    module = module_of(path, root)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            yield from ((node.lineno, f"{base}.{alias.name}") for alias in node.names)


def back_edges(root: Path = RUNNER) -> list[str]:
    """Every import in the runner that points up the order, or sideways within a line, as 'file:line a -> b'."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if path.name == "__main__.py":
            continue
        source = unit_of(module_of(path, root))
        if source is None:
            continue
        for line, target in imports_of(path, root):
            to = unit_of(target) if target.startswith("runner.") else None
            if to is None or to == source:
                continue
            if to not in RANK or source not in RANK or RANK[to] <= RANK[source]:
                found.append(f"{path.relative_to(root.parent)}:{line} {source} -> {to} ({target})")
    return found


def _documented_block(name: str) -> str:
    text = (REPO / "docs" / "architecture.md").read_text()
    return text.split(f"```{name}\n", 1)[1].split("```", 1)[0]


def allowed_imports() -> dict[str, set[str]]:
    """What docs/architecture.md lets each package beside the runner import from it: `package: module ...`."""
    allowed: dict[str, set[str]] = {}
    for line in _documented_block("imports").splitlines():
        package, sep, modules = line.split("#")[0].partition(":")
        if sep:
            allowed.setdefault(package.strip(), set()).update(modules.split())
    return allowed


def runner_imports(package: str) -> list[tuple[str, str]]:
    """('file:line', imported name) of every runner import in a package beside the runner, wherever it stands."""
    root = REPO / package
    return [
        (f"{path.relative_to(REPO)}:{line}", target)
        for path in sorted(root.rglob("*.py"))
        for line, target in imports_of(path, root)
        if target.startswith("runner.")
    ]


def outside(imports: list[tuple[str, str]], allowed: set[str]) -> list[str]:
    """The imports that name no allowed module (a module, or a name in it: runner.storage.Storage is storage's)."""
    return [
        f"{where} {target}"
        for where, target in imports
        if not any(target == module or target.startswith(module + ".") for module in allowed)
    ]


def test_every_unit_is_in_the_documented_order() -> None:
    units = {unit_of(module_of(p)) for p in RUNNER.rglob("*.py") if p.name != "__main__.py"}
    assert units - set(RANK) - {None} == set()


def test_no_import_points_up_the_layer_order() -> None:
    assert back_edges() == []


def test_the_order_is_the_documented_one() -> None:
    drawn = [line for line in _documented_block("layers").splitlines() if line.strip()]
    assert [tuple(line.split("#")[0].split()) for line in drawn] == LAYERS


@pytest.mark.parametrize("package", ["tpu_emulator", "faults"])
def test_the_emulator_and_the_faults_import_only_what_the_document_lists(package: str) -> None:
    """Each names its runner modules in docs/architecture.md; an import of another fails here, and a listed
    module nothing imports any more fails too, so the list stays what the code does."""
    allowed = allowed_imports()[package]
    imports = runner_imports(package)
    assert outside(imports, allowed) == []
    used = {
        module for module in allowed for _, target in imports if target == module or target.startswith(module + ".")
    }
    assert used == allowed


def test_the_emulator_does_not_import_the_faults() -> None:
    found = [
        f"{p.relative_to(REPO)}:{line} {target}"
        for p in (REPO / "tpu_emulator").rglob("*.py")
        for line, target in imports_of(p, REPO / "tpu_emulator")
        if target.split(".")[0] == "faults"
    ]
    assert found == []


def test_the_import_check_finds_a_module_not_listed() -> None:
    imports = [("faults/x.py:3", "runner.storage.Storage"), ("faults/x.py:9", "runner.lifecycle.run.RunLoop")]
    assert outside(imports, {"runner.storage"}) == ["faults/x.py:9 runner.lifecycle.run.RunLoop"]
    assert outside([("t.py:1", "runner.storagex.y")], {"runner.storage"}) == ["t.py:1 runner.storagex.y"]


def test_typer_is_the_clis() -> None:
    """The command line (runner/cli/, and `runner bench`'s command, which it mounts) is what imports typer."""
    found = sorted(
        str(p.relative_to(REPO))
        for p in RUNNER.rglob("*.py")
        for _, target in imports_of(p)
        if target.split(".")[0] == "typer"
    )
    assert found and all(f.startswith("runner/cli/") or f == "runner/bench/command.py" for f in found), found


def test_nothing_imports_an_entry_point() -> None:
    found = [
        f"{p.relative_to(REPO)}:{line} {target}"
        for p in RUNNER.rglob("*.py")
        for line, target in imports_of(p)
        if target.startswith("runner.") and target.endswith(".__main__")
    ]
    assert found == []


def test_the_test_finds_a_back_edge(tmp_path: Path) -> None:
    """The check fails on an import up the order, wherever it stands (here inside a function)."""
    root = tmp_path / "runner"
    (root / "storage").mkdir(parents=True)
    (root / "storage" / "probe.py").write_text(
        "import runner.errors\n\n\ndef f() -> None:\n    from runner.spec import JobSpec\n"
    )
    (root / "errors.py").write_text("from . import storage\n")
    assert back_edges(root) == [
        "runner/errors.py:1 errors -> storage (runner.storage)",
        "runner/storage/probe.py:5 storage -> spec (runner.spec.JobSpec)",
    ]


def test_the_supervisor_loads_no_pydantic() -> None:
    """The in-container supervisor and mirror start with every job: pydantic (and the spec) stay out of them."""
    code = (
        "import sys\n"
        "import runner.worker.supervisor, runner.worker.mirror, runner.worker.logsync\n"
        "heavy = sorted(m for m in ('pydantic', 'yaml', 'runner.spec', 'google.cloud.storage') if m in sys.modules)\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == ""


# Where a registered backend's name may stand outside its package and the registry, and why: not as a backend.
NOT_A_BACKEND = {
    ("runner/contract.py", "local"): "TensorFlow's name of a VM's own TPU (THIS_TPU), the run id outside a run",
    ("runner/spec/__init__.py", "tpu-vm"): "accelerator.backend's choices: the spec's schema (held below)",
    ("runner/spec/__init__.py", "compute-engine"): "accelerator.backend's choices: the spec's schema (held below)",
    ("runner/spec/__init__.py", "gke"): "accelerator.backend's choices, and the one that needs `cluster`",
}


def backend_names_outside(root: Path = RUNNER) -> list[str]:
    """Every string literal in the runner that is a registered backend's name, outside that backend's package
    (runner/backends/<name>/) and the registry: 'file:line name'."""
    from runner.backends import _REGISTRY

    homes = {name: Path(*registered.package.split(".")[1:]) for name, registered in _REGISTRY.items()}
    found = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root)
        if relative == Path("backends/__init__.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in homes and homes[node.value] not in relative.parents:
                found.append(f"{path.relative_to(root.parent)}:{node.lineno} {node.value}")
    return found


def test_no_backend_name_outside_its_package_and_the_registry() -> None:
    """What differs between backends is a capability the backend declares (the registry's is_cloud, its INFO, its
    Backend's attributes, its target's job_env and self_delete, its sweep's locations), never its name: a new backend
    needs no edit outside its package and the registry's table. The few literals that are another word spelled the
    same are listed, each with why, and each must still be there."""
    found = backend_names_outside()
    where = {f: (f.split(":")[0], f.rsplit(" ", 1)[1]) for f in found}
    assert [f for f in found if where[f] not in NOT_A_BACKEND] == []
    assert set(where.values()) == set(NOT_A_BACKEND)  # none of them is stale


def test_the_check_finds_a_backend_named_outside_its_package(tmp_path: Path) -> None:
    root = tmp_path / "runner"
    (root / "backends" / "tpu_vm").mkdir(parents=True)
    (root / "backends" / "compute_engine").mkdir(parents=True)
    (root / "backends" / "__init__.py").write_text('CLOUD = ("tpu-vm", "compute-engine")\n')
    (root / "backends" / "tpu_vm" / "target.py").write_text('NAME = "tpu-vm"\n')
    (root / "backends" / "compute_engine" / "x.py").write_text('OTHER = "tpu-vm"\n')
    (root / "plan.py").write_text('def f(b: str) -> bool:\n    return b in ("local", "gke", "azure")\n')
    assert backend_names_outside(root) == [  # "azure" is no registered backend's name
        "runner/backends/compute_engine/x.py:1 tpu-vm",
        "runner/plan.py:2 local",
        "runner/plan.py:2 gke",
    ]


def test_the_specs_backend_choices_are_the_registrys_cloud_backends() -> None:
    """The spec (below the registry in the layers) spells the choices out for its schema; they stay the registry's."""
    from typing import get_args

    from runner.backends import CLOUD
    from runner.spec import AcceleratorSpec

    assert get_args(AcceleratorSpec.model_fields["backend"].annotation) == ("auto", *CLOUD)
