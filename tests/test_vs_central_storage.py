"""Where TF's CentralStorageStrategy fails or is wrong with Keras 3, dpkeras is right.

Each case runs under both strategies, side by side, with 2 replicas and variables on /cpu:0.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import strategy_for
from models import train

STRATEGIES = {
    "central_storage": lambda: tf.distribute.experimental.CentralStorageStrategy(
        ["/cpu:1", "/cpu:2"], parameter_device="/cpu:0"),
    "dpkeras": lambda: strategy_for(2),
}


@pytest.mark.parametrize("kind,policy", [("batchnorm", "float32"), ("dropout", "float32"),
                                         ("dense", "mixed_float16")])
@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_models_central_storage_cannot_train(name, kind, policy):
    keras.config.set_dtype_policy(policy)
    if name == "central_storage":
        with pytest.raises(ValueError, match="You must specify an aggregation method to update"):
            train(kind, STRATEGIES[name]())
    else:
        model, history, _ = train(kind, STRATEGIES[name]())
        assert np.all(np.isfinite(history["loss"]))
        assert history["loss"][-1] < history["loss"][0]


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_metric_totals(name):
    """A Mean metric over 3 steps of value 2 on 2 replicas: totals 4, 8, 12 on one device."""
    strategy = STRATEGIES[name]()
    with strategy.scope():
        metric = keras.metrics.Mean()

    @tf.function
    def step():
        return strategy.run(lambda: metric.update_state(2.0))

    totals = []
    for _ in range(3):
        step()
        totals.append(float(metric.total.numpy()))
    if name == "central_storage":
        assert totals == [4.0, 12.0, 28.0]  # N * old + sum(new): silently wrong
    else:
        assert totals == [4.0, 8.0, 12.0]


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_fit_history_and_evaluate(name):
    expected_history, expected_eval = train("dense")[1:]
    _, history, evaluation = train("dense", STRATEGIES[name]())
    if name == "central_storage":
        assert not np.allclose(history["loss"], expected_history["loss"], rtol=1e-3)
    else:
        np.testing.assert_allclose(history["loss"], expected_history["loss"], rtol=1e-5)
        np.testing.assert_allclose(evaluation, expected_eval, rtol=1e-5)


def test_central_storage_reduces_gradients_to_cpu0_regardless_of_parameter_device():
    """Its extended class hard-codes ReductionToOneDevice("/device:CPU:0"); dpkeras uses the
    configured device (see test_semantics for the dpkeras side)."""
    strategy = tf.distribute.experimental.CentralStorageStrategy(["/cpu:1", "/cpu:2"],
                                                                 parameter_device="/cpu:3")
    assert strategy.extended._cross_device_ops.reduce_to_device == "/device:CPU:0"
