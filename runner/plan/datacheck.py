"""What can be known of the built-in trainer's data and model before anything runs, offline: `runner validate`
and the plan say it, and the trainer applies the same shape rules (runner.train.inputs) before it builds the model.

  * training.data as a local .npz: the file is there, holds x_train, y_train, x_test, y_test, and their shapes
    (read from the arrays' headers, not their data) agree: as many labels as examples, the same example shape in
    both sets, labels of shape (N,) or (N, classes), and the examples a built-in model can take;
  * module:function (training.model, training.data): the module is found in the job's working directory.

A gs:// file cannot be read offline: it is checked when the job starts. Only numpy and the standard library.
"""

from __future__ import annotations

import importlib.util
import sys
import zipfile
from pathlib import Path

from runner.spec import JobSpec

ARRAYS = ("x_train", "y_train", "x_test", "y_test")
IMAGE_MODELS = frozenset({"mnist_cnn"})  # runner.train.models.IMAGE_MODELS: built from (H, W[, C]) images
REF_SEP = ":"


def shape_problems(shapes: dict[str, tuple[int, ...]], model: str, source: str) -> list[str]:
    """Every problem the arrays' shapes show for `model` (one message each: the array, its shape, the fix)."""
    problems = []
    for part in ("train", "test"):
        x, y = shapes[f"x_{part}"], shapes[f"y_{part}"]
        if x[:1] != y[:1]:
            problems.append(f"{source}: x_{part} has {x[0]} examples and y_{part} {y[0]}; they must match")
        if len(y) > 2 or (len(y) == 2 and y[1] == 0):
            problems.append(
                f"{source}: y_{part} has shape {y}: labels are shape (N,) (class numbers) or (N, classes) (one-hot)"
            )
    if shapes["x_train"][1:] != shapes["x_test"][1:]:
        problems.append(
            f"{source}: x_train's examples are {shapes['x_train'][1:]} and x_test's {shapes['x_test'][1:]}; they "
            "must match"
        )
    example = shapes["x_train"][1:]
    if model in IMAGE_MODELS and (len(example) not in (2, 3) or min(example[:2], default=0) < 4):
        problems.append(
            f"x_train has shape {shapes['x_train']}, but {model} takes images: (N, height, width) or (N, height, "
            "width, channels), at least 4 x 4. Use model mnist_mlp (any shape), reshape your data "
            "(x.reshape(-1, 28, 28) for 784-vectors of MNIST), or give a model of yours (training.model: "
            "module:function)"
        )
    return problems


def npz_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """The four arrays' shapes from a .npz's headers. Raises ValueError naming what is wrong."""
    import numpy as np

    try:
        with zipfile.ZipFile(path) as archive:
            names = set(archive.namelist())
            missing = [a for a in ARRAYS if f"{a}.npy" not in names]
            if missing:
                raise ValueError(f"{path} has no {', '.join(missing)} (a .npz with {', '.join(ARRAYS)} is needed)")
            shapes = {}
            for array in ARRAYS:
                with archive.open(f"{array}.npy") as member:  # the header only, not the data
                    major, _minor = np.lib.format.read_magic(member)
                    read = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
                    shape, _, _ = read(member)
                    shapes[array] = tuple(int(d) for d in shape)
            return shapes
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        raise ValueError(f"{path} is not a .npz ({exc})") from None


def module_found(ref: str, cwd: Path) -> bool:
    """Whether module:function's top-level module is found from `cwd` (found, not imported)."""
    top = ref.split(REF_SEP)[0].split(".")[0]
    added = str(cwd) not in sys.path
    if added:
        sys.path.insert(0, str(cwd))
    try:
        return importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):
        return False
    finally:
        if added:
            sys.path.remove(str(cwd))


def problems(spec: JobSpec, cwd: Path) -> list[str]:
    """What the spec's training data and model will fail on, as far as this machine can tell."""
    training = spec.training
    if training is None:
        return []
    found: list[str] = []
    for field, value in (("training.model", training.model), ("training.data", training.data)):
        if value and REF_SEP in value and not value.startswith("gs://") and not module_found(value, cwd):
            found.append(
                f"{field} {value!r}: no module {value.split(REF_SEP)[0]!r} in {cwd} (the job's working directory "
                "here; /workspace in an image `runner build --context` made)"
            )
    data = training.data
    if data and REF_SEP not in data.replace("gs://", ""):
        path = Path(data).expanduser()
        path = path if path.is_absolute() else cwd / path
        if not path.is_file():
            found.append(f"training.data {data!r}: no such file (from {cwd})")
        else:
            try:
                found += shape_problems(npz_shapes(path), training.model, f"training.data {data!r}")
            except ValueError as exc:
                found.append(f"training.data {data!r}: {exc}")
    return found
