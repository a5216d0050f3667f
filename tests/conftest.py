"""Test base: every test process runs on 4 logical CPU devices; fixtures.

`/cpu:0` is the parameter device; `/cpu:1`..`/cpu:3` run up to 3 replicas
(`dpkeras.testing.cpu_strategy(n)`); with `DPKERAS_TEST_LOGICAL_GPUS=n` (`make gpu-check` on
a machine with one GPU), the GPU is split into `n` logical GPUs too. The device split must
happen before TensorFlow initialises, so it is done here, at import, once per process (pytest
and each pytest-xdist worker). Tests that need another split run a subprocess
(`dpkeras.testing.run_python`).
Helpers are imported from `dpkeras.testing` and `tests.*` modules, never from this file.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import dpkeras  # noqa: E402

NUM_CPUS = 4
dpkeras.simulate_cpu_devices(NUM_CPUS)
if os.environ.get("DPKERAS_TEST_LOGICAL_GPUS"):  # make gpu-check on a one-GPU machine
    dpkeras.testing.split_gpu(int(os.environ["DPKERAS_TEST_LOGICAL_GPUS"]))

import keras  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

from dpkeras.testing import LocalCluster  # noqa: E402

tf.get_logger().setLevel("ERROR")


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
    with LocalCluster(ps=2, workers=2, cpus=2) as running:
        yield running
