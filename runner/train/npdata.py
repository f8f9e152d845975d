"""MNIST for the JAX engine: numpy batches through keras.utils.PyDataset, with the same guarantees as data.py.

  * An epoch's order is a pure function of (seed, epoch): numpy's RandomState, whose streams NumPy keeps
    unchanged across releases (NEP 19: the legacy generator is frozen; Generator's methods may change), so a job
    resumed mid-epoch, even in a newer image, skips exactly the batches it trained. It differs from TensorFlow's
    stateless_shuffle, so the checkpoint manifest names it (DataOrder.shuffle) and a mid-epoch checkpoint of one
    engine restarts that epoch under the other.
  * Static shapes: the last partial training batch is dropped, the test set is padded with weight-0 examples.
  * Multi-host: every process feeds its own slice of each global batch (rows [p*b/P, (p+1)*b/P) for process p of
    P), which keras.distribution puts together with jax.make_array_from_process_local_data; the global batches,
    and so the training, are the same whatever the number of hosts.

Speed: the pixels stay uint8; one gather and one uint8 -> float32 scaling per batch (x * (1/255), as data.py's
TensorFlow map does, so both engines see the same values). No TensorFlow here.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from runner.train.checkpoints import NUMPY_SHUFFLE

SHUFFLE = NUMPY_SHUFFLE


def _seed_words(*values: int) -> np.ndarray:
    """Non-negative integers of any size as the uint32 words RandomState takes, each value's length first."""
    words: list[int] = []
    for value in values:
        parts = []
        while True:
            parts.append(value & 0xFFFFFFFF)
            value >>= 32
            if not value:
                break
        words += [len(parts), *parts]
    return np.array(words, dtype=np.uint32)


def epoch_order(seed: int, epoch: int, examples: int, global_batch: int) -> np.ndarray:
    """The example indices of each of epoch `epoch`'s batches: shape (steps, global_batch)."""
    steps = examples // global_batch
    order = np.random.RandomState(_seed_words(seed, epoch)).permutation(examples)
    return order[: steps * global_batch].reshape(steps, global_batch)


def normalize(x: np.ndarray, scale: float = 1 / 255, expand: bool = True) -> np.ndarray:
    """float32, scaled (uint8 pixels by 1/255), with a channel axis for 2-D images: as data.py's TensorFlow feed."""
    out = x.astype(np.float32)
    if scale != 1.0:
        out *= np.float32(scale)
    return out[..., np.newaxis] if expand else out


def _share(global_batch: int, process: int, processes: int) -> slice:
    if global_batch % processes:
        raise ValueError(f"global batch {global_batch} does not split evenly over {processes} processes")
    size = global_batch // processes
    return slice(process * size, (process + 1) * size)


class TrainData:
    """The training set for keras' fit: `epoch(index, skip)` is a PyDataset of that epoch's batches after the
    first `skip` (this process's share of each)."""

    def __init__(
        self,
        keras: Any,
        x: np.ndarray,
        y: np.ndarray,
        global_batch: int,
        seed: int,
        process: int = 0,
        processes: int = 1,
        scale: float = 1 / 255,
        expand: bool = True,
    ) -> None:
        # Labels converted once, not per batch: class numbers as int32, one-hot rows as float32.
        self.keras, self.x = keras, x
        self.y = y.astype(np.int32) if y.ndim == 1 else y.astype(np.float32)
        self.scale, self.expand = scale, expand
        self.global_batch, self.seed = global_batch, seed
        self.steps = len(x) // global_batch
        self.share = _share(global_batch, process, processes)

    def batch(self, order: np.ndarray, step: int) -> tuple[np.ndarray, np.ndarray]:
        rows = order[step, self.share]
        return normalize(self.x[rows], self.scale, self.expand), self.y[rows]

    def epoch(self, index: int, skip: int = 0) -> Any:
        """Epoch `index` (0-based) without its first `skip` batches."""
        if not 0 <= skip < self.steps:
            raise ValueError(f"skip {skip} is outside an epoch of {self.steps} steps")
        order = epoch_order(self.seed, index, len(self.x), self.global_batch)
        return _batches(self.keras, self.steps - skip, lambda i: self.batch(order, skip + i))


def eval_data(
    keras: Any,
    x: np.ndarray,
    y: np.ndarray,
    global_batch: int,
    process: int = 0,
    processes: int = 1,
    scale: float = 1 / 255,
    expand: bool = True,
) -> Any:
    """Every test example exactly once: the last batch padded to full size with weight-0 examples. Normalized
    once, up front (the test set is small and read every epoch)."""
    steps = math.ceil(len(x) / global_batch)
    pad = steps * global_batch - len(x)
    weights = np.concatenate([np.ones(len(x), np.float32), np.zeros(pad, np.float32)])
    images = normalize(np.concatenate([x, np.zeros((pad, *x.shape[1:]), x.dtype)]), scale, expand)
    labels = np.concatenate([y, np.zeros((pad, *y.shape[1:]), y.dtype)])
    labels = labels.astype(np.int32) if labels.ndim == 1 else labels.astype(np.float32)
    share = _share(global_batch, process, processes)

    def batch(i: int) -> tuple[np.ndarray, ...]:
        rows = slice(i * global_batch, (i + 1) * global_batch)
        return tuple(a[rows][share] for a in (images, labels, weights))

    return _batches(keras, steps, batch)


def _batches(keras: Any, count: int, get: Any) -> Any:
    """A keras.utils.PyDataset of `count` batches, batch i being get(i). workers=1: Keras reads it in the
    training loop's own thread, in order (no enqueuer), which is enough: a batch costs about a millisecond."""

    class Batches(keras.utils.PyDataset):
        def __init__(self) -> None:
            super().__init__(workers=1, use_multiprocessing=False)

        def __len__(self) -> int:
            return count

        def __getitem__(self, index: int) -> Any:
            if not 0 <= index < count:
                raise IndexError(index)
            return get(index)

    return Batches()
