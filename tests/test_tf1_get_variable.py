"""dpkeras.tf1._get_variable: create by name, or reuse (TF1 idiom 4); initializers and shapes."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from dpkeras.tf1 import (
    AUTO_REUSE,
    get_variable,
    variable_scope,
)
from tests.tf1_models import (
    L,
    _fresh_store,  # noqa: F401 (an autouse fixture)
    conv_relu,
    images,
)

# ---------------------------------------------------------------------------------------------
# Idiom 4: get_variable creates, or returns the existing variable when the scope reuses;
# calling a builder twice in one scope fails ("already exists").


def test_idiom4_get_variable_creates_then_reuses():
    with variable_scope("foo"):
        v = get_variable("v", [1])
    with variable_scope("foo", reuse=True):
        v1 = get_variable("v", [1])
    assert v1 is v
    assert isinstance(v, keras.Variable)
    assert v.path == "foo/v" and v.shape == (1,)


def test_idiom4_calling_a_builder_twice_in_one_scope_fails():
    x, _ = images()
    conv_relu(x, (3, 3, 3, 4), (4,))
    with pytest.raises(
        ValueError,
        match=r"'weights' already exists.*outside every "
        r"dpkeras.variable_scope.*reuse=True or dpkeras.AUTO_REUSE",
    ):
        conv_relu(x, (3, 3, 3, 4), (4,))


def test_idiom4_keras_layers_calling_get_variable_in_build_share_one_variable():
    class Scale(L.Layer):
        def build(self, input_shape):
            with variable_scope("shared", reuse=AUTO_REUSE):
                self.scale = get_variable("scale", (input_shape[-1],), initializer="ones")

        def call(self, x):
            return x * self.scale

    inputs = keras.Input((3,))
    first, second = Scale(name="first"), Scale(name="second")
    model = keras.Model(inputs, second(first(inputs)))
    assert first.scale is second.scale
    assert model.trainable_weights == [first.scale]
    model.compile(keras.optimizers.SGD(0.5), "mse")
    x = np.ones((4, 3), "float32")
    model.train_on_batch(x, np.zeros((4, 3), "float32"))
    # loss = mean_j (s_j^2 x_j)^2, so d/ds_j = 4/3 at s=1 and x=1: one SGD update of
    # 0.5 * 4/3 (a duplicated variable would get two and end at -1/3).
    np.testing.assert_allclose(first.scale.numpy(), [1 / 3] * 3, rtol=1e-6)


@pytest.mark.parametrize("initializer", [None, "zeros", keras.initializers.Ones()])
def test_error_get_variable_without_a_shape_or_a_value_initializer(initializer):
    with pytest.raises(
        ValueError,
        match=(
            r"get_variable\('model/w'\): the shape of a new variable must be known. Pass "
            r"shape=\.\.\., or an initializer that implies one.*Received: shape=None"
        ),
    ):
        with variable_scope("model"):
            get_variable("w", initializer=initializer)


def test_value_initializers_imply_or_fill_the_shape():
    a = get_variable("a", initializer=np.arange(6.0).reshape(2, 3))
    b = get_variable("b", (2, 2), initializer=0.5)
    c = get_variable("c", initializer=tf.ones((4,)))
    assert a.shape == (2, 3) and b.shape == (2, 2) and c.shape == (4,)
    np.testing.assert_allclose(b.numpy(), np.full((2, 2), 0.5))
    with pytest.raises(
        ValueError,
        match=r"get_variable\('d'\): the initializer value has "
        r"shape \(3,\) but shape=\(2,\) was given",
    ):
        get_variable("d", (2,), initializer=[1.0, 2.0, 3.0])
