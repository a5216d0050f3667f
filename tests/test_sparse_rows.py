"""Adagrad updates a table's sparse gradient on its rows only (`dpkeras._extended.sparse_rows`).

Keras's own `Adagrad.update_step` computes `sqrt(accumulator + epsilon)` and checks it for zeros
and NaNs over the whole table on every step; dpkeras's does the same arithmetic on the
gradient's rows. Each case compares every bit (NaN included) of the table and its accumulator
with Keras's own update, and looks for the whole-table work in the step's graph.
"""

import contextlib

import keras
import numpy as np
import pytest
import tensorflow as tf

from dpkeras import _keras_internals
from dpkeras._extended import optimizer_apply
from dpkeras._patches import table as keras_patches
from dpkeras.testing import assert_weights_close, cpu_strategy

ROWS, DIM = 40, 3
_TABLE = np.random.RandomState(0).rand(ROWS, DIM)


def _gradients(dtype, nan=False, repeats=True):
    """Five steps of sparse gradients of 8 rows: repeated ids in steps 0-2 (if `repeats`),
    an infinite row at step 4 (id 6) and, if `nan`, a NaN at step 3 (id 5)."""
    rng = np.random.RandomState(1)
    steps = []
    for step in range(5):
        ids = rng.permutation(ROWS // 2)[:8]
        if step < 3 and repeats:
            ids[:3] = [7, 7, 2]  # Keras adds each repeat's square and subtracts each repeat
        values = rng.randn(8, DIM)
        if step == 3:
            ids[ids == 5], ids[0] = ids[0], 5
            values[0, 1] = np.nan if nan else values[0, 1]
        if step == 4:
            ids[ids == 6], ids[0], values[0, 0] = ids[0], 6, np.inf
        steps.append((values.astype(dtype), ids))
    return steps


def _train(make, dtype, strategy=None, gradient_dtype=None, **gradients):
    """The table and its accumulator after the optimizer `make()` (made in `strategy`'s scope,
    if given) applied `_gradients(gradient_dtype or dtype, **gradients)`, in graph mode; and
    the step."""
    with strategy.scope() if strategy else contextlib.nullcontext():
        table = keras.Variable(_TABLE.astype(dtype), dtype=dtype, name="table")
        optimizer = make()
        optimizer.build([table])
    assert (optimizer_apply.attached(optimizer) is not None) == (strategy is not None)

    @tf.function
    def apply(values, ids):
        slices = tf.IndexedSlices(values, ids, tf.constant([ROWS, DIM], tf.int64))
        optimizer.apply([slices], [table])

    for values, ids in _gradients(gradient_dtype or dtype, **gradients):
        apply(tf.constant(values), tf.constant(ids, tf.int64))
    accumulator = _keras_internals.adagrad_accumulator(optimizer, table)
    # bfloat16 in float32 (exact), where NumPy's comparisons know NaN
    wide = "float32" if dtype == "bfloat16" else dtype
    return table.numpy().astype(wide), accumulator.numpy().astype(wide), apply


def _ops_on_the_whole_table(apply, dtype):
    """The types of the ops of `apply`'s graph that read or compute a value of the table's
    shape: Keras's read of the whole accumulator, its `add`, `sqrt` and zero/NaN checks (the
    scatters that update the table and its accumulator output nothing)."""
    graph = apply.get_concrete_function(
        tf.TensorSpec([8, DIM], dtype), tf.TensorSpec([8], tf.int64)
    ).graph
    assert not [op for op in graph.get_operations() if op.type in ("PartitionedCall",)]
    return [
        op.type
        for op in graph.get_operations()
        if any(t.shape.as_list()[:1] == [ROWS] for t in op.outputs)
    ]


def _adagrad(initial, epsilon, kind=keras.optimizers.Adagrad):
    return lambda: kind(0.1, initial_accumulator_value=initial, epsilon=epsilon)


class MyAdagrad(keras.optimizers.Adagrad):
    """An Adagrad of the user's: it inherits Keras's `update_step`, so dpkeras's too."""

    def get_config(self):
        return {**super().get_config(), "mine": True}


@pytest.mark.parametrize(
    "dtype, initial, epsilon",
    [
        ("float32", 0.1, 1e-7),
        ("float64", 0.0, 1e-7),
        ("float16", 0.1, 1e-3),
        ("float16", 0.0, 1e-7),  # a subnormal float16, which TensorFlow keeps
        ("bfloat16", 0.1, 1e-7),
        ("float64", 0.0, 1e-39),  # subnormal in float32, not in float64
        ("float32", 0.0, float(np.finfo(np.float32).tiny)),  # the smallest normal float32
    ],
)
def test_an_adagrad_of_dpkeras_updates_a_tables_rows_with_kerass_bits_and_no_whole_table_work(
    dtype, initial, epsilon
):
    """Repeated ids and an infinite row: every bit of the table and of its accumulator equals
    Keras's own update, and the update computes no square root and no zero/NaN check over the
    table (Keras's does both)."""
    table, accumulator, apply = _train(_adagrad(initial, epsilon), dtype, cpu_strategy(1))
    assert keras_patches.installed()  # dpkeras's variables live: Keras's own runs beside them
    expected_table, expected_accumulator, keras_apply = _train(_adagrad(initial, epsilon), dtype)
    np.testing.assert_array_equal(table, expected_table)
    np.testing.assert_array_equal(accumulator, expected_accumulator)
    assert np.isinf(accumulator[6]).any() and np.isnan(table[6]).any()  # inf / inf, as Keras
    assert {"AddV2", "Sqrt", "IsNan"} <= set(_ops_on_the_whole_table(keras_apply, dtype))
    assert _ops_on_the_whole_table(apply, dtype) == []


@pytest.mark.parametrize("gradient_dtype", ["float32", "float16"])
def test_a_subclass_and_a_gradient_of_another_dtype_update_on_the_rows_with_kerass_bits(
    gradient_dtype,
):
    """A subclass of Adagrad gets the rows-only update; a gradient in another dtype than the
    table's (float16 for a float32 table, float32 for a float16 one) is cast to the table's
    first, as Keras does: every bit equals Keras's own update of the same subclass."""
    dtype = "float16" if gradient_dtype == "float32" else "float32"
    make = _adagrad(0.0, 1e-3, MyAdagrad)
    table, accumulator, apply = _train(make, dtype, cpu_strategy(1), gradient_dtype)
    expected_table, expected_accumulator, _ = _train(make, dtype, None, gradient_dtype)
    np.testing.assert_array_equal(table, expected_table)
    np.testing.assert_array_equal(accumulator, expected_accumulator)
    assert not np.isnan(table[:6]).any()
    graph = apply.get_concrete_function(
        tf.TensorSpec([8, DIM], gradient_dtype), tf.TensorSpec([8], tf.int64)
    ).graph
    assert not [
        op
        for op in graph.get_operations()
        if any(t.shape.as_list()[:1] == [ROWS] for t in op.outputs)
    ]


def test_a_nan_gradient_row_stays_in_its_row():
    """A NaN in id 5's gradient row at step 3 makes that row of the table and its accumulator
    NaN, and no other: every other row is what Adagrad's formula gives (NumPy). Keras 3.15's
    own update, once a row of the accumulator is NaN, takes its union-of-indices path, which
    writes into other rows of the step (here row 1's middle value becomes NaN) and fails on
    repeated ids (`indices[4] = 10 is not in [0, 9)`)."""
    table, accumulator, _ = _train(_adagrad(0.1, 1e-7), "float32", cpu_strategy(1), nan=True)
    lr = np.float32(0.1)
    expected = _TABLE.astype("float32")
    expected_accumulator = np.full_like(expected, np.float32(0.1))
    with np.errstate(invalid="ignore"):  # inf / inf at step 4, as in the table
        for values, ids in _gradients("float32", nan=True):
            np.add.at(expected_accumulator, ids, values * values)
            np.subtract.at(expected, ids, lr * values / np.sqrt(expected_accumulator[ids] + 1e-7))
    np.testing.assert_array_equal(np.isnan(table), np.isnan(expected))
    np.testing.assert_array_equal(np.isnan(accumulator), np.isnan(expected_accumulator))
    assert np.isnan(table).sum() == 2 and np.isnan(table[5, 1]) and np.isnan(table[6, 0])
    np.testing.assert_allclose(table, expected, rtol=1e-6)
    np.testing.assert_allclose(accumulator, expected_accumulator, rtol=1e-6)
    keras_table, _, _ = _train(_adagrad(0.1, 1e-7), "float32", nan=True)
    assert np.isnan(keras_table).sum() > 2  # Keras 3.15's union path (see above)


@pytest.mark.parametrize(
    "dtype, initial, epsilon",
    [
        ("float32", 0.0, 0.0),
        ("float16", 0.0, 1e-8),
        ("float32", 0.0, 1e-40),
        ("float64", 0.0, 1e-310),
        ("bfloat16", 0.0, 1e-39),
        ("float32", -0.5, 1e-7),
        ("float32", float("nan"), 1e-7),
    ],
    ids=[
        "epsilon-0",
        "epsilon-0-in-float16",
        "subnormal-epsilon",
        "subnormal-epsilon-in-float64",
        "subnormal-epsilon-in-bfloat16",
        "negative-start",
        "nan-start",
    ],
)
def test_where_kerass_check_can_find_a_zero_or_a_nan_kerass_own_update_runs(
    dtype, initial, epsilon
):
    """A divisor that can be 0 (an epsilon of 0, one that is 0 in float16, or a subnormal one,
    which TensorFlow's CPU kernels flush to 0) or NaN (a negative or NaN start) makes Keras
    write NaN into rows no gradient touches: that update is
    Keras's own, bit for bit, untouched rows' NaN included (distinct ids: with repeated ones
    Keras 3.15's own update fails there)."""
    expected_table, expected_accumulator, _ = _train(
        _adagrad(initial, epsilon), dtype, repeats=False
    )
    assert np.isnan(expected_table[-1]).all()  # a row no gradient touched
    table, accumulator, apply = _train(
        _adagrad(initial, epsilon), dtype, cpu_strategy(1), repeats=False
    )
    np.testing.assert_array_equal(table, expected_table)
    np.testing.assert_array_equal(accumulator, expected_accumulator)
    assert {"AddV2", "Sqrt", "IsNan"} <= set(_ops_on_the_whole_table(apply, dtype))


@pytest.mark.parametrize("replicas", [1, 3])
def test_an_embedding_trained_with_adagrad_equals_one_device(replicas):
    """`fit` of an Embedding with Adagrad, ids repeated within and across the replicas' shares:
    on one replica the weights and losses are one device's bit for bit; on 3, within float
    tolerance (the Dense layer's gradient is a sum of 3 partial sums)."""
    rng = np.random.RandomState(2)
    x = (rng.zipf(1.3, (96, 4)) % 60).astype("int32")
    y = rng.rand(96, 1).astype("float32")

    def build():
        keras.utils.set_random_seed(3)
        model = keras.Sequential(
            [
                keras.Input((4,), dtype="int32"),
                keras.layers.Embedding(60, 5),
                keras.layers.Flatten(),
                keras.layers.Dense(1),
            ]
        )
        model.compile(optimizer=keras.optimizers.Adagrad(0.2), loss="mse")
        return model

    reference = build()
    expected = reference.fit(x, y, batch_size=24, epochs=3, shuffle=False, verbose=0)
    with cpu_strategy(replicas).scope():
        model = build()
    history = model.fit(x, y, batch_size=24, epochs=3, shuffle=False, verbose=0)
    if replicas == 1:
        for a, b in zip(reference.get_weights(), model.get_weights()):
            np.testing.assert_array_equal(a, b)
        assert history.history["loss"] == expected.history["loss"]
    else:
        assert_weights_close(reference.get_weights(), model.get_weights())
        np.testing.assert_allclose(history.history["loss"], expected.history["loss"], rtol=1e-5)


def test_the_accumulator_is_found_as_keras_finds_it():
    """`_keras_internals.adagrad_accumulator` names Keras 3.15's private attributes: fails here
    if an upgrade renames them."""
    optimizer = keras.optimizers.Adagrad(0.1, initial_accumulator_value=0.25)
    variables = [keras.Variable(np.zeros((2, 3)), name="a"), keras.Variable(np.zeros(4), name="b")]
    optimizer.build(variables)
    accumulator = _keras_internals.adagrad_accumulator(optimizer, variables[1])
    assert accumulator.shape == (4,) and np.all(accumulator.numpy() == 0.25)
