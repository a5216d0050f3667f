"""Keras's own tf.distribute tests, from the installed wheel, with dpkeras for MirroredStrategy.

Keras ships `keras/src/backend/tensorflow/distribute_test.py` and
`optimizer_distribute_test.py`. They run here in their own pytest process (they reset
TensorFlow's context and split the CPU in two) with `tests/keras_distribute_plugin.py`, which
builds a `dpkeras.ParameterDeviceStrategy` wherever they build a MirroredStrategy. Every test
must pass, except those that assert MirroredStrategy's representation of variables, which are
listed with their reasons in the plugin and must fail. The functional part of each of those is
checked for dpkeras below.
"""

import os
import subprocess
import sys
import xml.etree.ElementTree as ET

import keras
import numpy as np
import pytest
import tensorflow as tf

from dpkeras.testing import cpu_strategy
from tests.keras_distribute_plugin import EXPECTED_FAILURES, MODULES

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
KERAS_TIMEOUT = 600


def _outcomes(junit_path):
    """`{"Class::test": "passed" | "failed" | "skipped" | "xfailed"}` from a JUnit XML file."""
    outcomes = {}
    for case in ET.parse(junit_path).getroot().iter("testcase"):
        name = f"{case.get('classname').rsplit('.', 1)[-1]}::{case.get('name')}"
        skipped = case.find("skipped")
        if case.find("failure") is not None or case.find("error") is not None:
            outcomes[name] = "failed"
        elif skipped is not None:
            xfail = (skipped.get("type") or "").endswith("xfail")
            outcomes[name] = "xfailed" if xfail else f"skipped: {skipped.get('message')}"
        else:
            outcomes[name] = "passed"
    return outcomes


def test_keras_distribute_tests_pass_under_dpkeras(tmp_path):
    junit = tmp_path / "keras.xml"
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    env = dict(
        os.environ,
        TF_CPP_MIN_LOG_LEVEL="2",
        PYTHONPATH=os.pathsep.join([TESTS_DIR, os.path.dirname(TESTS_DIR)]),
    )
    env.pop("TF_CONFIG", None)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
        + ["-p", "keras_distribute_plugin", "-c", str(tmp_path / "pytest.ini")]
        + ["--rootdir", str(tmp_path), f"--junitxml={junit}", "--pyargs", *MODULES],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=KERAS_TIMEOUT,
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    outcomes = _outcomes(junit)
    xfailed = {name for name, outcome in outcomes.items() if outcome == "xfailed"}
    assert {n.split("[")[0] for n in xfailed} == set(EXPECTED_FAILURES)
    skipped = {n: o for n, o in outcomes.items() if o.startswith("skipped")}
    assert all("tf_keras" in o for o in skipped.values()), skipped
    passed = {n for n, o in outcomes.items() if o == "passed"}
    # The two that regressed in v0.2, among the rest.
    assert {
        "OptimizerDistributeTest::test_single_step0",
        "OptimizerDistributeTest::test_gradient_accumulation",
    } <= passed
    assert len(passed) >= 10, outcomes


# -- the functional part of each expected failure, for dpkeras ------------------------------


def test_strategy_run_gives_each_replica_its_own_result():
    strategy = cpu_strategy(2)
    with strategy.scope():
        inputs = keras.Input(shape=[4])
        model = keras.Model(inputs, keras.layers.Dense(2)(inputs))
    distributed = strategy.experimental_distribute_values_from_function(
        lambda ctx: tf.ones([8, 4]) if ctx.replica_id_in_sync_group == 1 else tf.zeros([8, 4])
    )
    result = strategy.run(tf.function(lambda data: model(data)), args=(distributed,))
    first, second = strategy.experimental_local_results(result)
    assert first.shape == second.shape == (8, 2)
    np.testing.assert_allclose(first, np.zeros((8, 2)))
    assert not np.allclose(first, second)


def test_seed_state_lives_once_and_replicas_draw_differently():
    strategy = cpu_strategy(2)
    with strategy.scope():
        seed_generator = keras.random.SeedGenerator(42)
    assert tuple(seed_generator.state.numpy()) == (42, 0)
    reads = strategy.experimental_local_results(
        strategy.run(lambda: tf.identity(seed_generator.state.value))
    )
    # Replica 0 reads the state as MirroredStrategy's replicas all do; replica 1 reads it
    # offset, so that Dropout masks differ across replicas (README, "Randomness").
    assert tuple(reads[0].numpy()) == (42, 0)
    assert reads[1].numpy()[0] != 42 and reads[1].numpy()[1] == 0


def _regularized_model():
    inputs = keras.Input(shape=(1,))
    layer = keras.layers.Dense(
        1,
        use_bias=False,
        kernel_initializer=keras.initializers.Constant(1),
        kernel_regularizer=keras.regularizers.L1L2(l1=0.01, l2=0.01),
    )
    model = keras.Model(inputs, layer(inputs))
    model.compile(loss="mse", optimizer="sgd")
    return model


@pytest.mark.parametrize("replicas", [2, 3])
def test_fit_with_a_regularizer_equals_one_device(replicas):
    x, y = np.ones((12, 1), "float32"), np.zeros((12, 1), "float32")
    expected = _regularized_model()
    expected_loss = expected.fit(x, y, batch_size=12, epochs=1, verbose=0).history["loss"]
    with cpu_strategy(replicas).scope():
        model = _regularized_model()
    loss = model.fit(x, y, batch_size=12, epochs=1, verbose=0).history["loss"]
    np.testing.assert_allclose(loss, expected_loss, rtol=1e-6)
    np.testing.assert_allclose(model.get_weights()[0], expected.get_weights()[0], rtol=1e-6)
