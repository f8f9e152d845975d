"""The guide's data (training.data: data:load): MNIST flattened to 784 floats in [0, 1], as the guide prepares it."""

from runner.datasets import mnist


def load():
    (x_train, y_train), (x_test, y_test) = mnist.load_data()
    return x_train.reshape(-1, 784) / 255.0, y_train, x_test.reshape(-1, 784) / 255.0, y_test
