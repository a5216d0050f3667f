"""Shared by the tests of dpkeras.tf1: the seed's towers as a model, its reference, a fresh store.

Each test module of the TF1 layer imports `_fresh_store` (an autouse fixture) so that every test
uses its own top-level variable store.
"""

import keras
import numpy as np
import pytest

from dpkeras.tf1 import VariableStore, get_variable, variable_scope

L = keras.layers

INPUT_SHAPE = (None, 6, 6, 3)


@pytest.fixture(autouse=True)
def _fresh_store():
    """Each test uses its own top-level variable store."""
    with VariableStore() as store:
        yield store


def images(n=8, seed=0):
    rng = np.random.RandomState(seed)
    return rng.rand(n, 6, 6, 3).astype("float32"), rng.rand(n, 1).astype("float32")


@keras.saving.register_keras_serializable(package="test_variable_scope")
class Towers(keras.Model):
    """The seed example as a Keras 3 model: two towers, each a Conv2D named 'Layer'.

    The second tower is built under `reuse=True` (and each tower in its own name scope), so it
    uses the first tower's kernel and bias.
    """

    def __init__(self, regularizer=None, **kwargs):
        super().__init__(**kwargs)
        self.regularizer = regularizer
        self.tower1 = L.Conv2D(4, 3, name="Layer", kernel_regularizer=regularizer)
        self.tower2 = L.Conv2D(4, 3, name="Layer", kernel_regularizer=regularizer)
        self.head = L.Dense(1, name="head")

    def build(self, input_shape):
        with keras.name_scope("Replica1"), variable_scope("towers") as scope:
            self.tower1.build(input_shape)
        with keras.name_scope("Replica2"), variable_scope(scope, reuse=True):
            self.tower2.build(input_shape)
        self.head.build((None, 4))

    def call(self, x):
        y = self.tower1(x) + self.tower2(x * 2.0)
        return self.head(keras.ops.mean(y, axis=(1, 2)))

    def get_config(self):
        config = super().get_config()
        config["regularizer"] = keras.regularizers.serialize(self.regularizer)
        return config

    @classmethod
    def from_config(cls, config):
        config["regularizer"] = keras.regularizers.deserialize(config["regularizer"])
        return cls(**config)


class OneLayerTwice(keras.Model):
    """The reference: the same computation with one Conv2D object called twice."""

    def __init__(self, regularizer=None, **kwargs):
        super().__init__(**kwargs)
        self.conv = L.Conv2D(4, 3, name="Layer", kernel_regularizer=regularizer)
        self.head = L.Dense(1, name="head")

    def call(self, x):
        y = self.conv(x) + self.conv(x * 2.0)
        return self.head(keras.ops.mean(y, axis=(1, 2)))


def reference_like(towers, regularizer=None):
    """A built OneLayerTwice with the weights of `towers`."""
    reference = OneLayerTwice(regularizer=regularizer)
    reference(np.zeros((1, 6, 6, 3), "float32"))
    for mine, theirs in [
        (reference.conv.kernel, towers.tower1.kernel),
        (reference.conv.bias, towers.tower1.bias),
        (reference.head.kernel, towers.head.kernel),
        (reference.head.bias, towers.head.bias),
    ]:
        mine.assign(theirs)
    return reference


def assert_towers_share(model):
    assert model.tower2.kernel is model.tower1.kernel
    assert model.tower2.bias is model.tower1.bias
    assert len(model.trainable_weights) == 4  # kernel, bias, head kernel, head bias


def assert_same_weights(model, reference):
    pairs = [
        (model.tower1.kernel, reference.conv.kernel),
        (model.tower1.bias, reference.conv.bias),
        (model.head.kernel, reference.head.kernel),
        (model.head.bias, reference.head.bias),
    ]
    for mine, theirs in pairs:
        np.testing.assert_allclose(mine.numpy(), theirs.numpy(), rtol=1e-6, atol=1e-7)


def conv_relu(x, kernel_shape, bias_shape):
    """The TF1 guide's builder: weights and biases by get_variable."""
    weights = get_variable("weights", kernel_shape, initializer="random_normal")
    biases = get_variable("biases", bias_shape, initializer="zeros")
    conv = keras.ops.conv(x, weights, strides=1, padding="same")
    return keras.ops.relu(conv + biases)
