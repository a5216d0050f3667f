"""The variable dpkeras gives Keras: one copy on the parameter device, read once per replica.

`ParameterVariable` is a resource variable that shares the handle of the variable the creator
chain made on the parameter device. It changes two things, and only inside a replica of a
`ParameterDeviceStrategy`:

Reads. Each replica gets the value once per traced step: the first read in a graph makes one
`ReadVariableOp` on the parameter device for that replica; later reads reuse it, and TensorFlow
sends it to the replica's device once (or not at all if the replica does not use it).
Embedding lookups gather on the parameter device and send only the rows (`dpkeras.lookups`).
The cached tensor is registered on the GradientTape as a read of the variable, and any write
to the variable drops the cache, so a read after a write sees the new value.

Writes, by the kind of variable (how tf.distribute defines them):

- `synchronization=ON_READ` (Keras metric state): every replica's change is summed (or
  averaged, per `aggregation`) and applied once, synchronously, so every replica then reads
  the same, global value.
- `aggregation=NONE` (BatchNormalization statistics, seeds, loss-scale counters): replica 0
  writes; the others' writes are dropped. No synchronization, so it is legal inside `tf.cond`.
  Replica 0 updating BatchNormalization's moving statistics with its own batch's statistics
  is exactly what MirroredStrategy's primary copy ends with.
- `aggregation=SUM`, `MEAN`, `ONLY_FIRST_REPLICA`: the replicas' values are reduced, then
  written once.

Writes in cross-replica context (the optimizer's `extended.update`) go straight to the variable.

Example of ON_READ arithmetic with two replicas: a `Mean` metric holds total=6, count=2. Replica
0 adds 3 (one example), replica 1 adds 5 (one example): both then read total=14, count=4, so both
report 3.5, the value one device would report after seeing the same four examples.
"""

import tensorflow as tf

from dpkeras import _tf_internals, device_names, replica_step
from dpkeras._cache import GraphCache
from dpkeras.placement import VariableKind

__all__ = ["ParameterVariable", "scale_gradient"]

# Added to the first seed component on replica k, times k, so that replicas draw different
# (but reproducible) random numbers: Dropout masks differ across replicas.
_REPLICA_SEED_STRIDE = 0x2545F491

_ON_READ = tf.VariableSynchronization.ON_READ
_NONE = tf.VariableAggregation.NONE


def _is_same_tensor(a, b):
    return a is b or (not tf.executing_eagerly() and a.graph is b.graph and a.name == b.name)


def _added_delta(new_value, read):
    """`x` when `new_value` was computed in the graph as `read + x`, else None.

    Keras implements `v.assign_add(x)` as `v.assign(v + x)`; recovering `x` lets dpkeras apply
    it as an `assign_add` where the variable lives, so the replica need not receive the value,
    with a bit-identical result.
    """
    if hasattr(new_value, "op") and new_value.op.type in ("AddV2", "Add"):
        a, b = new_value.op.inputs
        if _is_same_tensor(a, read):
            return b
        if _is_same_tensor(b, read):
            return a
    return None


def _delta(new_value, read):
    """`new_value - read`, exactly (without rounding) when it was computed as `read + x`."""
    delta = _added_delta(new_value, read)
    return new_value - read if delta is None else delta


def scale_gradient(grad, weight):
    """`grad` times `weight` (None: unchanged), keeping `tf.IndexedSlices` sparse."""
    if weight is None or grad is None:
        return grad
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(
            grad.values * tf.cast(weight, grad.values.dtype), grad.indices, grad.dense_shape
        )
    return grad * tf.cast(weight, grad.dtype)


class ParameterVariable(_tf_internals.BaseResourceVariable):
    """A variable on the parameter device of a `dpkeras.ParameterDeviceStrategy`.

    Users do not construct it: every variable created under `dpkeras.scope()` is one. It is a
    full `tf.Variable` (checkpoints, SavedModel, `assign`, `scatter_*`, `numpy()` work as
    usual); see the module docstring for what differs inside a replica.

    Args:
        extended: the `ParameterDeviceExtended` that created it.
        variable: the resource variable the creator chain made; its handle is shared and it is
            kept alive by this object.
        spec: the `dpkeras.placement.VariableSpec` it was placed by.
    """

    def __init__(self, extended, variable, spec):
        super().__init__(**_tf_internals.handle_sharing_arguments(variable))
        self._primary = variable  # owns the handle's deleter
        self._extended = extended
        self._spec = spec
        self._kind = spec.kind
        self._replica_reads = GraphCache()  # replica id (or a task's host) -> its read

    @property
    def kind(self):
        """The `dpkeras.placement.VariableKind` it was created as."""
        return self._kind

    @property
    def spec(self):
        """The `dpkeras.placement.VariableSpec` the placement policy saw."""
        return self._spec

    @property
    def extended(self):
        """The `ParameterDeviceExtended` that created it."""
        return self._extended

    # -- reads --------------------------------------------------------------------------------

    def _read_variable_op(self, no_copy=False):
        step = replica_step.current(self._extended)
        if step is None:
            return super()._read_variable_op(no_copy=no_copy)
        return self._replica_read(step)

    def _replica_read(self, step):
        if tf.executing_eagerly():
            value = self._new_replica_read(step, None)
        else:
            value = self._replica_reads.get_or_create(
                step.replica_id, lambda: self._new_replica_read(step, self._replica_reads)
            )
        if self.trainable:
            weight = step.gradient_weight
            _tf_internals.record_operation(
                "ReadVariableOp",
                [value],
                [self.handle],
                backward_function=lambda g: [scale_gradient(g, weight)],
                forward_function=lambda x: [x],
            )
        return value

    def _new_replica_read(self, step, cache):
        """Replica `step`'s value of this variable, read where it lives.

        The read stays on the parameter device: TensorFlow sends a tensor once to each device
        that consumes it, and not at all when nothing does (a read made only for `tf.shape`,
        say), so no replica-side copy is made here. A replica on another task (a worker of a
        cluster) reads the copy its task's host pulled, shared by every replica of that task.
        """
        host = device_names.pull_device(self.device, step.device)
        if host is None:
            value = self._read_where_it_lives()
        else:
            pulled = []

            def pull():
                pulled.append(True)
                with tf.device(host):
                    return tf.identity(self._read_where_it_lives())

            value = pull() if cache is None else cache.get_or_create(host, pull)
            if not pulled:
                _tf_internals.variable_accessed(self)  # as the read it does not make would
        if self._kind == VariableKind.SEED and step.replica_id:
            with tf.device(step.device):
                value = value + tf.constant(
                    [step.replica_id * _REPLICA_SEED_STRIDE, 0], dtype=value.dtype
                )
        return value

    def _read_where_it_lives(self):
        with tf.device(self.device):
            return super()._read_variable_op()

    def sparse_read(self, indices, name=None):
        """Gathers rows; in a replica, on the parameter device, sending only the rows."""
        step = replica_step.current(self._extended)
        if step is None:
            return super().sparse_read(indices, name=name)
        with tf.device(self.device):
            value = super().sparse_read(indices, name=name)
        weight = step.gradient_weight if self.trainable else None
        if weight is not None:
            flat_indices = tf.reshape(indices, [-1])
            row_shape = self.shape[1:]

            def backward(grad):
                values = tf.reshape(grad, tf.concat([[-1], row_shape], 0))
                return [
                    tf.IndexedSlices(
                        values * tf.cast(weight, values.dtype),
                        flat_indices,
                        tf.constant(self.shape.as_list()),
                    )
                ]

            _tf_internals.record_operation(
                "ResourceGather",
                [value],
                [self.handle],
                backward_function=backward,
                forward_function=lambda x: [x],
            )
        return value

    def _invalidate_reads(self):
        self._replica_reads.clear()

    # -- writes -------------------------------------------------------------------------------

    def _write(self, method, value, **kwargs):
        """Applies `method` (e.g. "assign_add") by this variable's kind; see module docstring."""
        step = replica_step.current(self._extended)
        if step is not None and method == "assign" and not tf.executing_eagerly():
            method, value = self._as_assign_add(value, step)
        write = getattr(super(), method)
        if step is None:
            self._invalidate_reads()
            return write(value, **kwargs)
        if step.num_replicas == 1:
            self._invalidate_reads()
            with step.after_inputs(0):
                return write(value, **kwargs)
        if (
            self.synchronization == _ON_READ
            and self.aggregation != _NONE
            and method in ("assign", "assign_add", "assign_sub")
        ):
            return self._merge_on_read_write(method, value, step)
        if self.aggregation == _NONE:
            if step.replica_id == 0:
                self._invalidate_reads()
                with step.after_inputs(0):
                    return write(value, **kwargs)
            return self._dropped_write_value(method, value, step)
        return tf.distribute.get_replica_context().merge_call(
            self._merge_aggregated_write, args=(method, value), kwargs=kwargs
        )

    def _as_assign_add(self, value, step):
        """`("assign_add", x)` for an `assign(read + x)` whose result that gives, else as is.

        True with one replica, and for NONE, ONLY_FIRST_REPLICA and MEAN aggregation (every
        replica read the same value); not for SUM, where assigning N values `read + x_i` sums
        to `N * read + sum(x_i)`, nor for ON_READ state, which has its own exact path.
        """
        single = step.num_replicas == 1
        if not single and (
            self.synchronization == _ON_READ or self.aggregation == tf.VariableAggregation.SUM
        ):
            return "assign", value
        delta = _added_delta(value, self._replica_read(step))
        if delta is None or self._kind == VariableKind.SEED and step.replica_id:
            return "assign", value
        return "assign_add", delta

    def _dropped_write_value(self, method, value, step):
        """What a non-zero replica's dropped NONE-aggregated write returns: the value it meant."""
        if method in ("assign", "assign_add", "assign_sub"):
            value = tf.cast(value, self.dtype)
            if method == "assign":
                return value
            read = self._replica_read(step)
            return read + value if method == "assign_add" else read - value
        return self._replica_read(step)

    def _merge_on_read_write(self, method, value, step):
        value = tf.cast(value, self.dtype)
        if method == "assign":
            delta = _delta(value, self._replica_read(step))
        else:
            delta = value if method == "assign_add" else -value
        tf.distribute.get_replica_context().merge_call(self._merge_on_read_apply, args=(delta,))
        return self._replica_read(step)

    def _merge_on_read_apply(self, strategy, per_replica_delta):
        total = strategy.extended.aggregate(self.aggregation, per_replica_delta, self.device)
        self._invalidate_reads()
        super().assign_add(total, read_value=False)

    def _merge_aggregated_write(self, strategy, method, per_replica_value, **kwargs):
        value = strategy.extended.aggregate(self.aggregation, per_replica_value, self.device)
        self._invalidate_reads()
        with replica_step.state_of(strategy.extended).after_inputs(0):
            return getattr(super(), method)(value, **kwargs)

    def assign(self, value, use_locking=None, name=None, read_value=True):
        return self._write(
            "assign", value, use_locking=use_locking, name=name, read_value=read_value
        )

    def assign_add(self, delta, use_locking=None, name=None, read_value=True):
        return self._write(
            "assign_add", delta, use_locking=use_locking, name=name, read_value=read_value
        )

    def assign_sub(self, delta, use_locking=None, name=None, read_value=True):
        return self._write(
            "assign_sub", delta, use_locking=use_locking, name=name, read_value=read_value
        )

    def scatter_add(self, sparse_delta, use_locking=False, name=None):
        return self._write("scatter_add", sparse_delta, use_locking=use_locking, name=name)

    def scatter_sub(self, sparse_delta, use_locking=False, name=None):
        return self._write("scatter_sub", sparse_delta, use_locking=use_locking, name=name)

    def scatter_update(self, sparse_delta, use_locking=False, name=None):
        return self._write("scatter_update", sparse_delta, use_locking=use_locking, name=name)

    def scatter_max(self, sparse_delta, use_locking=False, name=None):
        return self._write("scatter_max", sparse_delta, use_locking=use_locking, name=name)

    def scatter_min(self, sparse_delta, use_locking=False, name=None):
        return self._write("scatter_min", sparse_delta, use_locking=use_locking, name=name)

    def scatter_mul(self, sparse_delta, use_locking=False, name=None):
        return self._write("scatter_mul", sparse_delta, use_locking=use_locking, name=name)

    def scatter_div(self, sparse_delta, use_locking=False, name=None):
        return self._write("scatter_div", sparse_delta, use_locking=use_locking, name=name)

    def scatter_nd_add(self, indices, updates, name=None):
        return self._write_nd("scatter_nd_add", indices, updates, name)

    def scatter_nd_sub(self, indices, updates, name=None):
        return self._write_nd("scatter_nd_sub", indices, updates, name)

    def scatter_nd_update(self, indices, updates, name=None):
        return self._write_nd("scatter_nd_update", indices, updates, name)

    def _write_nd(self, method, indices, updates, name):
        step = replica_step.current(self._extended)
        if step is None:
            self._invalidate_reads()
            return getattr(super(), method)(indices, updates, name=name)
        if step.num_replicas == 1 or (self.aggregation == _NONE and step.replica_id == 0):
            self._invalidate_reads()
            with step.after_inputs(0):
                return getattr(super(), method)(indices, updates, name=name)
        if self.aggregation == _NONE:
            return self._replica_read(step)
        raise NotImplementedError(
            f"{method} in a replica context needs aggregation=NONE; variable {self.name} has "
            f"aggregation={self.aggregation}. Call it in cross-replica context "
            f"(for example inside strategy.extended.update) instead."
        )

    def _strided_slice_assign(self, *args, **kwargs):
        self._invalidate_reads()
        return super()._strided_slice_assign(*args, **kwargs)

    def __repr__(self):
        if tf.executing_eagerly():
            return (
                f"<dpkeras.ParameterVariable '{self.name}' shape={self.shape} "
                f"dtype={self.dtype.name} device={self.device} kind={self._kind}>"
            )
        return super().__repr__()
