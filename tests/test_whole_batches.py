"""On one machine of CPU replicas, Keras's epoch loop reads whole batches on the host and each
replica's step cuts its share (`dpkeras._patches.whole_batches`).

TensorFlow's distributed iterator, which Keras made each epoch for training and again for
validation, traced functions for every device as it was made: 42 functions for a 2-epoch fit
with validation on 2 replicas, most of what a small fit cost. A fit now makes none after the
first, as without a strategy (a count, not a clock: BENCHMARKS.md has the times), and still
equals one device. `train_on_batch` and `test_on_batch`, which hand `strategy.run` one whole
batch, run each replica on its share too (before, every replica ran every row)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from dpkeras import _tf_internals
from dpkeras._input.plan import InputPlan
from dpkeras.testing import cpu_strategy
from tests.gpu import needs_gpus
from tests.models import build_model, make_data

HOST = "/job:localhost/replica:0/task:0/device:CPU:0"


def _fit(model, x, y):
    # 14 rows, a quarter for validation: 10 training rows in batches of 4, 4, 2; 4 validation
    # rows (uneven shares on 3 replicas, and more replicas than rows on the last batch).
    return model.fit(
        x, y, batch_size=4, epochs=2, validation_split=0.25, shuffle=False, verbose=0
    ).history


def _functions_made_by(call):
    before = _tf_internals.function_names()
    call()
    return sorted(_tf_internals.function_names() - before)


def test_without_a_strategy_a_second_fit_makes_no_function():
    """The baseline the next test holds dpkeras to."""
    x, y = make_data("dense", 14)
    model = build_model("dense")
    _fit(model, x, y)
    assert _functions_made_by(lambda: _fit(model, x, y)) == []


@pytest.mark.parametrize("replicas", [2, 3])
def test_a_second_fit_and_evaluate_make_no_function(replicas):
    x, y = make_data("dense", 14)
    with cpu_strategy(replicas).scope():
        model = build_model("dense")
    _fit(model, x, y)
    model.evaluate(x, y, batch_size=4, verbose=0)
    assert _functions_made_by(lambda: _fit(model, x, y)) == []
    assert _functions_made_by(lambda: model.evaluate(x, y, batch_size=4, verbose=0)) == []


@pytest.mark.parametrize("replicas", [2, 3])
def test_fit_on_whole_batches_equals_one_device(replicas):
    x, y = make_data("dense", 14)
    reference = build_model("dense")
    expected = _fit(reference, x, y)
    with cpu_strategy(replicas).scope():
        model = build_model("dense")
    got = _fit(model, x, y)
    assert sorted(got) == sorted(expected)
    for key in expected:
        np.testing.assert_allclose(got[key], expected[key], rtol=1e-5, atol=1e-6, err_msg=key)
    for a, b in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        model.predict(x, batch_size=4, verbose=0),
        reference.predict(x, batch_size=4, verbose=0),
        rtol=1e-5,
        atol=1e-6,
    )


@pytest.mark.parametrize("replicas", [2, 3])
def test_train_and_test_on_batch_run_each_replica_on_its_share(replicas):
    """7 rows: shares 4, 3 (2 replicas) or 3, 2, 2 (3). Each replica running every row gives
    the same means (Keras scales each replica's loss by 1/N), but counts each row N times in
    the metrics' totals and counts."""
    reference = build_model("dense")
    with cpu_strategy(replicas).scope():
        model = build_model("dense")
    for seed in range(3):
        x, y = make_data("dense", 7, seed=seed)
        expected = reference.train_on_batch(x, y, return_dict=True)
        got = model.train_on_batch(x, y, return_dict=True)
        for key in expected:
            np.testing.assert_allclose(got[key], expected[key], rtol=1e-5, err_msg=key)
    for a, b in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    x, y = make_data("dense", 7, seed=9)
    expected = reference.test_on_batch(x, y, return_dict=True)
    got = model.test_on_batch(x, y, return_dict=True)
    for key in expected:
        np.testing.assert_allclose(got[key], expected[key], rtol=1e-5, err_msg=key)
    for ours, theirs in zip(model.metrics, reference.metrics):  # totals and counts
        for a, b in zip(ours.variables, theirs.variables):
            np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, err_msg=a.path)


class _ReplicaId(keras.layers.Layer):
    """Each row's output: the replica that ran it."""

    def call(self, x):
        context = tf.distribute.get_replica_context()  # None: Keras's symbolic build
        replica = 0 if context is None else context.replica_id_in_sync_group
        return tf.fill(tf.shape(x)[:1], tf.cast(replica, "float32"))

    def compute_output_shape(self, shape):
        return shape[:1]


@pytest.mark.parametrize("replicas, shares", [(2, [4, 4, 4, 3]), (3, [3, 3, 2, 3, 2, 2])])
def test_the_first_replicas_take_the_extra_rows_of_an_uneven_batch(replicas, shares):
    """TensorFlow's rule for each replica's rows: 7 over 2 are 4, 3 (not 3, 4); 8 over 3 are
    3, 3, 2. predict's outputs come back in replica order, each row naming its replica: from
    `predict`'s whole batches (rows known when they are read) and from `predict_on_batch`'s
    one batch (rows known when the step is made)."""
    with cpu_strategy(replicas).scope():
        # A weight keeps dpkeras's patches installed after the scope (they follow its variables)
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1), _ReplicaId()])
    x = np.zeros((15, 3), "float32")  # batches of 8 and 7
    expected = np.repeat(list(range(replicas)) * 2, shares).astype("float32")
    np.testing.assert_array_equal(model.predict(x, batch_size=8, verbose=0), expected)
    np.testing.assert_array_equal(model.predict_on_batch(x[8:]), expected[8:])


def _plan(*devices, host=HOST):
    return InputPlan([(host, devices)])


def test_only_replicas_on_this_machines_cpus_read_whole_batches():
    cpus = [f"/job:localhost/replica:0/task:0/device:CPU:{i}" for i in (1, 2)]
    gpus = [f"/job:localhost/replica:0/task:0/device:GPU:{i}" for i in (0, 1)]
    assert _plan(*cpus).reads_whole_batches()
    # GPUs keep TensorFlow's distributed iterator, which prefetches into each GPU's memory.
    assert not _plan(*gpus).reads_whole_batches()
    assert not _plan(cpus[0], gpus[0]).reads_whole_batches()
    # A cluster's workers run their own pipelines.
    worker = "/job:worker/replica:0/task:0/device:CPU:0"
    assert not _plan(worker, host=worker).reads_whole_batches()
    assert not InputPlan([(HOST, cpus), (worker, [worker])]).reads_whole_batches()


@needs_gpus(2)
def test_on_gpus_fit_keeps_the_distributed_iterator_and_equals_one_device():
    import dpkeras

    gpus = [d.name for d in tf.config.list_logical_devices("GPU")[:2]]
    x, y = make_data("dense", 14)
    with tf.device("/cpu:0"):
        reference = build_model("dense")
        expected = _fit(reference, x, y)
    strategy = dpkeras.get_strategy(gpus, "/cpu:0")
    assert not strategy.extended.input_plan.reads_whole_batches()
    with strategy.scope():
        model = build_model("dense")
    got = _fit(model, x, y)
    for key in expected:
        np.testing.assert_allclose(got[key], expected[key], rtol=1e-4, err_msg=key)
