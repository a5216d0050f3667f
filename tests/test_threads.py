"""Threads and several strategies in one process.

`dpkeras.scope()` is thread-local, like every `tf.distribute` scope: another thread does not see
it and may enter a scope of its own. Several dpkeras strategies (different compute and parameter
devices) work in one process, one after the other and at the same time in different threads.
"""

import threading

import numpy as np
import tensorflow as tf

import dpkeras
from dpkeras import ParameterVariable
from dpkeras.testing import assert_weights_close
from tests.models import build_model, make_data

TIMEOUT = 120


def _placed_on(model, device):
    devices = {v.value.device for v in model.variables}
    assert devices == {f"/job:localhost/replica:0/task:0/device:CPU:{device[-1]}"}, devices
    assert all(isinstance(v.value, ParameterVariable) for v in model.variables)


def test_another_thread_does_not_see_the_scope():
    held = threading.Event()
    observed = threading.Event()
    seen = {}

    def holder():
        with dpkeras.scope(["/cpu:1", "/cpu:2"]) as strategy:
            seen["holder"] = strategy
            held.set()
            observed.wait(TIMEOUT)
            seen["holder still in scope"] = tf.distribute.get_strategy() is strategy
            seen["holder variable"] = tf.Variable(1.0)

    def observer():
        held.wait(TIMEOUT)
        seen["observer has strategy"] = tf.distribute.has_strategy()
        seen["observer variable"] = tf.Variable(1.0)
        with dpkeras.scope(["/cpu:3"], "/cpu:2") as strategy:  # its own, meanwhile
            seen["observer"] = strategy
            seen["observer scoped variable"] = tf.Variable(1.0)
        observed.set()

    threads = [threading.Thread(target=holder), threading.Thread(target=observer)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
    assert not any(t.is_alive() for t in threads)
    assert seen["observer has strategy"] is False
    assert not isinstance(seen["observer variable"], ParameterVariable)
    assert seen["holder still in scope"] is True
    assert seen["holder variable"].extended is seen["holder"].extended
    assert seen["observer scoped variable"].extended is seen["observer"].extended
    assert seen["observer scoped variable"].device.endswith("CPU:2")
    assert not tf.distribute.has_strategy()  # nor did this thread


def test_two_strategies_in_one_process_train_correctly_one_after_the_other():
    """Different compute devices and parameter devices; interleaved fits; each model equals
    one device trained on the same batches."""
    x, y = make_data("dense", 96)
    first = dpkeras.get_strategy(["/cpu:1", "/cpu:2"], "/cpu:0")
    second = dpkeras.get_strategy(["/cpu:2", "/cpu:3", "/cpu:1"], "/cpu:1")
    assert first is not second
    with first.scope():
        a = build_model("dense")
    with second.scope():
        b = build_model("dense")
    reference = build_model("dense")
    for _ in range(2):
        for model in (a, b, reference):
            model.fit(x, y, batch_size=48, epochs=1, shuffle=False, verbose=0)
        assert_weights_close(reference.get_weights(), a.get_weights())
        assert_weights_close(reference.get_weights(), b.get_weights())
    _placed_on(a, "/cpu:0")
    _placed_on(b, "/cpu:1")
    ev_a, ev_b = a.evaluate(x, y, verbose=0), b.evaluate(x, y, verbose=0)
    np.testing.assert_allclose(ev_a, reference.evaluate(x, y, verbose=0), rtol=1e-5)
    np.testing.assert_allclose(ev_b, ev_a, rtol=1e-5)


def test_two_strategies_train_at_the_same_time_in_two_threads():
    x, y = make_data("dense", 96)
    strategies = [
        dpkeras.get_strategy(["/cpu:1"], "/cpu:0"),
        dpkeras.get_strategy(["/cpu:2", "/cpu:3"], "/cpu:1"),
    ]
    models = []
    for strategy in strategies:
        with strategy.scope():
            models.append(build_model("dense"))
    reference = build_model("dense")
    reference.fit(x, y, batch_size=48, epochs=3, shuffle=False, verbose=0)
    errors = []
    start = threading.Barrier(2)

    def train(model):
        try:
            start.wait(TIMEOUT)
            model.fit(x, y, batch_size=48, epochs=3, shuffle=False, verbose=0)
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=train, args=(m,)) for m in models]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    for model in models:
        assert_weights_close(reference.get_weights(), model.get_weights())
