# "Training Your Models on Cloud TPUs in 4 Easy Steps on Google Colab": original.py as the article describes it
# (its preprocessing as printed; its four steps, shown there as images, in the Colab form they describe), train.py
# as a runner job (diff -u original.py train.py).
import tensorflow as tf
from tensorflow.keras.datasets import mnist
from tensorflow.keras.utils import to_categorical
# This can be any dataset
(x_train, y_train), (x_test, y_test) = mnist.load_data()
x_train = x_train.reshape([x_train.shape[0], 784])
x_test = x_test.reshape([x_test.shape[0], 784])
x_train = x_train / 255
x_test = x_test / 255
y_train = to_categorical(y_train, 10)
y_test = to_categorical(y_test, 10)
print (x_train.shape, y_train.shape)
print (x_test.shape, y_test.shape)

# 1. Connect to an available TPU instance
tpu = tf.distribute.cluster_resolver.TPUClusterResolver()
tf.config.experimental_connect_to_cluster(tpu)
tf.tpu.experimental.initialize_tpu_system(tpu)

# 2. Initialize a distributed training strategy
strategy = tf.distribute.TPUStrategy(tpu)
print("We have", strategy.num_replicas_in_sync, "devices at our disposal")

# 3. Build our model under the said strategy
with strategy.scope():
    model = tf.keras.Sequential([
        tf.keras.layers.Dense(512, activation="relu", input_shape=(784,)),
        tf.keras.layers.Dropout(0.2),
        tf.keras.layers.Dense(10, activation="softmax"),
    ])
    model.compile(optimizer="adam", loss="categorical_crossentropy", metrics=["accuracy"])

# 4. Train the model and feel like a Wizard
model.fit(x_train, y_train, epochs=5, steps_per_epoch=50, validation_data=(x_test, y_test))
