"""`fit`, `evaluate` and `predict` on a cluster name the task that failed."""

from dpkeras._extended.extended import extended_of
from dpkeras.cluster import _health


def naming_failed_tasks(original, model, *args, **kwargs):
    """Wraps a Keras `fit`/`evaluate`/`predict`: a lost task becomes `TaskFailedError`.

    When a ps or worker dies mid-step, TensorFlow raises an error whose text buries the task
    in a gRPC message (as `UnavailableError`, or as a `ValueError` from inside Keras's `fit`).
    For a model of a dpkeras strategy on a cluster, such an error becomes
    `dpkeras.cluster.TaskFailedError` (a `tf.errors.UnavailableError`), naming the task and
    its address, with TensorFlow's error as its `tensorflow_error` (not chained: the traceback
    ends with one line naming the task). Every other error, and every other model, is left as
    it is.
    """
    extended = extended_of(model)
    spec = None if extended is None else extended.cluster_spec
    if spec is None:
        return original(model, *args, **kwargs)
    with _health.name_failures(spec):
        return original(model, *args, **kwargs)
