"""`needs_gpus(n)`: the mark of a test that runs only where there are GPUs.

Every such test carries the `gpu` marker, so that `make gpu-check` (benchmarks/gpu_check.py)
runs exactly them (`pytest -m gpu`); without enough GPUs they skip with the count they need.
The GPUs are the physical ones, or, when `DPKERAS_TEST_LOGICAL_GPUS` is set, the logical GPUs
tests/conftest.py split the first one into (`dpkeras.testing.split_gpu`). No test module asks
TensorFlow for GPUs in a skip condition of its own (tests/test_gpu_check.py checks it).
"""

import os

import pytest
import tensorflow as tf

LOGICAL_GPUS = "DPKERAS_TEST_LOGICAL_GPUS"


def gpu_count():
    """The GPUs this test process runs on, without initialising TensorFlow's devices."""
    physical = len(tf.config.list_physical_devices("GPU"))
    if physical and os.environ.get(LOGICAL_GPUS):
        return int(os.environ[LOGICAL_GPUS])
    return physical


def needs_gpus(n=1):
    """Marks a test `gpu` and skips it with fewer than `n` GPUs."""
    reason = f"needs {n} GPU{'s' if n > 1 else ''} (make gpu-check runs it where there are)"

    def mark(test):
        return pytest.mark.gpu(pytest.mark.skipif(gpu_count() < n, reason=reason)(test))

    return mark
