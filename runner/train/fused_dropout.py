"""Dropout fused by XLA into one kernel, for Keras 3 on TensorFlow on a CPU (a perf.py choice, calibrated).

Keras' dropout on TensorFlow draws a float per element with Philox (one pass writing the random tensor), compares
it with the rate (another), then scales and selects (two more), and the gradient reads the stored mask back. On a
CPU every pass is memory traffic: for the notebook's CNN at batch 1024 (12.8M + 1.6M + 0.26M elements per step)
the three dropouts took 57 of 247 ms per step on the Zen 4. Here one XLA kernel draws the Philox bits in registers,
compares them with the rate as 32-bit integers and writes the output once (its gradient is another such kernel).
XLA compiles only these: the convolutions stay on oneDNN (XLA's CPU convolutions are why XLA for the whole model
measured 0.57x, perf.jit_compile).

The model does not change: the layers stay keras.layers.Dropout (checkpoints hold nothing of this, so any
checkpoint resumes under either choice), only how each layer draws its mask does. A unit is kept with probability
exactly 1 - rate (to 2**-32) and scaled by 1 / (1 - rate), as Keras does; the random stream differs from Keras'
own, as it already differs between Keras' engines.
"""

from __future__ import annotations

from typing import Any

WORD = 2**32


def _threshold(rate: float) -> int:
    """Keep a unit when its 32-bit draw is at least this: P(keep) = 1 - rate to within 2**-32."""
    return min(WORD - 1, round(rate * WORD))


def make_dropout(tf: Any, rate: float) -> Any:
    """dropout(x, seed) for one rate: x's units kept with probability 1 - rate and scaled, the mask drawn from
    `seed` (an int32 pair) inside the kernel. TensorFlow differentiates it into a second XLA kernel. (A
    custom gradient that redraws the mask from the seed instead measured 0.64x Keras' dropout: slower, not faster.)"""
    threshold = _threshold(rate)
    scale = 1.0 / (1.0 - rate)

    @tf.function(jit_compile=True)
    def dropout(x: Any, seed: Any) -> Any:
        bits = tf.random.stateless_uniform(tf.shape(x), seed=seed, minval=None, maxval=None, dtype=tf.uint32)
        return tf.where(bits >= tf.constant(threshold, tf.uint32), x * tf.cast(scale, x.dtype), tf.zeros_like(x))

    return dropout


def dropout_layers(model: Any, tf: Any) -> list[Any]:
    """The model's keras.layers.Dropout layers, nested ones too."""
    found, stack = [], [model]
    while stack:
        layer = stack.pop()
        if isinstance(layer, tf.keras.layers.Dropout):
            found.append(layer)
        stack.extend(getattr(layer, "layers", []) or [])
    return found


def fuse_dropout(model: Any, tf: Any) -> int:
    """Make every Dropout layer of `model` draw its mask with the fused kernel; returns how many layers changed.
    Call before the model's first fit or train_on_batch, which trace the step."""
    changed = 0
    for layer in dropout_layers(model, tf):
        if layer.noise_shape is not None or not 0 < layer.rate < 1:
            continue  # a noise_shape shares the mask across axes, which Keras' own kernel does
        # An instance attribute, not a subclass: what the model saves stays a plain Dropout layer.
        object.__setattr__(layer, "call", _FusedCall(layer, tf))
        changed += 1
    return changed


class _FusedCall:
    """One Dropout layer's call, with the fused kernel."""

    def __init__(self, layer: Any, tf: Any) -> None:
        self.layer, self.tf = layer, tf
        self.dropout = make_dropout(tf, float(layer.rate))

    def __call__(self, inputs: Any, training: bool = False) -> Any:
        if not training:
            return inputs
        seed = self.layer.seed_generator.next()  # the layer's own seed stream, advanced as Keras' dropout does
        return self.dropout(inputs, self.tf.cast(self.tf.math.floormod(seed, 2**31 - 1), self.tf.int32))


def fused_layers(model: Any, tf: Any) -> int:
    """How many of the model's Dropout layers draw their masks with the fused kernel."""
    return sum(1 for layer in dropout_layers(model, tf) if isinstance(vars(layer).get("call"), _FusedCall))
