"""`runner build --context DIR`: the user's code layered onto the trainer image, tagged by its content, built and
pushed once (the engine CLI replaced by the recording stand-in of test_build), and what the plan says of it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from runner.cli import app
from runner.launch import build, code, variants
from tests.cli.test_cli import write_job
from tests.launch.test_build import FakeDocker

BASE = "us-central1-docker.pkg.dev/p/tpu-runner/trainer-tpu:0.1.0-0123456789abcdef"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    (root / "pkg" / "__pycache__").mkdir(parents=True)
    (root / "train.py").write_text("print('training')\n")
    (root / "pkg" / "model.py").write_text("LAYERS = 2\n")
    (root / "pkg" / "__pycache__" / "model.cpython-312.pyc").write_bytes(b"\0")
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (root / "data.bin").write_bytes(b"x" * 10)
    (root / ".dockerignore").write_text("data.bin\n")
    return root


def test_the_tag_follows_the_code_and_nothing_else(project: Path) -> None:
    assert code.code_files(project) == [".dockerignore", "pkg/model.py", "train.py"]
    ref = code.code_reference(BASE, project)
    assert ref.startswith(BASE + "-code-") and len(ref) == len(BASE) + len("-code-") + 12
    assert variants.variant_of(ref) == "tpu"  # the planner still knows what the image runs
    (project / "data.bin").write_bytes(b"y")
    (project / ".git" / "HEAD").write_text("ref: refs/heads/other\n")
    assert code.code_reference(BASE, project) == ref
    (project / "pkg" / "model.py").write_text("LAYERS = 3\n")
    assert code.code_reference(BASE, project) != ref
    assert code.dockerfile(BASE) == f"FROM {BASE}\nCOPY . /workspace\nWORKDIR /workspace\n"
    # A local image keeps its own name (not Docker Hub's library/...), a digest-pinned one loses the digest.
    assert code.code_reference("trainer-cpu:0.1.0-ab", project).startswith("trainer-cpu:0.1.0-ab-code-")
    assert code.code_reference(f"{BASE}@sha256:{'0' * 64}", project) == code.code_reference(BASE, project)


def test_built_and_pushed_once(project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    docker = FakeDocker(tmp_path, monkeypatch)
    local = BASE.split("/")[-1]
    docker.state.write_text(json.dumps({"images": [BASE, local], "pushed": [BASE]}))
    base = build.ImageResult(BASE, (BASE, local), built=False, pushed=False)
    first = code.ensure_code_image(base, project, push=True, say=lambda _: None, exists=lambda _: None)
    assert first.reference == code.code_reference(BASE, project) and (first.built, first.pushed) == (True, True)
    calls = docker.calls()
    build_argv = next(c for c in calls if c[0] == "build")
    assert build_argv[-1] == str(project) and build_argv.count("--tag") == 2
    assert [c[0] for c in calls][-1] == "push"
    again = code.ensure_code_image(base, project, push=True, say=lambda _: None, exists=lambda _: None)
    assert (again.built, again.pushed) == (False, False) and docker.verbs() == ["version", "manifest inspect"]


def test_print_ref_and_the_plan_say_where_the_code_is(project: Path, tmp_path: Path) -> None:
    printed = CliRunner().invoke(
        app, ["build", "--variant", "tpu", "--project", "p-123456", "--context", str(project), "--print-ref"]
    )
    assert printed.exit_code == 0, printed.output
    ref = printed.output.strip()
    assert "/trainer-tpu:" in ref and code.has_code(ref)
    job = write_job(
        tmp_path,
        f"""\
        name: mine
        image: {ref}
        command: python train.py
        storage: gs://my-bucket/runs
        accelerator: {{type: v5litepod-8, zone: us-west4-a, project: p-123456}}
        """,
    )
    shown = CliRunner().invoke(app, ["submit", str(job), "--dry-run"])
    assert shown.exit_code == 0, shown.output
    rows = [line.split(None, 2) for line in shown.output.splitlines() if line.startswith("working dir ")]
    assert rows == [["working", "dir", "/workspace  (your code, which `runner build --context` put in the image)"]]
    assert "warning" not in shown.output  # what /workspace holds is checked by `runner build`, not here
    plain = write_job(tmp_path, job.read_text().replace(ref, BASE), "plain.yaml")
    shown = CliRunner().invoke(app, ["submit", str(plain), "--dry-run"])
    assert "runner build --context DIR" in shown.output
