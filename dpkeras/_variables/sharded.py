"""`ShardedParameterVariable`: a variable cut into shards, seen by Keras as one variable.

This module is what the variable is (its shards, the `tf.Variable` it presents) and how it is
saved; its reads (`sharded_reads`) and writes (`sharded_writes`) are mixins, a module each;
the optimizer sums and updates it shard by shard in `shard_updates`.
"""

import functools
import itertools

import tensorflow as tf

from dpkeras._cache import GraphCache
from dpkeras._variables import partitioning, pieces, placed, shard_updates
from dpkeras._variables.placed import PlacedVariable
from dpkeras._variables.sharded_reads import ShardedReads
from dpkeras._variables.sharded_writes import ShardedWrites

_ids = itertools.count()


class ShardedParameterVariable(PlacedVariable, ShardedReads, ShardedWrites, tf.Variable):
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
      the looked-up rows). See `ShardedReads`.
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
    def device(self):
        """The first shard's device."""
        return self._shards[0].device

    @property
    def initializer(self):
        return tf.group(*[s.initializer for s in self._shards])

    # -- what tf.Variable asks of every variable ---------------------------------------------

    @property
    def name(self):
        """The whole variable's name, with TensorFlow's output index (`'embeddings:0'`)."""
        return self._name

    @property
    def _shared_name(self):
        """The name without its output index (`'embeddings'`)."""
        return self._name[:-2]

    @property
    def dtype(self):
        return self._dtype

    @property
    def shape(self):
        """The full shape: the shards' rows added up, the shards' other dimensions."""
        return self._shape

    def get_shape(self):
        return self._shape

    @property
    def trainable(self):
        return self._trainable

    @property
    def synchronization(self):
        return self._synchronization

    @property
    def aggregation(self):
        return self._aggregation

    @property
    def constraint(self):
        return self._constraint

    @property
    def handle(self):
        """The handle the tape knows this variable by: a full-shape variable never created
        (see `__init__`)."""
        return self._handle

    @property
    def graph(self):
        return self._shards[0].graph

    @property
    def op(self):
        return self._shards[0].op

    _in_graph_mode = False  # eager, as its shards are

    # -- what the strategy asks of every kind (`PlacedVariable`) ------------------------------

    def update(self, fn, args, kwargs, group):
        """Shard by shard, where each shard lives (`shard_updates.update_by_shard`)."""
        if pieces.writes_skipped(self._extended):
            return placed.skipped_update(group)
        select = self._extended.reductions.select_single_value
        results = shard_updates.update_by_shard(
            self, fn, select(args, self.device), select(kwargs, self.device)
        )
        return (None if tf.executing_eagerly() else tf.group(*results)) if group else results

    def sum_gradient(self, reductions, grad, sum_repeats):
        """Shard by shard, where each shard lives (`shard_updates.sum_by_shard`)."""
        components = reductions.components(grad, from_every_replica=False)
        reduce = functools.partial(reductions.reduce_components, sum_repeats=sum_repeats)
        return shard_updates.sum_by_shard(self, components, reduce)

    @property
    def parts(self):
        return self._shards

    @property
    def slot_rows(self):
        return list(self._rows)

    def why_not_xla(self):
        return next(filter(None, (s.why_not_xla() for s in self._shards)), None)

    # -- inside an optimizer update: one shard ------------------------------------------------

    def _focused(self):
        """The shard this variable acts as inside `pieces.shard`, else None."""
        current = pieces.current_shard()
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


tf.register_tensor_conversion_function(
    ShardedParameterVariable,
    lambda v, dtype=None, name=None, as_ref=False: v._dense_var_to_tensor(dtype, name, as_ref),
)
