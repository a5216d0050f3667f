"""`ReplicatedVariable`: a variable with a copy on every compute device.

A placement policy answers `placement.REPLICATED` for it (`placement.hybrid()` does for every
variable but the tables and metric state). Copy i lives on compute device i; replica i reads
its own copy, with no transfer; the optimizer all-reduces the copies' gradients among the
compute devices and updates every copy with the same sum (`dpkeras._extended.optimizer_apply`,
`dpkeras._extended.all_reduce`), so the copies stay identical, bit for bit. On a cluster, the
copies of a worker left out after its loss (`dpkeras._patches.lost_tasks`) are left out with
its replicas (`copies` are those of the devices that run replicas now), and made again when
it is taken back (`remake_on`).

Which copy an operation touches:
- inside replica i of the strategy: copy i;
- inside the optimizer's pass for copy j (`pieces.copy`): copy j;
- elsewhere (cross-replica: `model.get_weights`, a checkpoint, `numpy()`): reads see copy 0
  and writes go to every copy (`assign`, `set_weights`, loading a `.keras` file, restoring a
  checkpoint), so the copies stay identical. Traced in a function (a SavedModel's endpoint,
  say), such a write is made on copy 0, as on all-on-ps's one variable, and the other copies
  then take copy 0's new value.

Writes inside a replica, by aggregation:
- `NONE` (BatchNormalization's moving statistics, random seeds): replica 0 writes its copy and
  every other replica writes its copy with replica 0's value, so every copy ends with what
  the single variable of an all-on-parameter-device strategy ends with (replica 0's write).
  A write replica 0 makes inside a control-flow branch of its own (LossScaleOptimizer's
  counters, written in a `tf.cond` every replica traces for itself) cannot be repeated: there
  each replica writes its own value, as MirroredStrategy's copies do (the loss scale's
  counters are the same on every replica: dpkeras makes "finite" global);
- `SUM`, `MEAN`, `ONLY_FIRST_REPLICA`: the replicas' values are reduced, then every copy is
  written with the result.
`synchronization=ON_READ` (metric state) cannot be replicated (the creator refuses it).

A checkpoint holds one value per replicated variable, under the same key as a variable on a
parameter device: checkpoints restore into either placement. A SavedModel (`model.export`,
`tf.saved_model.save`) holds one variable too, with copy 0's value: an exported function
that writes the variable (a counter, a `SeedGenerator`'s state) writes that one variable
once per call, as the export of an all-on-ps model does.
"""

import tensorflow as tf

from dpkeras import _device_names as device_names
from dpkeras import _tf_internals, placement
from dpkeras._device_names import canonical_device
from dpkeras._variables import pieces, replica_step
from dpkeras._variables.variables import (
    ParameterVariable,
    WholeVariable,
    make_resource_again,
    record_lookup,
)

_BASE = _tf_internals.BaseResourceVariable
_NONE = tf.VariableAggregation.NONE


def _same_graph(tensor):
    return (
        tf.executing_eagerly()
        or not hasattr(tensor, "graph")
        or (tensor.graph is tf.compat.v1.get_default_graph())
    )


class ReplicatedVariable(WholeVariable):
    """A variable with one copy per compute device of its strategy; see the module docstring.

    Users do not construct it: `placement.REPLICATED` makes one. It is a `WholeVariable` (a
    full `tf.Variable` to Keras, checkpoints and SavedModel, read once per replica and step)
    whose handle is the copy the current context touches.

    Args:
        extended: the `ParameterDeviceExtended` that created it.
        copies: the resource variables, one per compute device, in replica order, all with the
            same initial value.
        spec: the `dpkeras.placement.VariableSpec` it was placed by.
    """

    def __init__(self, extended, copies, spec):
        super().__init__(extended, copies[0], spec)
        self._every_copy = tuple(copies)
        self._active = (None, self._every_copy)

    @property
    def _copies(self):
        """The copies on the compute devices the strategy runs replicas on now (all of them,
        unless a worker was left out: `ParameterDeviceExtended.compute_without`)."""
        devices = self._extended.worker_devices  # the same object until they change
        if self._active[0] is not devices:
            on = set(devices)
            active = tuple(c for c in self._every_copy if canonical_device(c.device) in on)
            self._active = (devices, active)
        return self._active[1]

    @property
    def copies(self):
        """The resource variables, one per compute device, in replica order."""
        return self._copies

    @property
    def copy_devices(self):
        return tuple(c.device for c in self._copies)

    @property
    def slot_device(self):
        """A slot created beside it is replicated too."""
        return placement.REPLICATED

    def why_not_xla(self):
        return (
            f"XLA compiles a step for one device, and replicated variable {self.name!r} "
            f"(placement.REPLICATED) has a copy on every compute device"
        )

    def remake_on(self, task):
        """Makes again its copies on `task` (a worker that restarted); returns how many. They
        take the value of the first running copy on another task (a left-out task's copies
        are stale: nothing writes them while it is out), so that a worker taken back at the
        start of a `fit`, with no backup to restore, holds what the others hold; a backup
        restored after overwrites every copy. With no running copy elsewhere they stay
        uninitialised, for the backup. The workers' all-reduce no longer uses TensorFlow's
        collectives (`dpkeras._patches.lost_tasks` tells `all_reduce.lost`)."""
        lost = [c for c in self._every_copy if device_names.task_of(c.device) == task]
        source = next((c for c in self._copies if all(c is not x for x in lost)), None)
        for copy in lost:
            make_resource_again(copy)
            if source is not None:
                with tf.device(copy.device):
                    copy.assign(source.read_value())
                source = copy  # the task's next copy from this one: one transfer per task
        if lost:
            self._invalidate_reads()
        return len(lost)

    def sum_gradient(self, reductions, grad, sum_repeats):
        """None: the optimizer all-reduces it among the compute devices, per copy."""
        return None

    @property
    def dense_sum_device(self):
        return None

    def update(self, fn, args, kwargs, group):
        """`fn` on copy j in the optimizer's pass for it (`pieces.copy`), else on every copy,
        each with its own component of a per-replica argument."""
        index = pieces.copy_index(self._extended)
        local_results = self._extended.reductions.local_results
        n = len(self._copies)
        results = []
        for i in [index] if index is not None else reversed(range(n)):
            device = self._copies[i].device

            def select(x, i=i):
                if isinstance(x, tf.distribute.DistributedValues):
                    parts = local_results(x)
                    x = parts[i] if len(parts) == n else parts[0]
                return x

            with (
                pieces.copy(self._extended, i),
                tf.device(device),
                _tf_internals.UpdateContext(device),
            ):
                results.append(
                    fn(
                        self,
                        *tf.nest.map_structure(select, args),
                        **tf.nest.map_structure(select, kwargs),
                    )
                )
        result = results[-1]  # copy `index`'s, or copy 0's
        if group:
            ops = [r for r in tf.nest.flatten(results) if r is not None]
            return result if tf.executing_eagerly() or not ops else tf.group(*ops)
        return tf.nest.map_structure(local_results, result)

    def _copy_index(self):
        index = pieces.copy_index(self._extended)
        if index is not None:
            return index
        ctx = tf.distribute.get_replica_context()
        if ctx is not None and ctx.strategy.extended is self._extended:
            return int(tf.get_static_value(ctx.replica_id_in_sync_group))
        return 0

    @property
    def handle(self):
        if "_active" not in self.__dict__:  # during construction
            return self._handle
        copies = self._copies
        return copies[self._copy_index()].handle

    # -- reads --------------------------------------------------------------------------------

    def _new_replica_read(self, step, cache):
        """Replica k > 0 reads what replica 0 wrote in this step until it repeats that write
        (see `_repeat_replica_0`): so it sees replica 0's writes, as every replica does of a
        variable on a parameter device (replica 0 traces its part of the step first)."""
        if step.replica_id:
            record = step.state.replicated_writes
            written = record.get(("after", id(self)), [])
            repeated = record.get((id(self), step.replica_id), 0)
            if repeated < len(written) and _same_graph(written[-1]):
                return self._for_replica(written[-1], step)
        return super()._new_replica_read(step, cache)

    def sparse_read(self, indices, name=None):
        """Gathers rows of the replica's own copy (in a replica), else of copy 0."""
        step = replica_step.current(self._extended)
        if step is None:
            return super().sparse_read(indices, name=name)
        indices = tf.convert_to_tensor(indices)
        value = self.gather_rows(indices, name=name)
        if self.trainable:
            record_lookup(value, indices, self.handle, self.shape, step.gradient_weight)
        return value

    # -- writes -------------------------------------------------------------------------------

    def _write(self, method, value, **kwargs):
        return self._route(method, (value,), kwargs)

    def _write_nd(self, method, indices, updates, name):
        return self._route(method, (indices, updates), {"name": name})

    def _strided_slice_assign(self, *args, **kwargs):
        return self._route("_strided_slice_assign", args, kwargs)

    def _route(self, method, args, kwargs):
        base = getattr(_BASE, method)
        extended = self._extended
        index = pieces.copy_index(extended)
        if index is not None:
            return self._write_copy(index, base, args, kwargs)
        step = replica_step.current(extended)
        if step is None:
            if tf.executing_eagerly():
                return self._write_every_copy(base, args, kwargs)
            return self._write_copy_0_then_the_others(base, args, kwargs)
        if step.num_replicas == 1:
            with step.after_inputs(0):
                return self._write_copy(0, base, args, kwargs)
        if self.aggregation == _NONE:
            return self._repeat_replica_0(method, base, args, kwargs, step)
        return tf.distribute.get_replica_context().merge_call(
            self._merge_reduced_write, args=(base,) + tuple(args), kwargs=kwargs
        )

    def _write_copy(self, index, base, args, kwargs):
        self._invalidate_reads()
        with tf.device(self._copies[index].device):
            return base(self, *args, **kwargs)

    def _write_every_copy(self, base, args, kwargs):
        """The same write on every copy (copy 0's result is returned)."""
        result = None
        for index in reversed(range(len(self._copies))):
            with pieces.copy(self._extended, index):
                result = self._write_copy(index, base, args, kwargs)
        return result

    def _write_copy_0_then_the_others(self, base, args, kwargs):
        """A write traced outside a replica: copy 0 is written as all-on-ps's one variable
        would be; every other copy then takes copy 0's new value, and copy 0 is written that
        value again after them, so a later use of copy 0 follows every copy's write.

        Exported to a SavedModel, every copy is the one variable (`_export_to_saved_model_graph`):
        the function makes the write once, then writes the variable's own value back, in order.
        Writing each copy with the same `assign_add` (as eagerly) would add it once per copy.
        """
        with pieces.copy(self._extended, 0):
            result = self._write_copy(0, base, args, kwargs)
        if len(self._copies) == 1:
            return result
        first = self._copies[0]
        with tf.device(first.device):
            value = first.read_value()
        writes = []
        for copy in self._copies[1:]:
            with tf.device(copy.device):
                writes.append(copy.assign(value, read_value=False))
        with tf.control_dependencies(writes), tf.device(first.device):
            first.assign(value, read_value=False)
        return result

    def _repeat_replica_0(self, method, base, args, kwargs, step):
        """aggregation=NONE in a replica: replica 0's write, on every replica's own copy."""
        record = step.state.replicated_writes
        if step.replica_id == 0:
            record.setdefault(id(self), []).append((method, args, kwargs))
            with step.after_inputs(0):
                result = self._write_copy(0, base, args, kwargs)
                with tf.device(self._copies[0].device):  # the value it wrote, for reads
                    after = tf.stop_gradient(self._copies[0].read_value())
            record.setdefault(("after", id(self)), []).append(after)
            return result
        key = (id(self), step.replica_id)
        count = record.get(key, 0)
        writes = record.get(id(self), [])
        if count >= len(writes) or writes[count][0] != method:
            raise RuntimeError(
                f"Replica {step.replica_id} wrote replicated variable {self.name!r} "
                f"({method}, write {count + 1} of this step) where replica 0 did not; the "
                f"copies of a replicated variable with aggregation=NONE are written with "
                f"replica 0's values, so every replica must make the same writes. Give the "
                f"variable an aggregation (SUM, MEAN or ONLY_FIRST_REPLICA), or place it on "
                f"a parameter device."
            )
        record[key] = count + 1
        _, args0, kwargs0 = writes[count]
        tensors = [a for a in tf.nest.flatten(args0) if isinstance(a, tf.Tensor)]
        if not all(_same_graph(t) for t in tensors):
            # Replica 0 wrote inside a control-flow branch of its own (LossScaleOptimizer's
            # counters, in a `tf.cond` each replica traces): its value cannot leave that
            # branch, so this replica writes its own value, as MirroredStrategy's copies do.
            args0, kwargs0 = args, kwargs
        with step.after_inputs(step.replica_id):
            return self._write_copy(step.replica_id, base, args0, kwargs0)

    def _merge_reduced_write(self, strategy, base, *args, **kwargs):
        value, rest = args[0], args[1:]
        value = strategy.extended.aggregate(self.aggregation, value, self._copies[0].device)
        return self._write_every_copy(base, (value,) + tuple(rest), kwargs)

    def _restore_from_tensors(self, restored_tensors):
        """A checkpoint's value goes to every copy."""
        self._invalidate_reads()
        ops = []
        for index in range(len(self._copies)):
            with pieces.copy(self._extended, index):
                ops.append(_tf_internals.restore_variable(self, restored_tensors))
        return ops[0] if tf.executing_eagerly() else tf.group(*ops)

    def _export_to_saved_model_graph(
        self, object_map=None, tensor_map=None, options=None, **kwargs
    ):
        """One variable in the SavedModel, with copy 0's value; every copy's handle maps to it
        (as MirroredStrategy's components map to its primary), so an exported function that
        was traced outside a replica, and writes every copy, writes that variable."""
        with pieces.copy(self._extended, 0):
            resources = super()._export_to_saved_model_graph(
                object_map=object_map, tensor_map=tensor_map, options=options, **kwargs
            )
        exported = tensor_map[self._copies[0].handle]
        for copy in self._copies:
            object_map[copy] = object_map[self]
            tensor_map[copy.handle] = exported
            if copy is not self._copies[0]:
                resources.append(copy.handle)
        return resources

    def _where(self):
        return f"copies={len(self._copies)}"


# `isinstance(v, dpkeras.ParameterVariable)` held for a replicated variable when this class
# was a subclass of that one: it still holds.
ParameterVariable.register(ReplicatedVariable)
