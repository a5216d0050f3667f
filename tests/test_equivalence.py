"""N replicas on a global batch give the weights, losses and metrics of one device.

For every layer kind the issue names, SGD and Adam, 2 and 3 replicas: same data, same order,
same global batches, several steps. Also uneven splits: global batches not divisible by the
replicas, and short last batches (split 20/19/19, and 2 examples over 3 replicas so one replica
gets none), which dpkeras weights by each replica's share.
"""

import contextlib
import functools

import keras
import numpy as np
import pytest
import tensorflow as tf

from dpkeras.testing import assert_weights_close, cpu_strategy
from tests.models import LOGS_AS_ONE_DEVICE, make_data, train

KINDS = ["dense", "conv2d", "embedding", "lstm", "gru"]


@functools.cache
def _one_device(kind, optimizer, n=288):
    model, history, evaluation = train(kind, None, n=n, optimizer=optimizer)
    return model.get_weights(), history, evaluation


def _assert_same_run(expected, actual, logs=None):
    """The weights of `expected` (one device's run), and its logs, or those of `logs`."""
    weights, history, evaluation = expected
    model, history2, evaluation2 = actual
    assert_weights_close(weights, model.get_weights())
    if logs is not None:
        history, evaluation = logs
    assert history.keys() == history2.keys()
    for key in history:
        np.testing.assert_allclose(history2[key], history[key], rtol=1e-5, err_msg=key)
    np.testing.assert_allclose(evaluation2, evaluation, rtol=1e-5)


@pytest.mark.parametrize("replicas", [2, 3])
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize("kind", KINDS)
def test_replicas_equal_one_device(kind, optimizer, replicas):
    expected = _one_device(kind, optimizer)
    logs = None
    if not LOGS_AS_ONE_DEVICE:  # Keras 3.8-3.9: the logs of Keras under any strategy
        devices = [f"/cpu:{i}" for i in range(1, replicas + 1)]
        keras.utils.set_random_seed(1234)
        _, history, evaluation = train(
            kind,
            # Not collectives: their groups, kept per process, would clash with the other
            # replica count's.
            tf.distribute.MirroredStrategy(devices, tf.distribute.ReductionToOneDevice()),
            optimizer=optimizer,
        )
        logs = history, evaluation
        keras.utils.set_random_seed(1234)
    _assert_same_run(expected, train(kind, cpu_strategy(replicas), optimizer=optimizer), logs)


@pytest.mark.parametrize("n", [250, 290], ids=["last-batch-58-over-3", "last-batch-2-over-3"])
def test_uneven_last_batch_equals_one_device(n):
    expected = _one_device("dense", "adam", n=n)
    _assert_same_run(expected, train("dense", cpu_strategy(3), n=n))


@pytest.mark.parametrize("batch_size", [10, 100], ids=["4-3-3", "34-33-33"])
def test_global_batch_not_divisible_by_replicas_equals_one_device(batch_size):
    """Every batch splits unevenly over 3 replicas; each replica's share weights its gradient."""
    one_device = train("dense", None, n=200, batch_size=batch_size)
    _assert_same_run(
        (one_device[0].get_weights(),) + one_device[1:],
        train("dense", cpu_strategy(3), n=200, batch_size=batch_size),
    )


def test_unbuilt_model_with_uneven_batches_equals_one_device():
    """No Input layer: Keras builds the model from the first (uneven) per-replica batch."""
    x, y = make_data("dense", 50)

    def fit(strategy):
        keras.utils.set_random_seed(3)
        with strategy.scope() if strategy else contextlib.nullcontext():
            model = keras.Sequential(
                [keras.layers.Dense(8, activation="relu"), keras.layers.Dense(4)]
            )
            model.compile(
                optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
            )
        model.fit(x, y, batch_size=10, epochs=2, shuffle=False, verbose=0)
        return model.get_weights()

    assert_weights_close(fit(None), fit(cpu_strategy(3)))


def test_training_actually_moves_the_weights():
    """Guards the comparisons above against a model that does not train at all."""
    initial = train("dense", None, epochs=0)[0].get_weights()
    trained = _one_device("dense", "adam")[0]
    assert max(np.abs(a - b).max() for a, b in zip(initial, trained)) > 1e-3
