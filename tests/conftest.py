"""Test base: every test process runs on 4 logical CPU devices.

`/cpu:0` is the parameter device; `/cpu:1`..`/cpu:3` run up to 3 replicas. The device split must
happen before TensorFlow initialises, so it is done here, at import, once per process (pytest
and each pytest-xdist worker). Tests that need another device count run a subprocess
(`run_python`).
"""

import os
import subprocess
import sys
import textwrap

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import dpkeras  # noqa: E402

NUM_CPUS = 4
dpkeras.simulate_cpu_devices(NUM_CPUS)

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.get_logger().setLevel("ERROR")

REPLICA_DEVICES = {1: ["/cpu:1"], 2: ["/cpu:1", "/cpu:2"], 3: ["/cpu:1", "/cpu:2", "/cpu:3"]}


def strategy_for(replicas, parameter_device="/cpu:0"):
    """The dpkeras strategy with `replicas` compute replicas on /cpu:1.. (cached)."""
    return dpkeras.get_strategy(REPLICA_DEVICES[replicas], parameter_device)


def run_python(code, cpus=None, env=None, timeout=600):
    """Runs `code` in a fresh Python; returns stdout. Fails the test with stderr on error.

    With `cpus`, the code is preceded by `dpkeras.simulate_cpu_devices(cpus)`.
    """
    prefix = ""
    if cpus is not None:
        prefix = f"import dpkeras\ndpkeras.simulate_cpu_devices({cpus})\n"
    full_env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", **(env or {}))
    proc = subprocess.run(
        [sys.executable, "-c", prefix + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
    )
    if proc.returncode != 0:
        pytest.fail(f"subprocess failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return proc.stdout


@pytest.fixture(autouse=True)
def _fresh_keras_state():
    """Each test starts with a clean Keras session, no active strategy and a fixed seed."""
    keras.backend.clear_session()
    keras.config.set_dtype_policy("float32")
    keras.utils.set_random_seed(1234)
    assert not tf.distribute.has_strategy()
    yield
    assert not tf.distribute.has_strategy(), "a test left a strategy scope entered"
    keras.config.set_dtype_policy("float32")


@pytest.fixture(autouse=True)
def _no_tf_config(monkeypatch):
    """No test sees a TF_CONFIG of the machine it runs on (it would name a cluster)."""
    monkeypatch.delenv("TF_CONFIG", raising=False)


@pytest.fixture(scope="module")
def local():
    """A real cluster of 2 ps + 2 workers, 2 CPU devices each, shared by a module's tests."""
    from benchmarks.local_cluster import LocalCluster

    with LocalCluster(ps=2, workers=2, cpus=2) as running:
        yield running


def assert_weights_close(expected, actual, rtol=1e-5, atol=1e-6):
    """Asserts two lists of arrays (e.g. `model.get_weights()`) are equal within tolerance."""
    assert len(expected) == len(actual)
    for i, (e, a) in enumerate(zip(expected, actual)):
        np.testing.assert_allclose(a, e, rtol=rtol, atol=atol, err_msg=f"weight {i}")
