"""Platform limits at plan time (runner.plan.limits): `runner validate`, the dry run and a local submit say which
value is over which limit, with exit 2, before anything is created: an environment string over Linux's 128 KiB,
an environment a TPU VM's startup script cannot carry (a metadata value holds 256 KiB), and this machine's
ARG_MAX for a local process."""

from __future__ import annotations

import os
import re
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from runner.cli import app
from runner.cli.validate import validate_paths
from runner.plan import limits
from runner.spec import MAX_ARG_STRLEN

IMAGE = "us-central1-docker.pkg.dev/acme-ml/runner/trainer:test"
WHERE = {
    "tpu-vm": "{type: v2-8, zone: us-central1-b, project: acme-ml}",
    "compute-engine": "{type: tpu7x-2, zone: us-central1-c, project: acme-ml}",
    "compute-engine slice": "{type: tpu7x-16, zone: us-central1-c, project: acme-ml}",
}


def spec_with(tmp_path: Path, env: dict[str, str], accelerator: str = WHERE["tpu-vm"]) -> Path:
    lines = "".join(f"  {key}: {value}\n" for key, value in env.items())
    path = tmp_path / "job.yaml"
    path.write_text(
        textwrap.dedent(f"""\
        name: big
        image: {IMAGE}
        command: [python, -c, "print(1)"]
        storage: gs://acme-runs/x
        accelerator: {accelerator}
        """)
        + "env:\n"
        + lines
    )
    return path


def test_an_environment_string_over_128_kib_is_refused_with_its_line(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """The issue's 300 KB value: refused by validate and the dry run alike (it could not start on any machine)."""
    path = spec_with(tmp_path, {"SMALL": "x", "BIG": "y" * 300_000})
    assert validate_paths([path]) == 2
    out = capsys.readouterr()
    said = out.out + out.err
    assert "line 6: env: BIG: 300,005 bytes as one KEY=VALUE string, over the 131,072 bytes" in said, said
    dry = CliRunner().invoke(app, ["submit", str(path), "--dry-run"])
    assert dry.exit_code == 2 and "MAX_ARG_STRLEN" in dry.output


@pytest.mark.parametrize("where", sorted(WHERE))
def test_an_environment_the_startup_script_cannot_carry_is_refused_by_validate_and_the_dry_run(
    tmp_path: Path,
    capsys,
    where: str,  # type: ignore[no-untyped-def]
) -> None:
    """Three values of 90 KB each pass Linux's limit, but a TPU VM's startup script carries them base64-encoded:
    over the 262,144 bytes one metadata value holds."""
    path = spec_with(tmp_path, {f"PART{i}": "z" * 90_000 for i in range(3)}, WHERE[where])
    assert validate_paths([path]) == 2
    out = capsys.readouterr()
    said = out.out + out.err
    assert "once base64-encoded into a TPU VM's startup script" in said and "262,144 bytes" in said, said
    dry = CliRunner().invoke(app, ["submit", str(path), "--dry-run"])
    assert dry.exit_code == 2, dry.output
    what = {"tpu-vm": "TPU node big-", "compute-engine": "instance big-", "compute-engine slice": "instance template"}
    # Anchored at the numbered problem: the script shown above it is one 370 KB line of base64.
    found = re.search(r"^ +1\. ([^'\n]+)'s metadata 'startup-script' is ([\d,]+) bytes", dry.output, re.M)
    assert found and found.group(1).startswith(what[where]), dry.output
    assert int(found.group(2).replace(",", "")) > limits.METADATA_VALUE_MAX
    real = CliRunner().invoke(app, ["submit", str(path)])  # refused before any API is asked anything
    assert real.exit_code == 2 and "startup-script" in real.output


def test_a_local_process_over_this_machines_arg_max_is_refused_naming_the_largest_values(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each value under Linux's per-string limit; the spec's (a spec file holds at most 1 MiB) and the runner's own
    environment (which a local job inherits) together over ARG_MAX as this machine says it (sysconf)."""
    arg_max = os.sysconf("SC_ARG_MAX")
    value = 100_000
    path = spec_with(tmp_path, {f"V{i}": "a" * value for i in range(8)})
    for i in range(arg_max // value):
        monkeypatch.setenv(f"SHELL_STUFF_{i}", "b" * value)
    result = CliRunner().invoke(app, ["submit", str(path), "--local", "--storage", str(tmp_path / "store")])
    assert result.exit_code == 2, result.output
    assert f"over this machine's ARG_MAX of {arg_max:,}" in result.output and "(largest: env." in result.output
    assert not (tmp_path / "store").exists()  # nothing started, no run directory


def test_limits_name_what_is_over() -> None:
    assert limits.env_problems({"A": "b"}) == []
    assert "env.K" in limits.env_problems({"K": "v" * MAX_ARG_STRLEN})[0]
    assert limits.metadata_problems({"startup-script": "s" * limits.METADATA_VALUE_MAX}, "node n") == []
    over = limits.metadata_problems({"startup-script": "s" * (limits.METADATA_VALUE_MAX + 1)}, "node n")
    assert over == [
        "node n's metadata 'startup-script' is 262,145 bytes (it carries the job's environment, base64-encoded), "
        "over the 262,144 bytes (256 KiB) a metadata value can hold"
    ]
    total = limits.metadata_problems({f"k{i}": "v" * 200_000 for i in range(3)}, "instance i")
    assert total == ["instance i's metadata is 600,006 bytes in all, not under the 524,288 (512 KB) allowed"]
    assert limits.label_problems({"tpu-runner-run": "a" * 63}, "node n") == []
    assert "up to 63" in limits.label_problems({"tpu-runner-run": "a" * 64}, "node n")[0]
    assert "65 labels" in limits.label_problems({f"k{i}": "" for i in range(65)}, "node n")[0]
    assert "arg" in limits.exec_problems(["x" * 10], {}, arg_max=10)[0].lower()
