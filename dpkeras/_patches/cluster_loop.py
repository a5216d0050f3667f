"""On a cluster, Keras's step functions run with a worker task as their coordinator, and
without XLA."""

import warnings

from dpkeras._extended.extended import extended_of
from dpkeras.cluster import _loop


def cluster_spec_of(model):
    """The cluster of `model`'s dpkeras strategy, or None (no cluster, or not dpkeras)."""
    extended = extended_of(model)
    return None if extended is None else extended.cluster_spec


def running_on_the_cluster(attribute):
    """A wrapper of Keras's `make_<step>_function` that makes the `attribute` it sets
    (`train_function`, `test_function` or `predict_function`) run on a task of the cluster
    (`dpkeras.cluster._loop.on_task`), for a model of a dpkeras strategy on a cluster.

    With `steps_per_execution=K`, the client then dispatches once per K steps and receives the
    logs once per K steps; Keras's loop over the K steps, and its control, run on the cluster.
    A model compiled with `jit_compile=True` gets its step built without XLA there
    (`_without_xla`).
    """

    def make_function(original, model, *args, **kwargs):
        spec = cluster_spec_of(model)
        if spec is not None and model.jit_compile and not model.run_eagerly:
            result = _without_xla(original, model, *args, **kwargs)
        else:
            result = original(model, *args, **kwargs)
        function = getattr(model, attribute, None)
        if spec is None or function is None or _loop.runs_on_task(function):
            return result
        wrapped = _loop.on_task(function, _loop.loop_device(spec))
        setattr(model, attribute, wrapped)
        return wrapped if result is function else result

    return make_function


def _without_xla(make, model, *args, **kwargs):
    """Keras's `make_<step>_function` for a model on a cluster compiled with `jit_compile=True`:
    the step is built as with `jit_compile=False`, with a warning naming the model.

    XLA compiles a function for the one device it is called on, and cannot read a variable
    that lives on another device ("Trying to access resource ... located in device
    /job:ps/... from device /job:worker/...", XLA's known issue
    tfvariable_on_a_different_device); a compiled function called on a remote task is
    refused too ("KernelAndDeviceOp does not support EagerFunctionParams"). On a cluster the
    variables live on other tasks than the one that runs the step, so `fit`, `evaluate` and
    `predict` would fail at their first step. The same step without XLA gives the same
    numbers, within float rounding. On one machine, dpkeras keeps Keras's XLA compilation.
    """
    warnings.warn(
        f"Model {model.name!r} was compiled with jit_compile=True, but on a cluster its steps "
        f"run without XLA: XLA cannot read variables that live on other tasks (the ps tasks). "
        f"Proceeding with jit_compile=False for its steps.",
        stacklevel=2,
    )
    model.jit_compile = False
    try:
        return make(model, *args, **kwargs)
    finally:
        model.jit_compile = True
