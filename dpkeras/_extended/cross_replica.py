"""`CrossReplicaHooks`: reductions, broadcasts and updates, where the values are consumed."""

import keras
import tensorflow as tf

from dpkeras import _tf_internals
from dpkeras._extended.reductions import normalize_op
from dpkeras._variables import pieces, placed


class CrossReplicaHooks:
    """The cross-replica hooks of `ParameterDeviceExtended` (tf.distribute's names).

    Reductions happen on the device that consumes them: a variable's own device for its
    update, the parameter device otherwise. Each kind of variable updates itself
    (`PlacedVariable.update`): on its device, once, with replica 0's component of any
    per-replica argument (the ledger moves a reduction to the variable's device if it was
    made elsewhere); shard by shard; or copy by copy, each with its own component. A mixin of
    `ParameterDeviceExtended`, which provides `_ledger`, `_parameter_device`,
    `_num_replicas_in_sync`, `_local_results` and `_own_device`.
    """

    @property
    def reductions(self):
        """The `ReductionLedger` of the reductions this strategy made."""
        return self._ledger

    def aggregate(self, how, value, device, from_every_replica=True, sum_repeats=False):
        """Reduces `value` onto `device`; see `ReductionLedger.aggregate`."""
        return self._ledger.aggregate(how, value, device, from_every_replica, sum_repeats)

    def _reduction_device(self, destinations):
        if isinstance(destinations, str):
            return self._own_device(destinations) if destinations else self._parameter_device
        if isinstance(destinations, tf.Variable):
            return destinations.device
        if isinstance(destinations, tf.distribute.DistributedValues):
            found = {getattr(v, "device", None) for v in destinations.values}
        else:
            found = {getattr(destinations, "device", None)}
        found.discard(None)
        found.discard("")
        return found.pop() if len(found) == 1 else self._parameter_device

    def _reduce_to(self, reduce_op, value, destinations, options):
        del options
        if not isinstance(value, tf.distribute.DistributedValues):
            if normalize_op(reduce_op) == "MEAN" or self._num_replicas_in_sync == 1:
                return value
            raise ValueError(
                f"A value that is not per-replica cannot be reduced with SUM over "
                f"{self._num_replicas_in_sync} replicas (it is unclear whether it stands for "
                f"one replica or all). Received: {value!r}. Return it from strategy.run to "
                f"get a per-replica value, or reduce with MEAN."
            )
        self._ledger.check_same_shapes(value)
        return self._ledger.aggregate(reduce_op, value, self._reduction_device(destinations))

    def _batch_reduce_to(self, reduce_op, value_destination_pairs, options):
        """`ReplicaContext.all_reduce`'s merge: as MirroredStrategy, a value that is not
        per-replica (one tensor captured in every replica) is one contribution, so its SUM
        is itself."""
        del options
        results = []
        for value, destinations in value_destination_pairs:
            if isinstance(value, tf.distribute.DistributedValues):
                self._ledger.check_same_shapes(value)
            results.append(
                self._ledger.aggregate(
                    reduce_op, value, self._reduction_device(destinations), from_every_replica=False
                )
            )
        return results

    def _gather_to_implementation(self, value, destinations, axis, options):
        del options
        if not isinstance(value, tf.distribute.DistributedValues):
            return value
        with tf.device(self._reduction_device(destinations)):
            return tf.concat(list(self._local_results(value)), axis=axis)

    def _broadcast_to(self, tensor, destinations):
        if isinstance(tensor, (float, int)):
            return tensor
        targets = (
            [destinations]
            if isinstance(destinations, str)
            else [
                getattr(v, "device", self._parameter_device)
                for v in getattr(destinations, "values", [destinations])
            ]
        )
        copies = []
        for d in targets:
            with tf.device(d):
                copies.append(tf.identity(tensor))
        return copies[0] if len(copies) == 1 else _tf_internals.Mirrored(copies)

    def _update(self, var, fn, args, kwargs, group):
        """Each kind of variable updates itself (`PlacedVariable.update`), as TensorFlow's
        MirroredExtended asks each of its variables for `_update_replica`."""
        if isinstance(var, keras.Variable):
            var = var.value
        if placed.of(var) is None:
            if pieces.writes_skipped(self):
                return placed.skipped_update(group)
            raise ValueError(
                f"Variable {getattr(var, 'name', var)!r} was not created under this "
                f"strategy's scope, so dpkeras cannot update it on the parameter device. "
                f"Create the model (and compile it) inside `with dpkeras.scope():`. "
                f"Received a {type(var).__name__}."
            )
        return var.update(fn, args, kwargs, group)

    def _update_non_slot(self, colocate_with, fn, args, kwargs, group):
        device = colocate_with if isinstance(colocate_with, str) else colocate_with.device
        select = self._ledger.select_single_value
        with tf.device(device), _tf_internals.UpdateContext(device):
            result = fn(*select(args), **select(kwargs))
        return result if group else tf.nest.map_structure(self._local_results, result)

    def value_container(self, value):
        return value

    def read_var(self, var):
        return tf.identity(var)
