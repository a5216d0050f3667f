"""`WholeVariable`, how a replica reads a variable kept whole, and `ParameterVariable`, one
copy on a parameter device."""

import tensorflow as tf

from dpkeras import _device_names as device_names
from dpkeras import _tf_internals
from dpkeras._cache import GraphCache
from dpkeras._config import Deduplicate
from dpkeras._variables import pieces, placed, replica_step, task_pulls
from dpkeras._variables.placed import PlacedVariable
from dpkeras._variables.writes import ReplicaWrites
from dpkeras.placement import VariableKind

# Added to the first seed component on replica k, times k, so that replicas draw different
# (but reproducible) random numbers: Dropout masks differ across replicas.
_REPLICA_SEED_STRIDE = 0x2545F491


def scale_gradient(grad, weight):
    """`grad` times `weight` (None: unchanged), keeping `tf.IndexedSlices` sparse."""
    if weight is None or grad is None:
        return grad
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(
            grad.values * tf.cast(weight, grad.values.dtype), grad.indices, grad.dense_shape
        )
    return grad * tf.cast(weight, grad.dtype)


def record_lookup(value, indices, handle, shape, weight):
    """Records `value` on the tape as the rows `indices` of the variable `handle` of `shape`.

    Its gradient is the variable's: a `tf.IndexedSlices` with one row per looked-up id (repeats
    kept, as Keras gives them), scaled by the replica's `weight` (None: unscaled). The lookup
    itself may have pulled each distinct id once (`dedup`); the tape does not see that.
    """
    flat = tf.reshape(indices, [-1])
    row_shape = shape.as_list()[1:]
    dense_shape = tf.constant(shape.as_list())

    def backward(grad):
        values = tf.reshape(grad, [-1] + row_shape)
        return [tf.IndexedSlices(scale_gradient(values, weight), flat, dense_shape)]

    _tf_internals.record_operation(
        "ResourceGather",
        [value],
        [handle],
        backward_function=backward,
        forward_function=lambda x: [x],
    )


def make_resource_again(variable):
    """Gives `variable` (a resource variable whose task restarted) a new, uninitialised
    resource in place of its lost one (`_tf_internals.new_variable_handle`), where TensorFlow
    keeps it (`_tf_internals.variable_handle_attribute`)."""
    setattr(
        variable,
        _tf_internals.variable_handle_attribute(),
        _tf_internals.new_variable_handle(variable),
    )


class WholeVariable(PlacedVariable, ReplicaWrites, _tf_internals.BaseResourceVariable):
    """A variable of a dpkeras strategy kept whole (not cut into shards): a full `tf.Variable`
    (checkpoints, SavedModel, `assign`, `scatter_*`, `numpy()` work as usual) over a resource
    variable the creator chain made, whose handle it shares. Two kinds: `ParameterVariable`
    (one copy, on a parameter device) and `ReplicatedVariable` (a copy on every compute
    device). Outside a replica of its strategy it is that variable. Inside one, reads and
    writes change:

    Reads. Each replica gets the value once per traced step: the first read in a graph makes
    one `ReadVariableOp` where the variable lives for that replica; later reads reuse it, and
    TensorFlow sends it to the replica's device once (or not at all if the replica does not use
    it). Embedding lookups (`sparse_read`) gather where the variable lives and send only the
    rows. The cached tensor is registered on the GradientTape as a read of the variable, and
    any write to the variable drops the cache, so a read after a write sees the new value.

    Writes depend on the variable's kind: see `ReplicaWrites`.

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
        self._writes = GraphCache()  # True -> True in each graph that wrote it

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
        cluster) reads the copy its task's host pulled, shared by every replica of that task;
        the step's pulls (`StepState.pulls`) from one ps to one host then cross as one tensor
        (`dpkeras._extended.packing.pack_reads`).
        """
        host = device_names.pull_device(self.device, step.device)
        if host is None:
            value = self._read_where_it_lives()
        else:
            pulled = []

            def pull():
                pulled.append(True)
                read = self._read_where_it_lives()
                with tf.device(host):
                    value = tf.identity(read)
                if step.state.pulls is not None:
                    step.state.pulls.add(self, host, read, value)
                return value

            value = pull() if cache is None else cache.get_or_create(host, pull)
            if not pulled:
                _tf_internals.variable_accessed(self)  # as the read it does not make would
        return self._for_replica(value, step)

    def _for_replica(self, value, step):
        """A random seed's state read by replica k > 0 is offset by k (distinct masks)."""
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
        """Gathers rows; in a replica, on the parameter device, sending only the rows.

        Unless the strategy's `deduplicate` is `Deduplicate.OFF`, the replica sends its distinct
        ids and receives one row per distinct id (`dpkeras._variables.dedup`). The gradient is
        one row per looked-up id (Keras's), made sparse; the optimizer's sum decides whether
        repeats are summed before they cross.
        """
        step = replica_step.current(self._extended)
        if step is None:
            return super().sparse_read(indices, name=name)
        indices = tf.convert_to_tensor(indices)
        if self._extended.deduplicate is Deduplicate.OFF:
            value = self.gather_rows(indices, name=name)
        else:
            value = task_pulls.lookup(self._extended, self.gather_rows, indices, name=name)
        if self.trainable:
            record_lookup(value, indices, self.handle, self.shape, step.gradient_weight)
        return value

    def gather_rows(self, indices, name=None):
        """Rows `indices`, gathered where the variable lives; no gradient of its own is kept
        (the caller records the lookup it makes of them)."""
        with tf.device(self.device):
            return super().sparse_read(indices, name=name)

    @tf.autograph.experimental.do_not_convert  # called from a user's converted step
    def _invalidate_reads(self):
        self._replica_reads.clear()
        # A write in the function being traced, and in those it is nested in (not in the
        # process's global graph, which would keep an entry per variable for ever).
        graph = tf.compat.v1.get_default_graph()
        while not tf.executing_eagerly() and graph is not None and graph.building_function:
            self._writes.set(True, True, graph)
            graph = getattr(graph, "outer_graph", None)

    def written_in_graph(self):
        """Whether something in the function being traced (or one nested in it) wrote it."""
        return not tf.executing_eagerly() and bool(self._writes.get(True))

    def _strided_slice_assign(self, *args, **kwargs):
        self._invalidate_reads()
        return super()._strided_slice_assign(*args, **kwargs)

    def _where(self):
        """Where it lives, for `repr`."""
        return f"device={self.device}"

    def __repr__(self):
        if tf.executing_eagerly():
            return (
                f"<dpkeras.{type(self).__name__} '{self.name}' shape={self.shape} "
                f"dtype={self.dtype.name} {self._where()} kind={self._kind}>"
            )
        return super().__repr__()


class ParameterVariable(WholeVariable):
    """A variable on a parameter device of a `dpkeras.ParameterDeviceStrategy`: one copy, read
    once per replica and step (see `WholeVariable`), updated once, where it lives.

    Users do not construct it: every variable created under `dpkeras.scope()` that the
    placement policy puts on a device is one (a sharded variable's shards too).
    `isinstance(v, dpkeras.ParameterVariable)` also holds for a `dpkeras.ReplicatedVariable`,
    as it did when that class was a subclass of this one.
    """

    def update(self, fn, args, kwargs, group):
        if pieces.writes_skipped(self._extended):
            return placed.skipped_update(group)
        reductions = self._extended.reductions
        select = reductions.select_single_value
        with tf.device(self.device), _tf_internals.UpdateContext(self.device):
            result = fn(self, *select(args, self.device), **select(kwargs, self.device))
        return result if group else tf.nest.map_structure(reductions.local_results, result)

    def sum_gradient(self, reductions, grad, sum_repeats):
        return reductions.aggregate(
            "SUM", grad, self.device, from_every_replica=False, sum_repeats=sum_repeats
        )

    @property
    def dense_sum_device(self):
        return self.device

    def why_not_xla(self):
        return placed.why_xla_cannot_reach(self._extended)

    def remake_on(self, task):
        if device_names.task_of(self.device) != task:
            return 0
        # The handle the creator's variable (`_primary`) holds is of the lost resource; reads
        # and writes go through this object's handle, and reads cached per replica are of it.
        make_resource_again(self)
        self._replica_reads = GraphCache()
        return 1
