"""`ShardedWrites`: writes to a sharded variable, cut into each shard's rows or ids.

One of three write modules, one concept each: a `ParameterVariable`'s writes by kind in a
replica are `writes` (each shard writes that way); the optimizer's update of a sharded
variable, shard by shard, is `shard_updates`.
"""

import tensorflow as tf

from dpkeras._variables import partitioning


class ShardedWrites:
    """The writes of a `ShardedParameterVariable`: `assign` sends each shard its rows,
    `scatter_*` each shard its ids (made local to the shard).

    Inside `pieces.shard` (the optimizer's update of shard i) they write shard i.
    A mixin of `ShardedParameterVariable`, which provides `_focused()`, `_shards`, `_offsets`,
    `_shape`, `_dtype`, `_name`, `_reads` and `value()`.
    """

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
            piece = partitioning.row_slice(value, self._offsets[i], self._offsets[i + 1])
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
        local, positions = partitioning.partition_ids(flat, self._offsets)
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
