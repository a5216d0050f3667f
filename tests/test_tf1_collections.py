"""dpkeras.tf1._collections: slim's variables and the lists of them (TF1 idioms 7-10)."""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from dpkeras.tf1 import (
    AUTO_REUSE,
    LocalVariable,
    VariableStore,
    add_model_variable,
    get_local_variables,
    get_model_variables,
    get_variable,
    get_variables,
    local_variable,
    model_variable,
    regularization_losses,
    variable,
    variable_scope,
)
from tests.tf1_models import (
    INPUT_SHAPE,
    L,
    Towers,
    _fresh_store,  # noqa: F401 (an autouse fixture)
)

# ---------------------------------------------------------------------------------------------
# Idiom 7: slim.variable: one call sets the initializer, attaches an L2 regularizer whose loss
# is collected, and places the variable.


def test_idiom7_one_call_initializes_regularizes_and_places():
    weights = variable(
        "weights",
        shape=(10, 10, 3, 3),
        initializer=keras.initializers.TruncatedNormal(stddev=0.1, seed=1),
        regularizer=keras.regularizers.L2(0.05),
        device="/CPU:1",
    )
    assert weights.value.device.endswith("CPU:1")
    assert 0 < float(keras.ops.std(weights)) < 0.1
    (loss,) = regularization_losses()
    np.testing.assert_allclose(loss, 0.05 * np.sum(weights.numpy() ** 2), rtol=1e-5)
    assert get_variables() == [weights] and get_model_variables() == []


def test_idiom7_regularizer_loss_is_added_to_a_keras_models_loss_once():
    class Scaled(L.Layer):
        def build(self, input_shape):
            with variable_scope("net", reuse=AUTO_REUSE):
                self.w = variable(
                    "w", initializer=[3.0, 4.0], regularizer=keras.regularizers.L2(0.5)
                )

        def call(self, x):
            return x * self.w

    inputs = keras.Input((2,))
    model = keras.Model(inputs, Scaled(name="b")(Scaled(name="a")(inputs)))
    model(np.ones((1, 2), "float32"))
    assert [float(loss) for loss in model.losses] == [12.5]
    assert [float(loss) for loss in regularization_losses()] == [12.5]


# ---------------------------------------------------------------------------------------------
# Idiom 8: model variables (parameters) vs regular variables (global_step, moving averages);
# layers create model variables; add_model_variable registers custom ones.


def test_idiom8_model_variables_vs_regular_variables():
    with variable_scope("net"):
        weights = model_variable("weights", (3, 2))
        step = variable("global_step", (), dtype="int64", trainable=False)
        dense = L.Dense(2, name="fc")
        dense.build((None, 3))
    custom = keras.Variable(np.zeros(2), name="custom")
    add_model_variable(custom)
    assert get_model_variables() == [weights, dense.kernel, dense.bias, custom]
    assert get_variables() == [weights, step, dense.kernel, dense.bias, custom]
    assert step.dtype == "int64" and not step.trainable
    add_model_variable(step)  # a variable of the store becomes a model variable
    assert any(v is step for v in get_model_variables())


def test_idiom8_lists_filter_by_scope_path_and_model():
    with variable_scope("model") as scope:
        with variable_scope("conv1"):
            a = model_variable("w", (1,))
        with variable_scope("conv10"):
            b = model_variable("w", (1,))
    assert get_model_variables("model/conv1") == [a]
    assert get_model_variables(scope) == [a, b]
    assert get_variables("other") == []
    model = Towers()
    model.build(INPUT_SHAPE)
    assert get_model_variables(model) == [model.tower1.kernel, model.tower1.bias]
    # The model's variables are in its own store, not in the top-level one.
    assert not any(v is model.tower1.kernel for v in get_model_variables())


def test_idiom8_functional_model_lists_the_variables_it_was_built_with():
    with variable_scope("net"):
        inputs = keras.Input((3,))
        hidden = L.Dense(4, name="fc1")(inputs)
    outputs = L.Dense(1, name="out")(hidden)  # built outside the scope: not in the store
    model = keras.Model(inputs, outputs)
    assert [v.path for v in get_model_variables(model)] == ["net/fc1/kernel", "net/fc1/bias"]


# ---------------------------------------------------------------------------------------------
# Idiom 9: local variables live only for a session and are never saved.


class Counting(L.Layer):
    """A layer that counts the examples it has seen in a local variable."""

    def build(self, input_shape):
        with variable_scope("metrics"):
            self.seen = local_variable("seen", (), dtype="float32")
        self.w = self.add_weight(shape=(input_shape[-1],), initializer="ones", name="w")

    def call(self, x):
        self.seen.assign_add(keras.ops.cast(keras.ops.shape(x)[0], "float32"))
        return x * self.w


def test_idiom9_local_variables_are_usable_and_listed_apart():
    total = local_variable("total", initializer=0.0)
    assert isinstance(total, LocalVariable) and not total.trainable
    total.assign_add(2.5)
    assert float(total + 1.0) == 3.5 and float(keras.ops.add(total, 1.0)) == 3.5
    assert float(tf.function(lambda: total * 2.0)()) == 5.0
    assert get_local_variables() == [total]
    assert get_variables() == [] and get_model_variables() == []
    with pytest.raises(ValueError, match=r"'total' is a local variable.*model_variable"):
        add_model_variable(total)


def test_idiom9_local_variables_are_never_saved(tmp_path):
    inputs = keras.Input((2,))
    layer = Counting(name="counting")
    model = keras.Model(inputs, layer(inputs))
    assert model.weights == [layer.w]  # the local variable is not a weight
    model(np.ones((3, 2), "float32"))
    assert float(layer.seen.numpy()) == 3.0

    saved = tf.train.Checkpoint(model=model).write(os.path.join(tmp_path, "ckpt"))
    layer.seen.assign(7.0)
    tf.train.Checkpoint(model=model).read(saved).assert_existing_objects_matched()
    assert float(layer.seen.numpy()) == 7.0  # not restored: it was not saved
    assert not any("seen" in name for name, _ in tf.train.list_variables(saved))

    path = os.path.join(tmp_path, "counting.keras")
    model.save(path)
    # A functional model's layers use the top-level store: load it into a fresh one.
    with VariableStore():
        loaded = keras.models.load_model(path, custom_objects={"Counting": Counting})
    assert [w.path for w in loaded.weights] == ["counting/w"]
    assert float(loaded.get_layer("counting").seen.numpy()) == 0.0


# ---------------------------------------------------------------------------------------------
# Idiom 10: collections: global (get_variables), trainable, local; trainable=False.


def test_idiom10_global_trainable_and_local_collections():
    with variable_scope("net"):
        w = get_variable("w", (2,))
        frozen = get_variable("frozen", (2,), trainable=False)
        scratch = local_variable("scratch", (2,))
    assert get_variables() == [w, frozen]
    assert [v for v in get_variables() if v.trainable] == [w]
    assert get_local_variables() == [scratch]
