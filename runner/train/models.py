"""The built-in trainer's models: its own two, written against the Keras API only (keras 3, tf_keras, or Keras 3 on
JAX), or yours, named `module:function` in training.model.

A model of yours is a function of your job's code (the working directory: where `runner submit --local` runs, or
/workspace in the image that `runner build --context` made) that returns a Keras model; it may take `input_shape`
(one example's shape), `num_classes` (from the labels) and `keras` (the Keras the trainer runs: Keras 3, or tf_keras
on a TPU under TensorFlow; build with it, and the same function serves both engines) as keyword arguments. Built
under the run's strategy scope and precision policy, then compiled by the trainer with the spec's optimizer, unless
it comes back compiled (its optimizer and loss are kept).
"""

from __future__ import annotations

import importlib
import inspect
import os
import re
import sys
from collections.abc import Callable
from typing import Any

INPUT_SHAPE = (28, 28, 1)
NUM_CLASSES = 10
# module:function, with a dotted module path: what training.model and training.data take for code of yours.
_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
REF_RE = re.compile(rf"^(?P<module>{_NAME}(?:\.{_NAME})*):(?P<function>{_NAME})$")


def mnist_cnn(keras: Any, input_shape: tuple[int, ...] = INPUT_SHAPE, num_classes: int = NUM_CLASSES) -> Any:
    """The CNN of the 'GPU vs TPU' Colab notebook, layer for layer."""
    layers = keras.layers
    return keras.Sequential(
        [
            keras.Input(input_shape),
            layers.Conv2D(64, kernel_size=2, padding="same", activation="relu"),
            layers.MaxPooling2D(pool_size=2),
            layers.Dropout(0.3),
            layers.Conv2D(32, kernel_size=2, padding="same", activation="relu"),
            layers.MaxPooling2D(pool_size=2),
            layers.Dropout(0.3),
            layers.Flatten(),
            layers.Dense(256, activation="relu"),
            layers.Dropout(0.5),
            layers.Dense(num_classes, activation="softmax"),
        ],
        name="mnist_cnn",
    )


def mnist_mlp(keras: Any, input_shape: tuple[int, ...] = INPUT_SHAPE, num_classes: int = NUM_CLASSES) -> Any:
    """The Dense-128 classifier of the GPU/TPU getting-started guides (their 784-vector input is the Flatten)."""
    layers = keras.layers
    return keras.Sequential(
        [
            keras.Input(input_shape),
            layers.Flatten(),
            layers.Dense(128, activation="relu"),
            layers.Dense(num_classes, activation="softmax"),
        ],
        name="mnist_mlp",
    )


MODELS = {"mnist_cnn": mnist_cnn, "mnist_mlp": mnist_mlp}
# The models with Dropout layers (a test holds this to what the builders build): calibration.py times the fused dropout
# kernel for these only, without building a model to find out.
DROPOUT_MODELS = frozenset({"mnist_cnn"})
# What each built-in model takes: the CNN images (height, width[, channels]) of at least 4 x 4 (two 2 x 2
# poolings); the MLP anything (its Flatten).
IMAGE_MODELS = frozenset({"mnist_cnn"})


class CodeError(ValueError):
    """A module:function of the job's code that cannot be imported or called as it should; the message says why."""


def is_ref(text: str | None) -> bool:
    return bool(text) and REF_RE.match(text or "") is not None


def import_ref(ref: str, what: str) -> Callable[..., Any]:
    """The function `ref` ('module:function') names, imported from the job's code: the working directory first
    (where the job runs: /workspace in the image), then the rest of sys.path."""
    match = REF_RE.match(ref)
    if match is None:
        raise CodeError(f"{what} {ref!r} is not module:function (e.g. my_model:build)")
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(match["module"])
    except ImportError as exc:
        raise CodeError(
            f"{what} {ref!r}: cannot import {match['module']!r} from {cwd} ({exc}); the job's code must be in its "
            "working directory (`runner build --context DIR` puts DIR at /workspace in the image)"
        ) from exc
    function = getattr(module, match["function"], None)
    if not callable(function):
        raise CodeError(f"{what} {ref!r}: {match['module']} has no function {match['function']!r}")
    return function


def call_with(function: Callable[..., Any], **offered: Any) -> Any:
    """Call `function` with those of `offered` it names (or all, given **kwargs)."""
    params = inspect.signature(function).parameters
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return function(**offered)
    return function(**{k: v for k, v in offered.items() if k in params})


def build_model(
    name: str, keras: Any, input_shape: tuple[int, ...] = INPUT_SHAPE, num_classes: int = NUM_CLASSES
) -> Any:
    """A built-in model by name, or yours by module:function (which gets input_shape, num_classes and keras when it
    takes them)."""
    if name in MODELS:
        return MODELS[name](keras, tuple(input_shape), num_classes)
    model = call_with(
        import_ref(name, "training.model"), input_shape=tuple(input_shape), num_classes=num_classes, keras=keras
    )
    if not hasattr(model, "fit") or not hasattr(model, "compile"):
        raise CodeError(f"training.model {name!r} returned {type(model).__name__}, not a Keras model")
    return model


def make_optimizer(name: str, learning_rate: float, keras: Any) -> Any:
    optimizers = {
        "adam": keras.optimizers.Adam,
        "sgd": keras.optimizers.SGD,
        "rmsprop": keras.optimizers.RMSprop,
    }
    return optimizers[name](learning_rate=learning_rate)


def has_dropout(model: Any, keras: Any) -> bool:
    return any(isinstance(layer, keras.layers.Dropout) for layer in _layers(model))


def _layers(model: Any) -> list[Any]:
    found = []
    for layer in getattr(model, "layers", []):
        found.append(layer)
        found += _layers(layer)
    return found
