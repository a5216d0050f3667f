"""The paths only GPUs take: replicas on GPUs, NCCL under hybrid, mixed precision, the parameter
device on a GPU. Every test here is `needs_gpus(n)`: it skips on a machine without GPUs and
`make gpu-check` runs it where there are (one GPU is split into logical GPUs there).

GPU kernels sum in their own orders (cuBLAS, cuDNN), so equality with one device is within
the tolerances of tests/test_hybrid.py's NCCL test, not bit for bit.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import dpkeras
from dpkeras import placement
from dpkeras.testing import assert_weights_close
from tests.gpu import needs_gpus
from tests.models import assert_copies_identical, train


def _gpus(n):
    return [d.name for d in tf.config.list_logical_devices("GPU")][:n]


def _close(expected, got, rtol=1e-4, atol=1e-5):
    (model_a, history_a, evaluation_a), (model_b, history_b, evaluation_b) = expected, got
    assert_weights_close(model_a.get_weights(), model_b.get_weights(), rtol=rtol, atol=atol)
    np.testing.assert_allclose(history_b["loss"], history_a["loss"], rtol=rtol, atol=atol)
    np.testing.assert_allclose(evaluation_b, evaluation_a, rtol=rtol, atol=atol)


@needs_gpus(2)
@pytest.mark.parametrize("kind", ["dense", "embedding", "conv2d", "lstm"])
def test_replicas_on_gpus_equal_one_device(kind):
    """Every variable on /cpu:0, the steps on two GPUs: one GPU's weights, history, metrics."""
    strategy = dpkeras.get_strategy(_gpus(2), "/cpu:0")
    got = train(kind, strategy)
    _close(train(kind), got)
    assert all(v.value.device.endswith("CPU:0") for v in got[0].weights)


@needs_gpus(2)
@pytest.mark.parametrize("kind", ["dense", "conv2d"])
def test_hybrid_on_gpus_equals_one_device(kind):
    """Dense variables copied on each GPU and all-reduced (NCCL), identical copies."""
    strategy = dpkeras.get_strategy(_gpus(2), placement.hybrid())
    got = train(kind, strategy)
    _close(train(kind), got)
    assert_copies_identical(got[0])


@needs_gpus(2)
@pytest.mark.parametrize("parameter_device", ["/cpu:0", "hybrid"])
def test_mixed_float16_on_gpus_equals_one_device(parameter_device):
    """float16 compute on the GPUs' tensor cores, float32 variables, a dynamic loss scale."""
    keras.config.set_dtype_policy("mixed_float16")  # the conftest fixture resets it
    policy = placement.hybrid() if parameter_device == "hybrid" else parameter_device
    got = train("dense", dpkeras.get_strategy(_gpus(2), policy))
    _close(train("dense"), got, rtol=1e-3, atol=2e-4)
    assert isinstance(got[0].optimizer, keras.optimizers.LossScaleOptimizer)
    assert int(got[0].optimizer.iterations.numpy()) == 6


@needs_gpus(2)
def test_the_parameter_device_can_be_a_gpu():
    """Variables on GPU:0, which also computes (tf_cnn_benchmarks' --local_parameter_device)."""
    gpus = _gpus(2)
    got = train("embedding", dpkeras.get_strategy(gpus, gpus[0]))
    _close(train("embedding"), got)
    for v in got[0].weights + got[0].optimizer.variables:
        assert v.value.device.endswith("GPU:0"), (v.path, v.value.device)
