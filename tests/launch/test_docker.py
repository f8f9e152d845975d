"""The trainer image: lint (hadolint, shellcheck), what its Dockerfile declares, and its entrypoint trained for real
as a local process with the image's environment. (The image built and run by an engine: test_container.)"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import uuid
from pathlib import Path

import pytest

from runner import contract
from runner.backends import container
from runner.launch import image
from runner.spec import TrainingSpec
from runner.storage import open_storage
from tests.conftest import REPO
from tests.dockerfile import image_config
from tests.environ import child_env


def _load(path: Path, name: str):  # type: ignore[no-untyped-def]
    module_spec = importlib.util.spec_from_file_location(name, path)
    assert module_spec and module_spec.loader
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


image_requirements = _load(REPO / "docker" / "requirements.py", "image_requirements")  # what the image build runs

BIN = Path(sys.executable).parent
# build/ and dist/ hold copies the wheel build makes (tests/launch/test_wheel.py): each file is checked once, here.
SKIP_DIRS = {".venv", ".git", "runs", ".pytest_cache", ".ruff_cache", "node_modules", "build", "dist"}


def repo_files(match: re.Pattern[str]) -> list[Path]:
    """Regular files (not symlinks, so each file once) in the repository outside caches and the venv."""
    found = []
    for dirpath, dirnames, filenames in os.walk(REPO):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS]
        found += [Path(dirpath, f) for f in filenames if match.search(f) and not Path(dirpath, f).is_symlink()]
    return sorted(found)


DOCKERFILES = repo_files(re.compile(r"^(Dockerfile(\.[\w-]+)?|[\w.-]+\.Dockerfile)$(?<!\.dockerignore)"))
SHELL_SCRIPTS = repo_files(re.compile(r"\.sh$"))


def tool(name: str) -> str:
    path = BIN / name
    assert path.exists(), f"{name} is missing: `pip install -e '.[dev]'` (make install) installs it"
    return str(path)


# -- lint -----------------------------------------------------------------------------------------------------------


def test_the_lint_targets_find_the_files() -> None:
    assert REPO / "docker" / "Dockerfile" in DOCKERFILES
    assert REPO / "runner" / "launch" / "startup-script.sh" in SHELL_SCRIPTS
    assert not any(p.name.endswith(".dockerignore") for p in DOCKERFILES)


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: str(p.relative_to(REPO)))
def test_hadolint_clean(dockerfile: Path) -> None:
    result = subprocess.run(
        [tool("hadolint"), "--format", "json", str(dockerfile)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0 and json.loads(result.stdout or "[]") == [], result.stdout + result.stderr


@pytest.mark.parametrize("script", SHELL_SCRIPTS, ids=lambda p: str(p.relative_to(REPO)))
def test_shellcheck_clean(script: Path) -> None:
    result = subprocess.run([tool("shellcheck"), "--format", "gcc", str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


# -- what the Dockerfile declares ---------------------------------------------------------------------------------


TENSORFLOW_VARIANTS = [v for v, framework in image.FRAMEWORKS.items() if framework == "tensorflow"]
JAX_VARIANTS = [v for v, framework in image.FRAMEWORKS.items() if framework == "jax"]
# Distributions that make up TensorFlow in an image; a JAX image has none of them.
TENSORFLOW_DISTS = {"tensorflow", "tensorflow-cpu", "tensorflow-tpu", "tf-keras", "tensorboard", "libclang"}
LOCK = REPO / "docker" / "constraints.txt"


def locked(variant: str) -> dict[str, str]:
    """{name: version} of everything `variant` installs, from docker/constraints.txt (what the image build applies)."""
    return image_requirements.pins(image_requirements.constraints(LOCK.read_text(), variant))


def test_the_variants_are_the_same_everywhere() -> None:
    assert image.VARIANTS == image_requirements.VARIANTS == ("cpu", "gpu", "tpu", "jax-tpu", "jax-gpu")
    assert TENSORFLOW_VARIANTS == list(image_requirements.TENSORFLOW_VARIANTS) == ["cpu", "gpu", "tpu"]
    assert JAX_VARIANTS == list(image_requirements.JAX_EXTRA) == ["jax-tpu", "jax-gpu"]
    dockerfile = (REPO / "docker" / "Dockerfile").read_text()
    for variant in image.VARIANTS:
        assert f" AS variant-{variant}\n" in dockerfile


def test_every_variant_runs_the_supervisor_and_only_the_tpu_ones_run_as_root() -> None:
    for variant in image.VARIANTS:
        config = image_config(variant)
        assert config.argv == container.ENTRYPOINT == ["python", "-m", "runner.worker"]
        assert config.env["PYTHONPATH"] == "/opt/app" and config.env["PYTHONUNBUFFERED"] == "1"
        # Keras' default backend is TensorFlow: the JAX images name theirs, the TensorFlow ones leave the default.
        assert config.env.get("KERAS_BACKEND") == ("jax" if variant in JAX_VARIANTS else None)
        # Set per run by the planner (pod slices, TensorFlow only), never baked into an image.
        assert "TPU_LOAD_LIBRARY" not in config.env and "TF_USE_LEGACY_KERAS" not in config.env
    for variant in ("cpu", "gpu", "jax-gpu"):
        assert image_config(variant).user == "1000:1000"
    for variant in ("gpu", "jax-gpu"):
        assert image_config(variant).env["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"
    tpu = image_config("tpu")
    assert tpu.user is None  # root: libtpu needs the capabilities --privileged gives root (docker/README.md)
    assert tpu.env["TPU_LIBRARY_PATH"] == tpu.env["TF_PLUGGABLE_DEVICE_LIBRARY_PATH"] == "/lib/libtpu.so"
    assert tpu.env["NEXT_PLUGGABLE_DEVICE_USE_C_API"] == "true"
    assert "TPU_LIBRARY_PATH" not in image_config("cpu").env
    jax_tpu = image_config("jax-tpu")
    assert jax_tpu.user is None  # root, as tpu
    # JAX finds libtpu through its pip package and detects the chips itself; a JAX_PLATFORMS baked in would make the
    # image fail on a machine without a TPU instead of running on its CPU.
    assert set(jax_tpu.env) == {
        "PYTHONUNBUFFERED",
        "PYTHONDONTWRITEBYTECODE",
        "PIP_NO_CACHE_DIR",
        "PIP_DISABLE_PIP_VERSION_CHECK",
        "PIP_ROOT_USER_ACTION",
        "PYTHONPATH",
        "KERAS_BACKEND",
    }


def _generated(tmp_path: Path, variant: str) -> dict[str, list[str]]:
    """What `requirements.py requirements` writes for a variant, as the image build runs it."""
    generator = [sys.executable, str(REPO / "docker" / "requirements.py"), "requirements"]
    subprocess.run([*generator, "--variant", variant, "--out", str(tmp_path / variant)], check=True)
    return {
        name: (tmp_path / variant / f"{name}.txt").read_text().splitlines()
        for name in ("requirements", "no-deps", "constraints")
    }


def _name(requirement: str) -> str:
    return re.split(r"[\[=<>~! ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def test_every_tensorflow_variant_installs_the_tensorflow_of_pyproject(tmp_path: Path) -> None:
    pins = {variant: locked(variant) for variant in image.VARIANTS}
    tf = pins["cpu"]["tensorflow-cpu"]
    out = {variant: _generated(tmp_path, variant) for variant in image.VARIANTS}
    reqs = {variant: out[variant]["requirements"] + out[variant]["no-deps"] for variant in image.VARIANTS}
    assert f"tensorflow-cpu=={tf}" in reqs["cpu"]  # the same TensorFlow without CUDA kernels
    assert f"tensorflow[and-cuda]=={tf}" in reqs["gpu"]
    assert f"tensorflow-tpu=={tf}" in reqs["tpu"]
    assert f"--find-links {image_requirements.LIBTPU_FIND_LINKS}" in reqs["tpu"]
    assert f"libtpu=={image_requirements.LIBTPU}" in reqs["tpu"]
    for variant in ("cpu", "tpu"):
        assert not any(r.startswith("tensorflow==") for r in reqs[variant])
        # tf-keras requires `tensorflow`, which would install the full build over tensorflow-cpu / -tpu
        assert out[variant]["no-deps"] == [f"tf-keras=={pins[variant]['tf-keras']}"]
    assert out["gpu"]["no-deps"] == []
    for variant in TENSORFLOW_VARIANTS:  # the TensorFlow images stay as they were: no JAX in them
        assert not any(_name(r) in ("jax", "jaxlib") for r in reqs[variant])
        assert not {"jax", "jaxlib"} & set(pins[variant])
    # One version for everything, the same in the Dockerfile, the generator and the lock.
    dockerfile = (REPO / "docker" / "Dockerfile").read_text()
    assert f"ARG LIBTPU_VERSION={image_requirements.LIBTPU}" in dockerfile
    assert pins["tpu"]["libtpu"] == image_requirements.LIBTPU
    assert pins["tpu"]["tensorflow-tpu"] == pins["gpu"]["tensorflow"] == tf
    cuda = [name for name in pins["gpu"] if name.startswith("nvidia-")]
    assert pins["gpu"]["nvidia-cudnn-cu12"].startswith("9.3.")
    assert pins["gpu"]["nvidia-cuda-runtime-cu12"].startswith("12.5.")
    assert len(cuda) == 12  # the CUDA TensorFlow 2.20 was built with: the floors of its and-cuda extra
    for variant in image.VARIANTS:
        # The build installs under exactly the variant's lines of the lock, and every requirement is pinned there.
        assert out[variant]["constraints"] == image_requirements.constraints(LOCK.read_text(), variant)
        for req in reqs[variant]:
            if not req.startswith("--"):
                assert _name(req) in pins[variant], f"{variant}: {req} not pinned in docker/constraints.txt"


def test_the_local_environment_has_the_full_tensorflow_only_with_an_nvidia_gpu(tmp_path: Path) -> None:
    """`make install`'s train extra, both ways (whatever this machine has): the extra as written with a GPU; without
    one the cpu image's TensorFlow build, tf-keras without its dependency on the full one, and everything else
    (JAX, Keras 3, gcsfs) as written. The command removes the other build, which shares the module `tensorflow`."""
    pyproject = REPO / "pyproject.toml"
    train = image_requirements.tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]["train"]
    tf = next(r for r in train if _name(r) == "tensorflow").removeprefix("tensorflow")
    assert image_requirements.local(pyproject, gpu=True) == (train, [])
    lines, no_deps = image_requirements.local(pyproject, gpu=False)
    assert lines == [f"tensorflow-cpu{tf}" if _name(r) == "tensorflow" else r for r in train if _name(r) != "tf-keras"]
    assert no_deps == [r for r in train if _name(r) == "tf-keras"]
    assert image_requirements.main(["local", "--out", str(tmp_path)]) == 0
    gpu = image_requirements.has_nvidia_gpu()
    here, here_no_deps = image_requirements.local(pyproject, gpu)
    written = {f.stem: f.read_text().splitlines() for f in tmp_path.glob("*.txt")}
    assert written == {
        "requirements": here,
        "no-deps": here_no_deps,
        "remove": ["tensorflow-cpu" if gpu else "tensorflow"],
    }


def test_the_jax_variants_install_jax_and_keras_and_no_tensorflow(tmp_path: Path) -> None:
    pyproject = image_requirements.tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    train = {_name(r): r for r in pyproject["optional-dependencies"]["train"]}
    jax_range = train["jax"].split("]", 1)[1]  # the version range pyproject.toml gives jax[cpu]
    for variant in JAX_VARIANTS:
        out = _generated(tmp_path, variant)
        reqs, pins = out["requirements"], locked(variant)
        extra = {"jax-tpu": "tpu", "jax-gpu": "cuda12"}[variant]
        assert f"jax[{extra}]{jax_range}" in reqs
        assert train["keras"] in reqs and train["numpy"] in reqs and "matplotlib" not in train
        assert out["no-deps"] == []
        # Nothing of TensorFlow, neither asked for nor brought in by a dependency.
        assert not any(_name(r).startswith(("tensorflow", "tf-keras")) for r in reqs)
        assert not TENSORFLOW_DISTS & set(pins), f"{variant} installs {TENSORFLOW_DISTS & set(pins)}"
        # What the trainer, the supervisor and the mirror import.
        assert {"jax", "jaxlib", "keras", "numpy", "google-cloud-storage", "pydantic"} <= set(pins)
        assert "matplotlib" not in pins  # no chart needs it, and Keras imports it at start-up wherever it is
        assert pins["jax"] == pins["jaxlib"]
        assert pins["keras"] == locked("cpu")["keras"]  # one Keras for both engines
    assert f"--find-links {image_requirements.JAX_LIBTPU_FIND_LINKS}" in _generated(tmp_path, "jax-tpu")["requirements"]
    jax_tpu, jax_gpu, tpu = locked("jax-tpu"), locked("jax-gpu"), locked("tpu")
    assert "libtpu" in jax_tpu and jax_tpu["libtpu"] != tpu["libtpu"]  # jax[tpu] pins its own libtpu
    assert not any(n.startswith("nvidia-") for n in jax_tpu) and "libtpu" not in jax_gpu
    assert jax_gpu["jax-cuda12-plugin"] == jax_gpu["jax-cuda12-pjrt"] == jax_gpu["jax"]
    assert jax_gpu["nvidia-cudnn-cu12"].startswith("9.") and jax_gpu["nvidia-cuda-runtime-cu12"].startswith("12.")
    # One set of versions across the images, apart from each one's accelerator runtime (libtpu, CUDA).
    for variant in JAX_VARIANTS:
        for other in TENSORFLOW_VARIANTS:
            shared = set(locked(variant)) & set(locked(other))
            differ = {n for n in shared if locked(variant)[n] != locked(other)[n]}
            assert all(image_requirements.own_runtime(n) for n in differ), (variant, other, differ)


def test_the_lock_names_what_each_variant_installs() -> None:
    text = "# header\na==1\n\n# [tpu jax-tpu]\nb==2\n# [jax-tpu]\nc==3\n# [tpu]\nc==4\n"
    assert image_requirements.constraints(text, "tpu") == ["a==1", "b==2", "c==4"]
    assert image_requirements.constraints(text, "jax-tpu") == ["a==1", "b==2", "c==3"]
    assert image_requirements.constraints(text, "cpu") == ["a==1"]  # "tpu" is a word, not a substring of "jax-tpu"
    with pytest.raises(ValueError, match="unknown variant"):
        image_requirements.constraints(text, "arm")
    # The lock is in the generator's own form: reading every variant back and rendering gives the file again.
    lines = LOCK.read_text().splitlines(keepends=True)
    header = next(i for i, line in enumerate(lines) if not line.startswith("#"))
    installs = {variant: locked(variant) for variant in image.VARIANTS}
    assert image_requirements.render(installs) == "".join(lines[header:])


def test_the_build_check_refuses_packages_the_lock_does_not_hold(tmp_path: Path) -> None:
    """The check the dependency layer ends with, run here against this venv (which has TensorFlow, its CPU build or
    the full one) as if it were a JAX image: it names TensorFlow as installed without being locked, and what the lock
    wants but is missing."""
    out = _generated(tmp_path, "jax-tpu")
    assert out["no-deps"] == []
    check = [sys.executable, str(REPO / "docker" / "requirements.py"), "check"]
    check += ["--no-deps", str(tmp_path / "jax-tpu" / "no-deps.txt")]
    result = subprocess.run(
        [*check, "--constraints", str(tmp_path / "jax-tpu" / "constraints.txt")], capture_output=True, text=True
    )
    assert result.returncode == 1
    installed = r"^tensorflow(-cpu)? \S+ is installed but not in the lock"
    assert re.search(installed, result.stdout, re.MULTILINE), result.stdout
    assert re.search(r"^libtpu: locked \S+, installed nothing$", result.stdout, re.MULTILINE)


def _sections(library: Path) -> set[str]:
    listing = subprocess.run(["readelf", "--section-headers", "--wide", str(library)], capture_output=True, text=True)
    return set(re.findall(r"\]\s+(\.\S+)", listing.stdout))


def test_slim_removes_what_no_job_loads_and_strips_only_tensorflows_libraries(tmp_path: Path) -> None:
    """The dependency layer's `slim` step, on a site-packages made of the parts it treats differently. A small
    library of this venv's TensorFlow stands in for TensorFlow's (built with its symbol table left in)."""
    if shutil.which("strip") is None or shutil.which("readelf") is None:
        pytest.skip("binutils (strip, readelf) is not installed here; the image build installs its own")
    spec = importlib.util.find_spec("tensorflow")
    assert spec and spec.submodule_search_locations
    candidates = sorted(Path(spec.submodule_search_locations[0]).rglob("*.so"), key=lambda p: p.stat().st_size)
    library = next(p for p in candidates if ".symtab" in _sections(p))
    site = tmp_path / "site-packages"
    (site / "tensorflow" / "include" / "tensorflow").mkdir(parents=True)
    (site / "tensorflow" / "include" / "tensorflow" / "op.h").write_text("// a header\n")
    shutil.copy(library, site / "tensorflow" / "lib_kernels.so")
    (site / "numpy" / "tests").mkdir(parents=True)
    (site / "numpy" / "tests" / "test_core.py").write_text("")
    (site / "numpy" / "core.py").write_text("")
    shutil.copy(library, site / "numpy" / "vendored.so")  # as auditwheel's patched copies: left alone
    (site / "clang" / "native").mkdir(parents=True)
    (site / "clang" / "__init__.py").write_text("")
    (site / "clang" / "native" / "libclang.so").write_bytes(b"\0" * 4096)
    info = site / "libclang-18.1.1.dist-info"
    info.mkdir()
    record = ["clang/__init__.py,,", "clang/native/libclang.so,,", "libclang-18.1.1.dist-info/RECORD,,"]
    (info / "RECORD").write_text("\n".join(record) + "\n")
    (site / "keep_me").mkdir()  # an empty directory of another package stays
    saved = image_requirements.slim(site)
    assert not (site / "clang").exists() and not info.exists()
    assert not (site / "tensorflow" / "include").exists() and not (site / "numpy" / "tests").exists()
    assert (site / "numpy" / "core.py").exists() and (site / "keep_me").is_dir()
    stripped = _sections(site / "tensorflow" / "lib_kernels.so")
    assert ".symtab" not in stripped and ".dynsym" in stripped  # what the dynamic linker reads stays
    assert ".symtab" in _sections(site / "numpy" / "vendored.so")
    assert saved > 4096


# -- the entrypoint, as a local process with the image's environment ----------------------------------------------


def image_env(variant: str = "cpu") -> dict[str, str]:
    env = child_env("TF_USE_LEGACY_KERAS")
    return {**env, **image_config(variant).env}


def entrypoint_argv(variant: str = "cpu") -> list[str]:
    """The image's ENTRYPOINT + CMD, with `python` being this interpreter (the one with the runner and TensorFlow),
    as runner.backends.container runs it when there is no container engine."""
    argv = image_config(variant).argv
    assert argv[0] == "python"
    return [sys.executable, *argv[1:]]


@pytest.mark.slow
def test_the_entrypoint_trains_a_tiny_real_job(tmp_path: Path, mnist_npz: Path) -> None:
    # 1024 test images, not all 10000: evaluating the CNN twice on the whole test set took 3.6 s of this test's 11.
    training = TrainingSpec.model_validate(
        {"max_train_examples": 256, "max_test_examples": 1024, "epochs": 1, "batch_size": 128}
    )
    run_dir = tmp_path / "run"
    env = image_env()
    env.update(
        {
            contract.RUN_DIR: str(run_dir),
            contract.RUN_ID: "image-entrypoint",
            contract.TRAINING: training.model_dump_json(),
            contract.DATA_DIR: str(mnist_npz.parent),  # the real cache, ~/.cache/tpu-runner/datasets
        }
    )
    result = subprocess.run(
        entrypoint_argv(), env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads((run_dir / contract.SUMMARY).read_text())
    assert summary["train_examples"] == 256 and summary["strategy"]["kind"] == "cpu"
    assert len((run_dir / contract.METRICS).read_text().splitlines()) == 1
    # Two steps of 128 real images: 0.32, 0.30 and 0.25 with seeds 0-2 on the whole test set, 0.31, 0.29 and 0.28 on
    # these 1024; chance is 0.1.
    assert summary["test_accuracy"] >= 0.2
    exit_record = json.loads((run_dir / contract.exit_key(0)).read_text())
    assert (exit_record["state"], exit_record["exit_code"]) == ("succeeded", 0)


def test_the_entrypoint_runs_a_custom_command_under_the_same_contract(tmp_path: Path) -> None:
    script = (
        "import json, os; print('custom', json.dumps({k: os.environ[k] for k in "
        "['RUNNER_RUN_ID', 'RUNNER_OUTPUT_DIR', 'RUNNER_CHECKPOINT_DIR', 'PYTHONPATH']}))"
    )
    run_dir = tmp_path / "run"
    env = image_env()
    env.update(
        {
            contract.RUN_DIR: str(run_dir),
            contract.RUN_ID: "custom",
            contract.COMMAND: json.dumps([sys.executable, "-c", script]),
        }
    )
    result = subprocess.run(entrypoint_argv(), env=env, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    seen = json.loads(result.stdout.split("custom ", 1)[1].splitlines()[0])
    assert seen == {
        "RUNNER_RUN_ID": "custom",
        "RUNNER_OUTPUT_DIR": str(run_dir),
        "RUNNER_CHECKPOINT_DIR": str(run_dir / "checkpoints"),
        "PYTHONPATH": "/opt/app",
    }
    assert "custom" in (run_dir / contract.log_key(0)).read_text()
    assert json.loads((run_dir / contract.exit_key(0)).read_text())["state"] == "succeeded"


def test_the_entrypoint_refuses_to_start_without_a_run_directory() -> None:
    result = subprocess.run(entrypoint_argv(), env=image_env(), capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "RUNNER_RUN_DIR is not set" in result.stderr


# -- a JAX image: the runner without TensorFlow ----------------------------------------------------------------


@pytest.fixture(scope="module")
def jax_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A Python holding what every JAX image installs (the lock's jax-tpu and jax-gpu lines, as this venv has them:
    jax[cpu] here, so no libtpu or CUDA) and nothing else: no TensorFlow, tf-keras or TensorBoard, no test tools,
    no runner installed (it comes from PYTHONPATH, as in the image). A venv whose site directory links this venv's
    packages of those distributions; `sys.executable` there is that venv's, so the trainer the supervisor starts
    sees the same packages."""
    root = tmp_path_factory.mktemp("jax-image")
    wanted = set.intersection(*(set(locked(v)) for v in JAX_VARIANTS))
    site_packages = Path(sysconfig.get_paths()["purelib"])
    keep: set[str] = set()
    for dist in importlib.metadata.distributions(path=[str(site_packages)]):
        if re.sub(r"[-_.]+", "-", dist.name or "").lower() in wanted:
            keep |= {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
    site = root / "site"
    site.mkdir()
    for name in sorted(keep):
        if (site_packages / name).exists():
            (site / name).symlink_to(site_packages / name)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "venv")], check=True)
    python = root / "venv" / "bin" / "python"
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(purelib, "jax_image.pth").write_text(f"import site; site.addsitedir({str(site)!r})\n")
    return str(python)


def jax_image_env(variant: str = "jax-tpu") -> dict[str, str]:
    """The image's environment, with this checkout standing in for /opt/app."""
    return {**image_env(variant), "PYTHONPATH": str(REPO)}


def test_the_jax_image_python_has_keras_on_jax_and_no_tensorflow(jax_python: str) -> None:
    probe = (
        "import importlib.util, json, keras, jax; "
        "print(json.dumps({m: importlib.util.find_spec(m) is not None for m in "
        "['tensorflow', 'tf_keras', 'tensorboard', 'pytest', 'runner', 'google.cloud.storage']} | "
        "{'backend': keras.backend.backend(), 'sum': float(keras.ops.sum(keras.ops.ones((2, 2))))}))"
    )
    result = subprocess.run(
        [jax_python, "-c", probe], env=jax_image_env(), capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout.splitlines()[-1])
    assert seen == {
        "tensorflow": False,
        "tf_keras": False,
        "tensorboard": False,
        "pytest": False,
        "runner": True,
        "google.cloud.storage": True,
        "backend": "jax",  # KERAS_BACKEND from the Dockerfile
        "sum": 4.0,
    }


def test_a_jax_image_runs_the_supervisor_and_the_mirror_without_tensorflow(jax_python: str, gcs: str) -> None:
    """The entrypoint with a gs:// run directory: the supervisor stages the job's output locally and the mirror
    uploads it through google-cloud-storage (here to the emulator), with no TensorFlow importable."""
    run_dir = f"gs://runner-test/{uuid.uuid4().hex}/runs/jax"
    script = (
        "import os, pathlib, keras; p = pathlib.Path(os.environ['RUNNER_CHECKPOINT_DIR']); "
        "p.mkdir(parents=True, exist_ok=True); (p / 'weights.bin').write_bytes(b'x' * 1000); "
        "print('backend', keras.backend.backend())"
    )
    env = jax_image_env()
    env.update(
        {
            contract.RUN_DIR: run_dir,
            contract.RUN_ID: "jax-image",
            contract.COMMAND: json.dumps([jax_python, "-c", script]),
            contract.SYNC_S: "0.5",
            "STORAGE_EMULATOR_HOST": gcs,
        }
    )
    argv = [jax_python, *image_config("jax-tpu").argv[1:]]
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=180, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    store = open_storage(run_dir)
    assert {"checkpoints/weights.bin", "logs/worker-0.log", "exit/worker-0.json"} <= {o.key for o in store.list()}
    assert b"backend jax" in store.read_bytes("logs/worker-0.log")
    assert json.loads(store.read_bytes(contract.exit_key(0)) or b"{}")["state"] == "succeeded"


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("runner.train.engines.jax") is None,
    reason="the JAX engine (training.framework: jax, runner/train/engines/jax.py) is not in this checkout",
)
def test_a_jax_image_trains_with_framework_jax_without_tensorflow(
    jax_python: str, tmp_path: Path, mnist_npz: Path
) -> None:
    # The MLP on 256 test images: what is tested is the image's Python (no TensorFlow) running the JAX engine, which
    # does not depend on the model; JAX compiling the CNN and evaluating all 10000 test images took half of 15 s.
    # The CNN trains on JAX without TensorFlow in tests/bench (test_bench_on_jax_runs_without_tensorflow).
    training = TrainingSpec.model_validate(
        {
            "framework": "jax",
            "model": "mnist_mlp",
            "max_train_examples": 256,
            "max_test_examples": 256,
            "epochs": 1,
            "batch_size": 128,
        }
    )
    run_dir = tmp_path / "run"
    env = jax_image_env()
    env.update(
        {
            contract.RUN_DIR: str(run_dir),
            contract.RUN_ID: "jax-image-train",
            contract.TRAINING: training.model_dump_json(),
            contract.DATA_DIR: str(mnist_npz.parent),
        }
    )
    argv = [jax_python, *image_config("jax-tpu").argv[1:]]
    result = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=900, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads((run_dir / contract.SUMMARY).read_text())
    assert (summary["framework"], summary["train_examples"]) == ("jax", 256)
    exit_record = json.loads((run_dir / contract.exit_key(0)).read_text())
    assert (exit_record["state"], exit_record["exit_code"]) == ("succeeded", 0)
