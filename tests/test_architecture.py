"""The package boundaries docs/architecture.md draws, checked on the source: the runner never imports the emulator
or the fault suite, only the CLI knows typer, and the control plane's modules stay within their size."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO

RUNNER = REPO / "runner"


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def test_the_runner_never_imports_the_emulator_or_the_fault_suite() -> None:
    offenders = {
        str(path.relative_to(REPO)): sorted(
            m for m in imports_of(path) if m.split(".")[0] in ("tpu_emulator", "faults")
        )
        for path in RUNNER.rglob("*.py")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_only_the_cli_knows_typer() -> None:
    knows = {
        str(path.relative_to(REPO))
        for path in RUNNER.rglob("*.py")
        if any(m.split(".")[0] == "typer" for m in imports_of(path))
    }
    allowed_prefixes = ("runner/cli/", "runner/bench/command.py")  # the bench's options are its command's own
    assert all(p.startswith(allowed_prefixes) for p in knows), sorted(knows)


def test_modules_stay_small() -> None:
    sizes = {str(p.relative_to(REPO)): len(p.read_text().splitlines()) for p in RUNNER.rglob("*.py")}
    assert {p: n for p, n in sizes.items() if n > 600} == {}
    interfaces = ("runner/backends/base.py", "runner/contract.py", "runner/errors.py", "runner/watch/state.py")
    assert {p: sizes[p] for p in interfaces if sizes[p] > 300} == {}
