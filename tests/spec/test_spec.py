"""The job spec: valid jobs load, every kind of invalid input is reported with its path, line and a suggestion."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from runner.errors import SpecError
from runner.spec import JobSpec, parse_duration
from runner.spec.loader import dump_spec, load_spec, load_spec_text
from tests.conftest import REPO

VALID = """\
name: demo
image: us-central1-docker.pkg.dev/proj-123/repo/trainer:v1
training:
  epochs: 2
"""


def problems(text: str) -> list[str]:
    with pytest.raises(SpecError) as info:
        load_spec_text(textwrap.dedent(text), "job.yaml")
    assert info.value.exit_code == 2
    return info.value.problems


@pytest.mark.parametrize("path", sorted((REPO / "jobs").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_jobs_are_valid(path: Path) -> None:
    spec = load_spec(path)
    assert (spec.training is None) == (spec.command is not None)  # the built-in trainer, or a command


def test_default_job_is_the_notebook_cnn() -> None:
    spec = load_spec(REPO / "jobs" / "mnist.yaml")
    assert spec.training is not None
    assert (spec.training.model, spec.training.batch_size, spec.training.epochs) == ("mnist_cnn", 1024, 3)
    assert spec.training.learning_rate == pytest.approx(3e-3)


def test_defaults_and_normalisation() -> None:
    spec = load_spec_text(
        VALID
        + "env: {EPOCHS: 3, RATE: 0.5, NAME: x}\nteardown: {max_runtime: 1h30m}\naccelerator: {zone: us-east1-d}\n"
    )
    assert spec.env == {"EPOCHS": "3", "RATE": "0.5", "NAME": "x"}
    assert spec.teardown.max_runtime == 5400
    assert spec.teardown.policy == "always"
    assert spec.accelerator.candidate_zones == ["us-east1-d"]
    assert spec.accelerator.type == "v5litepod-8"


def test_custom_command_string_runs_in_a_shell_list_is_exec_form() -> None:
    base = "name: c\nimage: img:1\n"
    assert load_spec_text(base + "command: python train.py --x 'a b'\n").command == [
        "/bin/sh",
        "-c",
        "python train.py --x 'a b'",
    ]
    assert load_spec_text(base + "command: [python, train.py]\n").command == ["python", "train.py"]


def test_an_ai_zone_is_a_zone_and_a_zone_of_another_form_is_not() -> None:
    """AI zones (us-central1-ai1a, where the catalog has TPU7x) are zones; 'us-central1-ai' is not."""
    ok = load_spec_text("name: a\nimage: i\naccelerator: {zones: [us-central1-c, us-central1-ai1a]}\ntraining: {}\n")
    assert ok.accelerator.zones == ["us-central1-c", "us-central1-ai1a"]
    with pytest.raises(SpecError, match=r"accelerator.zone: 'us-central1-ai' is not a zone"):
        load_spec_text("name: a\nimage: i\naccelerator: {zone: us-central1-ai}\ntraining: {}\n")


def test_resolved_spec_round_trips() -> None:
    spec = load_spec_text(VALID)
    again = load_spec_text(dump_spec(spec))
    assert again == spec


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("name: Bad_Name\nimage: i\ntraining: {}\n", "line 1: name: 'Bad_Name' must be lowercase"),
        ("name: a\nimage: 'not an image!'\ntraining: {}\n", "line 2: image: 'not an image!' is not a container image"),
        ("name: a\nimage: i\naccelerator: {type: TPU_8}\ntraining: {}\n", "accelerator.type: 'TPU_8' is not a TPU"),
        ("name: a\nimage: i\naccelerator: {zones: [us-central1-a, nowhere]}\ntraining: {}\n", "accelerator.zones[1]"),
        ("name: a\nimage: i\ntraining: {epochs: 0}\n", "training.epochs: Input should be greater than or equal to 1"),
        ("name: a\nimage: i\ntraining: {batch_size: big}\n", "training.batch_size: Input should be a valid integer"),
        (
            "name: a\nimage: i\ntraining: {model: resnet}\n",
            "training.model: 'resnet' is neither a built-in model (mnist_cnn, mnist_mlp) nor module:function",
        ),
        ("name: a\nimage: i\ntraining: {learning_rate: -1}\n", "training.learning_rate: Input should be greater"),
        ("name: a\nimage: i\ntraining: {}\nstorage: s3://b/x\n", "storage: 's3://b/x': storage must be gs://"),
        ("name: a\nimage: i\ntraining: {}\nstorage: gs://A_B\n", "is not gs://BUCKET[/PREFIX]"),
        ("name: a\nimage: i\ntraining: {}\nenv: {RUNNER_RUN_ID: x}\n", "names starting with RUNNER_ are set by"),
        ("name: a\nimage: i\ntraining: {}\nenv: {'1X': y}\n", "'1X' is not a valid environment variable name"),
        ("name: a\nimage: i\ntraining: {}\nenv: {DEBUG: yes}\n", "env.DEBUG: Input should be a valid string"),
        ("name: a\nimage: i\ntraining: {}\nteardown: {policy: sometimes}\n", "teardown.policy: Input should be"),
        ("name: a\nimage: i\ntraining: {}\nteardown: {max_runtime: soon}\n", "'soon' is not a duration"),
        ("name: a\nimage: i\ntraining: {}\nteardown: {max_runtime: 10s}\n", "greater than or equal to 60"),
        ("name: a\nimage: i\naccelerator: {spot: true, reserved: true}\ntraining: {}\n", "cannot both be true"),
        ("name: a\nimage: i\naccelerator: {zone: us-east1-d, zones: [us-east1-c]}\ntraining: {}\n", "either `zone`"),
        ("name: a\nimage: i\naccelerator: {node: my-vm, spot: true}\ntraining: {}\n", "only apply to new ones"),
        ("name: a\nimage: i\naccelerator: {provisioning: queue}\ntraining: {}\n", "'auto', 'node' or 'queued'"),
        ("name: a\nimage: i\naccelerator: {node: my-vm, provisioning: queued}\ntraining: {}\n", "only applies to new"),
        ("name: a\nimage: i\naccelerator: {provisioning: node, max_wait: 1h}\ntraining: {}\n", "needs provisioning"),
        ("name: a\nimage: i\naccelerator: {max_wait: 5s}\ntraining: {}\n", "greater than or equal to 10"),
        ("name: a\nimage: i\naccelerator: {max_wait: later}\ntraining: {}\n", "'later' is not a duration"),
        ("name: a\nimage: i\n", "nothing to run"),
        ("name: a\nimage: i\ntraining: {}\ncommand: [x]\n", "not both"),
        ("name: a\nimage: i\ncommand: []\n", "command: List should have at least 1 item"),
        ("image: i\ntraining: {}\n", "line 1: name: required field is missing"),
        ("name: a\nimage: i\ntraining: 5\n", "training: Input should be a valid dictionary"),
    ],
)
def test_invalid_values_are_located(text: str, expected: str) -> None:
    assert any(expected in p for p in problems(text)), problems(text)


def test_every_error_at_once_sorted_by_line() -> None:
    found = problems(
        """\
        name: OK_not
        image: us-central1-docker.pkg.dev/p/r/t:1
        accelerator:
          type: v4-8
          spto: true
        training:
          epochs: 0
          lr: 0.1
          batch_szie: 64
        storage: ftp://x
        """
    )
    assert [p.split(":")[0] for p in found] == ["line 1", "line 5", "line 7", "line 8", "line 9", "line 10"]
    assert "accelerator.spto: unknown field; did you mean 'spot'?" in found[1]
    assert "training.lr: unknown field; did you mean 'learning_rate'?" in found[3]
    assert "training.batch_szie: unknown field; did you mean 'batch_size'?" in found[4]


def test_unknown_top_level_key_lists_known_fields_when_nothing_is_close() -> None:
    (problem,) = problems(VALID + "zzzz: 1\n")
    assert problem.startswith("line 5: zzzz: unknown field; known fields: name, image, accelerator")


def test_unknown_key_suggestion_at_top_level() -> None:
    (problem,) = problems(VALID + "storge: runs\n")
    assert "did you mean 'storage'?" in problem


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a: &x [1, 2]\nb: *x\n", "anchors (&x) are not allowed"),
        ("a: *x\n", "aliases"),
        ("name: !!python/object/apply:os.system ['touch /tmp/pwned']\n", "tags"),
        ("name: !custom x\n", "tags (!custom)"),
        ("name: a\nname: b\n", "line 2: key 'name' appears twice (first on line 1)"),
        ("1: a\n", "keys must be plain strings"),
        ("name: [unclosed\n", "line 2"),
        ("- a\n- b\n", "not a list"),
        ("just text\n", "not a str"),
        ("", "empty"),
        ("a: b\n---\nc: d\n", "expected a single document"),
        ("name: a\n\x0c\n", "line 2: the control character U+000C is not allowed"),
    ],
)
def test_unsafe_or_broken_yaml_is_rejected(text: str, expected: str) -> None:
    with pytest.raises(SpecError) as info:
        load_spec_text(text, "job.yaml")
    assert expected in str(info.value)


def test_alias_bomb_is_rejected_before_expansion() -> None:
    bomb = 'a: &a ["x","x","x","x","x","x","x","x","x"]\n' + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n"
        for i in range(20)
    )
    with pytest.raises(SpecError, match="anchors"):
        load_spec_text(bomb)


def test_python_tag_has_no_effect(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    with pytest.raises(SpecError):
        load_spec_text(f"name: !!python/object/apply:os.system ['touch {marker}']\nimage: i\ntraining: {{}}\n")
    assert not marker.exists()


def test_file_errors(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="no such file"):
        load_spec(tmp_path / "missing.yaml")
    with pytest.raises(SpecError, match="is a directory"):
        load_spec(tmp_path)
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(SpecError, match="not UTF-8"):
        load_spec(binary)
    big = tmp_path / "big.yaml"
    big.write_text("a: " + "x" * (1 << 20) + "\n")
    with pytest.raises(SpecError, match="larger than"):
        load_spec(big)


@pytest.mark.parametrize(
    ("value", "seconds"), [("45m", 2700), ("2h", 7200), ("1h30m", 5400), ("1d", 86400), (600, 600), ("90", 90)]
)
def test_durations(value: object, seconds: int) -> None:
    assert parse_duration(value) == seconds


@pytest.mark.parametrize(
    "image",
    [
        "trainer",
        "trainer:cpu",
        "localhost:5000/t:1",
        "us-central1-docker.pkg.dev/p/r/trainer:abc123",
        "gcr.io/p/t@sha256:" + "a" * 64,
        "ghcr.io/org/sub/image:1.2.3-rc1",
    ],
)
def test_image_references_accepted(image: str) -> None:
    JobSpec.model_validate({"name": "a", "image": image, "training": {}})


@pytest.mark.parametrize("image", ["UPPER/case", "a b", "t:", ":tag", "t@sha256:abc", "-lead/x"])
def test_image_references_rejected(image: str) -> None:
    with pytest.raises(ValueError):
        JobSpec.model_validate({"name": "a", "image": image, "training": {}})


@pytest.mark.parametrize(
    ("accelerator", "training", "message"),
    [
        ({"slices": 2, "provisioning": "node"}, None, "Cloud TPU creates through a queued resource only"),
        ({"slices": 2, "node": "my-vm"}, None, "`node` attaches to one existing TPU VM"),
        ({"slices": 2}, {"framework": "tensorflow"}, "TensorFlow has no multislice path"),
        ({"slices": 0}, None, "greater than or equal to 1"),
    ],
)
def test_multislice_refusals_in_the_spec(accelerator: dict, training: dict | None, message: str) -> None:
    body = {"type": "v4-16", "zone": "us-central2-b", **accelerator}
    workload = f"training: {json.dumps(training)}" if training else "command: [python, x.py]"
    text = f"name: j\nimage: us-central1-docker.pkg.dev/p-123/r/t:v1\naccelerator: {json.dumps(body)}\n{workload}\n"
    assert any(message in problem for problem in problems(text)), problems(text)
    jax = load_spec_text(text.replace('"tensorflow"', '"jax"'), "job.yaml") if training else None
    assert jax is None or jax.accelerator.slices == 2  # the JAX engine may run on several slices
