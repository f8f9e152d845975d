"""A user's own Keras training script, as a `command` job runs it: a small dense model on a slice of real MNIST,
with no runner callback. Keras prints every epoch (and the test evaluation) to the job's log; that is all the
runner gets. Knobs (environment): TF_USE_LEGACY_KERAS=1 (tf_keras instead of Keras 3), FIT_VERBOSE (1 or 2),
TRAIN_EXAMPLES, EPOCHS, and RUNNER_CHECKPOINT_DIR (set in a run: one .keras file per epoch, Keras'
ModelCheckpoint)."""

import os

from runner.datasets import load_dataset

if os.environ.get("TF_USE_LEGACY_KERAS") == "1":
    import tf_keras as keras
else:
    import keras

keras.utils.set_random_seed(0)
verbose = int(os.environ.get("FIT_VERBOSE", "1"))
n = int(os.environ.get("TRAIN_EXAMPLES", "2048"))
x_train, y_train, x_test, y_test = load_dataset("mnist")
x = x_train[:n].reshape(n, 784).astype("float32") / 255.0
y = y_train[:n]
xt = x_test[:1000].reshape(1000, 784).astype("float32") / 255.0
yt = y_test[:1000]

model = keras.Sequential(
    [keras.Input((784,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10, activation="softmax")]
)
model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
callbacks = []
if os.environ.get("RUNNER_CHECKPOINT_DIR"):
    path = os.path.join(os.environ["RUNNER_CHECKPOINT_DIR"], "model-{epoch:02d}.keras")
    callbacks.append(keras.callbacks.ModelCheckpoint(path))
epochs = int(os.environ.get("EPOCHS", "3"))
model.fit(x, y, epochs=epochs, batch_size=64, validation_split=0.1, verbose=verbose, callbacks=callbacks)
model.evaluate(xt, yt, verbose=verbose)
