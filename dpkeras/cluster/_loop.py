"""The on-cluster loop: a step function runs with a task of the cluster as its coordinator."""

import contextlib
import functools
import threading

import tensorflow as tf

from dpkeras.cluster._spec import task_name

_state = threading.local()


def loop_device(cluster_spec):
    """The device that coordinates each call of a step function on a cluster: the host CPU of
    worker 0 (`/job:worker/replica:0/task:0/device:CPU:0`)."""
    del cluster_spec  # every cluster dpkeras accepts has worker 0
    return f"{task_name('worker', 0)}/device:CPU:0"


def on_task(function, device):
    """`function`, called with `device` as the device of the call.

    TensorFlow runs a multi-device function from the task its call is placed on: that task
    instantiates it, runs the partitions on the other tasks, carries the control of a
    `tf.while_loop` (Keras's loop over `steps_per_execution` steps) and gathers the outputs.
    Called from the client without a device, the client is that task, and sends every
    partition the loop's predicate in every iteration: the client's work per step grows with
    the number of workers, and `steps_per_execution` cannot amortise it. Called on a task of
    the cluster, the client sends one request per call and receives the outputs once.
    """

    @functools.wraps(function)
    def call(*args, **kwargs):
        if getattr(_state, "on_the_client", False):
            return function(*args, **kwargs)
        with tf.device(device):
            return function(*args, **kwargs)

    call.__dpkeras_loop_device__ = device
    return call


def runs_on_task(function):
    """Whether `function` was made by `on_task`."""
    return hasattr(function, "__dpkeras_loop_device__")


@contextlib.contextmanager
def on_the_client():
    """Step functions called on this thread in the block run from the client, as without
    `on_task`: their partitions are then instantiated, and recorded, by this process
    (`dpkeras.record_transfers` reads them)."""
    saved = getattr(_state, "on_the_client", False)
    _state.on_the_client = True
    try:
        yield
    finally:
        _state.on_the_client = saved
