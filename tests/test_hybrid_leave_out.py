"""The pieces of leaving out a worker under `placement.hybrid()` that need no cluster: a
replicated variable's `copies` follow the devices that run replicas now (in replica order,
the left-out ones' skipped), `remake_on` makes every copy of the task again (those of a
left-out device too), and once a task was lost the traced all-reduce is exchanged (no
collective) and gives every device the same bits. The whole path, on a real cluster whose
worker is killed and restarted, is tests/test_cluster_training.py's
`test_a_worker_lost_mid_fit_is_left_out_and_taken_back_within_float_tolerance[hybrid-k2]`.

The cluster's tasks are one task here (every logical CPU is in /job:localhost), so the
strategy's devices are changed as `compute_without` changes them: a new tuple of devices.
"""

import contextlib

import keras
import numpy as np
import pytest
import tensorflow as tf

from dpkeras import placement
from dpkeras._extended import all_reduce
from dpkeras._variables import pieces
from dpkeras.testing import cpu_strategy

TASK = "/job:localhost/replica:0/task:0"


@contextlib.contextmanager
def _running_on(extended, indices):
    """The strategy's replicas on its devices `indices` only (as after a worker's leave-out),
    then on every device again."""
    every = extended._compute_devices
    extended._compute_devices = tuple(every[i] for i in indices)
    try:
        yield
    finally:
        extended._compute_devices = every


@pytest.fixture
def kernel():
    strategy = cpu_strategy(3, placement.hybrid())
    with strategy.scope():
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(3)])
    yield strategy.extended, model.layers[0].kernel.value


def test_copies_are_those_of_the_devices_that_run_replicas_now_in_replica_order(kernel):
    extended, kernel = kernel
    every = tuple(kernel.copies)
    assert len(every) == 3
    for i, copy in enumerate(every):  # each copy its own value, to see which one is touched
        copy.assign(np.full((2, 3), float(i), "float32"))
    with _running_on(extended, [0, 2]):
        assert kernel.copies == (every[0], every[2])
        assert kernel.copy_devices == (every[0].device, every[2].device)
        # Replica (and the optimizer's pass) 1 is device 2's: copy 2, not the left-out copy 1.
        with pieces.copy(extended, 1):
            assert kernel.handle is every[2].handle
            np.testing.assert_array_equal(kernel.numpy(), np.full((2, 3), 2.0))
        # A write from outside a step reaches every copy that runs, not the left-out one.
        kernel.assign(np.full((2, 3), 7.0, "float32"))
        assert [float(c.numpy()[0, 0]) for c in every] == [7.0, 1.0, 7.0]
    assert kernel.copies == every  # every device again: every copy again
    with pieces.copy(extended, 1):
        assert kernel.handle is every[1].handle


def test_remake_on_makes_every_copy_of_the_task_again_even_of_a_left_out_device(kernel):
    """A worker is taken back (its copies made again) before its devices run replicas again:
    `remake_on` makes the copies of every device of the task, not only of those running."""
    extended, kernel = kernel
    every = tuple(kernel.copies)
    handles = [c.handle for c in every]
    with _running_on(extended, [0, 1]):
        assert kernel.remake_on(TASK) == 3
        assert kernel.remake_on("/job:worker/replica:0/task:7") == 0
    assert all(c.handle is not h for c, h in zip(every, handles, strict=True))
    assert not any(bool(c.is_initialized()) for c in every)
    kernel.assign(np.ones((2, 3), "float32"))  # then restored into every copy
    assert all(np.array_equal(c.numpy(), np.ones((2, 3))) for c in every)


@pytest.mark.parametrize("mode", ["eager", "traced"])
def test_after_a_lost_task_the_sum_is_exchanged_the_same_on_every_device(monkeypatch, mode):
    """No collective once a task was lost (`all_reduce.lost`); each device sums the same
    components in replica order: the same bits on every device, though float addition
    depends on the order (1 + 1e8 - 1e8 is 0 in float32, -1e8 + 1e8 + 1 is 1; traced,
    TensorFlow's graph optimizer may put an AddN's inputs in an order of its own, the same
    on every device)."""
    devices = cpu_strategy(3, placement.hybrid()).extended.worker_devices
    tokens = []
    for device in devices:
        with tf.device(device):
            tokens.append(tf.Variable(0.0).handle)
    monkeypatch.setattr(all_reduce, "_lost", {"/job:worker/replica:0/task:1"})
    assert not all_reduce.collectives_trusted()

    def sums():
        parts = []
        for value, device in zip((1.0, 1e8, -1e8), devices, strict=True):
            with tf.device(device):
                parts.append(tf.fill([2], value))
        return all_reduce.sum_per_copy([parts], devices, tokens, [(2,)])

    function = tf.function(sums)
    graph = function.get_concrete_function().graph
    assert not [op for op in graph.get_operations() if op.type == "CollectiveReduceV2"]
    (out,) = function() if mode == "traced" else sums()
    expected = tf.add_n([tf.fill([2], v) for v in (1.0, 1e8, -1e8)]).numpy()
    for total in out:
        np.testing.assert_array_equal(total.numpy(), expected)
