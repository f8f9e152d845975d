"""The built-in models, written against the Keras API only (keras 3, tf_keras, or Keras 3 on JAX)."""

from __future__ import annotations

from typing import Any

INPUT_SHAPE = (28, 28, 1)
NUM_CLASSES = 10


def mnist_cnn(keras: Any) -> Any:
    """The CNN of the 'GPU vs TPU' Colab notebook, layer for layer."""
    layers = keras.layers
    return keras.Sequential(
        [
            keras.Input(INPUT_SHAPE),
            layers.Conv2D(64, kernel_size=2, padding="same", activation="relu"),
            layers.MaxPooling2D(pool_size=2),
            layers.Dropout(0.3),
            layers.Conv2D(32, kernel_size=2, padding="same", activation="relu"),
            layers.MaxPooling2D(pool_size=2),
            layers.Dropout(0.3),
            layers.Flatten(),
            layers.Dense(256, activation="relu"),
            layers.Dropout(0.5),
            layers.Dense(NUM_CLASSES, activation="softmax"),
        ],
        name="mnist_cnn",
    )


def mnist_mlp(keras: Any) -> Any:
    """The Dense-128 classifier of the GPU/TPU getting-started guides (their 784-vector input is the Flatten)."""
    layers = keras.layers
    return keras.Sequential(
        [
            keras.Input(INPUT_SHAPE),
            layers.Flatten(),
            layers.Dense(128, activation="relu"),
            layers.Dense(NUM_CLASSES, activation="softmax"),
        ],
        name="mnist_mlp",
    )


MODELS = {"mnist_cnn": mnist_cnn, "mnist_mlp": mnist_mlp}
# The models with Dropout layers (a test holds this to what the builders build): perf.py times the fused dropout
# kernel for these only, without building a model to find out.
DROPOUT_MODELS = frozenset({"mnist_cnn"})


def build_model(name: str, keras: Any) -> Any:
    return MODELS[name](keras)


def make_optimizer(name: str, learning_rate: float, keras: Any) -> Any:
    optimizers = {
        "adam": keras.optimizers.Adam,
        "sgd": keras.optimizers.SGD,
        "rmsprop": keras.optimizers.RMSprop,
    }
    return optimizers[name](learning_rate=learning_rate)
