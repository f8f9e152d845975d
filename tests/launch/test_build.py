"""runner.launch.build: build and push skip logic, the check of a finished image, CA certificates as a build secret
and the refusal of a variant whose package index does not answer, with the engine's CLI replaced by a recording
stand-in. (Real builds and runs: test_container.)"""

from __future__ import annotations

import http.server
import json
import os
import shutil
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from runner.errors import BackendError, UsageError
from runner.launch import build, image
from tests.conftest import REPO

FAKE_DOCKER = """\
#!{python}
import json, os, sys
state_path, log_path = os.environ["FAKE_DOCKER_STATE"], os.environ["FAKE_DOCKER_LOG"]
state = json.load(open(state_path)) if os.path.exists(state_path) else {{"images": [], "pushed": []}}
args = sys.argv[1:]
with open(log_path, "a") as log:
    log.write(json.dumps(args) + "\\n")
rc = 0
if args[:1] == ["version"]:
    rc = 0 if os.environ.get("FAKE_DOCKER_ENGINE", "1") == "1" else 1
    print("24.0.7" if rc == 0 else "")
elif args[:2] == ["image", "inspect"]:
    rc = 0 if args[-1] in state["images"] else 1
    if rc == 0 and "{{{{.Size}}}}" in args:
        print(1190000000)
elif args[:1] == ["run"]:  # the check of a finished image
    rc = 0 if os.environ.get("FAKE_DOCKER_CHECK", "ok") == "ok" else 1
    print("pip check: no broken requirements" if rc == 0 else "tensorflow-cpu: locked 2.20.0, installed nothing")
elif args[:1] == ["build"]:
    state["images"] += [args[i + 1] for i, a in enumerate(args) if a == "--tag"]
    state["dockerfile"] = open(args[args.index("--file") + 1]).read()  # gone once the build is over
    assert os.environ.get("DOCKER_BUILDKIT") == "1"
    if "--secret" in args:  # keep what the build was handed: the file is gone once the build is over
        secret = args[args.index("--secret") + 1].split("src=")[1]
        state["secret"] = open(secret).read()
elif args[:1] == ["tag"]:
    state["images"].append(args[2])
elif args[:1] == ["push"]:
    rc = 0 if args[1] in state["images"] else 1
    state["pushed"].append(args[1])
elif args[:2] == ["manifest", "inspect"]:
    rc = 0 if args[2] in state["pushed"] else 1
json.dump(state, open(state_path, "w"))
sys.exit(rc)
"""


class FakeDocker:
    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        script = bin_dir / "docker"
        script.write_text(FAKE_DOCKER.format(python=sys.executable))
        script.chmod(0o755)
        self.log = tmp_path / "docker.log"
        self.state = tmp_path / "docker.json"
        monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
        monkeypatch.setenv("FAKE_DOCKER_LOG", str(self.log))
        monkeypatch.setenv("RUNNER_CONTAINER_ENGINE", "docker")  # this stand-in, not Podman if it is installed
        monkeypatch.setenv("FAKE_DOCKER_STATE", str(self.state))

    def calls(self) -> list[list[str]]:
        lines = self.log.read_text().splitlines() if self.log.exists() else []
        self.log.write_text("")
        return [json.loads(line) for line in lines]

    def verbs(self) -> list[str]:
        return [" ".join(c[:2]) if c[0] in ("image", "manifest") else c[0] for c in self.calls()]


@pytest.fixture
def docker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeDocker:
    return FakeDocker(tmp_path, monkeypatch)


def ensure(**kwargs: object) -> build.ImageResult:
    """ensure_image with the registry check answering "cannot tell", so the engine CLI's own check decides."""
    return build.ensure_image("cpu", say=lambda _: None, exists=lambda _: None, **kwargs)  # type: ignore[arg-type]


def test_build_once_then_never_again(docker: FakeDocker) -> None:
    tag = image.content_tag("cpu")
    said: list[str] = []
    first = build.ensure_image("cpu", say=said.append, exists=lambda _: None)
    assert first == build.ImageResult(f"trainer-cpu:{tag}", (f"trainer-cpu:{tag}",), built=True, pushed=False)
    calls = docker.calls()
    assert [c[0] for c in calls] == ["version", "image", "build", "run", "image"]
    build_argv = next(c for c in calls if c[0] == "build")
    assert build_argv[build_argv.index("--file") + 1] == str(REPO / "docker" / "Dockerfile")
    assert build_argv[build_argv.index("--build-arg") + 1] == "VARIANT=cpu"
    assert build_argv[-1] == str(REPO) and f"org.opencontainers.image.version={tag}" in build_argv
    assert "--secret" not in build_argv
    # The finished image is checked in a container of its own, off the network, against its variant's lock.
    run = next(c for c in calls if c[0] == "run")
    assert run[:6] == ["run", "--rm", "--network", "none", "--entrypoint", "python"]
    assert run[6] == f"trainer-cpu:{tag}" and run[7:9] == ["/opt/requirements/requirements.py", "check"]
    assert said[0] == f"building trainer-cpu:{tag} with Docker 24.0.7"
    assert said[-1].startswith(f"trainer-cpu:{tag}: 1.19 GB on disk (built in ")
    assert ensure().built is False
    assert docker.verbs() == ["version", "image inspect", "image inspect"]  # found locally, its size said: no build


def test_push_builds_and_pushes_once_and_a_retry_does_nothing(docker: FakeDocker) -> None:
    tag = image.content_tag("cpu")
    remote = f"us-central1-docker.pkg.dev/p/tpu-runner/trainer-cpu:{tag}"
    first = ensure(project="p", push=True)
    assert (first.reference, first.built, first.pushed) == (remote, True, True)
    assert docker.verbs() == [
        "version", "manifest inspect", "image inspect", "image inspect", "build", "run", "image inspect", "push"
    ]  # fmt: skip
    again = ensure(project="p", push=True)
    assert (again.built, again.pushed) == (False, False)
    assert docker.verbs() == ["version", "manifest inspect"]  # the registry has it: nothing else is looked at


def test_built_elsewhere_pushed_elsewhere_and_registry_answers(docker: FakeDocker) -> None:
    tag = image.content_tag("cpu")
    remote = f"us-central1-docker.pkg.dev/p/tpu-runner/trainer-cpu:{tag}"
    docker.state.write_text(json.dumps({"images": [f"trainer-cpu:{tag}"], "pushed": []}))
    result = ensure(project="p", push=True)
    assert (result.built, result.pushed) == (False, True)
    assert docker.verbs() == [
        "version", "manifest inspect", "image inspect", "image inspect", "image inspect", "tag", "push"
    ]  # fmt: skip
    # When the registry answers itself (True / False), no engine is needed, nor asked.
    found = build.ensure_image("cpu", project="p", push=True, say=lambda _: None, exists=lambda ref: ref == remote)
    assert (found.built, found.pushed) == (False, False) and docker.verbs() == []


def test_no_engine_is_a_clear_error(docker: FakeDocker, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_DOCKER_ENGINE", "0")
    with pytest.raises(BackendError, match="Docker does not answer") as err:
        ensure()
    assert "make podman" in (err.value.hint or "")
    assert docker.verbs() == ["version"]


def test_an_image_that_fails_its_check_is_an_error(docker: FakeDocker, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever a build cache did, an image whose packages are not its variant's lock is never passed on."""
    monkeypatch.setenv("FAKE_DOCKER_CHECK", "stale")
    with pytest.raises(BackendError, match="does not hold what its variant locks") as err:
        ensure()
    assert "tensorflow-cpu: locked 2.20.0, installed nothing" in str(err.value)
    assert "docker rmi trainer-cpu:" in (err.value.hint or "")


def test_ca_certificates_go_to_the_build_as_a_secret(docker: FakeDocker, tmp_path: Path) -> None:
    certs = tmp_path / "certs"
    certs.mkdir()
    pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    (certs / "proxy.crt").write_text(pem)
    (certs / "other.pem").write_text(pem.replace("MIIB", "MIIC"))
    (certs / "README").write_text("not a certificate")
    tag = image.content_tag("cpu")
    result = ensure(ca_certs=certs)
    build_argv = next(c for c in docker.calls() if c[0] == "build")
    secret = build_argv[build_argv.index("--secret") + 1]
    assert secret.startswith("id=ca-certificates,src=")
    # Every .crt and .pem of the directory, sorted: what the build could read while it ran.
    assert json.loads(docker.state.read_text())["secret"] == pem.replace("MIIB", "MIIC") + pem
    assert not Path(secret.split("src=")[1]).exists()  # a temporary file, gone after the build
    assert result.reference.endswith(tag)  # a secret is not part of what the image is: same tag
    (certs / "bad.pem").write_text("nothing")
    with pytest.raises(UsageError, match="no PEM certificate"):
        build.ca_bundle(certs / "bad.pem", tmp_path)


class _Index(http.server.BaseHTTPRequestHandler):
    def do_HEAD(self) -> None:
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def checkout(tmp_path: Path) -> Iterator[Path]:
    """A copy of what the build reads, its libtpu index pointed at a local server that answers."""
    root = tmp_path / "checkout"
    for rel in ("pyproject.toml", "docker/Dockerfile", "docker/Dockerfile.dockerignore", "docker/constraints.txt"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / rel, root / rel)
    shutil.copytree(REPO / "runner", root / "runner", ignore=shutil.ignore_patterns("__pycache__"))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Index)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    generator = (REPO / "docker" / "requirements.py").read_text()
    url = f"http://127.0.0.1:{server.server_address[1]}/libtpu-tf-releases/index.html"
    (root / "docker" / "requirements.py").write_text(
        generator.replace("https://storage.googleapis.com/libtpu-tf-releases/index.html", url)
    )
    yield root
    server.shutdown()
    server.server_close()


def test_a_variant_whose_package_index_does_not_answer_is_refused_at_once(docker: FakeDocker, checkout: Path) -> None:
    assert build.extra_hosts("cpu", checkout) == []
    (index,) = build.extra_hosts("tpu", checkout)
    assert index.startswith("http://127.0.0.1:")
    assert build.ensure_image("tpu", root=checkout, say=lambda _: None, exists=lambda _: None).built
    closed = index.replace(index.split("/")[2], "127.0.0.1:9")  # nothing listens on the discard port
    generator = checkout / "docker" / "requirements.py"
    generator.write_text(generator.read_text().replace(index, closed))
    docker.calls()
    with pytest.raises(BackendError, match=r"cannot build the tpu image here: 127\.0\.0\.1:9 does not answer") as err:
        build.ensure_image("tpu", root=checkout, say=lambda _: None, exists=lambda _: None)
    assert "cpu, gpu, jax-gpu install from PyPI alone" in (err.value.hint or "")
    assert "build" not in docker.verbs()
