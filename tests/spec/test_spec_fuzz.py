"""Fuzz the spec loader: whatever the bytes, the answer is a JobSpec or a SpecError (exit 2), never a traceback."""

from __future__ import annotations

import string
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from runner.cli import app
from runner.errors import SpecError
from runner.spec import JobSpec
from runner.spec.loader import load_spec_text
from tests.conftest import REPO

KEYS = [
    "name",
    "image",
    "accelerator",
    "training",
    "command",
    "env",
    "storage",
    "teardown",
    "type",
    "zone",
    "zones",
    "spot",
    "reserved",
    "node",
    "project",
    "runtime_version",
    "model",
    "epochs",
    "batch_size",
    "learning_rate",
    "policy",
    "max_runtime",
    "checkpoint_every",
    "keras",
    "data",
    "seed",
    "nmae",
    "epoch",
    "lr",
    "",
]
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
    st.sampled_from(
        [
            "v2-8",
            "v5litepod-8",
            "us-central1-a",
            "gs://bkt/x",
            "always",
            "2h",
            "mnist_cnn",
            "1e-3",
            "yes",
            "~",
            "0x1F",
            "NaN",
            ".inf",
        ]
    ),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=8), inner, max_size=5)
    ),
    max_leaves=12,
)
documents = st.dictionaries(st.sampled_from(KEYS), values, max_size=9)

VALID = (REPO / "jobs" / "mnist.yaml").read_text()
YAML_NOISE = string.printable + "&*!|>%@`{}[]:#-?'\"\\\t\u00e9\u2603"


def assert_clean(text: str) -> None:
    try:
        assert isinstance(load_spec_text(text, "fuzz.yaml"), JobSpec)
    except SpecError as exc:
        assert exc.exit_code == 2 and str(exc).strip()


@settings(max_examples=700, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(documents)
def test_structured_documents(doc: dict) -> None:
    try:
        text = yaml.safe_dump(doc, allow_unicode=True)
    except (yaml.YAMLError, ValueError):
        return
    assert_clean(text)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, len(VALID)), st.integers(0, 40), st.text(alphabet=YAML_NOISE, max_size=30))
def test_mutated_valid_spec(position: int, cut: int, insert: str) -> None:
    assert_clean(VALID[:position] + insert + VALID[position + cut :])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=300))
def test_arbitrary_bytes(raw: bytes) -> None:
    assert_clean(raw.decode("utf-8", errors="replace"))


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(st.binary(max_size=200) | documents.map(lambda d: yaml.safe_dump(d).encode()))
def test_cli_validate_never_tracebacks(tmp_path: Path, raw: bytes) -> None:
    path = tmp_path / "fuzz.yaml"
    path.write_bytes(raw)
    result = CliRunner().invoke(app, ["validate", str(path)])
    assert result.exit_code in (0, 2), result.output
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


NESTING_OPENERS = ["[", "{a: ", "- ", "a:\n", "[{a: [", "? "]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.sampled_from(NESTING_OPENERS), min_size=1, max_size=6),
    st.integers(1, 3_000),
    st.text(alphabet=YAML_NOISE, max_size=10),
)
def test_deep_nesting_is_a_spec_error_never_a_recursion_error(openers: list[str], depth: int, tail: str) -> None:
    """PyYAML's composer, our position walk and pydantic all recurse per level: any depth must end in a SpecError.
    Block openers indent as they nest, as YAML wants them to."""
    parts = []
    for level in range(depth):
        opener = openers[level % len(openers)]
        parts.append(opener.replace("\n", "\n" + " " * (level + 1)) if opener.endswith("\n") else opener)
    assert_clean("name: x\nimage: i\ntraining: {}\nenv: " + "".join(parts) + tail)
