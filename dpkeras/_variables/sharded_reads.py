"""`ShardedReads`: reads of a sharded variable, gathered from its shards where they live."""

import numpy as np
import tensorflow as tf

from dpkeras import _tf_internals
from dpkeras._config import Deduplicate
from dpkeras._variables import partitioning, replica_step, task_pulls
from dpkeras._variables.variables import record_lookup, scale_gradient


class ShardedReads:
    """The reads of a `ShardedParameterVariable`: the whole value concatenates the shards,
    once per replica and traced step; a lookup sends each shard its own ids, gathers there, and
    only the rows travel.

    Example, 10 rows in 3 shards on two devices: shard 0 (rows 0-3) on /cpu:0, shard 1
    (rows 4-6) on /gpu:0, shard 2 (rows 7-9) on /cpu:0. Looking up ids [5, 0] sends id 1 to
    shard 1 and id 0 to shard 0, and stitches the two rows back in order. Both are recorded on
    the tape against the whole variable's `handle`, so its gradient is one full-shape gradient
    (sparse for a lookup).

    Inside `pieces.shard` (the optimizer's update of shard i) they read shard i.
    A mixin of `ShardedParameterVariable`, which provides `_focused()`, `_extended`,
    `_shards`, `_offsets`, `_shape`, `_name`, `_trainable`, `_handle` and `_reads`.
    """

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
        local, positions = partitioning.partition_ids(ids, self._offsets)
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
