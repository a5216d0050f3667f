"""The optimizer runs once, where the variables live, on the summed gradient."""

import weakref

import keras
import tensorflow as tf

from dpkeras._extended import all_reduce, packing
from dpkeras._variables import dedup, pieces, placed, replica_step

_attached = weakref.WeakKeyDictionary()  # optimizer -> the extended it sums for
_IN_EACH_REPLICA = object()  # the merge's answer when no gradient is per-replica


def attach(optimizer, extended):
    """Makes `optimizer` sum its gradients across `extended`'s replicas before it applies them.

    Records the pair only; `summing_first`, which dpkeras._patches puts in place of Keras's
    `Optimizer.apply`, acts for recorded optimizers and calls Keras's own for every other.

    One device clips, decays and accumulates the gradient of the whole batch. Keras under a
    `tf.distribute` strategy does those per replica, on each replica's partial gradient, and sums
    last: with `clipnorm=0.1` and 3 replicas, each replica's third of the gradient is clipped to
    0.1 and the sum can reach 0.3 (MirroredStrategy gives exactly these wrong numbers), and
    `gradient_accumulation_steps` fails (a merge inside Keras's `cond`).

    Under dpkeras, a Keras optimizer created in the strategy's scope sums first: its `apply`,
    called in a replica, merges the replicas' gradients, sums each on its variable's device, and
    runs Keras's own `apply` once, in cross-replica context, on the sums. Clipping
    (`clipnorm`, `global_clipnorm`, `clipvalue`), weight decay, accumulation (the accumulators live
    with their variables; the sum crosses once per step, not per update), EMA and the iteration
    count then see what one device sees. With 3 replicas whose gradients are [1], [2] and [3] and
    `clipvalue=4`, the update uses clip(6) = 4, as one device would, not 1 + 2 + 3 = 6.

    Gradients that are not per-replica (the same tensors, captured from outside `strategy.run`,
    handed to `apply` by every replica) are not a data-parallel gradient: the replicas then run
    Keras's own `apply`, as they do under MirroredStrategy, so the numbers are Mirrored's (the
    tensor counts once; with `gradient_accumulation_steps`, each replica's accumulated average
    counts at the update step, as in Keras's tests of MirroredStrategy). Keras's
    LossScaleOptimizer is left as it is: it already moves to cross-replica context and calls its
    inner optimizer in each replica, whose `apply` sums.

    Idempotent; LossScaleOptimizers are left alone (see above).
    """
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer) or optimizer in _attached:
        return
    _attached[optimizer] = extended


def attached(optimizer):
    """The extended `optimizer` sums for (see `attach`), or None."""
    return _attached.get(optimizer)


def summing_first(keras_apply, optimizer, grads, trainable_variables=None):
    """Stands in for Keras's `Optimizer.apply(grads, trainable_variables)` (see `attach`).

    Args:
        keras_apply: Keras's own `Optimizer.apply`, unbound.
        optimizer, grads, trainable_variables: its arguments.
    """
    extended = _attached.get(optimizer)
    ctx = tf.distribute.get_replica_context()
    if extended is None or ctx is None or ctx.strategy.extended is not extended:
        return keras_apply(optimizer, grads, trainable_variables)
    grads = list(grads)
    result = ctx.merge_call(
        _apply_summed, args=(extended, optimizer, keras_apply, grads, trainable_variables)
    )
    if result is _IN_EACH_REPLICA:
        return keras_apply(optimizer, grads, trainable_variables)
    return result


# Not converted by AutoGraph: `merge_call` converts its function when the replica function was
# converted (Keras's steps are), and two threads tracing at once raced in AutoGraph's
# conversion cache ("tf___sum() missing 3 required positional arguments", once in a suite
# run); dpkeras's code branches on Python values only.
@tf.autograph.experimental.do_not_convert
def _apply_summed(strategy, extended, optimizer, keras_apply, grads, trainable_variables):
    if strategy.num_replicas_in_sync > 1 and not any(
        isinstance(g, tf.distribute.DistributedValues) for g in grads
    ):
        return _IN_EACH_REPLICA
    variables = (
        trainable_variables if trainable_variables is not None else optimizer.trainable_variables
    )
    replicated = [_copied(v) for v in variables]
    summed = _sums(extended, optimizer, grads, variables, replicated)
    with tf.control_dependencies(_checks_of_the_step()):
        if any(replicated):
            return _apply_in_passes(
                extended, optimizer, keras_apply, grads, summed, variables, trainable_variables
            )
        # Ops Keras does not place (the iteration count's `+ 1`, the clipping norm) run on the
        # home parameter device, not wherever the placer would put them.
        with (
            tf.device(extended.parameter_devices[0]),
            replica_step.state_of(extended).after_inputs(0),
        ):
            return keras_apply(optimizer, summed, trainable_variables)


def _checks_of_the_step():
    """The checks the step made so far in every replica (the traced graph's `Assert` ops and
    their guards, such as a layer's `tf.debugging.assert_less`), for the updates to wait on: a
    step whose check fails changes no weight.

    An `Assert` feeds no other op, so nothing orders the updates after it (TensorFlow's
    automatic control dependencies order stateful ops only by the resources they touch); on a
    cluster a replica's check runs on its worker while the updates run on the ps tasks, and a
    failing check on one worker did not stop the ps from applying the step (seen in 1 of 4
    runs of 6 failing fits). Eagerly, a check raises before anything after it runs."""
    if tf.executing_eagerly():
        return []
    return [op for op in tf.compat.v1.get_default_graph().get_operations() if _is_a_check(op)]


def _is_a_check(op):
    """An `Assert`, or the conditional TensorFlow wraps one in when its data is not all int32
    or strings (`tf.debugging.assert_*` of floats: an `If` named `.../AssertGuard`)."""
    if op.type == "Assert":
        return True
    return op.type in ("If", "StatelessIf") and op.name.rsplit("/", 1)[-1].startswith("AssertGuard")


def _apply_in_passes(
    extended, optimizer, keras_apply, grads, summed, variables, trainable_variables
):
    """Keras's `apply` once per copy of the replicated variables: pass j on compute device j.

    The replicated variables' gradients are all-reduced among the compute devices
    (`all_reduce.sum_per_copy`); pass j gives Keras device j's sums (and the parameter
    devices' sums of the other variables, the same tensors in every pass) and runs in
    `pieces.copy(extended, j)`: the replicated variables read and write their copy j, so
    clipping, weight decay, accumulation, EMA and the iteration count run on device j with
    device j's numbers, and every copy receives the same update. The other variables are
    written in pass 0 only (`pieces.writes_skipped`), which runs last.
    """
    devices = extended.worker_devices
    indices = [i for i, v in enumerate(variables) if summed[i] is None and grads[i] is not None]
    by_variable = {}
    if indices:
        tokens = [c.handle for c in _tf_variable(variables[indices[0]]).copies]
        sums = all_reduce.sum_per_copy(
            [extended.reductions.components(grads[i], from_every_replica=False) for i in indices],
            devices,
            tokens,
            [variables[i].shape for i in indices],
        )
        by_variable = dict(zip(indices, sums))
    state = replica_step.state_of(extended)
    result = None
    for j in reversed(range(len(devices))):
        pass_grads = [
            by_variable[i][j] if i in by_variable else summed[i] for i in range(len(variables))
        ]
        with (
            pieces.copy(extended, j),
            _pass_device(devices[j]),
            state.after_inputs(j),
        ):
            result = keras_apply(optimizer, pass_grads, trainable_variables)
    return result


_UNKNOWN_SIZE = 1 << 40  # a dimension known only at run time: a table's rows, say


def _size(tensor):
    if tensor.dtype == tf.resource:
        return 0
    shape = tensor.shape
    return shape.num_elements() if shape.is_fully_defined() else _UNKNOWN_SIZE


def _pass_device(device):
    """The device scope of an optimizer pass on `device` (see `_beside_the_largest`); eager
    ops take a device name only."""
    if tf.executing_eagerly():
        return tf.device(device)
    return tf.compat.v1.get_default_graph().device(_beside_the_largest(device))


def _beside_the_largest(device):
    """A device function for an optimizer pass on compute device `device`: an op Keras does
    not place runs where its largest input is, else on `device`.

    Clipping scales a table's summed gradient (on its parameter device) and a dense layer's
    (on `device`) by one scalar: each product then runs beside its gradient, and only the
    scalar travels; with `device` alone, a table's gradient would cross to the compute device
    (made dense by the multiplication) and back.
    """

    def place(op):
        if op.device:
            return op.device
        best, size = device, 0
        for tensor in op.inputs:
            n = _size(tensor)
            if tensor.device and n > size:
                best, size = tensor.device, n
        return best

    return place


def _sums(extended, optimizer, grads, variables, replicated):
    """Each gradient summed where its variable consumes it (None for a replicated variable's,
    or no gradient); the dense ones a worker sends to one parameter device cross packed
    (`packing`)."""
    entries = []
    for g, v, r in zip(grads, variables, replicated):
        ours = placed.of(_tf_variable(v))
        device = None if r or ours is None else ours.dense_sum_device
        per_replica = isinstance(g, tf.distribute.DistributedValues)
        components = (
            extended.reductions.components(g, from_every_replica=False)
            if device and per_replica
            else None
        )
        entries.append((components, device))
    packed = packing.sum_packed(entries)
    return [
        p if p is not None else None if r else _sum(extended, optimizer, g, v)
        for p, g, v, r in zip(packed, grads, variables, replicated)
    ]


def _sum(extended, optimizer, grad, variable):
    if grad is None:
        return None
    sum_repeats = dedup.sums_gradient_rows(extended.deduplicate, optimizer)
    variable = _tf_variable(variable)
    if placed.of(variable) is not None:
        return variable.sum_gradient(extended.reductions, grad, sum_repeats)
    return extended.aggregate(
        "SUM", grad, variable.device, from_every_replica=False, sum_repeats=sum_repeats
    )


def _copied(variable):
    """Whether `variable` (a Keras or TensorFlow variable) has a copy per compute device."""
    ours = placed.of(_tf_variable(variable))
    return ours is not None and bool(ours.copy_devices)


def _tf_variable(variable):
    """The `tf.Variable` of a `keras.Variable`; a `tf.Variable` (its `value` is a method) as is."""
    return variable.value if isinstance(variable, keras.Variable) else variable
