"""TF1 towers in Keras's Functional API (issue 10): one layer name per tower, shared variables.

The seed built "the same" Conv2D once per tower, in name scopes `Replica1`/`Replica2`, under one
reusing variable scope. Under dpkeras the second tower's layer reuses the first's variables and
is named `conv_1`, so the functional model builds, holds one set of variables (and slots), and
trains like one layer called twice.
"""

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import dpkeras
from dpkeras.testing import assert_weights_close

REPLICAS = ["/cpu:1", "/cpu:2"]


def _towers(num_towers=2):
    """The seed's form: a Conv2D named "conv" built in each tower's name scope."""
    with dpkeras.variable_scope("towers", reuse=dpkeras.AUTO_REUSE):
        inputs = keras.Input((6, 6, 3))
        outputs = []
        for t in range(num_towers):
            with tf.name_scope(f"Replica{t + 1}"):
                outputs.append(keras.layers.Conv2D(4, 3, name="conv")(inputs))
        return keras.Model(inputs, keras.layers.Add(name="sum")(outputs))


def _shared_layer():
    """Keras's form: one layer called once per tower."""
    inputs = keras.Input((6, 6, 3))
    conv = keras.layers.Conv2D(4, 3, name="conv")
    outputs = [conv(inputs), conv(inputs)]
    return keras.Model(inputs, keras.layers.Add(name="sum")(outputs))


def _compile(model):
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse")
    return model


def _data(n=32, seed=0):
    rng = np.random.default_rng(seed)
    return (
        rng.normal(size=(n, 6, 6, 3)).astype("float32"),
        rng.normal(size=(n, 4, 4, 4)).astype("float32"),
    )


def test_the_towers_build_with_one_set_of_variables():
    with dpkeras.VariableStore() as store:
        model = _towers(num_towers=3)
    assert [layer.name for layer in model.layers] == [
        "input_layer",
        "conv",
        "conv_1",
        "conv_2",
        "sum",
    ]
    conv, conv_1, conv_2 = model.layers[1:4]
    assert conv.kernel is conv_1.kernel is conv_2.kernel
    assert conv.bias is conv_1.bias is conv_2.bias
    assert [v.path for v in model.weights] == ["towers/conv/kernel", "towers/conv/bias"]
    assert store.paths() == ["towers/conv/kernel", "towers/conv/bias"]
    assert model.count_params() == 3 * 3 * 3 * 4 + 4


def test_the_towers_train_step_for_step_like_one_layer_called_twice():
    x, y = _data()
    reference = _compile(_shared_layer())
    initial = reference.get_weights()
    with dpkeras.scope(REPLICAS), dpkeras.VariableStore():
        towers = _compile(_towers())
    towers.set_weights(initial)
    for step in range(4):
        batch = slice(8 * step, 8 * step + 8)
        expected = reference.train_on_batch(x[batch], y[batch])
        loss = towers.train_on_batch(x[batch], y[batch])
        assert loss == pytest.approx(expected, rel=1e-5)
        # Each replica runs its half of the batch, summed on the parameter device: rounding
        # differs from one device's sum over 8 rows by ~1e-7, and Adam divides a near-zero
        # gradient by its own size (an element moved 4e-5 further after 4 steps at lr 0.05).
        assert_weights_close(reference.get_weights(), towers.get_weights(), atol=1e-4)
    # One set of slots: Adam's two per variable, plus its two scalars.
    assert len(towers.optimizer.variables) == len(reference.optimizer.variables) == 2 + 2 * 2


def _trained_towers():
    x, y = _data()
    with dpkeras.scope(REPLICAS), dpkeras.VariableStore():
        model = _compile(_towers())
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    return model


def _assert_shared(model):
    conv, conv_1 = model.get_layer("conv"), model.get_layer("conv_1")
    assert conv.kernel is conv_1.kernel and conv.bias is conv_1.bias


def test_save_weights_round_trips_with_the_sharing_intact(tmp_path):
    model = _trained_towers()
    model.save_weights(tmp_path / "towers.weights.h5")
    with dpkeras.scope(REPLICAS), dpkeras.VariableStore():
        again = _compile(_towers())
        again.optimizer.build(again.trainable_variables)  # so its state loads too
    again.load_weights(tmp_path / "towers.weights.h5")
    _assert_shared(again)
    assert_weights_close(model.get_weights(), again.get_weights(), rtol=0, atol=0)
    x, y = _data(seed=1)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
    again.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
    assert_weights_close(model.get_weights(), again.get_weights())


def test_a_checkpoint_round_trips_with_the_sharing_intact(tmp_path):
    model = _trained_towers()
    path = tf.train.Checkpoint(model=model, optimizer=model.optimizer).write(tmp_path / "c")
    with dpkeras.scope(REPLICAS) as strategy, dpkeras.VariableStore():
        again = _compile(_towers())
    with strategy.scope():
        again.optimizer.build(again.trainable_variables)
    tf.train.Checkpoint(model=again, optimizer=again.optimizer).read(path).assert_consumed()
    _assert_shared(again)
    assert_weights_close(model.get_weights(), again.get_weights(), rtol=0, atol=0)
    assert_weights_close(
        [v.numpy() for v in model.optimizer.variables],
        [v.numpy() for v in again.optimizer.variables],
        rtol=0,
        atol=0,
    )


def test_a_keras_file_says_the_towers_will_not_share_once_loaded(tmp_path):
    model = _trained_towers()
    with pytest.warns(UserWarning, match=r"layers \[\['conv', 'conv_1'\]\] are distinct layers"):
        model.save(tmp_path / "towers.keras")
    loaded = keras.models.load_model(tmp_path / "towers.keras")
    x, _ = _data()
    np.testing.assert_allclose(loaded.predict(x, verbose=0), model.predict(x, verbose=0), atol=1e-6)
    # What the warning says: loaded, the towers hold equal but separate variables.
    assert loaded.get_layer("conv").kernel is not loaded.get_layer("conv_1").kernel


def test_one_layer_called_in_each_tower_keeps_the_sharing_in_a_keras_file(tmp_path):
    with dpkeras.scope(REPLICAS):
        model = _compile(_shared_layer())
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        model.save(tmp_path / "shared.keras")
    loaded = keras.models.load_model(tmp_path / "shared.keras")
    assert [layer.name for layer in loaded.layers] == ["input_layer", "conv", "sum"]
    assert len(loaded.weights) == 2


def test_a_layer_of_another_name_in_a_reusing_scope_is_not_renamed():
    with dpkeras.VariableStore():
        with dpkeras.variable_scope("towers", reuse=dpkeras.AUTO_REUSE):
            inputs = keras.Input((6, 6, 3))
            a = keras.layers.Conv2D(4, 3, name="conv")(inputs)
            b = keras.layers.Conv2D(4, 3, name="other")(inputs)
            model = keras.Model(inputs, [a, b])
    assert [layer.name for layer in model.layers] == ["input_layer", "conv", "other"]
    assert len(model.weights) == 4
