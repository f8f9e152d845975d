"""The published numbers of the public Colab 'GPU vs TPU' notebook, the reference every bench table shows.

It trained runner.train.models.mnist_cnn with a plain `model.fit(x_train, y_train, batch_size=...)` on numpy arrays,
on a K80 GPU and on a TPU v2-8: epoch time in seconds and per-example step time in microseconds, as Keras printed
them ("6s 94us/sample").
"""

from __future__ import annotations

from typing import NamedTuple


class Published(NamedTuple):
    label: str
    epoch_s: dict[int, int]  # batch size -> epoch time (s), whole seconds as published
    us_per_example: dict[int, int]  # batch size -> per-example step time (us)


NOTEBOOK_GPU = Published("notebook K80 GPU", {256: 6, 512: 5, 1024: 4}, {256: 94, 512: 82, 1024: 79})
NOTEBOOK_TPU = Published("notebook TPU v2-8", {256: 6, 512: 3, 1024: 2}, {256: 97, 512: 58, 1024: 37})
NOTEBOOK = (NOTEBOOK_GPU, NOTEBOOK_TPU)
BATCH_SIZES = (256, 512, 1024)
