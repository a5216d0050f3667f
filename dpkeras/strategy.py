"""`ParameterDeviceStrategy`: variables on a parameter device, Keras computation on replicas."""

import contextlib
import dataclasses
import inspect
import itertools
import logging
import weakref

import keras
import tensorflow as tf

from dpkeras import _tf_internals, devices, keras_patches, placement
from dpkeras.variables import ParameterVariable

__all__ = ["ParameterDeviceStrategy", "ParameterDeviceExtended"]

_log = logging.getLogger("dpkeras")

_VALID_AGGREGATIONS = (tf.VariableAggregation.NONE, tf.VariableAggregation.SUM,
                       tf.VariableAggregation.MEAN, tf.VariableAggregation.ONLY_FIRST_REPLICA)


class ParameterDeviceStrategy(tf.distribute.Strategy):
    """Keeps every variable once on a parameter device; runs each step on several replicas.

    Each step runs the same Keras computation on every compute device (a replica) on its share
    of the global batch. Every variable (layer weights, optimizer slots, metric state, RNG
    seeds, loss-scale state) lives once on the parameter device, and each replica reads each
    variable once per step. Gradients are summed on the parameter device and the optimizer
    updates there, once. This is TF1's "variables on the CPU, towers on the GPUs" recipe, as a
    `tf.distribute.Strategy` that Keras 3 trains under unchanged.

    ```python
    import dpkeras, keras
    strategy = dpkeras.ParameterDeviceStrategy()          # all GPUs; variables on /cpu:0
    with strategy.scope():
        model = keras.Sequential([keras.layers.Dense(10)])
        model.compile(optimizer="adam", loss="mse")
    model.fit(x, y, batch_size=256)
    ```

    Semantics, with 2 replicas: a global batch of 256 gives each replica 128 examples; Keras
    scales each replica's loss by 1/2, the two gradients are summed on the parameter device, so
    the update equals one device's on all 256. An uneven split (a global batch of 101, split
    51/50, or a short last batch) is weighted by each replica's share in `fit`, so it too
    equals one device.

    Args:
        compute_devices: list of str, the devices that run replicas, such as
            `["/gpu:0", "/gpu:1"]`. Defaults to `$DPKERAS_COMPUTE_DEVICES` (comma-separated),
            else every GPU, else every logical CPU but the parameter device, else the one CPU.
        parameter_device: where variables live: a device string (it may also be a compute
            device), a list of devices (spread by `placement.greedy_by_size`), or a placement
            policy (see `dpkeras.placement`: any callable taking a `VariableSpec` and returning
            a device). Defaults to `$DPKERAS_PARAMETER_DEVICE` (one device, or
            comma-separated devices), else `"/cpu:0"`.

    Raises:
        ValueError: for an unparseable, absent or duplicated device, an empty list, or a
            parameter_device of another type, before anything is created. A policy that fails
            or returns a bad device raises ValueError when the variable is created, naming it.
    """

    def __init__(self, compute_devices=None, parameter_device=None):
        super().__init__(ParameterDeviceExtended(self, compute_devices, parameter_device))

    @property
    def compute_devices(self):
        """Tuple of the canonical names of the devices that run replicas."""
        return self.extended.worker_devices

    @property
    def parameter_device(self):
        """Canonical name of the (first) device that holds variables."""
        return self.extended.parameter_devices[0]

    def scope(self):
        """`tf.distribute.Strategy.scope`, with dpkeras's Keras patches (dpkeras.keras_patches)."""
        return keras_patches.installed_during(super().scope(), self.extended.variables)

    def __repr__(self):
        compute = ", ".join(devices.short_device(d) for d in self.compute_devices)
        return (f"ParameterDeviceStrategy(compute_devices=[{compute}], "
                f"parameter_device={devices.short_device(self.parameter_device)!r})")


def _bound_method(fn):
    """`(owner, method name)` of a bound method (through decorators), else `(None, "")`."""
    target = inspect.unwrap(fn)
    return getattr(target, "__self__", None), getattr(target, "__name__", "")


def _keras_step_owner(fn):
    """`(model, step name)` when `fn` is a Keras model's train/test/predict step."""
    owner, name = _bound_method(fn)
    if isinstance(owner, keras.Model) and name in ("train_step", "test_step", "predict_step"):
        return owner, name
    return None, None


class ParameterDeviceExtended(_tf_internals.StrategyExtendedV1):
    """The machinery of `ParameterDeviceStrategy` (reached as `strategy.extended`).

    Placement is one creator (`_create_variable`); replicas run through TF's lock-stepped
    replica threads (as in Mirrored and CentralStorage strategies); reductions happen on the
    device that will consume them, the parameter device by default.
    """

    def __init__(self, container_strategy, compute_devices=None, parameter_device=None):
        super().__init__(container_strategy)
        compute, policy, home, reason = devices.resolve_devices(compute_devices,
                                                                parameter_device)
        self._compute_devices = compute
        self._policy = policy
        self._parameter_device = home
        self._parameter_devices = tuple(getattr(policy, "devices", ())) or (home,)
        self._available = {devices.canonical_device(d.name)
                           for d in tf.config.list_logical_devices()}
        self._variables = weakref.WeakValueDictionary()  # creation order -> ParameterVariable
        self._creation_order = itertools.count()
        self._device_reason = reason
        self._host_device = devices.canonical_device("/cpu:0")
        self._step_weights = None
        self._step_inputs = None  # per replica: the input tensors of the step being traced
        # Reductions this strategy made, by graph and tensor name: (how, per-replica value);
        # see `_home_tensor`.
        self._reductions = weakref.WeakKeyDictionary()
        _log.info("dpkeras: compute devices %s (%s); parameter devices %s (policy %r)",
                  [devices.short_device(d) for d in compute], reason,
                  [devices.short_device(d) for d in self._parameter_devices], policy)

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
        return self._parameter_devices

    @property
    def placement_policy(self):
        """The callable that chose each variable's device (see `dpkeras.placement`)."""
        return self._policy

    def variables(self):
        """Every live variable created under this strategy, in creation order."""
        return [v for _, v in sorted(self._variables.items(), key=lambda item: item[0])]

    @property
    def device_reason(self):
        """Why these compute devices were chosen (for `dpkeras env` and logs)."""
        return self._device_reason

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

    def _current_replica_id(self):
        """The replica id (an int) when called inside one of this strategy's replicas."""
        ctx = tf.distribute.get_replica_context()
        if ctx is None or ctx.strategy is not self._container_strategy():
            return None
        return int(tf.get_static_value(ctx.replica_id_in_sync_group))

    # -- variables ----------------------------------------------------------------------------

    def _place(self, spec):
        """The device the placement policy chooses for `spec`, validated."""
        try:
            device = self._policy(spec)
        except Exception as e:  # a user policy may raise anything; say which variable
            raise ValueError(
                f"The placement policy {self._policy!r} failed for variable {spec.path!r} "
                f"({spec.kind}, shape {spec.shape}): {type(e).__name__}: {e}") from e
        try:
            device = devices.canonical_device(device)
        except ValueError as e:
            raise ValueError(f"The placement policy {self._policy!r} returned an invalid device "
                             f"for variable {spec.path!r}: {e}") from None
        if device not in self._available:
            raise ValueError(
                f"The placement policy {self._policy!r} placed variable {spec.path!r} on "
                f"{devices.short_device(device)}, which does not exist in this process. "
                f"Available devices: "
                f"{', '.join(sorted(devices.short_device(d) for d in self._available))}.")
        return device

    def _create_variable(self, next_creator, **kwargs):
        colocate_with = kwargs.pop("colocate_with", None)
        name = kwargs.get("name") or "Variable"
        aggregation = kwargs.get("aggregation") or tf.VariableAggregation.NONE
        if aggregation not in _VALID_AGGREGATIONS:
            raise ValueError(
                f"Variable {name!r}: aggregation must be one of "
                f"{[a.name for a in _VALID_AGGREGATIONS]}. Received: aggregation={aggregation!r}")
        dtype = kwargs.get("dtype")
        initial_value = kwargs.get("initial_value")
        if dtype is None and initial_value is not None and not callable(initial_value):
            dtype = getattr(initial_value, "dtype", None) or tf.convert_to_tensor(
                initial_value).dtype
        if dtype is not None:
            self._check_aggregation_dtype(name, aggregation, tf.as_dtype(dtype))
        spec = placement.describe_variable(kwargs)
        # Optimizer slots are created under colocate_vars_with(variable): they follow it.
        device = self._place(spec) if colocate_with is None else colocate_with.device
        with tf.compat.v1.colocate_with(None, ignore_existing=True), tf.device(device):
            variable = next_creator(**kwargs)
        if isinstance(variable, ParameterVariable):
            return variable  # a creator below returned a variable we already placed
        if not _tf_internals.is_resource_variable(variable):
            raise TypeError(
                f"dpkeras places resource variables only; the variable creators below "
                f"dpkeras.scope() returned {type(variable).__name__} for {name!r}.")
        if dtype is None:
            self._check_aggregation_dtype(name, aggregation, variable.dtype)
        if spec.shape is None:
            spec = dataclasses.replace(spec, shape=tuple(variable.shape.as_list()))
        wrapped = ParameterVariable(self, variable, spec)
        self._variables[next(self._creation_order)] = wrapped
        return wrapped

    @staticmethod
    def _check_aggregation_dtype(name, aggregation, dtype):
        if aggregation == tf.VariableAggregation.MEAN and not (dtype.is_floating or
                                                               dtype.is_complex):
            raise ValueError(
                f"Variable {name!r} has dtype {dtype.name} and aggregation=MEAN; the mean of "
                f"integers across replicas is not an integer. Use aggregation SUM, "
                f"ONLY_FIRST_REPLICA or NONE, or a floating dtype.")

    def _validate_colocate_with_variable(self, colocate_with_variable):
        if not isinstance(colocate_with_variable, ParameterVariable):
            raise ValueError(
                f"colocate_vars_with() needs a variable created under this strategy's scope. "
                f"Received: {colocate_with_variable!r}")

    # -- running replicas ---------------------------------------------------------------------

    def _call_for_each_replica(self, fn, args, kwargs):
        model, step = _keras_step_owner(fn)
        if model is not None:
            self._check_model_variables(model)
        previous = self._step_weights, self._step_inputs
        self._step_weights = (self._keras_train_step_weights(args) if step == "train_step"
                              else None)
        self._step_inputs = self._replica_inputs(args, kwargs)
        try:
            result = _tf_internals.call_for_each_replica(self._container_strategy(), fn, args,
                                                         kwargs)
        finally:
            self._step_weights, self._step_inputs = previous
        owner, name = _bound_method(fn)
        if isinstance(owner, keras.optimizers.LossScaleOptimizer) and name == "check_finite":
            result = self._all_replicas_finite(result)
        return result

    def _replica_inputs(self, args, kwargs):
        """Per replica, the tensors a traced step receives (None when running eagerly)."""
        if tf.executing_eagerly():
            return None
        inputs = [[] for _ in range(self._num_replicas_in_sync)]
        for x in tf.nest.flatten((args, kwargs)):
            parts = (self._local_results(x) if isinstance(x, tf.distribute.DistributedValues)
                     else [x] * self._num_replicas_in_sync)
            for replica_inputs, part in zip(inputs, parts):
                replica_inputs += [t for t in tf.nest.flatten(part, expand_composites=True)
                                   if isinstance(t, tf.Tensor)]
        return inputs

    def _after_step_inputs(self, replica_id=0):
        """Orders a write that does not depend on the step's data after that data arrives.

        A replica-context write of a counter or a seed (the optimizer's iteration count,
        `SeedGenerator` state) has no data dependency. When Keras calls its step once more
        to find the end of a dataset of unknown size, TensorFlow may run such a write before
        the missing batch stops the step: the count and the random stream then drift, and
        differ from run to run. Writes made inside this context cannot run without the data.
        """
        inputs = self._step_inputs[replica_id] if self._step_inputs else None
        if not inputs or tf.executing_eagerly():
            return contextlib.nullcontext()
        return tf.control_dependencies(inputs)

    def _all_replicas_finite(self, per_replica_finite):
        """Every replica's answer to "are all gradients finite?" becomes the global answer.

        Keras's LossScaleOptimizer asks each replica (from cross-replica context) and then uses
        replica 0's answer, assuming the gradients were already all-reduced; they are not, so
        an overflow on another replica alone would let non-finite gradients into the weights.
        """
        with tf.device(self._parameter_device):
            finite = tf.reduce_all(tf.stack(list(self._local_results(per_replica_finite))))
        return _tf_internals.Mirrored([finite] * self._num_replicas_in_sync)

    def _gradient_weight(self, replica_id):
        return None if self._step_weights is None else self._step_weights[replica_id]

    def _check_model_variables(self, model):
        """A Keras step of a model built outside this strategy's scope fails here, at trace."""
        for v in model.variables:
            value = getattr(v, "value", v)
            if not (isinstance(value, ParameterVariable) and value._extended is self):
                raise ValueError(
                    f"Model {model.name!r} has variable {getattr(v, 'path', v.name)!r} that was "
                    f"not created under this strategy's scope ({type(value).__name__} on "
                    f"{value.device or 'no device'}), so it cannot be trained on the parameter "
                    f"device. Create the model (and compile it) inside `with dpkeras.scope():`.")

    def _keras_train_step_weights(self, args):
        """Per-replica gradient weights `N * b_i / B` for a Keras train step, else None.

        Keras scales each replica's mean loss by 1/N, which equals one device only when every
        replica has the same number of examples b_i. Weighting replica i's gradients by
        N * b_i / B (B = sum of b_i) makes any split exact, and leaves even splits bit-identical
        (the weight is exactly 1.0). Custom loops that scale by the global batch themselves
        (`tf.nn.compute_average_loss`) are not Keras train steps and are left alone.
        """
        if self._num_replicas_in_sync == 1:
            return None
        per_replica = next((x for x in tf.nest.flatten(args)
                            if isinstance(x, tf.distribute.DistributedValues)), None)
        if per_replica is None:
            return None
        components = self._local_results(per_replica)
        static = [c.shape[0] if c.shape.rank else None for c in components]
        if None not in static and len(set(static)) == 1:
            return None
        counts = []
        for c in components:
            with tf.device(c.device):
                counts.append(tf.cast(tf.shape(c)[0], tf.float32))
        with tf.device(self._parameter_device):
            total = tf.add_n(counts)
            n = float(self._num_replicas_in_sync)
            return [tf.math.divide_no_nan(c * n, total) for c in counts]

    # -- reductions and updates ---------------------------------------------------------------

    def _reduction_device(self, destinations):
        if isinstance(destinations, str):
            return devices.canonical_device(destinations) if destinations else (
                self._parameter_device)
        if isinstance(destinations, tf.Variable):
            return destinations.device
        if isinstance(destinations, tf.distribute.DistributedValues):
            found = {getattr(v, "device", None) for v in destinations.values}
        else:
            found = {getattr(destinations, "device", None)}
        found.discard(None)
        found.discard("")
        if len(found) == 1:
            return found.pop()
        return self._parameter_device

    def _aggregate(self, how, value, device):
        """Reduces `value` (per-replica) onto `device`.

        Args:
            how: a `tf.VariableAggregation` or `tf.distribute.ReduceOp` (or its name).
            value: a `DistributedValues`, or one value standing for every replica.
            device: where the result is computed.

        Returns:
            A tensor (or `tf.IndexedSlices`, kept sparse) on `device`.
        """
        how = getattr(how, "name", how)
        how = str(how).upper()
        n = self._num_replicas_in_sync
        if isinstance(value, tf.distribute.DistributedValues):
            components = list(self._local_results(value))
        else:
            components = [value] * n
        if how == "ONLY_FIRST_REPLICA":
            return components[0]
        if how not in ("SUM", "MEAN"):
            raise ValueError(f"Cannot reduce with {how!r}; expected SUM, MEAN or "
                             f"ONLY_FIRST_REPLICA.")
        with tf.device(device):
            sparse = [isinstance(c, tf.IndexedSlices) for c in components]
            if all(sparse):
                values = tf.concat([c.values for c in components], axis=0)
                if how == "MEAN":
                    values = values / tf.cast(n, values.dtype)
                result = tf.IndexedSlices(values, tf.concat([c.indices for c in components], 0),
                                          components[0].dense_shape)
            else:
                dense = [tf.convert_to_tensor(c) for c in components]
                result = tf.add_n(dense) if len(dense) > 1 else tf.identity(dense[0])
                if how == "MEAN":
                    result = (result // n if result.dtype.is_integer else
                              result / tf.cast(n, result.dtype))
        self._remember_reduction(result, how, value)
        return result

    def _remember_reduction(self, result, how, value):
        if tf.executing_eagerly():
            return
        key = result.values if isinstance(result, tf.IndexedSlices) else result
        self._reductions.setdefault(key.graph, {})[key.name] = (how, value)

    def _home_tensor(self, t):
        """The reduction `t` forwards, if `t` is an identity of one this strategy made.

        `ReplicaContext.all_reduce` wraps merged results in a `custom_gradient` IdentityN
        created on each replica's device. Handing that to `update` would copy every reduced
        gradient to replica 0 and back; this finds the reduction where it already is.
        """
        if not isinstance(t, tf.Tensor) or tf.executing_eagerly():
            return t
        if t.op.type in ("Identity", "IdentityN"):
            source = t.op.inputs[t.value_index if t.op.type == "IdentityN" else 0]
            if source.name in self._reductions.get(source.graph, ()):
                return source
        return t

    def _for_device(self, x, device):
        """`x`, with a reduction this strategy made redone on `device` if it was elsewhere.

        All-reduced gradients are summed on the home device before the strategy knows which
        variable each belongs to; with variables spread over several devices, each is summed
        again where its variable lives, and the first sum, unused, is pruned from the graph.
        """
        sparse = isinstance(x, tf.IndexedSlices)
        key = self._home_tensor(x.values if sparse else x)
        if sparse and key is not x.values:
            x = tf.IndexedSlices(key, self._home_tensor(x.indices), x.dense_shape)
        elif not sparse:
            x = key
        if isinstance(key, tf.Tensor) and not tf.executing_eagerly() and device and (
                key.device != device):
            found = self._reductions.get(key.graph, {}).get(key.name)
            if found is not None:
                return self._aggregate(found[0], found[1], device)
        return x

    def _select_single_value(self, structure, device=None):
        def select(x):
            if isinstance(x, tf.distribute.DistributedValues):
                x = self._local_results(x)[0]
            if isinstance(x, (tf.Tensor, tf.IndexedSlices)):
                return self._for_device(x, device)
            return x
        return tf.nest.map_structure(select, structure)

    def _reduce_to(self, reduce_op, value, destinations, options):
        del options
        if not isinstance(value, tf.distribute.DistributedValues):
            if (getattr(reduce_op, "name", reduce_op) == "MEAN" or
                    self._num_replicas_in_sync == 1):
                return value
            raise ValueError(
                f"A value that is not per-replica cannot be reduced with SUM over "
                f"{self._num_replicas_in_sync} replicas (it is unclear whether it stands for "
                f"one replica or all). Received: {value!r}. Return it from strategy.run to "
                f"get a per-replica value, or reduce with MEAN.")
        self._check_same_shapes(value)
        return self._aggregate(reduce_op, value, self._reduction_device(destinations))

    def _check_same_shapes(self, value):
        shapes = [getattr(c, "shape", None) for c in self._local_results(value)]
        known = [s for s in shapes if s is not None and s.is_fully_defined()]
        if len(known) == len(shapes) and len({tuple(s) for s in known}) > 1:
            raise ValueError(
                f"Cannot reduce per-replica values of different shapes "
                f"{[tuple(s) for s in known]} element-wise. With uneven per-replica batches, "
                f"reduce along the batch axis (strategy.reduce(op, value, axis=0)) or use a "
                f"global batch size divisible by {self._num_replicas_in_sync}.")

    def _batch_reduce_to(self, reduce_op, value_destination_pairs, options):
        return [self._reduce_to(reduce_op, v, d, options) for v, d in value_destination_pairs]

    def _gather_to_implementation(self, value, destinations, axis, options):
        del options
        if not isinstance(value, tf.distribute.DistributedValues):
            return value
        with tf.device(self._reduction_device(destinations)):
            return tf.concat(list(self._local_results(value)), axis=axis)

    def _broadcast_to(self, tensor, destinations):
        if isinstance(tensor, (float, int)):
            return tensor
        targets = ([destinations] if isinstance(destinations, str) else
                   [getattr(v, "device", self._parameter_device) for v in
                    getattr(destinations, "values", [destinations])])
        copies = []
        for d in targets:
            with tf.device(d):
                copies.append(tf.identity(tensor))
        return copies[0] if len(copies) == 1 else _tf_internals.Mirrored(copies)

    def _update(self, var, fn, args, kwargs, group):
        if isinstance(var, keras.Variable):
            var = var.value
        if not isinstance(var, ParameterVariable):
            raise ValueError(
                f"Variable {getattr(var, 'name', var)!r} was not created under this "
                f"strategy's scope, so dpkeras cannot update it on the parameter device. "
                f"Create the model (and compile it) inside `with dpkeras.scope():`. "
                f"Received a {type(var).__name__}.")
        with tf.device(var.device), _tf_internals.UpdateContext(var.device):
            result = fn(var, *self._select_single_value(args, var.device),
                        **self._select_single_value(kwargs, var.device))
        return result if group else tf.nest.map_structure(self._local_results, result)

    def _update_non_slot(self, colocate_with, fn, args, kwargs, group):
        device = colocate_with if isinstance(colocate_with, str) else colocate_with.device
        with tf.device(device), _tf_internals.UpdateContext(device):
            result = fn(*self._select_single_value(args), **self._select_single_value(kwargs))
        return result if group else tf.nest.map_structure(self._local_results, result)

    def value_container(self, value):
        return value

    def read_var(self, var):
        return tf.identity(var)

    # -- input --------------------------------------------------------------------------------

    def _input_workers(self, options=None):
        if options is not None and not options.experimental_fetch_to_device:
            targets = (self._host_device,) * self._num_replicas_in_sync
        else:
            targets = self._compute_devices
        return _tf_internals.InputWorkers([(self._host_device, targets)])

    def _check_input_options(self, options, api):
        if options is not None and (options.experimental_replication_mode ==
                                    _tf_internals.InputReplicationMode.PER_REPLICA):
            raise NotImplementedError(
                f"{api} under dpkeras supports InputReplicationMode.PER_WORKER (the default): "
                f"one input pipeline rebatched over the replicas. Received: "
                f"experimental_replication_mode=PER_REPLICA.")

    def _experimental_distribute_dataset(self, dataset, options):
        self._check_input_options(options, "experimental_distribute_dataset")
        self._check_not_empty(dataset)
        return _tf_internals.get_distributed_dataset(
            dataset, self._input_workers(options), self._container_strategy(),
            num_replicas_in_sync=self._num_replicas_in_sync, options=options)

    @staticmethod
    def _check_not_empty(dataset):
        """A dataset known to be empty fails here, not with a bare StopIteration in Keras."""
        if tf.get_static_value(dataset.cardinality()) == 0:
            raise ValueError(
                f"Cannot distribute an empty dataset: it yields no batch (cardinality 0), so "
                f"Keras's fit, evaluate and predict would stop with a bare StopIteration. "
                f"Received: {dataset!r}. Give it at least one batch (check for empty arrays, a "
                f"filter or take that removes everything, or batch(..., drop_remainder=True) "
                f"on fewer examples than one batch).")

    def _distribute_datasets_from_function(self, dataset_fn, options):
        self._check_input_options(options, "distribute_datasets_from_function")
        context = _tf_internals.InputContext(
            num_input_pipelines=1, input_pipeline_id=0,
            num_replicas_in_sync=self._num_replicas_in_sync)
        return _tf_internals.get_distributed_datasets_from_function(
            dataset_fn, self._input_workers(options), [context], self._container_strategy(),
            options=options)

    def _experimental_distribute_values_from_function(self, value_fn):
        values = []
        for replica_id, device in enumerate(self._compute_devices):
            with tf.device(device):
                values.append(value_fn(_tf_internals.ValueContext(
                    replica_id, self._num_replicas_in_sync)))
        return _tf_internals.regroup(values, always_wrap=True)
