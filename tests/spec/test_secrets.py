"""The spec's `secrets:`: references in every form, a literal refused without being repeated, `env:` keys that look
like secrets warned about (by `runner validate`, with the fix), and the plan that says who reads what."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from runner.backends import plan_local
from runner.errors import PlanError, SpecError
from runner.plan.planner import plan_secrets
from runner.spec.loader import dump_spec, load_spec_text
from runner.spec.secrets import looks_secret, parse_ref

BASE = """\
name: demo
image: us-central1-docker.pkg.dev/proj-123/repo/trainer:v1
command: [python, train.py]
"""
LITERAL = "hf_qWeRtYuIoPaSdFgHjKl0123456789"  # what a Hugging Face token looks like


def load(extra: str) -> object:
    return load_spec_text(BASE + textwrap.dedent(extra), "job.yaml")


def refused(extra: str) -> list[str]:
    with pytest.raises(SpecError) as info:
        load(extra)
    assert info.value.exit_code == 2
    return info.value.problems


@pytest.mark.parametrize(
    ("text", "kind", "name"),
    [
        ("projects/my-proj/secrets/wandb/versions/3", "secretmanager", "projects/my-proj/secrets/wandb/versions/3"),
        ("projects/123456789012/secrets/wandb", "secretmanager", "projects/123456789012/secrets/wandb/versions/latest"),
        ("wandb-key/versions/latest", "secretmanager", "projects/run-proj/secrets/wandb-key/versions/latest"),
        ("env:HF_TOKEN", "env", None),
        ("file:~/keys/sa.json", "file", None),
    ],
)
def test_every_form_of_reference(text: str, kind: str, name: str | None) -> None:
    ref = parse_ref(text)
    assert ref.kind == kind
    if name:
        assert ref.version_name("run-proj") == name


@pytest.mark.parametrize(
    "value",
    [LITERAL, "wandb-key", "12345678", "projects/x/secrets", "env:1BAD", "file:", "a/versions/0", "p4ss word"],
)
def test_anything_but_a_reference_is_refused_and_never_repeated(value: str) -> None:
    found = refused(f"secrets: {{TOKEN: {json.dumps(value)}}}\n")
    assert len(found) == 1 and found[0].startswith("line 4: secrets.TOKEN: ")
    assert value not in found[0] or value in ("file:",)  # the value may be the secret itself
    assert "gcloud secrets create" in found[0] or "write" in found[0]


def test_a_number_or_a_list_under_secrets_is_refused_without_repeating_it() -> None:
    found = refused("secrets:\n  PIN: 918273\n  LIST: [918274]\n")
    assert len(found) == 2 and not any("918273" in p or "918274" in p for p in found)


def test_as_file_and_the_defaults() -> None:
    spec = load("secrets:\n  A: a/versions/1\n  B: {ref: 'file:key.pem', as: file}\n")
    assert spec.secrets["A"].as_ == "env" and spec.secrets["B"].as_ == "file"  # type: ignore[attr-defined]
    again = load_spec_text(dump_spec(spec), "spec.yaml")  # type: ignore[arg-type]  # the run directory's copy
    assert again == spec
    assert "as: file" in dump_spec(spec)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        ("secrets: {B: {ref: a/versions/1, az: file}}\n", "secrets.B.az: unknown field; known fields: ref, as"),
        ("secrets: {B: {ref: a/versions/1, as: disk}}\n", "secrets.B.as"),
        ("secrets: {RUNNER_X: a/versions/1}\n", "set by the runner"),
        ("secrets: {1A: a/versions/1}\n", "not a valid environment variable name"),
        ("env: {A: x}\nsecrets: {A: a/versions/1}\n", "A: in both `env` and `secrets`"),
    ],
)
def test_bad_secrets_entries(extra: str, said: str) -> None:
    assert any(said in p for p in refused(extra))


@pytest.mark.parametrize(
    ("key", "secret"),
    [("WANDB_API_KEY", True), ("HF_TOKEN", True), ("DB_PASSWORD", True), ("MY_SECRET", True),
     ("GITHUB_ACCESSTOKEN", True), ("EPOCHS", False), ("MONKEY", False), ("KEYRING_BACKEND", False)],
)  # fmt: skip
def test_env_keys_that_look_like_secrets(key: str, secret: bool) -> None:
    assert looks_secret(key) is secret


def test_validate_refuses_a_literal_and_warns_on_an_env_secret(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(BASE + f"secrets: {{HF_TOKEN: {LITERAL}}}\n")
    warned = tmp_path / "warned.yaml"
    warned.write_text(BASE + f"env: {{WANDB_API_KEY: {LITERAL}}}\n")
    run = [sys.executable, "-m", "runner", "validate"]
    refused_run = subprocess.run([*run, str(bad)], capture_output=True, text=True, timeout=60, check=False)
    assert refused_run.returncode == 2
    assert "secrets.HF_TOKEN: not a reference to a secret, so it is refused as a literal value" in refused_run.stderr
    assert LITERAL not in refused_run.stdout + refused_run.stderr
    ok = subprocess.run([*run, str(warned)], capture_output=True, text=True, timeout=60, check=False)
    assert ok.returncode == 0
    assert "warning: env.WANDB_API_KEY looks like a secret" in ok.stdout
    assert "secrets: {WANDB_API_KEY: NAME/versions/latest}" in ok.stdout and LITERAL not in ok.stdout
    as_json = subprocess.run([*run, "--json", str(warned)], capture_output=True, text=True, timeout=60, check=False)
    assert "env.WANDB_API_KEY looks like a secret" in json.loads(as_json.stdout)["files"][0]["warnings"][0]


def test_a_cloud_plan_refuses_this_machines_references_and_a_local_one_checks_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = load("secrets: {A: env:MY_TOKEN, B: {ref: 'file:key.pem', as: file}}\n")
    with pytest.raises(PlanError, match=r"secrets\.A: env:MY_TOKEN is this machine's, which a TPU VM cannot read"):
        plan_secrets(spec, "proj", local=False)  # type: ignore[arg-type]
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MY_TOKEN", raising=False)
    with pytest.raises(PlanError, match=r"\$MY_TOKEN is not set"):
        plan_local(spec, None)  # type: ignore[arg-type]
    monkeypatch.setenv("MY_TOKEN", LITERAL)
    with pytest.raises(PlanError, match=r"key\.pem is not a readable file of at most 64 KiB"):
        plan_local(spec, None)  # type: ignore[arg-type]
    (tmp_path / "key.pem").write_text("k" * 40)
    plan = plan_local(spec, None, storage=str(tmp_path))  # type: ignore[arg-type]
    assert [(s.name, s.mode, s.source) for s in plan.secrets] == [
        ("A", "env", "env:MY_TOKEN"),
        ("B", "file", f"file:{tmp_path / 'key.pem'}"),
    ]
    assert json.loads(plan.env["RUNNER_SECRETS"]) == {"A": "env", "B": "file"}  # names only
    assert LITERAL not in json.dumps(plan.env)


def test_the_cloud_plan_and_dry_run_show_references_and_who_reads_them(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from runner.cli import app

    spec = BASE.replace("proj-123", "my-project") + textwrap.dedent("""\
        storage: gs://my-bucket/runs
        accelerator: {type: v2-8, zone: us-central1-b, project: my-project}
        secrets:
          WANDB_API_KEY: wandb/versions/latest
          KEY: {ref: projects/my-project/secrets/key/versions/2, as: file}
        """)
    path = tmp_path / "job-with-secrets.yaml"
    path.write_text(spec)
    result = CliRunner().invoke(app, ["submit", str(path), "--dry-run"], env={"CLOUDSDK_CONFIG": "/nonexistent"})
    out = result.output
    assert result.exit_code == 0, out
    assert (
        "secret WANDB_API_KEY  projects/my-project/secrets/wandb/versions/latest  (read on the VM as the project's "
        "Compute Engine default service account; $WANDB_API_KEY holds the value)"
    ) in out
    assert "secret check          not done offline: `runner submit` asks Secret Manager before creating" in out
    assert "    KEY            projects/my-project/secrets/key/versions/2  (as file)" in out
    assert "SECRETS='KEY file projects/my-project/secrets/key/versions/2" in out  # the script: references only
