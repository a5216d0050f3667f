"""The per-step state replicas read (`dpkeras._variables.replica_step`) belongs to one traced step.

A cached strategy is shared: two threads may trace steps under it at the same time. Each
step's gradient weights (uneven batches) and inputs must reach that step's replicas only.
"""

import threading

import keras
import numpy as np
import tensorflow as tf

from dpkeras._variables import replica_step
from dpkeras.testing import assert_weights_close, cpu_strategy

TIMEOUT = 120


class _Rendezvous(keras.layers.Layer):
    """Makes replica 0 of each of two traced steps wait for the other, once.

    Both steps are then inside their replicas at the same time, after each strategy.run
    declared its own step state and before any variable is read: the interleaving in which
    state kept on the shared strategy object would reach the wrong step.
    """

    def __init__(self, barrier, strategy, **kwargs):
        super().__init__(**kwargs)
        self._barrier, self._strategy = barrier, strategy
        self.met = False

    def call(self, x):
        ctx = tf.distribute.get_replica_context()
        if (
            not self.met
            and ctx is not None
            and ctx.strategy is self._strategy
            and tf.get_static_value(ctx.replica_id_in_sync_group) == 0
        ):
            self._barrier.wait(TIMEOUT)
            self.met = True
        return x


def _build(barrier=None, strategy=None):
    keras.utils.set_random_seed(3)
    layers = [keras.Input((6,))]
    if barrier is not None:
        layers.append(_Rendezvous(barrier, strategy))
    layers += [keras.layers.Dense(5, activation="tanh"), keras.layers.Dense(2)]
    model = keras.Sequential(layers)
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss="mse")
    return model


def test_two_threads_tracing_under_one_cached_strategy_get_their_own_gradient_weights():
    """Each thread traces and runs `strategy.run(model.train_step)`; the traces overlap.

    The batches are distributed before the threads start: TensorFlow's distributed
    iterators are not safe to create and drain from two threads under one strategy (two
    concurrent `fit`s mix their batches, under MirroredStrategy too), which is not what this
    test is about.
    """
    strategy = cpu_strategy(3)
    rng = np.random.RandomState(0)
    # Global batches of 10 and 8 over 3 replicas: splits 4/3/3 and 3/3/2, so the two steps'
    # gradient weights differ (1.2, 0.9, 0.9 against 1.125, 1.125, 0.75).
    data = [
        (rng.rand(10, 6).astype("float32"), rng.rand(10, 2).astype("float32")),
        (rng.rand(8, 6).astype("float32"), rng.rand(8, 2).astype("float32")),
    ]
    barrier = threading.Barrier(2)
    with strategy.scope():
        models = [_build(barrier, strategy), _build(barrier, strategy)]
    batches = [
        next(
            iter(
                strategy.experimental_distribute_dataset(
                    tf.data.Dataset.from_tensor_slices((x, y)).batch(len(x))
                )
            )
        )
        for x, y in data
    ]
    errors = []

    def train(model, batch):
        try:
            step = tf.function(lambda b: strategy.run(model.train_step, args=(b,)))
            for _ in range(3):
                step(batch)
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=train, args=(m, b)) for m, b in zip(models, batches)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    assert [m.layers[0].met for m in models] == [True, True]  # the traces did overlap
    for model, (x, y) in zip(models, data):
        reference = _build()
        reference.fit(x, y, batch_size=len(x), epochs=3, shuffle=False, verbose=0)
        assert_weights_close(reference.get_weights(), model.get_weights())


def test_no_replica_step_outside_a_replica():
    strategy = cpu_strategy(2)
    assert replica_step.current(strategy.extended) is None
    with strategy.scope():
        assert replica_step.current(strategy.extended) is None  # cross-replica context


def test_replica_step_names_the_replica_and_its_device():
    strategy = cpu_strategy(2)
    seen = []

    @tf.function
    def step():
        def replica_fn():
            seen.append(replica_step.current(strategy.extended))
            return tf.constant(0.0)

        return strategy.run(replica_fn)

    step()
    assert [(s.replica_id, s.num_replicas, s.device) for s in seen] == [
        (i, 2, d) for i, d in enumerate(strategy.extended.worker_devices)
    ]
    assert all(s.gradient_weight is None for s in seen)  # not a Keras train step
    assert all(len(s.state.inputs) == 2 for s in seen)  # traced: inputs are known (none here)


def test_state_is_found_from_a_nested_function_graph_and_not_after_the_step():
    strategy = cpu_strategy(2)
    state = replica_step.StepState(gradient_weights=["w0", "w1"])
    outer = tf.Graph()
    with outer.as_default(), replica_step.running(strategy.extended, state):
        inner = tf.__internal__.FuncGraph("inner")  # nested in `outer`, as a tf.function is
        assert inner.outer_graph is outer
        with inner.as_default():
            assert replica_step.state_of(strategy.extended) is state
    with outer.as_default():
        assert replica_step.state_of(strategy.extended) is not state
