"""A pytest plugin that runs Keras's own tf.distribute tests with dpkeras for MirroredStrategy.

Loaded by `tests/test_keras_conformance.py` into a separate pytest process
(`-p keras_distribute_plugin`) that collects the test modules shipped in the installed Keras
wheel. `tf.distribute.MirroredStrategy(devices)` then builds a
`dpkeras.ParameterDeviceStrategy(compute_devices=devices)`: the same devices compute, and the
variables live once on `/cpu:0`.

Tests that assert MirroredStrategy's own representation of variables (one copy per replica)
are expected to fail, each for the reason given in `EXPECTED_FAILURES`; they are marked
`xfail(strict=True)`, so one that starts passing fails the run, and a listed test that Keras no
longer ships is an error. Every other test must pass.
"""

import pytest
import tensorflow as tf

import dpkeras

MODULES = (
    "keras.src.backend.tensorflow.distribute_test",
    "keras.src.backend.tensorflow.optimizer_distribute_test",
)

_ONE_VARIABLE = (
    "dpkeras keeps one variable on the parameter device, not a MirroredVariable with a copy "
    "per replica"
)

# Test name -> why it fails under dpkeras. The functional part of each is re-checked for
# dpkeras in tests/test_keras_conformance.py.
EXPECTED_FAILURES = {
    "DistributeTest::test_variable_creation": (
        f"asserts the variable is a MirroredVariable (DistributedValues): {_ONE_VARIABLE}"
    ),
    "DistributeTest::test_variable_synchronization": (
        "asserts MirroredStrategy turns synchronization AUTO into ON_WRITE: dpkeras keeps "
        "AUTO, there being no per-replica copies to write"
    ),
    "DistributeTest::test_strategy_run": (
        f"first asserts `dense.kernel.value` is DistributedValues: {_ONE_VARIABLE}"
    ),
    "DistributeTest::test_seed_generator": (
        "reads `.values` of `strategy.run(lambda: state.value)`, which returns the one state "
        "variable itself under dpkeras (MirroredStrategy returns its per-replica copies)"
    ),
    "DistributeTest::test_correctness_with_fit_and_regularizer": (
        "reads `.values` of `strategy.run(lambda: layer.kernel.value)`, which returns the one "
        "kernel variable itself under dpkeras (MirroredStrategy returns its per-replica copies)"
    ),
}


def _dpkeras_in_place_of_mirrored(devices=None, cross_device_ops=None):
    del cross_device_ops  # dpkeras sums where each variable lives
    return dpkeras.ParameterDeviceStrategy(compute_devices=list(devices) if devices else None)


def pytest_configure(config):
    tf.distribute.MirroredStrategy = _dpkeras_in_place_of_mirrored


def _short_name(item):
    return f"{item.cls.__name__}::{item.originalname or item.name}" if item.cls else item.name


def pytest_collection_modifyitems(session, config, items):
    names = {_short_name(item) for item in items}
    missing = sorted(set(EXPECTED_FAILURES) - names)
    if missing:
        raise pytest.UsageError(
            f"Expected failures {missing} are not among the collected Keras tests; update "
            f"EXPECTED_FAILURES in {__file__} for this Keras version. Collected: {sorted(names)}"
        )
    for item in items:
        reason = EXPECTED_FAILURES.get(_short_name(item))
        if reason is not None:
            item.add_marker(pytest.mark.xfail(reason=reason, strict=True))
