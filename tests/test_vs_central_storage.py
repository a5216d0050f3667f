"""Where TF's CentralStorageStrategy fails or is wrong with Keras 3, dpkeras is right.

Each case runs under both strategies, side by side, with 2 replicas and variables on /cpu:0.
CentralStorageStrategy's cases run in one fresh process (see `_central_storage_results`):
running two strategies' models in one process is where TensorFlow is least stable (measured on
TF 2.21: two different MirroredStrategy models in one process can fail with a
`CollectiveReduceV2` shape mismatch that a fresh process does not show).
"""

import functools
import json
import pathlib

import keras
import numpy as np
import pytest
import tensorflow as tf

from dpkeras.testing import cpu_strategy, run_python
from tests.models import train

_CSS_PROGRAM = """
import json, sys
sys.path.insert(0, {tests!r})
import keras, numpy as np, tensorflow as tf
from tests.models import train

def css():
    return tf.distribute.experimental.CentralStorageStrategy(["/cpu:1", "/cpu:2"],
                                                             parameter_device="/cpu:0")

out = {{"errors": {{}}}}
for kind, policy in [("batchnorm", "float32"), ("dropout", "float32"), ("dense", "mixed_float16")]:
    keras.backend.clear_session()
    keras.config.set_dtype_policy(policy)
    try:
        train(kind, css())
        out["errors"][kind + "/" + policy] = None
    except ValueError as e:
        out["errors"][kind + "/" + policy] = str(e)
keras.backend.clear_session()
keras.config.set_dtype_policy("float32")
strategy = css()
with strategy.scope():
    metric = keras.metrics.Mean()

@tf.function
def step():
    return strategy.run(lambda: metric.update_state(2.0))

totals = []
for _ in range(3):
    step()
    totals.append(float(metric.total.numpy()))
out["totals"] = totals
keras.backend.clear_session()
keras.utils.set_random_seed(1234)
_, history, evaluation = train("dense", css())
out["history"], out["evaluation"] = history["loss"], [float(v) for v in evaluation]
out["reduce_to_device"] = tf.distribute.experimental.CentralStorageStrategy(
    ["/cpu:1", "/cpu:2"], parameter_device="/cpu:3").extended._cross_device_ops.reduce_to_device
print(json.dumps(out))
"""


@functools.cache
def _central_storage_results():
    tests = str(pathlib.Path(__file__).parent)
    return json.loads(run_python(_CSS_PROGRAM.format(tests=tests), cpus=4).strip().splitlines()[-1])


@pytest.mark.parametrize(
    "kind,policy", [("batchnorm", "float32"), ("dropout", "float32"), ("dense", "mixed_float16")]
)
def test_models_central_storage_cannot_train(kind, policy):
    error = _central_storage_results()["errors"][f"{kind}/{policy}"]
    assert error and "You must specify an aggregation method to update" in error
    keras.config.set_dtype_policy(policy)
    model, history, _ = train(kind, cpu_strategy(2))
    assert np.all(np.isfinite(history["loss"]))
    assert history["loss"][-1] < history["loss"][0]


def test_metric_totals():
    """A Mean metric over 3 steps of value 2 on 2 replicas: totals 4, 8, 12 on one device."""
    assert _central_storage_results()["totals"] == [4.0, 12.0, 28.0]  # N*old + sum(new)
    strategy = cpu_strategy(2)
    with strategy.scope():
        metric = keras.metrics.Mean()

    @tf.function
    def step():
        return strategy.run(lambda: metric.update_state(2.0))

    totals = []
    for _ in range(3):
        step()
        totals.append(float(metric.total.numpy()))
    assert totals == [4.0, 8.0, 12.0]


def test_fit_history_and_evaluate():
    expected_history, expected_eval = train("dense")[1:]
    css = _central_storage_results()
    assert not np.allclose(css["history"], expected_history["loss"], rtol=1e-3)
    _, history, evaluation = train("dense", cpu_strategy(2))
    np.testing.assert_allclose(history["loss"], expected_history["loss"], rtol=1e-5)
    np.testing.assert_allclose(evaluation, expected_eval, rtol=1e-5)


def test_central_storage_reduces_gradients_to_cpu0_regardless_of_parameter_device():
    """Its extended class hard-codes ReductionToOneDevice("/device:CPU:0"); dpkeras uses the
    configured device (see test_semantics for the dpkeras side)."""
    assert _central_storage_results()["reduce_to_device"] == "/device:CPU:0"
