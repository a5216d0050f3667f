"""`ShardedParameterVariable`: a variable cut into shards, seen by Keras as one variable."""

import itertools

import numpy as np
import tensorflow as tf

from dpkeras import _tf_internals
from dpkeras._cache import GraphCache
from dpkeras._config import Deduplicate
from dpkeras._variables import partitioning, replica_step, shard_updates, task_pulls
from dpkeras._variables.sharded_writes import ShardedWrites
from dpkeras._variables.variables import ParameterVariable, record_lookup, scale_gradient

_ids = itertools.count()


class ShardedParameterVariable(ShardedWrites, tf.Variable):
    """A variable of the full shape whose rows live in `shards`, on several devices.

    Users do not construct it: a partitioned variable created under `dpkeras.scope()` is one,
    and its `keras.Variable` holds it. Each shard is a `ParameterVariable` (path
    `<variable path>/part_<i>`, TF1's naming) holding a contiguous block of rows on the device
    the placement policy chose for it; Keras sees one `tf.Variable` of the full shape
    (`model.weights`, `get_weights`, `set_weights`, `summary` and `count_params` are
    unchanged).

    - Reading the whole variable concatenates the shards. A lookup (`Embedding`,
      `keras.ops.take`, `tf.gather`, `tf.nn.embedding_lookup`) sends each shard its own ids,
      gathers there, and only the rows travel; the gradient is sparse (`tf.IndexedSlices` of
      the looked-up rows). Example, 10 rows in 3 shards on two devices: shard 0 (rows 0-3) on
      /cpu:0, shard 1 (rows 4-6) on /gpu:0, shard 2 (rows 7-9) on /cpu:0. Looking up ids
      [5, 0] sends id 1 to shard 1 and id 0 to shard 0, and stitches the two rows back in
      order.
    - Writes are cut the same way (`ShardedWrites`).
    - The optimizer updates shard by shard, on each shard's device
      (`shard_updates.update_by_shard`).
    - Files hold the full variable: `.keras`, `.weights.h5` and `tf.train.Checkpoint` read
      and write the whole value, so they load across shard counts and in plain Keras.

    Args:
        extended: the `ParameterDeviceExtended` that created it.
        shards: list of `ParameterVariable`, in row order.
        spec: the `dpkeras.placement.VariableSpec` of the whole variable.
        name: str, the variable's name.
        trainable, synchronization, aggregation, constraint: as for `tf.Variable`.
    """

    _should_act_as_resource_variable = True  # Keras and the tape use `.handle`

    @classmethod
    def _variable_call(cls, *args, **kwargs):
        return None  # tf.Variable's metaclass: construct this class as it is

    def __init__(
        self, extended, shards, spec, name, trainable, synchronization, aggregation, constraint
    ):
        self._extended = extended
        self._shards = tuple(shards)
        self._spec = spec
        self._rows = tuple(int(s.shape[0]) for s in shards)
        self._offsets = tuple(partitioning.offsets(self._rows))
        self._shape = tf.TensorShape([self._offsets[-1]] + shards[0].shape.as_list()[1:])
        self._dtype = shards[0].dtype
        self._name = name if name.endswith(":0") else f"{name}:0"
        self._trainable = bool(trainable)
        self._synchronization = synchronization
        self._aggregation = aggregation
        self._constraint = constraint
        self._unique_id = f"dpkeras_sharded_{next(_ids)}"
        # The tape knows a variable by its handle. This one names a variable of the full
        # shape that is never created (no memory): the container's own reads and lookups are
        # recorded against it, so `tape.gradient` gives one full-shape gradient, while the
        # shards (not trainable themselves) stay off the tape.
        with tf.init_scope(), tf.device(shards[0].device):
            self._handle = tf.raw_ops.VarHandleOp(
                dtype=self._dtype, shape=self._shape, shared_name=self._unique_id
            )
        self._reads = GraphCache()  # replica id -> its read of the whole variable

    # -- what it is ---------------------------------------------------------------------------

    @property
    def shards(self):
        """The shards, `ParameterVariable`s in row order."""
        return self._shards

    @property
    def rows(self):
        """Rows per shard."""
        return self._rows

    @property
    def offsets(self):
        """Shard i holds rows `offsets[i]` to `offsets[i + 1] - 1`."""
        return self._offsets

    @property
    def spec(self):
        """The whole variable's `dpkeras.placement.VariableSpec`."""
        return self._spec

    @property
    def extended(self):
        """The `ParameterDeviceExtended` that created it."""
        return self._extended

    @property
    def kind(self):
        """The whole variable's `dpkeras.placement.VariableKind`."""
        return self._spec.kind

    @property
    def device(self):
        """The first shard's device."""
        return self._shards[0].device

    @property
    def initializer(self):
        return tf.group(*[s.initializer for s in self._shards])

    # What tf.Variable asks of every variable.
    name = property(lambda self: self._name)
    dtype = property(lambda self: self._dtype)
    shape = property(lambda self: self._shape)
    trainable = property(lambda self: self._trainable)
    synchronization = property(lambda self: self._synchronization)
    aggregation = property(lambda self: self._aggregation)
    constraint = property(lambda self: self._constraint)
    handle = property(lambda self: self._handle)
    graph = property(lambda self: self._shards[0].graph)
    op = property(lambda self: self._shards[0].op)
    _shared_name = property(lambda self: self._name[:-2])
    _in_graph_mode = False

    @classmethod
    def of(cls, extended, shards, spec, kwargs):
        """The variable over `shards`, from the keyword arguments its creator received."""
        return cls(
            extended,
            shards,
            spec,
            name=kwargs.get("name") or "Variable",
            trainable=True if kwargs.get("trainable") is None else kwargs["trainable"],
            synchronization=kwargs.get("synchronization") or tf.VariableSynchronization.AUTO,
            aggregation=kwargs.get("aggregation") or tf.VariableAggregation.NONE,
            constraint=kwargs.get("constraint"),
        )

    def get_shape(self):
        return self._shape

    def _focused(self):
        """The shard this variable acts as inside `shard_focus`, else None."""
        current = shard_updates.current_focus()
        if current is None:
            return None
        rows, index, owner = current
        if rows != self._rows:
            raise ValueError(
                f"Sharded variable {self._name[:-2]!r} (rows per shard {list(self._rows)}) is "
                f"used in the update of {owner.name[:-2]!r} (rows per shard {list(rows)}). "
                f"An optimizer update may combine a sharded variable only with state sharded "
                f"like it (its slots) and unsharded scalars."
            )
        return self._shards[index]

    # -- reads --------------------------------------------------------------------------------

    def value(self):
        shard = self._focused()
        if shard is not None:
            return shard.value()
        step = replica_step.current(self._extended)
        if step is None or tf.executing_eagerly():
            return self._read_whole(step)
        made = []

        def read():
            made.append(True)
            return self._read_whole(step)

        value = self._reads.get_or_create(step.replica_id, read)
        if not made:
            _tf_internals.variable_accessed(self)  # as the read it does not make would
        return value

    def _read_whole(self, step):
        value = tf.concat([s.value() for s in self._shards], axis=0)
        self._record_read(value, step)
        return value

    def read_value(self):
        return self.value()

    def _record_read(self, value, step):
        _tf_internals.variable_accessed(self)
        if self._trainable:
            weight = None if step is None else step.gradient_weight
            _tf_internals.record_operation(
                "ReadVariableOp",
                [value],
                [self._handle],
                backward_function=lambda g: [scale_gradient(g, weight)],
                forward_function=lambda x: [x],
            )

    def sparse_read(self, indices, name=None):
        """Rows `indices` (ids of the full variable): each shard gathers its own ids.

        In a replica, unless the strategy's `deduplicate` is `Deduplicate.OFF`, each shard
        receives only the distinct ids and sends one row per distinct id
        (`dpkeras._variables.dedup`).
        """
        shard = self._focused()
        if shard is not None:
            return shard.sparse_read(indices, name=name)
        indices = tf.convert_to_tensor(indices)
        flat = tf.reshape(indices, [-1])
        dedup_here = (
            self._extended.deduplicate is not Deduplicate.OFF
            and replica_step.current(self._extended) is not None
        )
        if dedup_here:
            value = task_pulls.lookup(self._extended, self._gather_by_shard, indices, name=name)
        else:
            value = tf.reshape(
                self._gather_by_shard(flat),
                tf.concat([tf.shape(indices), tf.constant(self._shape.as_list()[1:])], 0),
                name=name,
            )
        _tf_internals.variable_accessed(self)
        if self._trainable:
            step = replica_step.current(self._extended)
            weight = None if step is None else step.gradient_weight
            record_lookup(value, flat, self._handle, self._shape, weight)
        return value

    def _gather_by_shard(self, ids):
        """Rows `ids` (a vector of ids of the full variable), each gathered by its shard."""
        local, positions = shard_updates.partition_ids(ids, self._offsets)
        rows = [s.gather_rows(i) for s, i in zip(self._shards, local)]
        return tf.dynamic_stitch(positions, rows)

    def gather_nd(self, indices, name=None):
        return tf.gather_nd(self.value(), indices, name=name)

    def numpy(self):
        return self.value().numpy()

    def __array__(self, dtype=None, copy=None):
        return np.asarray(self.numpy(), dtype=dtype)

    def _dense_var_to_tensor(self, dtype=None, name=None, as_ref=False):
        value = self.value()
        if dtype is not None and not dtype.is_compatible_with(value.dtype):
            raise ValueError(
                f"Incompatible type conversion requested to type {dtype.name} for variable "
                f"{self._name[:-2]!r} of type {value.dtype.name}"
            )
        return value

    # -- saving: the whole value, so files move across shard counts ---------------------------

    def _serialize_to_tensors(self):
        return {"VARIABLE_VALUE": self.value()}

    def _restore_from_tensors(self, restored_tensors):
        return self.assign(restored_tensors["VARIABLE_VALUE"], read_value=False)

    def _copy_trackable_to_cpu(self, object_map):
        with tf.device("/cpu:0"):
            object_map[self] = tf.Variable(self.value(), name=self._shared_name)

    def _export_to_saved_model_graph(self, object_map, tensor_map, options, **kwargs):
        raise NotImplementedError(
            f"SavedModel export (tf.saved_model.save, model.export) of sharded variable "
            f"{self._name[:-2]!r} is not supported; save a .keras file or a checkpoint, which "
            f"hold the whole variable and load in plain Keras. To export for serving, save "
            f"the model as .keras, load it outside dpkeras.scope() with "
            f"keras.models.load_model, and export that model."
        )

    def __repr__(self):
        devices = ", ".join(s.device for s in self._shards)
        return (
            f"<dpkeras.ShardedParameterVariable '{self._name[:-2]}' shape={self._shape} "
            f"dtype={self._dtype.name} shards={list(self._rows)} devices=[{devices}]>"
        )


# What a variable created under a dpkeras strategy is: whole, or cut into shards.
PLACED_TYPES = (ParameterVariable, ShardedParameterVariable)

tf.register_tensor_conversion_function(
    ShardedParameterVariable,
    lambda v, dtype=None, name=None, as_ref=False: v._dense_var_to_tensor(dtype, name, as_ref),
)
