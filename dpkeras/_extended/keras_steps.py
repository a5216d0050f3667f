"""What the strategy does around a Keras step, so that N replicas equal one device."""

import inspect

import keras
import tensorflow as tf

from dpkeras import _keras_internals
from dpkeras._input import batch_rows
from dpkeras._variables import placed

_STEPS = ("train_step", "test_step", "predict_step")


def _bound_method(fn):
    """`(owner, method name)` of a bound method (through decorators), else `(None, "")`."""
    target = inspect.unwrap(fn)
    return getattr(target, "__self__", None), getattr(target, "__name__", "")


def step_model(fn):
    """`(model, step name)` when `fn` is a Keras model's train/test/predict step, else Nones."""
    owner, name = _bound_method(fn)
    # A Keras trainer: a keras.Model, or any class built on Keras's TF trainer (Keras's own
    # tests train a Layer that mixes it in).
    if isinstance(owner, _keras_internals.tensorflow_trainer()) and name in _STEPS:
        return owner, name
    model = _keras_internals.predict_step_model(fn)
    if model is not None:
        return model, "predict_step"
    return None, None


def safe_with_an_empty_share(fn):
    """`fn`, a predict step, made safe on a replica whose share of the batch is empty.

    With more replicas than rows in a batch (3 replicas, a last batch of 1), a replica gets no
    rows. A model run on an empty batch does not always give an empty output of the right
    shape: TensorFlow's CPU `Conv2D` hands back its input (`[0, 24, 24, 3]` where the other
    replicas give `[2, 21, 21, 5]`), and concatenating the replicas' outputs fails. On an
    empty share the step runs on one row of zeros and returns none of its rows, so the
    outputs concatenate to one device's. A replica with rows runs `fn` on its rows.

    The row of zeros is appended, not chosen by a `tf.cond`: each batched input gets
    `max(1 - rows, 0)` rows of zeros (none when it has rows) and each batched output keeps its
    first `rows` rows. A `tf.cond` around the step would put every `merge_call` of the model
    inside control flow, which TensorFlow refuses; on a cluster whose workers run several
    replicas each lookup merges its task's ids with one (`dpkeras._variables.task_pulls`).
    """

    def step(*args, **kwargs):
        leaves = [t for t in tf.nest.flatten((args, kwargs)) if batch_rows.is_dense_batch(t)]
        if not leaves or (leaves[0].shape[0] or 0) > 0:
            return fn(*args, **kwargs)
        rows = tf.shape(leaves[0])[0]
        missing = tf.maximum(1 - rows, 0)

        def at_least_one_row(x):
            if not batch_rows.is_dense_batch(x):
                return x
            zeros = tf.zeros(tf.concat([[missing], tf.shape(x)[1:]], 0), x.dtype)
            return tf.concat([x, zeros], 0)

        def its_rows(x):
            return x[:rows] if batch_rows.is_dense_batch(x) else x

        padded_args, padded_kwargs = tf.nest.map_structure(at_least_one_row, (args, kwargs))
        return tf.nest.map_structure(its_rows, fn(*padded_args, **padded_kwargs))

    return step


def is_whole_batch(args, kwargs):
    """Whether a step's arguments are one batch for every replica (no distributed value)."""
    leaves = tf.nest.flatten((args, kwargs))
    return not any(isinstance(x, tf.distribute.DistributedValues) for x in leaves)


def check_model_variables(model, extended):
    """Raises ValueError naming the first variable of `model` not created under `extended`."""
    for v in model.variables:
        value = getattr(v, "value", v)
        if placed.of(value) is None or value.extended is not extended:
            raise ValueError(
                f"Model {model.name!r} has variable {getattr(v, 'path', v.name)!r} that was "
                f"not created under this strategy's scope ({type(value).__name__} on "
                f"{value.device or 'no device'}), so it cannot be trained on the parameter "
                f"device. Create the model (and compile it) inside `with dpkeras.scope():`."
            )


def gradient_weights(args, local_results, num_replicas, device):
    """Per-replica gradient weights `N * b_i / B` for a Keras train step, else None.

    Keras scales each replica's mean loss by 1/N, which equals one device only when every
    replica has the same number of examples b_i. Weighting replica i's gradients by
    N * b_i / B (B = sum of b_i) makes any split exact, and leaves even splits bit-identical
    (None: no scaling at all). With 3 replicas and a global batch of 10 split 4/3/3, the
    weights are 1.2, 0.9, 0.9. Custom loops that scale by the global batch themselves
    (`tf.nn.compute_average_loss`) are not Keras train steps and are left alone.

    Args:
        args: the step's arguments; the first per-replica input with rows (a dense, ragged or
            sparse tensor; None and scalars are passed over) counts each replica's examples.
        local_results: callable, a `DistributedValues` -> its per-replica components.
        num_replicas: int.
        device: where the weights are computed (the parameter device).
    """
    if num_replicas == 1:
        return None
    components = _batch_components(args, local_results)
    if components is None:
        return None
    static = [batch_rows.static_rows(c) for c in components]
    if None not in static and len(set(static)) == 1:
        return None
    counts = []
    for c in components:
        with tf.device(batch_rows.device_of(c)):
            counts.append(tf.cast(batch_rows.rows(c), tf.float32))
    with tf.device(device):
        total = tf.add_n(counts)
        n = float(num_replicas)
        return [tf.math.divide_no_nan(c * n, total) for c in counts]


def _batch_components(args, local_results):
    """Per replica, the first input of the step that has a batch dimension: a dense, ragged or
    sparse tensor (an optional input given as None, and scalars, are passed over), or None."""
    for x in tf.nest.flatten(args):
        if not isinstance(x, tf.distribute.DistributedValues):
            continue
        components = list(local_results(x))
        if all(batch_rows.has_rows(c) for c in components):
            return components
    return None


def replica_inputs(args, kwargs, local_results, num_replicas):
    """Per replica, the tensors a traced step receives (None when running eagerly)."""
    if tf.executing_eagerly():
        return None
    inputs = [[] for _ in range(num_replicas)]
    for x in tf.nest.flatten((args, kwargs)):
        parts = (
            local_results(x)
            if isinstance(x, tf.distribute.DistributedValues)
            else [x] * num_replicas
        )
        for replica, part in zip(inputs, parts):
            replica += [
                t for t in tf.nest.flatten(part, expand_composites=True) if isinstance(t, tf.Tensor)
            ]
    return inputs


def is_check_finite(fn):
    """Whether `fn` is Keras's `LossScaleOptimizer.check_finite`."""
    owner, name = _bound_method(fn)
    return isinstance(owner, keras.optimizers.LossScaleOptimizer) and name == "check_finite"


def all_replicas_finite(per_replica_finite, local_results, device, mirrored):
    """Every replica's answer to "are all gradients finite?" becomes the global answer.

    Keras's LossScaleOptimizer asks each replica (from cross-replica context) and then uses
    replica 0's answer, assuming the gradients were already all-reduced; they are not, so an
    overflow on another replica alone would let non-finite gradients into the weights.

    Args:
        per_replica_finite: what `call_for_each_replica(check_finite)` returned.
        local_results: callable, a `DistributedValues` -> its per-replica components.
        device: where the answers are combined.
        mirrored: callable, a list of per-replica values -> a mirrored value.
    """
    answers = list(local_results(per_replica_finite))
    with tf.device(device):
        finite = tf.reduce_all(tf.stack(answers))
    return mirrored([finite] * len(answers))
