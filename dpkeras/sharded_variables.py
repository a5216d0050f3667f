"""A variable cut into shards on several parameter devices, seen by Keras as one variable.

`ShardedParameterVariable` is what a partitioned variable's `keras.Variable` holds. Each shard
is a `ParameterVariable` (path `<variable path>/part_<i>`, TF1's naming) holding a contiguous
block of rows on the device the placement policy chose for it; Keras sees one `tf.Variable` of
the full shape (`model.weights`, `get_weights`, `set_weights`, `summary` and `count_params`
are unchanged).

- Reading the whole variable concatenates the shards. A lookup (`Embedding`, `keras.ops.take`,
  `tf.gather`, `tf.nn.embedding_lookup`) sends each shard its own ids, gathers there, and only
  the rows travel; the gradient is sparse (`tf.IndexedSlices` of the looked-up rows).
- Writes are cut the same way: `assign` sends each shard its rows, `scatter_*` its ids.
- The optimizer updates shard by shard, on each shard's device (`shard_focus`): inside,
  every sharded variable of the same row split (the variable and its optimizer slots, which
  are sharded like it) reads and writes shard i, so Keras's update step, weight decay and EMA
  run unchanged on shard-sized tensors.
- Files hold the full variable: `.keras`, `.weights.h5` and `tf.train.Checkpoint` read and
  write the whole value, so they load across shard counts and in plain Keras.

Example, 10 rows in 3 shards on two devices: shard 0 (rows 0-3) on /cpu:0, shard 1 (rows 4-6)
on /gpu:0, shard 2 (rows 7-9) on /cpu:0. Looking up ids [5, 0] sends id 1 to shard 1 and id 0
to shard 0, and stitches the two rows back in order.
"""

import contextlib
import itertools
import threading

import keras
import numpy as np
import tensorflow as tf

from dpkeras import _tf_internals, partitioning, replica_step
from dpkeras._cache import GraphCache
from dpkeras.variables import ParameterVariable, scale_gradient

__all__ = [
    "ShardedParameterVariable",
    "PLACED_TYPES",
    "ROW_WISE_OPTIMIZERS",
    "shard_focus",
    "shard_arguments",
    "sum_by_shard",
    "update_by_shard",
]

_focus = threading.local()
_ids = itertools.count()


@contextlib.contextmanager
def shard_focus(variable, index):
    """Sharded variables cut like `variable` act as their shard `index` in this block."""
    saved = getattr(_focus, "current", None)
    _focus.current = (variable.rows, index, variable)
    try:
        yield
    finally:
        _focus.current = saved


def _row_slice(x, lo, hi):
    """Rows `lo:hi` of a dense tensor or of `tf.IndexedSlices` (ids made local), at the source."""
    device = getattr(x.values if isinstance(x, tf.IndexedSlices) else x, "device", "") or None
    with tf.device(device):
        if isinstance(x, tf.IndexedSlices):
            keep = tf.logical_and(x.indices >= lo, x.indices < hi)
            shape = tf.concat([tf.constant([hi - lo], x.dense_shape.dtype), x.dense_shape[1:]], 0)
            return tf.IndexedSlices(
                tf.boolean_mask(x.values, keep),
                tf.boolean_mask(x.indices, keep) - tf.cast(lo, x.indices.dtype),
                shape,
            )
        return x[lo:hi]


_sums = GraphCache()  # name of a summed gradient -> (rows per shard, the per-shard sums)


def _key(x):
    return x.values if isinstance(x, tf.IndexedSlices) else x


def sum_by_shard(variable, components, reduce_components):
    """The sum of per-replica gradients of `variable`, made shard by shard where each lives.

    Each replica cuts its gradient into the shards' rows (sparse: each shard's ids) on its own
    device, and each shard's rows are summed on the shard's device: a row travels once, from
    the replica to the device that holds it. The result is one full-shape gradient (what
    Keras's clipping and update see); `shard_arguments` hands each shard its own sum, so an
    update uses the per-shard sums and the joined one is only computed if something else
    (clipping) reads it.

    Args:
        variable: the `ShardedParameterVariable`.
        components: list of per-replica gradients (tensors or `tf.IndexedSlices`).
        reduce_components: `ReductionLedger.reduce_components`.
    """
    sums = []
    for i, shard in enumerate(variable.shards):
        lo, hi = variable.offsets[i], variable.offsets[i + 1]
        sums.append(
            reduce_components("SUM", [_row_slice(c, lo, hi) for c in components], shard.device)
        )
    if all(isinstance(s, tf.IndexedSlices) for s in sums):
        joined = tf.IndexedSlices(
            tf.concat([s.values for s in sums], 0),
            tf.concat([s.indices + lo for s, lo in zip(sums, variable.offsets)], 0),
            tf.constant(variable.shape.as_list()),
        )
    else:
        joined = tf.concat([tf.convert_to_tensor(s) for s in sums], 0)
    if not tf.executing_eagerly():
        key = _key(joined)
        _sums.set(key.name, (variable.rows, sums), graph=key.graph)
    return joined


def _own_sum(x, rows, index):
    key = _key(x)
    if not isinstance(key, tf.Tensor) or tf.executing_eagerly():
        return None
    found = _sums.get(key.name, graph=key.graph)
    return found[1][index] if found is not None and found[0] == rows else None


def shard_arguments(variable, index, structure):
    """`structure` with each full-variable-shaped tensor or gradient cut to shard `index`."""
    lo, hi = variable.offsets[index], variable.offsets[index + 1]
    full = variable.shape

    def cut(x):
        own = (
            _own_sum(x, variable.rows, index)
            if isinstance(x, (tf.Tensor, tf.IndexedSlices))
            else None
        )
        if own is not None:
            return own
        if isinstance(x, tf.IndexedSlices):
            return _row_slice(x, lo, hi)
        if isinstance(x, tf.Tensor) and x.shape.rank and x.shape.is_compatible_with(full):
            return _row_slice(x, lo, hi)
        return x

    return tf.nest.map_structure(cut, structure)


def update_by_shard(variable, fn, args, kwargs):
    """`fn(variable, *args, **kwargs)` once per shard, on its device, in update context.

    Full-shape tensors and gradients in `args`/`kwargs` are cut to the shard's rows
    (`shard_arguments`), and inside, `variable` and every variable sharded like it (its
    optimizer slots) act as that shard (`shard_focus`), so Keras's update step, weight decay
    and EMA run unchanged on shard-sized tensors.

    Returns:
        A tuple of what `fn` returned for each shard, with TensorFlow ops and tensors only.
    """
    results = []
    for i, shard in enumerate(variable.shards):
        shard_args = shard_arguments(variable, i, args)
        shard_kwargs = shard_arguments(variable, i, kwargs)
        with (
            tf.device(shard.device),
            _tf_internals.UpdateContext(shard.device),
            shard_focus(variable, i),
        ):
            results.append(fn(variable, *shard_args, **shard_kwargs))
    return tuple(r for r in tf.nest.flatten(results) if isinstance(r, (tf.Tensor, tf.Operation)))


def _partition(flat_ids, offsets):
    """Per shard: the local ids of `flat_ids` it holds, and their positions in `flat_ids`."""
    n = len(offsets) - 1
    bounds = tf.constant(offsets[1:-1], dtype=flat_ids.dtype)
    shard = tf.searchsorted(bounds, flat_ids, side="right", out_type=tf.int32)
    local = flat_ids - tf.gather(tf.constant(offsets[:-1], dtype=flat_ids.dtype), shard)
    positions = tf.range(tf.size(flat_ids))
    return tf.dynamic_partition(local, shard, n), tf.dynamic_partition(positions, shard, n)


class ShardedParameterVariable(tf.Variable):
    """A variable of the full shape whose rows live in `shards` (see the module docstring).

    Users do not construct it: a partitioned variable created under `dpkeras.scope()` is one.

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

    shards = property(lambda self: self._shards, doc="The shards, in row order.")
    rows = property(lambda self: self._rows, doc="Rows per shard.")
    offsets = property(lambda self: self._offsets, doc="Shard i holds rows offsets[i]:[i+1].")
    spec = property(lambda self: self._spec, doc="The whole variable's `VariableSpec`.")
    extended = property(lambda self: self._extended)
    kind = property(lambda self: self._spec.kind)
    name = property(lambda self: self._name)
    dtype = property(lambda self: self._dtype)
    shape = property(lambda self: self._shape)
    trainable = property(lambda self: self._trainable)
    synchronization = property(lambda self: self._synchronization)
    aggregation = property(lambda self: self._aggregation)
    constraint = property(lambda self: self._constraint)
    handle = property(lambda self: self._handle)
    device = property(lambda self: self._shards[0].device, doc="The first shard's device.")
    graph = property(lambda self: self._shards[0].graph)
    initializer = property(lambda self: tf.group(*[s.initializer for s in self._shards]))
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
        current = getattr(_focus, "current", None)
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
        """Rows `indices` (ids of the full variable): each shard gathers its own ids."""
        shard = self._focused()
        if shard is not None:
            return shard.sparse_read(indices, name=name)
        indices = tf.convert_to_tensor(indices)
        flat = tf.reshape(indices, [-1])
        local, positions = _partition(flat, self._offsets)
        rows = [s.sparse_read(ids) for s, ids in zip(self._shards, local)]
        row_shape = self._shape.as_list()[1:]
        value = tf.reshape(
            tf.dynamic_stitch(positions, rows),
            tf.concat([tf.shape(indices), tf.constant(row_shape, tf.int32)], 0),
            name=name,
        )
        _tf_internals.variable_accessed(self)
        if self._trainable:
            step = replica_step.current(self._extended)
            weight = None if step is None else step.gradient_weight
            dense_shape = tf.constant(self._shape.as_list())

            def backward(grad):
                values = tf.reshape(grad, [-1] + row_shape)
                return [tf.IndexedSlices(scale_gradient(values, weight), flat, dense_shape)]

            _tf_internals.record_operation(
                "ResourceGather",
                [value],
                [self._handle],
                backward_function=backward,
                forward_function=lambda x: [x],
            )
        return value

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

    # -- writes -------------------------------------------------------------------------------

    def _dense_write(self, method, value, read_value, name=None):
        shard = self._focused()
        if shard is not None:
            return getattr(shard, method)(value, name=name, read_value=read_value)
        value = tf.convert_to_tensor(value, dtype=self._dtype)
        if not value.shape.is_compatible_with(self._shape):
            raise ValueError(
                f"Cannot {method} a value of shape {value.shape} to sharded variable "
                f"{self._name[:-2]!r} of shape {self._shape}."
            )
        self._reads.clear()
        ops = []
        for i, s in enumerate(self._shards):
            piece = _row_slice(value, self._offsets[i], self._offsets[i + 1])
            ops.append(getattr(s, method)(piece, read_value=False))
        if read_value:
            with tf.control_dependencies([o for o in ops if o is not None]):
                return self.value()
        return None if tf.executing_eagerly() else tf.group(*ops)

    def assign(self, value, use_locking=None, name=None, read_value=True):
        return self._dense_write("assign", value, read_value, name)

    def assign_add(self, delta, use_locking=None, name=None, read_value=True):
        return self._dense_write("assign_add", delta, read_value, name)

    def assign_sub(self, delta, use_locking=None, name=None, read_value=True):
        return self._dense_write("assign_sub", delta, read_value, name)

    def _scatter(self, method, sparse_delta, name=None):
        shard = self._focused()
        if shard is not None:
            return getattr(shard, method)(sparse_delta, name=name)
        if not isinstance(sparse_delta, tf.IndexedSlices):
            raise TypeError(f"{method} needs tf.IndexedSlices. Received: {sparse_delta!r}")
        self._reads.clear()
        flat = tf.reshape(sparse_delta.indices, [-1])
        local, positions = _partition(flat, self._offsets)
        ops = []
        for s, ids, where in zip(self._shards, local, positions):
            values = tf.gather(sparse_delta.values, where)
            ops.append(getattr(s, method)(tf.IndexedSlices(values, ids, s.shape)))
        return self if tf.executing_eagerly() else tf.group(*ops)

    def scatter_add(self, sparse_delta, use_locking=False, name=None):
        return self._scatter("scatter_add", sparse_delta, name)

    def scatter_sub(self, sparse_delta, use_locking=False, name=None):
        return self._scatter("scatter_sub", sparse_delta, name)

    def scatter_update(self, sparse_delta, use_locking=False, name=None):
        return self._scatter("scatter_update", sparse_delta, name)

    def scatter_max(self, sparse_delta, use_locking=False, name=None):
        return self._scatter("scatter_max", sparse_delta, name)

    def scatter_min(self, sparse_delta, use_locking=False, name=None):
        return self._scatter("scatter_min", sparse_delta, name)

    def scatter_mul(self, sparse_delta, use_locking=False, name=None):
        return self._scatter("scatter_mul", sparse_delta, name)

    def scatter_div(self, sparse_delta, use_locking=False, name=None):
        return self._scatter("scatter_div", sparse_delta, name)

    def _unsupported(self, what):
        raise NotImplementedError(
            f"{what} is not supported on sharded variable {self._name[:-2]!r}; assign the "
            f"whole variable, or use scatter_update with tf.IndexedSlices of its rows."
        )

    def scatter_nd_update(self, indices, updates, name=None):
        self._unsupported("scatter_nd_update")

    def scatter_nd_add(self, indices, updates, name=None):
        self._unsupported("scatter_nd_add")

    def scatter_nd_sub(self, indices, updates, name=None):
        self._unsupported("scatter_nd_sub")

    def _strided_slice_assign(self, *args, **kwargs):
        self._unsupported("Assigning to a slice (variable[...].assign)")

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


# Optimizers whose update of a variable is row by row (elementwise, with scalar state), so that
# updating shard by shard equals updating the whole variable. Not Adafactor, Lamb or Muon: they
# factor or normalise over the whole variable.
ROW_WISE_OPTIMIZERS = (
    keras.optimizers.SGD,
    keras.optimizers.Adam,
    keras.optimizers.AdamW,
    keras.optimizers.Adagrad,
    keras.optimizers.RMSprop,
    keras.optimizers.Adadelta,
    keras.optimizers.Adamax,
    keras.optimizers.Nadam,
    keras.optimizers.Ftrl,
    keras.optimizers.Lion,
)

# What a variable created under a dpkeras strategy is: whole, or cut into shards.
PLACED_TYPES = (ParameterVariable, ShardedParameterVariable)

tf.register_tensor_conversion_function(
    ShardedParameterVariable,
    lambda v, dtype=None, name=None, as_ref=False: v._dense_var_to_tensor(dtype, name, as_ref),
)
