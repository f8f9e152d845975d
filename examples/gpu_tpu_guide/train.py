# The "Using GPU/TPU" guide: original.py as published, train.py as a runner job (diff -u original.py train.py).
import tensorflow as tf
from runner.datasets import mnist
from runner.train import keras_callbacks, resolve_strategy

resolved = resolve_strategy()  # TPU (tpu="local" on a TPU VM), else GPUs, else the default strategy; never a
strategy = resolved.strategy  # quiet CPU fallback on a machine whose TPU does not answer, as `except ValueError` was
print("Running on", resolved.describe())

with strategy.scope():
    model = tf.keras.Sequential([
        tf.keras.layers.Dense(128, activation='relu', input_shape=(784,)),
        tf.keras.layers.Dense(10, activation='softmax')
    ])

    model.compile(optimizer='adam',
                  loss='sparse_categorical_crossentropy',
                  metrics=['accuracy'])

# Load MNIST dataset
(x_train, y_train), (x_test, y_test) = mnist.load_data()
x_train = x_train.reshape(-1, 784) / 255.0
x_test = x_test.reshape(-1, 784) / 255.0

# Train the model (runs on GPU if available)
model.fit(x_train, y_train, epochs=5, batch_size=64, callbacks=keras_callbacks())
