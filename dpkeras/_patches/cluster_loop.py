"""On a cluster, Keras's step functions run with a worker task as their coordinator (without
XLA there: `dpkeras._patches.xla` decides)."""

from dpkeras._extended.extended import extended_of
from dpkeras._patches import step_loop, xla
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
    XLA cannot compile such a step (`dpkeras._patches.xla.why_not_xla`). For `fit` and
    `evaluate`, the loop reads each worker's batch on the worker
    (`dpkeras._patches.step_loop`), not through worker 0.
    """
    step = {"train_function": "train_step", "test_function": "test_step"}.get(attribute)

    def make_function(original, model, *args, **kwargs):
        spec = cluster_spec_of(model)
        result = original(model, *args, **kwargs)
        function = getattr(model, attribute, None)
        if spec is None or function is None or _loop.runs_on_task(function):
            return result
        looped = function
        if step is not None:
            looped = step_loop.reading_on_each_host(
                model,
                function,
                getattr(model, step),
                xla=model.jit_compile and xla.why_not_xla(model) is None,
            )
        wrapped = _loop.on_task(looped, _loop.loop_device(spec))
        setattr(model, attribute, wrapped)
        return wrapped if result is function else result

    return make_function
