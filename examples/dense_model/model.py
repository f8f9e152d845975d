"""The "Using GPU/TPU" guide's Dense-128 network as a model of yours for the built-in trainer (training.model:
model:build): built with the Keras the trainer hands it, so that one function serves TensorFlow and JAX."""


def build(input_shape, num_classes, keras):
    return keras.Sequential([
        keras.Input(input_shape),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(num_classes, activation="softmax"),
    ])
