"""`ReplicaWrites`: how a replica's write reaches a variable, by the variable's kind.

Writes are three modules, one concept each: this one, a `ParameterVariable`'s writes inside
a replica, by kind (metric state, `aggregation=NONE`, reduced); `sharded_writes`, a sharded
variable's writes cut into its shards (each shard a `ParameterVariable`, writing as here);
`shard_updates`, the optimizer's sum and update of a sharded variable, shard by shard.
"""

import tensorflow as tf

from dpkeras._variables import pieces, replica_step
from dpkeras.placement import VariableKind

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


class ReplicaWrites:
    """The writes of a `ParameterVariable`, by the kind of variable (as tf.distribute defines
    the kinds), inside a replica of its strategy:

    - `synchronization=ON_READ` (Keras metric state): every replica's change is summed (or
      averaged, per `aggregation`) and applied once, synchronously, so every replica then reads
      the same, global value. With two replicas: a `Mean` metric holds total=6, count=2;
      replica 0 adds 3 (one example), replica 1 adds 5 (one example); both then read total=14,
      count=4, and both report 3.5, what one device reports after the same four examples.
    - `aggregation=NONE` (BatchNormalization statistics, seeds, loss-scale counters): replica 0
      writes; the others' writes are dropped. No synchronization, so it is legal inside
      `tf.cond`. Replica 0 updating BatchNormalization's moving statistics with its own
      batch's statistics is exactly what MirroredStrategy's primary copy ends with. A replica
      that reads the variable after replica 0 wrote it in the same step sees the write.
    - `aggregation=SUM`, `MEAN`, `ONLY_FIRST_REPLICA`: the replicas' values are reduced, then
      written once.

    Writes in cross-replica context (the optimizer's `extended.update`) go straight to the
    variable, once: not in the optimizer's passes for copies j > 0 (`pieces.writes_skipped`).
    A mixin of `WholeVariable`, which provides `_extended`, `_kind`, `_replica_read(step)` and
    `_invalidate_reads()`.
    """

    def _write(self, method, value, **kwargs):
        """Applies `method` (e.g. "assign_add") by this variable's kind; see the class docstring."""
        step = replica_step.current(self._extended)
        if step is not None and method == "assign" and not tf.executing_eagerly():
            method, value = self._as_assign_add(value, step)
        if step is None:
            return self._cross_replica_write(method, (value,), kwargs)
        write = getattr(super(), method)
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

    def _cross_replica_write(self, method, args, kwargs):
        """A write outside a replica: to the variable, except where `pieces.writes_skipped`
        (the optimizer's pass for copy j > 0), which returns what the write would (the
        variable, or no op)."""
        if pieces.writes_skipped(self._extended):
            if kwargs.get("read_value", True):
                return self
            return None if tf.executing_eagerly() else tf.no_op()
        self._invalidate_reads()
        return getattr(super(), method)(*args, **kwargs)

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
            return self._cross_replica_write(method, (indices, updates), {"name": name})
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
