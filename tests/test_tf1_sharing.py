"""dpkeras.tf1._sharing: Keras layers built in a scope share their weights (TF1 idioms 2, 3).

Sharing is real: one entry in `trainable_weights`, one set of optimizer slots, Adam step for
step equal to one layer called twice; it survives `.keras` files and checkpoints, works for
lazily built subclassed models or fails saying to build them inside the scope.
"""

import contextlib
import os
import threading

import keras
import numpy as np
import pytest
import tensorflow as tf

from dpkeras.tf1 import (
    AUTO_REUSE,
    VariableStore,
    get_model_variables,
    get_variable,
    get_variable_store,
    regularization_losses,
    variable_scope,
)
from tests.tf1_models import (
    INPUT_SHAPE,
    L,
    Towers,
    _fresh_store,  # noqa: F401 (an autouse fixture)
    assert_same_weights,
    assert_towers_share,
    images,
    reference_like,
)

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


def test_pending_shares_belong_to_the_thread_that_built_the_layer():
    """A layer tracks a weight after it is created, so the swap to the shared keras.Variable
    waits (pending) until this thread creates another variable or leaves a scope. Another
    thread's variable creation must not apply it, racing with this thread's layer."""
    built, other_done = threading.Event(), threading.Event()
    seen = {}

    def builder():
        with VariableStore():
            with variable_scope("towers") as scope:
                first = L.Dense(2, name="fc")
                first.build((None, 3))
            with variable_scope(scope, reuse=True):
                second = L.Dense(2, name="fc")
                second.build((None, 3))  # its bias's swap is pending now
                built.set()
                other_done.wait(timeout=30)
                seen["before_leaving"] = second.bias is first.bias
            seen["after_leaving"] = second.bias is first.bias

    def other():
        built.wait(timeout=30)
        with VariableStore(), variable_scope("elsewhere"):
            get_variable("w", (1,))  # creating a variable applies pending shares
        other_done.set()

    threads = [threading.Thread(target=builder), threading.Thread(target=other)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    assert seen == {"before_leaving": False, "after_leaving": True}
