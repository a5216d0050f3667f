"""`CrossReplicaHooks`: reductions, broadcasts and updates, where the values are consumed."""

import keras
import tensorflow as tf

from dpkeras import _tf_internals
from dpkeras._device_names import canonical_device
from dpkeras._extended.reductions import normalize_op
from dpkeras._variables import replica_step
from dpkeras._variables.replicated import ReplicatedVariable
from dpkeras._variables.shard_updates import update_by_shard
from dpkeras._variables.sharded import ShardedParameterVariable
from dpkeras._variables.variables import ParameterVariable


class CrossReplicaHooks:
    """The cross-replica hooks of `ParameterDeviceExtended` (tf.distribute's names).

    Reductions happen on the device that consumes them: a variable's own device for its
    update, the parameter device otherwise. Updates run on the variable's device, once, with
    replica 0's component of any per-replica argument (the ledger moves a reduction to the
    variable's device if it was made elsewhere). A mixin of `ParameterDeviceExtended`, which
    provides `_ledger`, `_parameter_device`, `_num_replicas_in_sync` and `_local_results`.
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
            return canonical_device(destinations) if destinations else self._parameter_device
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
        if isinstance(var, keras.Variable):
            var = var.value
        index = replica_step.pass_index(self)
        if isinstance(var, ReplicatedVariable):
            return self._update_copies(var, fn, args, kwargs, group, index)
        if index:  # the optimizer's pass for copy index > 0: parameter devices update in pass 0
            return None if group or tf.executing_eagerly() else tf.no_op()
        if isinstance(var, ShardedParameterVariable):
            select = self._ledger.select_single_value
            results = update_by_shard(var, fn, select(args, var.device), select(kwargs, var.device))
            return (None if tf.executing_eagerly() else tf.group(*results)) if group else results
        if not isinstance(var, ParameterVariable):
            raise ValueError(
                f"Variable {getattr(var, 'name', var)!r} was not created under this "
                f"strategy's scope, so dpkeras cannot update it on the parameter device. "
                f"Create the model (and compile it) inside `with dpkeras.scope():`. "
                f"Received a {type(var).__name__}."
            )
        select = self._ledger.select_single_value
        with tf.device(var.device), _tf_internals.UpdateContext(var.device):
            result = fn(var, *select(args, var.device), **select(kwargs, var.device))
        return result if group else tf.nest.map_structure(self._local_results, result)

    def _update_copies(self, var, fn, args, kwargs, group, index):
        """`fn` on copy `index` of replicated `var` (in the optimizer's pass for it), else on
        every copy, each with its own component of a per-replica argument."""
        n = len(var.copies)
        results = []
        for i in [index] if index is not None else reversed(range(n)):
            device = var.copies[i].device

            def select(x, i=i):
                if isinstance(x, tf.distribute.DistributedValues):
                    parts = self._local_results(x)
                    x = parts[i] if len(parts) == n else parts[0]
                return x

            with (
                replica_step.optimizer_pass(self, i),
                tf.device(device),
                _tf_internals.UpdateContext(device),
            ):
                results.append(
                    fn(
                        var,
                        *tf.nest.map_structure(select, args),
                        **tf.nest.map_structure(select, kwargs),
                    )
                )
        result = results[-1]  # copy `index`'s, or copy 0's
        if group:
            ops = [r for r in tf.nest.flatten(results) if r is not None]
            return result if tf.executing_eagerly() or not ops else tf.group(*ops)
        return tf.nest.map_structure(self._local_results, result)

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
