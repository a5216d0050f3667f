"""Keras's own tf.distribute optimizer cases, in eager `strategy.run` with a captured gradient.

The gradient is one tensor captured from outside `strategy.run`, the same object in every
replica: as under MirroredStrategy, it counts as one contribution (its all-reduced SUM is
itself), so the result equals the same calls with no strategy.
"""

import keras
import numpy as np
import tensorflow as tf

from dpkeras.testing import cpu_strategy


def _run(strategy, make, steps):
    """Creates variables and an optimizer with `make()` and applies `steps` captured updates."""
    scope = strategy.scope() if strategy is not None else tf.init_scope()
    with scope:
        variables, optimizer, grads = make()
    for _ in range(steps):

        def step():
            optimizer.apply_gradients(zip(grads, variables))

        if strategy is None:
            step()
        else:
            strategy.run(step)
    return [v.numpy() for v in variables], optimizer


def _ema():
    v = keras.Variable([[3.0, 4.0], [5.0, 6.0]])
    grads = [tf.constant([[1.0, 1.0], [1.0, 1.0]])]
    optimizer = keras.optimizers.SGD(
        learning_rate=1.0, use_ema=True, ema_momentum=0.5, ema_overwrite_frequency=3
    )
    return [v], optimizer, grads


def _weight_decay():
    decayed, excluded = (
        keras.Variable(np.ones((2,), "float32")),
        keras.Variable(np.ones((2,), "float32") * 2.0),
    )
    optimizer = keras.optimizers.SGD(learning_rate=1.0, weight_decay=0.004)
    optimizer.exclude_from_weight_decay(var_list=[excluded])
    grads = [tf.ones((2,)), tf.ones((2,))]
    return [decayed, excluded], optimizer, grads


def test_ema_with_overwrite_frequency():
    expected, _ = _run(None, _ema, steps=3)
    actual, optimizer = _run(cpu_strategy(2), _ema, steps=3)
    for e, a in zip(expected, actual):
        np.testing.assert_allclose(a, e, rtol=1e-6)
    assert int(optimizer.iterations.numpy()) == 3
    # One contribution, not two: after 3 steps of -1 and the EMA overwrite, not -2 per step.
    assert not np.allclose(actual[0], np.array([[3.0, 4.0], [5.0, 6.0]]) - 6.0)


def test_weight_decay_with_excluded_variables():
    expected, _ = _run(None, _weight_decay, steps=2)
    actual, _ = _run(cpu_strategy(3), _weight_decay, steps=2)
    for e, a in zip(expected, actual):
        np.testing.assert_allclose(a, e, rtol=1e-6)
    # The excluded variable moved by the gradient only: 2 - 1 - 1.
    np.testing.assert_allclose(actual[1], [0.0, 0.0], atol=1e-6)
    assert not np.allclose(actual[0], [-1.0, -1.0])  # the decayed one was decayed too
