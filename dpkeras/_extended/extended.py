"""`ParameterDeviceExtended`: the `tf.distribute` machinery behind `ParameterDeviceStrategy`.

It holds the devices and answers TensorFlow's questions; the work is done by one module per
concept: `creator` (placing variables), `reductions` (cross-replica sums and where they
happen), `cross_replica` (reductions, broadcasts, and updates, which each kind of variable
makes itself), `keras_steps` (what a Keras step needs around it), `replica_step` (the state a
replica's variables read), and `input` (feeding the replicas).
"""

import contextlib
import logging
import threading

import keras
import tensorflow as tf

from dpkeras import _carried, _keras_internals, _tf_internals
from dpkeras import _device_names as device_names
from dpkeras._device_names import canonical_device, short_device
from dpkeras._extended import devices, keras_steps, optimizer_apply, packing
from dpkeras._extended.creator import VariableCreator
from dpkeras._extended.cross_replica import CrossReplicaHooks
from dpkeras._extended.reductions import ReductionLedger
from dpkeras._input import shares
from dpkeras._input.plan import InputPlan
from dpkeras._variables import placed, replica_step
from dpkeras._variables.replicated import ReplicatedVariable
from dpkeras._variables.sharded import ShardedParameterVariable
from dpkeras._variables.variables import ParameterVariable
from dpkeras.cluster import _health

_log = logging.getLogger("dpkeras")


def extended_of(obj):
    """The `ParameterDeviceExtended` that `obj` belongs to, or None: the one predicate for
    "is this dpkeras's?".

    Args:
        obj: a strategy (its `extended`); or a Keras model or layer, which belongs to the
            strategy that made its variables (any of them), or, before it has variables (an
            unbuilt model), to its `distribute_strategy` (the strategy in scope when it was
            made, else the current one).
    """
    if isinstance(obj, tf.distribute.Strategy):
        extended = obj.extended
        return extended if isinstance(extended, ParameterDeviceExtended) else None
    variables = getattr(obj, "variables", None)
    for v in variables or ():
        extended = extended_of_variable(v)
        if extended is not None:
            return extended
    if variables:
        return None
    strategy = getattr(obj, "distribute_strategy", None)
    return extended_of(strategy) if strategy is not None else None


def extended_of_variable(variable):
    """The `ParameterDeviceExtended` whose creator made `variable` (a `tf.Variable` or a
    `keras.Variable`), or None (made outside every dpkeras strategy, or not yet created)."""
    if isinstance(variable, keras.Variable):
        variable = _keras_internals.underlying_variable(variable)
    return variable.extended if placed.of(variable) is not None else None


class ParameterDeviceExtended(CrossReplicaHooks, _tf_internals.StrategyExtendedV1):
    """The machinery of `ParameterDeviceStrategy` (reached as `strategy.extended`).

    Placement is one creator; replicas run through TF's lock-stepped replica threads (as in
    Mirrored and CentralStorage strategies); reductions happen on the device that will consume
    them, the parameter device by default; updates run there, once.

    Args:
        container_strategy: the `ParameterDeviceStrategy`.
        config: the `dpkeras._config.Config` in force (devices, deduplication).
        cluster: the `Cluster` this process joined as its client (a `tf.train.ClusterSpec`,
            see `dpkeras.cluster._spec.cluster_of`) or None.
        partitioner: a partitioner (see `dpkeras._variables.partitioning`) or None.
    """

    def __init__(self, container_strategy, config, cluster=None, partitioner=None):
        super().__init__(container_strategy)
        self._cluster = cluster
        self._config = config
        compute, policy, home, reason = devices.strategy_devices(config, cluster)
        self._input = InputPlan.by_task(compute, canonical_device("/cpu:0"))
        compute = self._input.compute_devices  # grouped by task: replica order = input order
        self._compute_devices = compute
        self._every_compute_device = compute  # with the tasks left out (`compute_without`)
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
            compute_devices=compute,
            wrap_replicated=lambda copies, spec: ReplicatedVariable(self, copies, spec),
            home=home,
        )
        self._ledger = ReductionLedger(len(compute), self._local_results)
        self._eager_steps = threading.RLock()  # eager steps share one graph: one at a time
        if cluster is not None:
            _health.watch(cluster)  # a hung task ends the client, naming it
        _log.info(
            "dpkeras: compute devices %s (%s); parameter devices %s (policy %r)",
            [short_device(d) for d in compute],
            reason,
            [short_device(d) for d in self._parameter_devices],
            policy,
        )

    # -- devices ------------------------------------------------------------------------------

    def compute_without(self, tasks):
        """Runs the replicas on every compute device of the strategy but those of `tasks`
        (task names; none: every device again), feeding each task's replicas as before.
        Returns whether the devices changed (the step functions then need making again).

        For a worker lost mid-`fit` (`dpkeras._patches.lost_tasks`): the global batch is cut
        among fewer replicas, and Keras's step functions, made again, run on them. Raises
        ValueError if no device would be left, or if a variable's values live on one of
        `tasks` (a parameter device there). `placement.hybrid()`'s copies on them are left
        out with their devices: the others carry on.
        """
        tasks = set(tasks)
        for variable in self.variables() if tasks else ():
            ours = placed.of(variable)
            if ours is not None and any(ours.lives_on(task) for task in tasks):
                raise ValueError(
                    f"Variable {ours.name!r} lives on {sorted(tasks)}: its replicas cannot be "
                    f"left out."
                )
        compute = [d for d in self._every_compute_device if device_names.task_of(d) not in tasks]
        if not compute:
            raise ValueError(f"No compute device is left without {sorted(tasks)}.")
        if list(self._compute_devices) == compute:
            return False
        self._input = InputPlan.by_task(compute, self._input.local_host)
        self._compute_devices = self._input.compute_devices
        self._ledger = ReductionLedger(len(self._compute_devices), self._local_results)
        return True

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
    def strategy(self):
        """The `ParameterDeviceStrategy` this is the machinery of."""
        return self._container_strategy()

    @property
    def cluster_spec(self):
        """The `tf.train.ClusterSpec` this strategy runs on, or None on one machine."""
        return self._cluster

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
        """The partitioner of layer weights (`dpkeras._variables.partitioning`), or None."""
        return self._creator.partitioner

    @property
    def input_plan(self):
        """The `InputPlan`: which input host feeds which replicas."""
        return self._input

    @property
    def config(self):
        """The `dpkeras._config.Config` this strategy was made with."""
        return self._config

    @property
    def deduplicate(self):
        """A `dpkeras.Deduplicate`: how repeated ids cross (`dpkeras._variables.dedup`)."""
        return self._config.deduplicate

    def _validate_colocate_with_variable(self, colocate_with_variable):
        if placed.of(colocate_with_variable) is None:
            raise ValueError(
                f"colocate_vars_with() needs a variable created under this strategy's scope. "
                f"Received: {colocate_with_variable!r}"
            )

    def _own_device(self, device):
        """`device` canonical; one named without a job (TensorFlow's default destination of
        `strategy.reduce`, `/device:CPU:0`) is this process's: on a cluster whose client is
        one of its tasks (the chief, or worker 0), that task's, since connecting renamed
        `/job:localhost` to it."""
        own = None if self._cluster is None else self._cluster.own
        spec = tf.DeviceSpec.from_string(device)
        if own is not None and not spec.job:
            device = spec.make_merged_spec(tf.DeviceSpec(job=own[0], replica=0, task=own[1]))
            device = device.to_string()
        return canonical_device(device)

    # -- running replicas ---------------------------------------------------------------------

    def _call_for_each_replica(self, fn, args, kwargs):
        """Runs `fn` on every replica (TF's replica threads), with what a Keras step needs.

        Keras's TF trainer calls `strategy.run(model.train_step, ...)` (and `test_step`, and
        a closure for `predict`). Before the replicas run, this checks that every variable of
        the model was created under this strategy (else it fails at trace, naming the
        variable, instead of training a copy nobody reads); weights each replica's gradients
        by `N * b_i / B` when the replicas got uneven shares of the global batch (Keras scales
        each replica's mean loss by 1/N, exact only for even shares); and collects each
        replica's input tensors, so writes without a data dependency wait for them. A Keras
        step given one whole batch (`train_on_batch` and its kin, or Keras's epoch loop on CPU
        replicas, `dpkeras._patches.whole_batches`) runs each replica on its share of it
        (`dpkeras._input.shares.cut_whole_batch`). A predict step does not run the model on a
        replica's empty share of a batch (`keras_steps.safe_with_an_empty_share`). After
        Keras's LossScaleOptimizer asks each replica whether its gradients are finite, the
        answer is made global (Keras reads replica 0's answer only).
        """
        model, step = keras_steps.step_model(fn)
        n = self._num_replicas_in_sync
        if model is not None:
            keras_steps.check_model_variables(model, self)
            if n > 1 and keras_steps.is_whole_batch(args, kwargs):
                args, kwargs = shares.cut_whole_batch(args, kwargs, n, self._input.local_host)
        state = replica_step.StepState(
            pulls=None
            if tf.executing_eagerly()
            else replica_step.Pulls(tf.compat.v1.get_default_graph()),
            gradient_weights=(
                keras_steps.gradient_weights(args, self._local_results, n, self._parameter_device)
                if step == "train_step"
                else None
            ),
            inputs=keras_steps.replica_inputs(args, kwargs, self._local_results, n),
        )
        if step == "predict_step" and n > 1:
            fn = keras_steps.safe_with_an_empty_share(fn)
        fn = _carried.into_replicas(fn)  # the caller's TF1 variable scopes, in each replica
        serial = self._eager_steps if tf.executing_eagerly() else contextlib.nullcontext()
        with serial, replica_step.running(self, state):
            result = _tf_internals.call_for_each_replica(
                self._container_strategy(), fn, args, kwargs
            )
        packing.pack_reads(state.pulls)
        if keras_steps.is_check_finite(fn):
            result = keras_steps.all_replicas_finite(
                result, self._local_results, self._parameter_device, _tf_internals.Mirrored
            )
        return result

    def _use_merge_call(self):
        """Merge from replica context; in cross-replica context there is nothing to merge.

        Keras's `maybe_merge_call` (weight decay, updates, accumulators) then calls its function
        directly when the optimizer applies the summed gradient
        (`dpkeras._extended.optimizer_apply`).
        """
        return tf.distribute.get_replica_context() is not None

    # -- input --------------------------------------------------------------------------------

    def _experimental_distribute_dataset(self, dataset, options):
        return self._input.distribute_dataset(dataset, self._container_strategy(), options)

    def _distribute_datasets_from_function(self, dataset_fn, options):
        return self._input.distribute_datasets_from_function(
            dataset_fn, self._container_strategy(), options
        )

    def _experimental_distribute_values_from_function(self, value_fn):
        return self._input.distribute_values_from_function(value_fn)
