"""The built-in trainer's data: found, limited and checked before anything trains.

training.data is one of
  * nothing: MNIST from the data cache (runner.datasets: the cache, its copy in the run's storage, Keras' cache,
    then Keras' download);
  * a .npz (a path, or gs://) with x_train, y_train, x_test, y_test of any shapes;
  * module:function of the job's code (runner.train.models.import_ref), returning those four arrays (a tuple, or a
    dict with those keys), or a pair of tf.data.Datasets (train, test) of batches (the TensorFlow engine only).

Labels are sparse (integers, shape (N,) or (N, 1)) or one-hot (shape (N, classes)); the class count comes from
them. Every problem is found here, before the model is built, in one message that names the array, its shape and
the fix: a traceback from inside fit, minutes into a paid run, is what this is for.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from runner import datasets
from runner.train.models import IMAGE_MODELS, MODELS, CodeError, call_with, import_ref, is_ref
from runner.train.restore import TrainerError

SPARSE, ONE_HOT = "sparse", "one_hot"


@dataclass(frozen=True)
class Inputs:
    """Checked training data: arrays, or (TensorFlow only) a pair of datasets."""

    source: str
    labels: str  # SPARSE | ONE_HOT
    classes: int
    example_shape: tuple[int, ...]  # one example as the model gets it (a channel axis added for 2-D images)
    x_train: Any = None
    y_train: Any = None
    x_test: Any = None
    y_test: Any = None
    train_ds: Any = None  # a user's tf.data.Datasets instead of arrays
    test_ds: Any = None
    expand: bool = False  # images (N, H, W) get a channel axis: (N, H, W, 1)
    scale: float = 1.0  # uint8 pixels are scaled by 1/255, as MNIST; other data is fed as it is

    @property
    def datasets(self) -> bool:
        return self.train_ds is not None

    @property
    def train_examples(self) -> int:
        return len(self.x_train) if self.x_train is not None else 0

    @property
    def test_examples(self) -> int:
        return len(self.x_test) if self.x_test is not None else 0


def load(data: str | None, model: str, max_train: int | None, max_test: int | None, keras: Any = None) -> Inputs:
    """The run's data, limited to the first max_train/max_test examples, checked for `model`."""
    if data and is_ref(data):
        try:
            got = call_with(import_ref(data, "training.data"))
        except CodeError as exc:
            raise TrainerError(str(exc)) from exc
        if _is_dataset_pair(got):
            return _datasets(got, data)
        arrays = _four_arrays(got, data)
        source = data
    else:
        arrays, source = datasets.find_arrays(data, keras)
    x_train, y_train, x_test, y_test = (np.asarray(a) for a in arrays)
    x_train, y_train, x_test, y_test = x_train[:max_train], y_train[:max_train], x_test[:max_test], y_test[:max_test]
    return check(source, model, x_train, y_train, x_test, y_test)


def _is_dataset_pair(value: Any) -> bool:
    import sys

    tf = sys.modules.get("tensorflow")
    return (
        tf is not None
        and isinstance(value, tuple | list)
        and len(value) == 2
        and all(isinstance(v, tf.data.Dataset) for v in value)
    )


def _four_arrays(value: Any, ref: str) -> tuple[Any, Any, Any, Any]:
    names = ("x_train", "y_train", "x_test", "y_test")
    if isinstance(value, dict):
        missing = [n for n in names if n not in value]
        if missing:
            raise TrainerError(f"training.data {ref!r} returned a dict without {', '.join(missing)}")
        return tuple(value[n] for n in names)
    if isinstance(value, tuple | list) and len(value) == 2 and all(isinstance(v, tuple | list) for v in value):
        (x_train, y_train), (x_test, y_test) = value  # Keras' load_data() shape: ((x, y), (x, y))
        return x_train, y_train, x_test, y_test
    if isinstance(value, tuple | list) and len(value) == 4:
        return tuple(value)
    raise TrainerError(
        f"training.data {ref!r} returned {type(value).__name__}; return (x_train, y_train, x_test, y_test), "
        "a dict with those keys, ((x_train, y_train), (x_test, y_test)), or a pair of tf.data.Datasets"
    )


def label_kind(name: str, y: np.ndarray) -> tuple[str, int]:
    """(SPARSE or ONE_HOT, class count) of a label array; TrainerError when it is neither."""
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.ndim == 1:
        if y.size and (not np.issubdtype(y.dtype, np.number) or np.any(y < 0) or np.any(np.mod(y, 1) != 0)):
            raise TrainerError(
                f"{name} holds values that are not class numbers (0, 1, 2, ...); labels are sparse "
                "class numbers, shape (N,), or one-hot rows, shape (N, classes)"
            )
        return SPARSE, int(y.max()) + 1 if y.size else 0
    if y.ndim == 2:
        if y.size and not np.allclose(y.sum(axis=1), 1.0, atol=1e-3):
            raise TrainerError(
                f"{name} has shape {y.shape} but its rows do not sum to 1: not one-hot labels "
                "(sparse labels are shape (N,))"
            )
        return ONE_HOT, int(y.shape[1])
    raise TrainerError(f"{name} has shape {y.shape}: labels are shape (N,) (class numbers) or (N, classes) (one-hot)")


def check(source: str, model: str, x_train: Any, y_train: Any, x_test: Any, y_test: Any) -> Inputs:
    """The arrays checked for `model` (the shape rules `runner validate` applies offline, then their values)."""
    from runner.plan.datacheck import shape_problems

    arrays = {"x_train": x_train, "y_train": y_train, "x_test": x_test, "y_test": y_test}
    if problems := shape_problems({k: tuple(v.shape) for k, v in arrays.items()}, model, source):
        raise TrainerError("; ".join(problems))
    if len(x_train) == 0:
        raise TrainerError(f"{source}: x_train is empty")
    if not np.issubdtype(x_train.dtype, np.number):
        raise TrainerError(f"{source}: x_train has dtype {x_train.dtype}; the inputs must be numbers")
    kind, classes = label_kind("y_train", y_train)
    test_kind, test_classes = label_kind("y_test", y_test)
    if test_kind != kind or (kind == ONE_HOT and test_classes != classes):
        raise TrainerError(f"{source}: y_train is {kind} ({y_train.shape}) and y_test {test_kind} ({y_test.shape})")
    classes = max(classes, test_classes)
    if classes < 2:
        raise TrainerError(f"{source}: the labels name {classes} class; a classifier needs at least 2")
    example = tuple(int(d) for d in x_train.shape[1:])
    expand = model in IMAGE_MODELS and len(example) == 2
    shape = (*example, 1) if expand else example
    scale = 1.0 / 255.0 if x_train.dtype == np.uint8 else 1.0
    if kind == SPARSE:
        y_train, y_test = (y.reshape(-1) if y.ndim == 2 else y for y in (y_train, y_test))
    return Inputs(source, kind, classes, shape, x_train, y_train, x_test, y_test, expand=expand, scale=scale)


def _datasets(pair: Any, ref: str) -> Inputs:
    """A user's (train, test) tf.data.Datasets of (x, y) batches: shapes from their element specs."""
    train, test = pair
    spec = train.element_spec
    if not isinstance(spec, tuple) or len(spec) < 2:
        raise TrainerError(f"training.data {ref!r}: the training dataset must yield (x, y) batches, not {spec}")
    x_spec, y_spec = spec[0], spec[1]
    example = tuple(int(d) if d is not None else 0 for d in x_spec.shape[1:])
    if y_spec.shape.rank == 2 and (y_spec.shape[1] or 0) > 1:
        kind, classes = ONE_HOT, int(y_spec.shape[1])
    else:
        kind, classes = SPARSE, 0  # counted from the model's output when it is built
    return Inputs(ref, kind, classes, example, train_ds=train, test_ds=test)


def check_model(model: Any, name: str, inputs: Inputs) -> None:
    """The model built for `inputs` takes their examples and has an output per class."""
    want = tuple(inputs.example_shape)
    got = tuple(getattr(model, "input_shape", (None, *want))[1:])
    if len(got) != len(want) or any(g is not None and g != w for g, w in zip(got, want, strict=False)):
        what = "the CNN" if name in MODELS else f"training.model {name!r}"
        raise TrainerError(
            f"x_train's examples are {want}, but {what} takes {got}; give data of the model's shape, or a model "
            "for this data (its input_shape argument is the examples' shape)"
        )
    out = getattr(model, "output_shape", None)
    units = out[-1] if isinstance(out, tuple) and out else None
    if inputs.classes and units is not None and units != inputs.classes:
        raise TrainerError(
            f"the labels name {inputs.classes} classes, but the model's output has {units} units; build it with "
            "num_classes outputs (its num_classes argument)"
        )
