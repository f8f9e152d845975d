# examples/flax_mnist. original.py: a plain Flax NNX + Optax + Orbax MNIST trainer, as the Flax NNX MNIST tutorial
# writes one (an nnx.Module CNN, nnx.Optimizer with optax.adamw, nnx.jit train and eval steps, nnx.MultiMetric),
# with numpy batches and an Orbax CheckpointManager that resumes from its latest step. train.py: the same as a runner
# job, on one host or on every host of a pod slice (diff -u original.py train.py).
import argparse
import functools
import os

import numpy as np
import optax
import orbax.checkpoint as ocp
import tensorflow_datasets as tfds
from flax import nnx

parser = argparse.ArgumentParser()
parser.add_argument("--train-steps", type=int, default=1200)
parser.add_argument("--eval-every", type=int, default=200)
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--checkpoint-dir", default=os.path.abspath("checkpoints"))
args = parser.parse_args()

# MNIST as numpy arrays: images scaled to [0, 1], with a channel axis; int32 labels.
(x_train, y_train), (x_test, y_test) = tfds.as_numpy(
    tfds.load("mnist", split=["train", "test"], batch_size=-1, as_supervised=True)
)
x_train = x_train.reshape(-1, 28, 28, 1).astype(np.float32) / 255.0
x_test = x_test.reshape(-1, 28, 28, 1).astype(np.float32) / 255.0
y_train, y_test = y_train.astype(np.int32), y_test.astype(np.int32)
steps_per_epoch = len(x_train) // args.batch_size


@functools.lru_cache(maxsize=1)
def epoch_order(epoch):  # the same shuffle for an epoch whenever it is trained: a resumed run sees the same batches
    return np.random.default_rng(epoch).permutation(len(x_train))


def train_batch(step):
    epoch, i = divmod(step, steps_per_epoch)
    idx = epoch_order(epoch)[i * args.batch_size : (i + 1) * args.batch_size]
    return {"image": x_train[idx], "label": y_train[idx]}


class CNN(nnx.Module):
    """A simple CNN model."""

    def __init__(self, *, rngs: nnx.Rngs):
        self.conv1 = nnx.Conv(1, 32, kernel_size=(3, 3), rngs=rngs)
        self.conv2 = nnx.Conv(32, 64, kernel_size=(3, 3), rngs=rngs)
        self.avg_pool = functools.partial(nnx.avg_pool, window_shape=(2, 2), strides=(2, 2))
        self.linear1 = nnx.Linear(3136, 256, rngs=rngs)
        self.linear2 = nnx.Linear(256, 10, rngs=rngs)

    def __call__(self, x):
        x = self.avg_pool(nnx.relu(self.conv1(x)))
        x = self.avg_pool(nnx.relu(self.conv2(x)))
        x = x.reshape(x.shape[0], -1)  # flatten
        x = nnx.relu(self.linear1(x))
        x = self.linear2(x)
        return x


model = CNN(rngs=nnx.Rngs(0))
optimizer = nnx.Optimizer(model, optax.adamw(learning_rate=0.005, b1=0.9), wrt=nnx.Param)
metrics = nnx.MultiMetric(accuracy=nnx.metrics.Accuracy(), loss=nnx.metrics.Average("loss"))


def loss_fn(model: CNN, batch):
    logits = model(batch["image"])
    loss = optax.softmax_cross_entropy_with_integer_labels(logits=logits, labels=batch["label"]).mean()
    return loss, logits


@nnx.jit
def train_step(model: CNN, optimizer: nnx.Optimizer, metrics: nnx.MultiMetric, batch):
    """Train for a single step."""
    grad_fn = nnx.value_and_grad(loss_fn, has_aux=True)
    (loss, logits), grads = grad_fn(model, batch)
    metrics.update(loss=loss, logits=logits, labels=batch["label"])  # In-place updates.
    optimizer.update(model, grads)  # In-place updates.


@nnx.jit
def eval_step(model: CNN, metrics: nnx.MultiMetric, batch):
    loss, logits = loss_fn(model, batch)
    metrics.update(loss=loss, logits=logits, labels=batch["label"])  # In-place updates.


# Orbax: a checkpoint every eval_every steps, the newest 3 kept; a restart goes on from the latest one.
mngr = ocp.CheckpointManager(
    args.checkpoint_dir, options=ocp.CheckpointManagerOptions(max_to_keep=3, save_interval_steps=args.eval_every)
)
start = mngr.latest_step() or 0
if start:
    restored = mngr.restore(start, args=ocp.args.StandardRestore(nnx.state((model, optimizer))))
    nnx.update((model, optimizer), restored)
print(f"starting at step {start} of {args.train_steps}", flush=True)

for step in range(start, args.train_steps):
    train_step(model, optimizer, metrics, train_batch(step))
    mngr.save(step + 1, args=ocp.args.StandardSave(nnx.state((model, optimizer))))
    if (step + 1) % args.eval_every == 0 or step + 1 == args.train_steps:
        train_metrics = {f"train_{k}": float(v) for k, v in metrics.compute().items()}
        metrics.reset()
        for i in range(0, len(x_test) - 1023, 1024):
            eval_step(model, metrics, {"image": x_test[i : i + 1024], "label": y_test[i : i + 1024]})
        test_metrics = {f"test_{k}": float(v) for k, v in metrics.compute().items()}
        metrics.reset()
        print(f"step {step + 1}: {train_metrics} {test_metrics}", flush=True)

mngr.wait_until_finished()
print(f"done: {int(optimizer.step[...])} optimizer steps", flush=True)
