"""Name-keyed variable scopes: TF1 idioms 2-10 of TF1_IDIOMS.md, each from its example.

Also: sharing is real (one entry in `trainable_weights`, one set of optimizer slots, Adam step
for step equal to one layer called twice), survives `.keras` files and checkpoints, works for
lazily built subclassed models or fails saying to build them inside the scope, and every error
names the full path and what is valid.
"""

import contextlib
import importlib
import os
import re
import threading

import keras
import numpy as np
import pytest
import tensorflow as tf

from dpkeras.variable_collections import (
    LocalVariable,
    add_model_variable,
    get_local_variables,
    get_model_variables,
    get_variables,
    local_variable,
    model_variable,
    regularization_losses,
    variable,
)
from dpkeras.variable_store import (
    AUTO_REUSE,
    VariableScope,
    VariableStore,
    get_variable,
    get_variable_store,
    variable_scope,
)

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


# ---------------------------------------------------------------------------------------------
# Idiom 2: the seed example. Replica 1 builds conv2d(name='Layer', reuse=False), replica 2 the
# same layer with reuse=True and gets its kernel and bias, each replica in its own name scope.


@pytest.mark.parametrize("name_scope", [tf.name_scope, keras.name_scope])
def test_idiom2_second_tower_uses_first_towers_kernel_and_bias(name_scope):
    x1, _ = images(seed=1)
    x2, _ = images(seed=2)
    with name_scope("Replica1"), variable_scope("towers") as scope:
        tower1 = L.Conv2D(4, 3, name="Layer")
        y1 = tower1(x1)
    with name_scope("Replica2"), variable_scope(scope, reuse=True):
        tower2 = L.Conv2D(4, 3, name="Layer")
        y2 = tower2(x2)
    assert tower2.kernel is tower1.kernel and tower2.bias is tower1.bias
    assert [w.path for w in tower2.weights] == ["towers/Layer/kernel", "towers/Layer/bias"]
    np.testing.assert_allclose(tower2(x1), y1, rtol=1e-6)
    assert not np.allclose(y1, y2)
    assert get_variable_store().paths() == ["towers/Layer/kernel", "towers/Layer/bias"]


def test_idiom2_model_with_both_towers_lists_each_shared_variable_once():
    model = Towers()
    model.build(INPUT_SHAPE)
    assert_towers_share(model)
    assert [w.path for w in model.tower1.weights] == ["towers/Layer/kernel", "towers/Layer/bias"]
    assert get_model_variables(model) == [model.tower1.kernel, model.tower1.bias]
    # A second instance has its own variables: stores are per model being built.
    other = Towers()
    other.build(INPUT_SHAPE)
    assert other.tower1.kernel is not model.tower1.kernel
    assert_towers_share(other)


def test_idiom2_adam_training_equals_one_layer_called_twice_step_for_step():
    x, y = images()
    model = Towers()
    model.build(INPUT_SHAPE)
    reference = reference_like(model)
    model.compile(keras.optimizers.Adam(0.05), "mse")
    reference.compile(keras.optimizers.Adam(0.05), "mse")
    for _ in range(3):
        loss = model.train_on_batch(x, y)
        reference_loss = reference.train_on_batch(x, y)
        np.testing.assert_allclose(loss, reference_loss, rtol=1e-6)
        assert_same_weights(model, reference)
    assert_towers_share(model)
    # One set of slots: iterations, learning rate, and 2 per trainable variable.
    assert len(model.optimizer.variables) == len(reference.optimizer.variables) == 10


def test_idiom2_shared_regularizer_counts_once_in_the_model_loss():
    regularizer = keras.regularizers.L2(0.1)
    model = Towers(regularizer=regularizer)
    model.build(INPUT_SHAPE)
    x, y = images()
    model(x)
    reference = reference_like(model, regularizer=regularizer)
    reference(x)
    assert len(model.losses) == len(reference.losses) == 1
    np.testing.assert_allclose(model.losses[0], reference.losses[0], rtol=1e-6)
    assert len(regularization_losses(model)) == 1


def test_idiom2_keras_file_round_trip_keeps_the_sharing(tmp_path):
    x, y = images()
    model = Towers()
    model.build(INPUT_SHAPE)
    model.compile(keras.optimizers.Adam(0.05), "mse")
    model.train_on_batch(x, y)
    path = os.path.join(tmp_path, "towers.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    assert_towers_share(loaded)
    assert loaded.tower1.kernel is not model.tower1.kernel
    np.testing.assert_allclose(loaded.predict(x, verbose=0), model.predict(x, verbose=0))
    assert len(loaded.optimizer.variables) == 10
    # Training continues identically from the loaded state.
    model.train_on_batch(x, y)
    loaded.train_on_batch(x, y)
    np.testing.assert_allclose(
        loaded.tower2.kernel.numpy(), model.tower1.kernel.numpy(), rtol=1e-6, atol=1e-7
    )


@pytest.mark.parametrize("kind", ["checkpoint", "weights_h5"])
def test_idiom2_checkpoints_keep_the_sharing(tmp_path, kind):
    x, _ = images()
    model = Towers()
    model.build(INPUT_SHAPE)
    model.tower1.kernel.assign(model.tower1.kernel * 3.0)
    restored = Towers()
    restored.build(INPUT_SHAPE)
    if kind == "checkpoint":
        saved = tf.train.Checkpoint(model=model).write(os.path.join(tmp_path, "ckpt"))
        tf.train.Checkpoint(model=restored).read(saved).assert_existing_objects_matched()
    else:
        path = os.path.join(tmp_path, "towers.weights.h5")
        model.save_weights(path)
        restored.load_weights(path)
    assert_towers_share(restored)
    np.testing.assert_allclose(restored(x), model(x), rtol=1e-6)


def test_idiom2_subclassed_model_built_lazily_inside_fit_shares():
    # Without a strategy, Keras builds an unbuilt model while tracing the first train step,
    # and build() enters the scopes there.
    x, y = images()
    model = Towers()
    model.compile(keras.optimizers.SGD(0.1), "mse")
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert_towers_share(model)


def test_idiom2_model_built_lazily_inside_fit_within_an_outer_scope_shares():
    # fit() traces its first step in a tf.function, whose variable creator sits above the
    # creators entered before the trace: the scopes build() enters must still be in charge.
    x, y = images()
    model = Towers()
    model.compile(keras.optimizers.SGD(0.1), "mse")
    with variable_scope("outer"):
        model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert_towers_share(model)
    assert model.tower1.kernel.path == "outer/towers/Layer/kernel"


def test_fit_of_an_unbuilt_model_without_build_inside_a_scope_fails_instead_of_not_sharing():
    # Keras builds such a model symbolically and creates its variables afterwards, when the
    # layers that declared them are no longer known: sharing by name is impossible there.
    class Unbuildable(keras.Model):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.tower1 = L.Dense(2, name="Layer")
            self.tower2 = L.Dense(2, name="Layer")

        def call(self, x):
            return self.tower1(x) + self.tower2(x)

    model = Unbuildable(name="two")
    model.compile(keras.optimizers.SGD(0.1), "mse")
    expected = (
        r"variable_scope\('towers'\): Keras created weights "
        r"\['towers/two/Layer/kernel'.*not shared by name.*Build the model inside the "
        r"scope before training"
    )
    with pytest.warns(RuntimeWarning, match=expected), pytest.raises(RuntimeError, match=expected):
        with variable_scope("towers", reuse=AUTO_REUSE):
            model.fit(np.ones((4, 3)), np.ones((4, 2)), verbose=0)
    assert model.tower1.kernel.value is not model.tower2.kernel.value  # never half-shared
    assert get_variable_store().paths() == []

    # Under a strategy, fit() builds the model before tracing, outside any layer call.
    with tf.distribute.OneDeviceStrategy("/cpu:0").scope():
        model = Unbuildable(name="two")
        model.compile(keras.optimizers.SGD(0.1), "mse")
    with pytest.warns(RuntimeWarning, match=expected), pytest.raises(RuntimeError, match=expected):
        with variable_scope("towers", reuse=AUTO_REUSE):
            model.fit(np.ones((4, 3)), np.ones((4, 2)), verbose=0)
    assert model.tower1.kernel.value is not model.tower2.kernel.value


@pytest.mark.parametrize("strategy", [None, "one_device"])
def test_fit_of_a_built_model_inside_a_scope_is_fine(strategy, recwarn):
    # Metrics and optimizer state are created during fit (symbolically under a strategy):
    # they are not layer weights and must not trip the checks for late layer weights.
    x, y = images()
    context = (
        tf.distribute.OneDeviceStrategy("/cpu:0").scope() if strategy else contextlib.nullcontext()
    )
    with context:
        model = Towers()
        model.build(INPUT_SHAPE)
        model.compile(keras.optimizers.Adam(0.01), "mse", metrics=["mae"])
    with variable_scope("outer", reuse=AUTO_REUSE):
        model.fit(x, y, batch_size=8, epochs=2, verbose=0)
        model.evaluate(x, y, verbose=0)
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]
    assert_towers_share(model)


def test_model_without_build_method_shares_when_first_called_on_data():
    class CallScoped(keras.Model):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.tower1 = L.Conv2D(4, 3, name="Layer")
            self.tower2 = L.Conv2D(4, 3, name="Layer")

        def call(self, x):
            with variable_scope("towers") as scope:
                a = self.tower1(x)
            with variable_scope(scope, reuse=True):
                b = self.tower2(x)
            return keras.ops.mean(a + b, axis=(1, 2, 3))

    x, y = images()
    model = CallScoped()
    model(x)
    assert model.tower1.kernel is model.tower2.kernel
    assert len(model.trainable_weights) == 2
    model.compile(keras.optimizers.SGD(0.1), "mse")
    model.fit(x, y[:, 0], batch_size=8, verbose=0)  # the call-time scopes trace fine

    # Built lazily by fit (no strategy): a symbolic attempt is stopped before it declares
    # anything, then the traced step builds the towers inside the scopes.
    lazy = CallScoped()
    lazy.compile(keras.optimizers.SGD(0.1), "mse")
    lazy.fit(x, y[:, 0], batch_size=8, verbose=0)
    assert lazy.tower1.kernel is lazy.tower2.kernel
    assert len(lazy.trainable_weights) == 2


def test_a_built_model_with_scopes_in_call_nests_in_a_new_sequential_model():
    class CallScoped(keras.Model):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.tower1 = L.Dense(4, name="Layer")
            self.tower2 = L.Dense(4, name="Layer")

        def call(self, x):
            with variable_scope("towers") as scope:
                a = self.tower1(x)
            with variable_scope(scope, reuse=True):
                b = self.tower2(x)
            return a + b

    inner = CallScoped()
    inner(np.ones((2, 3), "float32"))
    # The new Sequential traces `inner` symbolically while it is itself unbuilt: the scopes
    # must not object, as `inner` creates nothing.
    outer = keras.Sequential([keras.Input((3,)), inner, L.Dense(1)])
    outer.compile(keras.optimizers.SGD(0.1), "mse")
    outer.fit(np.ones((4, 3)), np.ones((4, 1)), verbose=0)
    assert len(outer.trainable_weights) == 4


def test_model_built_lazily_under_a_strategy_fails_saying_to_build_inside_the_scope():
    # Under a strategy, fit() builds an unbuilt model symbolically (a Keras StatelessScope),
    # where Keras creates variables only after the scope has exited.
    x, y = images()
    with tf.distribute.OneDeviceStrategy("/cpu:0").scope():
        model = Towers()
        model.compile(keras.optimizers.SGD(0.1), "mse")
    with pytest.raises(
        RuntimeError,
        match=r"variable_scope\('towers'\).*symbolically.*"
        r"Build the model inside the scope.*model\.build\(input_shape\)",
    ):
        model.fit(x, y, verbose=0)


def test_layer_built_by_tracing_inside_a_scope_fails_instead_of_not_sharing():
    # A layer without build() is built by tracing call(); when Keras cannot trace it, it marks
    # it built and the next symbolic call declares the sublayer's variables too late.
    class Block(L.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.conv = L.Conv2D(4, 3, name="conv")

        def call(self, x):
            with variable_scope("block"):
                return self.conv(x)

    with pytest.warns(UserWarning), pytest.raises(RuntimeError, match=r"block/conv/kernel"):
        Block(name="b")(keras.Input((6, 6, 3)))


# ---------------------------------------------------------------------------------------------
# Idiom 3: slim's form, tf.variable_scope('Layer', reuse=...) + fully_connected(scope=scope).


def test_idiom3_slim_layers_in_a_reused_scope_share():
    x = np.random.RandomState(0).rand(4, 5).astype("float32")
    outputs = []
    layers = []
    for replica, reuse in enumerate([False, True]):
        with tf.name_scope(f"Replica{replica}"), variable_scope("Layer", reuse=reuse):
            layer = L.Dense(3, name="fully_connected")
            outputs.append(layer(x))
            layers.append(layer)
    assert layers[1].kernel is layers[0].kernel
    np.testing.assert_allclose(outputs[0], outputs[1])
    paths = [v.path for v in get_model_variables()]
    assert paths == ["Layer/fully_connected/kernel", "Layer/fully_connected/bias"]


# ---------------------------------------------------------------------------------------------
# Idiom 4: get_variable creates, or returns the existing variable when the scope reuses;
# calling a builder twice in one scope fails ("already exists").


def conv_relu(x, kernel_shape, bias_shape):
    """The TF1 guide's builder: weights and biases by get_variable."""
    weights = get_variable("weights", kernel_shape, initializer="random_normal")
    biases = get_variable("biases", bias_shape, initializer="zeros")
    conv = keras.ops.conv(x, weights, strides=1, padding="same")
    return keras.ops.relu(conv + biases)


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


# ---------------------------------------------------------------------------------------------
# Idiom 5: variable_scope prefixes names, so one builder makes distinct variables per scope.


def test_idiom5_scopes_prefix_names_and_nest():
    x, _ = images()
    with variable_scope("model"):
        with variable_scope("conv1"):
            relu1 = conv_relu(x, (3, 3, 3, 4), (4,))
        with variable_scope("conv2"):
            conv_relu(relu1, (3, 3, 4, 4), (4,))
    assert get_variable_store().paths() == [
        "model/conv1/weights",
        "model/conv1/biases",
        "model/conv2/weights",
        "model/conv2/biases",
    ]
    with variable_scope("model/conv1", reuse=True) as scope:
        assert scope.name == "model/conv1"
        assert get_variable("weights").path == "model/conv1/weights"


# ---------------------------------------------------------------------------------------------
# Idiom 6: sharing a whole model: reuse=True around a second call, scope.reuse_variables(),
# re-entering the scope object, and AUTO_REUSE.


def image_filter(x):
    with variable_scope("conv1"):
        relu1 = conv_relu(x, (3, 3, 3, 4), (4,))
    with variable_scope("conv2"):
        return conv_relu(relu1, (3, 3, 4, 4), (4,))


def test_idiom6_reuse_true_around_a_second_call():
    x1, _ = images(seed=1)
    with variable_scope("model"):
        out1 = image_filter(x1)
    with variable_scope("model", reuse=True):
        out2 = image_filter(x1)
    np.testing.assert_allclose(out1, out2)
    assert len(get_variable_store()) == 4


def test_idiom6_reuse_variables_inside_the_first_scope():
    x1, _ = images(seed=1)
    with variable_scope("model") as scope:
        out1 = image_filter(x1)
        assert scope.reuse is False
        scope.reuse_variables()
        assert scope.reuse is True
        out2 = image_filter(x1)
    np.testing.assert_allclose(out1, out2)


def test_idiom6_reentering_the_scope_object_anywhere():
    x1, _ = images(seed=1)
    with variable_scope("model") as model_scope:
        out1 = image_filter(x1)
    with variable_scope("elsewhere"):
        with variable_scope(model_scope, reuse=True) as scope:
            assert isinstance(scope, VariableScope)
            assert scope.name == "model"  # the object's full path, not elsewhere/model
            out2 = image_filter(x1)
    np.testing.assert_allclose(out1, out2)


def test_idiom6_auto_reuse_creates_when_missing_and_reuses_otherwise():
    def counter():
        with variable_scope("counters", reuse=AUTO_REUSE):
            return get_variable("count", (), initializer=0.0)

    first = counter()
    assert counter() is first
    with variable_scope("counters", reuse=tf.compat.v1.AUTO_REUSE) as scope:
        assert scope.reuse is AUTO_REUSE
        assert get_variable("count", ()) is first
    assert repr(AUTO_REUSE) == "dpkeras.AUTO_REUSE"


def test_idiom6_reuse_is_inherited_by_inner_scopes():
    with variable_scope("outer", reuse=AUTO_REUSE):
        with variable_scope("inner") as inner:
            assert inner.reuse is AUTO_REUSE
    with variable_scope("top") as top:
        top.reuse_variables()
        with variable_scope("child") as child:
            assert child.reuse is True
    with variable_scope(top) as reentered:  # reuse=None: the scope object's reuse
        assert reentered.reuse is True
    with variable_scope(top, reuse=False) as explicit:
        assert explicit.reuse is False


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


# ---------------------------------------------------------------------------------------------
# Errors: each names the full path and what is valid.


def test_error_reusing_a_variable_that_does_not_exist_lists_close_names():
    with variable_scope("model/conv1"):
        get_variable("weights", (2,))
        get_variable("biases", (2,))
    with pytest.raises(
        ValueError,
        match=(
            r"get_variable\('model/conv1/weight'\): variable 'model/conv1/weight' does not "
            r"exist, and scope 'model/conv1' has reuse=True.*Close names: "
            r"'model/conv1/weights'.*reuse=dpkeras.AUTO_REUSE"
        ),
    ):
        with variable_scope("model/conv1", reuse=True):
            get_variable("weight", (2,))


def test_error_reusing_a_layer_weight_that_does_not_exist_names_the_layer_and_path():
    with variable_scope("towers"):
        L.Conv2D(4, 3, name="Layer").build(INPUT_SHAPE)
    with pytest.raises(
        ValueError,
        match=(
            r"Keras layer 'Layr' \(Conv2D\) creating weight 'kernel': variable 'towers/Layr/kernel'"
            r" does not exist.*Close names: 'towers/Layer/kernel'"
        ),
    ):
        with variable_scope("towers", reuse=True):
            L.Conv2D(4, 3, name="Layr").build(INPUT_SHAPE)


def test_error_creating_a_variable_that_exists_without_reuse():
    with variable_scope("model"):
        get_variable("w", (2, 3))
    with pytest.raises(
        ValueError,
        match=(
            r"variable 'model/w' already exists \(shape \(2, 3\), float32\), and scope 'model' "
            r"has reuse=False.*reuse=True or dpkeras.AUTO_REUSE"
        ),
    ):
        with variable_scope("model"):
            get_variable("w", (2, 3))


def test_error_creating_a_layer_weight_that_exists_hints_at_explicit_reuse_false():
    with variable_scope("model"), variable_scope("towers"):
        L.Conv2D(4, 3, name="Layer").build(INPUT_SHAPE)
    with pytest.raises(
        ValueError,
        match=(
            r"creating weight 'kernel': variable 'model/towers/Layer/kernel' already exists.*"
            r"enclosing scope 'model' has reuse=True.*pass reuse=None to inherit"
        ),
    ):
        with variable_scope("model", reuse=True), variable_scope("towers", reuse=False):
            L.Conv2D(4, 3, name="Layer").build(INPUT_SHAPE)


@pytest.mark.parametrize("builder", ["get_variable", "layer"])
def test_error_reusing_with_another_shape(builder):
    with variable_scope("model"):
        if builder == "get_variable":
            get_variable("w", (3, 3))
        else:
            L.Dense(3, name="fc").build((None, 3))
    expected = r"'model/w' with shape \(3, 4\): it was created with shape \(3, 3\)"
    if builder == "layer":
        expected = r"'model/fc/kernel' with shape \(3, 4\): it was created with shape \(3, 3\)"
    with pytest.raises(ValueError, match=expected + r".*keeps the shape and dtype"):
        with variable_scope("model", reuse=True):
            if builder == "get_variable":
                get_variable("w", (3, 4))
            else:
                L.Dense(4, name="fc").build((None, 3))


@pytest.mark.parametrize("builder", ["get_variable", "layer"])
def test_error_reusing_with_another_dtype(builder):
    with variable_scope("model"):
        if builder == "get_variable":
            get_variable("w", (3, 3))
        else:
            L.Dense(3, name="fc").build((None, 3))
    path = "model/w" if builder == "get_variable" else "model/fc/kernel"
    with pytest.raises(
        ValueError,
        match=(
            rf"'{path}' with dtype float64: it was created with dtype float32.*keeps the shape "
            r"and dtype"
        ),
    ):
        with variable_scope("model", reuse=True):
            if builder == "get_variable":
                get_variable("w", (3, 3), dtype="float64")
            else:
                L.Dense(3, name="fc", dtype="float64").build((None, 3))


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


def test_error_invalid_arguments_name_the_rule():
    with pytest.raises(
        ValueError,
        match=r"reuse=\.\.\.\) must be True, False, None \(inherit\) "
        r"or dpkeras.AUTO_REUSE. Received: reuse='yes'",
    ):
        with variable_scope("model", reuse="yes"):
            pass
    with pytest.raises(
        ValueError,
        match=r"name_or_scope must be a non-empty name.*"
        r"Received: name_or_scope='a//b'",
    ):
        with variable_scope("a//b"):
            pass
    with pytest.raises(TypeError, match=r"scope name \(str\) or a VariableScope.*of type int"):
        with variable_scope(3):
            pass
    with pytest.raises(ValueError, match=r"get_variable\(\): name must be a non-empty name"):
        get_variable("", (1,))
    with pytest.raises(TypeError, match=r"keras.Variable or a tf.Variable.*of type str"):
        add_model_variable("w")
    with pytest.raises(
        TypeError,
        match=r"scope must be None, a dpkeras VariableScope, a path "
        r"string or a Keras layer/model. Received: scope=3",
    ):
        get_variables(3)


# ---------------------------------------------------------------------------------------------
# Stores and state.


def test_stores_isolate_top_level_code_and_restore_on_exit(_fresh_store):
    get_variable("w", (1,))
    with VariableStore() as inner:
        assert get_variable_store() is inner
        get_variable("w", (1,))  # no clash: another store
    assert get_variable_store() is _fresh_store
    assert _fresh_store.paths() == ["w"]
    _fresh_store.clear()
    assert len(_fresh_store) == 0


def test_scope_state_is_thread_local():
    seen = {}

    def worker():
        with VariableStore() as store:  # the main thread's `with VariableStore()` is not here
            seen["store"] = store
            with variable_scope("thread"):  # nor is its variable scope
                seen["w"] = get_variable("w", (1,))

    with variable_scope("main", reuse=True):
        thread = threading.Thread(target=worker)
        thread.start()
        thread.join()
    assert seen["w"].path == "thread/w"
    assert seen["store"].paths() == ["thread/w"] and len(get_variable_store()) == 0


def test_a_failing_scope_body_leaves_no_scope_entered():
    with pytest.raises(RuntimeError, match="boom"):
        with variable_scope("boom"):
            raise RuntimeError("boom")
    assert get_variable("w", (1,)).path == "w"
    dense = L.Dense(1, name="plain")
    dense.build((None, 1))
    assert dense.kernel.path == "plain/kernel"
    assert get_variable_store().paths() == ["w"]


def _docstring_examples():
    collections_module = importlib.import_module("dpkeras.variable_collections")
    scope_module = importlib.import_module("dpkeras.variable_store")

    for module in (scope_module, collections_module):
        objects = [module] + [getattr(module, name) for name in module.__all__]
        objects += [
            member
            for obj in objects
            if isinstance(obj, type)
            for member in vars(obj).values()
            if callable(member) or isinstance(member, property)
        ]
        for obj in objects:
            for index, code in enumerate(
                re.findall(r"```python\n(.*?)```", obj.__doc__ or "", re.S)
            ):
                name = getattr(obj, "__qualname__", getattr(obj, "__name__", "?"))
                yield pytest.param(code, id=f"{module.__name__}.{name}-{index}")


@pytest.mark.parametrize("code", list(_docstring_examples()))
def test_docstring_examples_run(code):
    import textwrap

    exec(compile(textwrap.dedent(code), "docstring", "exec"), {"__name__": "docstring"})
