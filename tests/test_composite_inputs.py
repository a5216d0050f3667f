"""`fit` on ragged, sparse and optional (None) inputs, where the global batch does not split
evenly over the replicas (the per-replica gradient weights then count each replica's rows:
`dpkeras._extended.keras_steps.gradient_weights`). 2 replicas on simulated CPU devices against
one device: weights and loss history equal."""

import contextlib

import keras
import numpy as np
import pytest
import tensorflow as tf

from dpkeras.testing import assert_weights_close, cpu_strategy

Y = np.random.RandomState(9).rand(10, 1).astype("float32")


def _ragged(rng):
    inputs = keras.Input((None,), dtype="int32", ragged=True)
    pooled = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(50, 4)(inputs))
    rows = [rng.randint(0, 50, rng.randint(1, 5)).tolist() for _ in range(10)]
    features = tf.ragged.constant(rows, dtype="int32")
    return keras.Model(inputs, keras.layers.Dense(1)(pooled)), features


def _sparse(rng):
    inputs = keras.Input((6,), sparse=True)
    dense = np.where(rng.rand(10, 6) > 0.6, rng.rand(10, 6), 0).astype("float32")
    return keras.Model(inputs, keras.layers.Dense(1)(inputs)), tf.sparse.from_dense(dense)


def _optional(rng):
    """Two inputs, the second optional and given as None."""
    a = keras.Input((3,), name="a", optional=True)  # first in the flattened inputs
    b = keras.Input((3,), name="b")

    class Add(keras.layers.Layer):
        def call(self, a=None, b=None):
            return b if a is None else a + b

    outputs = keras.layers.Dense(1)(Add()(a, b))
    features = {"a": None, "b": rng.rand(10, 3).astype("float32")}
    return keras.Model({"a": a, "b": b}, outputs), features


def _train(make, strategy=None, distributed=False):
    keras.utils.set_random_seed(1)
    rng = np.random.RandomState(0)
    with strategy.scope() if strategy is not None else contextlib.nullcontext():
        model, x = make(rng)
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    ds = tf.data.Dataset.from_tensor_slices((x, Y)).batch(5)  # 5 rows: 3 and 2 per replica
    if distributed:
        ds = strategy.experimental_distribute_dataset(ds)
    history = model.fit(ds, epochs=3, verbose=0).history["loss"]
    return model, history


@pytest.mark.parametrize("make", [_ragged, _sparse, _optional], ids=["ragged", "sparse", "none"])
@pytest.mark.parametrize(
    # Keras's epoch loop reads whole batches on CPU replicas (each step cuts its shares); a
    # dataset the user distributed, as on GPUs and clusters, is TensorFlow's distributed one.
    "distributed",
    [False, True],
    ids=["whole-batches", "distributed-dataset"],
)
def test_uneven_batches_of_composite_inputs_equal_one_device(make, distributed):
    expected, expected_history = _train(make)
    model, history = _train(make, cpu_strategy(2), distributed)
    assert history == pytest.approx(expected_history, rel=1e-5)
    assert_weights_close(expected.get_weights(), model.get_weights())
