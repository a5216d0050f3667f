"""`ParameterDeviceExtended`: the `tf.distribute` machinery behind `ParameterDeviceStrategy`.

It holds the devices and answers TensorFlow's questions; the work is done by one module per
concept: `creator` (placing variables), `reductions` (cross-replica sums and where they
happen), `keras_steps` (what a Keras step needs around it), `replica_step` (the state a
replica's variables read), and `distributed_input` (feeding the replicas).
"""

import contextlib
import logging
import threading

import keras
import tensorflow as tf

from dpkeras import (
    _keras_internals,
    _tf_internals,
    cluster,
    devices,
    keras_steps,
    optimizer_apply,
    replica_step,
)
from dpkeras.creator import VariableCreator
from dpkeras.device_names import canonical_device, short_device
from dpkeras.distributed_input import InputPlan
from dpkeras.reductions import ReductionLedger, normalize_op
from dpkeras.sharded_variables import ShardedParameterVariable, update_by_shard
from dpkeras.variables import ParameterVariable

__all__ = ["ParameterDeviceExtended"]

_log = logging.getLogger("dpkeras")


class ParameterDeviceExtended(_tf_internals.StrategyExtendedV1):
    """The machinery of `ParameterDeviceStrategy` (reached as `strategy.extended`).

    Placement is one creator; replicas run through TF's lock-stepped replica threads (as in
    Mirrored and CentralStorage strategies); reductions happen on the device that will consume
    them, the parameter device by default; updates run there, once.

    Args:
        container_strategy: the `ParameterDeviceStrategy`.
        compute_devices, parameter_device: see `ParameterDeviceStrategy`.
        cluster_spec: a `tf.train.ClusterSpec` (see `dpkeras.cluster.resolve_cluster`) or None.
    """

    def __init__(
        self,
        container_strategy,
        compute_devices=None,
        parameter_device=None,
        cluster_spec=None,
        partitioner=None,
    ):
        super().__init__(container_strategy)
        self._cluster_spec = cluster_spec
        compute, policy, home, reason = devices.resolve_devices(
            compute_devices, parameter_device, cluster_spec
        )
        self._input = InputPlan.by_task(compute, canonical_device("/cpu:0"))
        compute = self._input.compute_devices  # grouped by task: replica order = input order
        self._compute_devices = compute
        self._parameter_device = home
        self._parameter_devices = tuple(getattr(policy, "devices", ())) or (home,)
        self._device_reason = reason
        available = {canonical_device(d.name) for d in tf.config.list_logical_devices()}
        self._creator = VariableCreator(
            policy,
            available,
            lambda variable, spec: ParameterVariable(self, variable, spec),
            partitioner,
            lambda shards, spec, kwargs: ShardedParameterVariable.of(self, shards, spec, kwargs),
        )
        self._ledger = ReductionLedger(len(compute), self._local_results)
        self._eager_steps = threading.RLock()  # eager steps share one graph: one at a time
        if cluster_spec is not None:
            cluster.watch(cluster_spec)  # a hung task ends the client, naming it
        _log.info(
            "dpkeras: compute devices %s (%s); parameter devices %s (policy %r)",
            [short_device(d) for d in compute],
            reason,
            [short_device(d) for d in self._parameter_devices],
            policy,
        )

    # -- devices ------------------------------------------------------------------------------

    @property
    def _num_replicas_in_sync(self):
        return len(self._compute_devices)

    @property
    def worker_devices(self):
        return self._compute_devices

    @property
    def worker_devices_by_replica(self):
        return [[d] for d in self._compute_devices]

    @property
    def parameter_devices(self):
        """Canonical names of every device that may hold variables."""
        return self._parameter_devices

    @property
    def placement_policy(self):
        """The callable that chose each variable's device (see `dpkeras.placement`)."""
        return self._creator.policy

    @property
    def cluster_spec(self):
        """The `tf.train.ClusterSpec` this strategy runs on, or None on one machine."""
        return self._cluster_spec

    @property
    def device_reason(self):
        """Why these compute devices were chosen (for `dpkeras env` and logs)."""
        return self._device_reason

    def variables(self):
        """Every live variable created under this strategy, in creation order."""
        return self._creator.variables()

    def non_slot_devices(self, var_list):
        del var_list
        return self._parameter_device

    @property
    def experimental_between_graph(self):
        return False

    @property
    def experimental_should_init(self):
        return True

    @property
    def should_checkpoint(self):
        return True

    @property
    def should_save_summary(self):
        return True

    @property
    def _global_batch_size(self):
        return True

    def _in_multi_worker_mode(self):
        return False

    def _get_local_replica_id(self, replica_id_in_sync_group):
        return replica_id_in_sync_group

    def _get_replica_id_in_sync_group(self, replica_id):
        return replica_id

    # -- variables ----------------------------------------------------------------------------

    def _create_variable(self, next_creator, **kwargs):
        variable = self._creator(next_creator, **kwargs)
        optimizer = _keras_internals.creating_optimizer()
        if optimizer is not None:
            optimizer_apply.attach(optimizer, self)
        return variable

    @property
    def partitioner(self):
        """The partitioner of layer weights (`dpkeras.partitioning`), or None."""
        return self._creator.partitioner

    def _validate_colocate_with_variable(self, colocate_with_variable):
        if not isinstance(colocate_with_variable, (ParameterVariable, ShardedParameterVariable)):
            raise ValueError(
                f"colocate_vars_with() needs a variable created under this strategy's scope. "
                f"Received: {colocate_with_variable!r}"
            )

    # -- running replicas ---------------------------------------------------------------------

    def _call_for_each_replica(self, fn, args, kwargs):
        model, step = keras_steps.step_model(fn)
        if model is not None:
            keras_steps.check_model_variables(model, self)
        n = self._num_replicas_in_sync
        state = replica_step.StepState(
            gradient_weights=(
                keras_steps.gradient_weights(args, self._local_results, n, self._parameter_device)
                if step == "train_step"
                else None
            ),
            inputs=keras_steps.replica_inputs(args, kwargs, self._local_results, n),
        )
        serial = self._eager_steps if tf.executing_eagerly() else contextlib.nullcontext()
        with serial, replica_step.running(self, state):
            result = _tf_internals.call_for_each_replica(
                self._container_strategy(), fn, args, kwargs
            )
        if keras_steps.is_check_finite(fn):
            result = keras_steps.all_replicas_finite(
                result, self._local_results, self._parameter_device, _tf_internals.Mirrored
            )
        return result

    def _use_merge_call(self):
        """Merge from replica context; in cross-replica context there is nothing to merge.

        Keras's `maybe_merge_call` (weight decay, updates, accumulators) then calls its function
        directly when the optimizer applies the summed gradient (`dpkeras.optimizer_apply`).
        """
        return tf.distribute.get_replica_context() is not None

    # -- reductions and updates ---------------------------------------------------------------

    @property
    def reductions(self):
        """The `dpkeras.reductions.ReductionLedger` of the reductions this strategy made."""
        return self._ledger

    def aggregate(self, how, value, device, from_every_replica=True):
        """Reduces `value` onto `device`; see `dpkeras.reductions.ReductionLedger.aggregate`."""
        return self._ledger.aggregate(how, value, device, from_every_replica)

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

    # -- input --------------------------------------------------------------------------------

    def _experimental_distribute_dataset(self, dataset, options):
        return self._input.distribute_dataset(dataset, self._container_strategy(), options)

    def _distribute_datasets_from_function(self, dataset_fn, options):
        return self._input.distribute_datasets_from_function(
            dataset_fn, self._container_strategy(), options
        )

    def _experimental_distribute_values_from_function(self, value_fn):
        return self._input.distribute_values_from_function(value_fn)
