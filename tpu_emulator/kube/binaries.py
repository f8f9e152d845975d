"""Where the control plane's binaries are: the cache infra/kube-build.sh fills once per machine (`make kube`)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

NAMES = ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager")
CACHE_ENV = "KUBE_CACHE"  # the same variable the build script reads


def cache_dir() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "tpu-runner" / "kube"


@dataclass(frozen=True)
class Binaries:
    folder: Path
    stamp: dict[str, str]  # what built them: kubernetes-source, go, etcd-server, built, build-seconds

    def path(self, name: str) -> str:
        return str(self.folder / name)


def find() -> Binaries | str:
    """The cached binaries, or why they cannot be used (a sentence that names `make kube`)."""
    folder = cache_dir() / "bin"
    stamp = folder / "STAMP"
    missing = [name for name in NAMES if not os.access(folder / name, os.X_OK)]
    if missing or not stamp.is_file():
        what = ", ".join(missing) if missing else "its STAMP"
        return f"the Kubernetes control plane is not built in {folder} ({what} missing): `make kube` builds it once"
    pairs = (line.partition("=") for line in stamp.read_text().splitlines())
    return Binaries(folder, {key: value for key, _, value in pairs if key})
