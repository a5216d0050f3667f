"""The one variable creator: every variable made under the strategy is placed here, once.

It validates the request, describes it as a `placement.VariableSpec`, asks the placement
policy for a device (optimizer slots follow their variable instead), creates the variable there
with the creators below it, and wraps it as a `ParameterVariable` (one copy), a
`ReplicatedVariable` (a copy on every compute device) or a `ShardedParameterVariable` (its
rows in shards). Nothing else places variables.
"""

import contextlib
import dataclasses
import itertools
import threading
import warnings
import weakref

import tensorflow as tf

from dpkeras import _keras_internals, _tf_internals, placement
from dpkeras._compat_scopes import refuse_tf_variable_scope
from dpkeras._device_names import canonical_device, short_device
from dpkeras._variables import partitioning, placed
from dpkeras._variables.shard_updates import ROW_WISE_OPTIMIZERS
from dpkeras.placement import VariableKind

VALID_AGGREGATIONS = (
    tf.VariableAggregation.NONE,
    tf.VariableAggregation.SUM,
    tf.VariableAggregation.MEAN,
    tf.VariableAggregation.ONLY_FIRST_REPLICA,
)


def _check_aggregation_dtype(name, aggregation, dtype):
    if aggregation == tf.VariableAggregation.MEAN and not (dtype.is_floating or dtype.is_complex):
        raise ValueError(
            f"Variable {name!r} has dtype {dtype.name} and aggregation=MEAN; the mean of "
            f"integers across replicas is not an integer. Use aggregation SUM, "
            f"ONLY_FIRST_REPLICA or NONE, or a floating dtype."
        )


def _refuse_tf1_get_variable(name):
    """Raises RuntimeError when TF1's `tf.compat.v1.get_variable` creates this variable.

    In TensorFlow 2 it shares nothing, even under `reuse=AUTO_REUSE` (what `tf_upgrade_v2`
    writes): an eager build and a `tf.function` step each make their own `conv1/weights`,
    without a word. Variables it makes beside another (slots of TF1 optimizers and of
    `ExponentialMovingAverage`, created under `colocate_vars_with`) are not refused.
    """
    if not _tf_internals.called_from_tf1_get_variable():
        return
    path = name.split(":")[0]
    scope, _, leaf = path.rpartition("/")
    dpkeras_call = (
        f"dpkeras.get_variable('{leaf}') inside dpkeras.variable_scope('{scope}', reuse=...)"
        if scope
        else f"dpkeras.get_variable('{leaf}')"
    )
    raise RuntimeError(
        f"tf.compat.v1.get_variable('{path}') was called under dpkeras's strategy; in "
        f"TensorFlow 2 it shares nothing, even with reuse=AUTO_REUSE: an eager build and a "
        f"tf.function step would each make their own '{path}'. Use {dpkeras_call}: the same "
        f"name and reuse (True, False or dpkeras.AUTO_REUSE), shared by name."
    )


_warned = set()  # the paths `_warn_untracked` named, each once


def _warn_untracked(spec):
    """Warns, once per path, that a Keras layer made a plain `tf.Variable` (TF1 code kept as
    is in `build()` or `call()`): placed like any other, but Keras never tracks it, so it is
    never trained nor saved, and Keras says only "The model does not have any trainable
    weights"."""
    if spec.path in _warned:
        return
    _warned.add(spec.path)
    layer = f" by a Keras layer ({spec.layer})" if spec.layer is not None else ""
    warnings.warn(
        f"tf.Variable {spec.path!r} was made{layer} (TF1 code in build() or call()): Keras does "
        f"not track a tf.Variable, so it is never trained nor saved. Make it with "
        f"dpkeras.get_variable(...) or self.add_weight(...) instead.",
        UserWarning,
        stacklevel=2,
    )


class _Named(threading.local):
    def __init__(self):
        self.device = None  # the device named for the variables created now, or None


_NAMED = _Named()


@contextlib.contextmanager
def named_device(device):
    """Variables created in the block go to `device`, not where the placement policy says.

    For a device the user named for a variable (`dpkeras.get_variable(device=...)`, or a
    `tf.device` around it): TF1 placed the variable there. `device` is canonical and one of
    the strategy's devices (the caller checks, before anything is created); a variable the
    partitioner cuts, or an optimizer slot, is placed as always.
    """
    previous, _NAMED.device = _NAMED.device, device
    try:
        yield
    finally:
        _NAMED.device = previous


class VariableCreator:
    """Places variables by a policy and keeps a registry of what it created.

    A variable the partitioner cuts (see `dpkeras._variables.partitioning`) becomes a
    `ShardedParameterVariable`: every shard's device is chosen (each shard is its own
    `VariableSpec`, path `<path>/part_<i>`) before any shard is created, the initial value is
    computed once, whole (so a sharded variable starts with the numbers an unsharded one would)
    and each shard receives only its rows. Optimizer slots of a sharded variable are sharded
    like it, shard by shard on the same devices.

    Args:
        policy: callable `(VariableSpec) -> device`; see `dpkeras.placement`.
        available: set of canonical device names the policy may choose from.
        wrap: callable `(variable, spec) -> ParameterVariable`.
        partitioner: the strategy's partitioner for layer weights, or None.
        wrap_sharded: callable `(shards, spec, kwargs) -> ShardedParameterVariable`.
    """

    def __init__(
        self,
        policy,
        available,
        wrap,
        partitioner=None,
        wrap_sharded=None,
        compute_devices=(),
        wrap_replicated=None,
        home=None,
    ):
        self.policy = policy
        self._home = home
        self._compute_devices = tuple(compute_devices)
        self._wrap_replicated = wrap_replicated
        self.partitioner = partitioner
        self._available = frozenset(available)
        self._wrap = wrap
        self._wrap_sharded = wrap_sharded
        self._lock = threading.Lock()
        self._variables = weakref.WeakValueDictionary()  # creation order -> PlacedVariable
        self._order = itertools.count()

    def _register(self, variables):
        """Records `variables` (in creation order) among those `variables()` lists."""
        with self._lock:
            for variable in variables:
                self._variables[next(self._order)] = variable

    def _create_below(self, next_creator, kwargs, device, name, placed_as_is=False):
        """The variable the creators below this one make on `device`: a resource variable
        (with `placed_as_is`, a variable a dpkeras strategy already placed is returned as is;
        otherwise it is refused too)."""
        with _tf_internals.no_colocation(), tf.device(device):
            variable = next_creator(**kwargs)
        if placed_as_is and placed.of(variable) is not None:
            return variable
        if not _tf_internals.is_resource_variable(variable) or placed.of(variable) is not None:
            raise TypeError(
                f"dpkeras places resource variables only; the variable creators below "
                f"dpkeras.scope() returned {type(variable).__name__} for {name!r}."
            )
        return variable

    def variables(self):
        """Every live variable created here, in creation order."""
        with self._lock:
            items = sorted(self._variables.items(), key=lambda item: item[0])
        return [v for _, v in items]

    def place(self, spec):
        """The device the placement policy chooses for `spec`, validated, or
        `placement.REPLICATED`."""
        try:
            device = self.policy(spec)
        except Exception as e:  # a user policy may raise anything; say which variable
            raise ValueError(
                f"The placement policy {self.policy!r} failed for variable {spec.path!r} "
                f"({spec.kind}, shape {spec.shape}): {type(e).__name__}: {e}"
            ) from e
        if device is placement.REPLICATED:
            if spec.shard is not None:
                raise ValueError(
                    f"The placement policy {self.policy!r} answered REPLICATED for shard "
                    f"{spec.path!r} ({spec.shard[0] + 1} of {spec.shard[1]}); a partitioned "
                    f"variable's shards live on parameter devices. Answer a device for "
                    f"shards (spec.shard is not None), or do not partition the variable."
                )
            if spec.kind is VariableKind.METRIC:
                raise ValueError(
                    f"The placement policy {self.policy!r} answered REPLICATED for metric "
                    f"state {spec.path!r} (synchronization=ON_READ); metric state lives on a "
                    f"parameter device, where every replica's update is summed once. Answer "
                    f"a device for spec.kind == 'metric'."
                )
            return device
        try:
            device = canonical_device(device)
        except ValueError as e:
            raise ValueError(
                f"The placement policy {self.policy!r} returned an invalid device "
                f"for variable {spec.path!r}: {e}"
            ) from None
        if device not in self._available:
            raise ValueError(
                f"The placement policy {self.policy!r} placed variable {spec.path!r} on "
                f"{short_device(device)}, which does not exist in this process. "
                f"Available devices: "
                f"{', '.join(sorted(short_device(d) for d in self._available))}."
            )
        return device

    def __call__(self, next_creator, **kwargs):
        """A `tf.variable_creator_scope` creator."""
        colocate_with = kwargs.pop("colocate_with", None)
        name = kwargs.get("name") or "Variable"
        aggregation = kwargs.get("aggregation") or tf.VariableAggregation.NONE
        if aggregation not in VALID_AGGREGATIONS:
            raise ValueError(
                f"Variable {name!r}: aggregation must be one of "
                f"{[a.name for a in VALID_AGGREGATIONS]}. Received: aggregation={aggregation!r}"
            )
        dtype = kwargs.get("dtype")
        initial_value = kwargs.get("initial_value")
        if dtype is None and initial_value is not None and not callable(initial_value):
            dtype = (
                getattr(initial_value, "dtype", None) or tf.convert_to_tensor(initial_value).dtype
            )
        if dtype is not None:
            _check_aggregation_dtype(name, aggregation, tf.as_dtype(dtype))
        if colocate_with is None and "collections" in kwargs:
            _refuse_tf1_get_variable(name)
        spec = placement.describe_variable(kwargs)
        if spec.kind is VariableKind.WEIGHT:
            refuse_tf_variable_scope(f"A Keras layer creating weight '{spec.path}' under dpkeras")
            if not _keras_internals.making_a_keras_variable():
                _warn_untracked(spec)
        rows = self._rows_per_shard(spec, kwargs, colocate_with)
        if rows is not None:
            return self._create_sharded(next_creator, kwargs, spec, rows, colocate_with)
        # Optimizer slots are created under colocate_vars_with(variable): they follow it.
        if colocate_with is not None:
            device = colocate_with.slot_device
        elif _NAMED.device is not None:
            device = _NAMED.device  # a device the user named (see named_device)
        else:
            device = self.place(spec)
            if device is placement.REPLICATED and kwargs.get("initial_value") is None:
                device = self._loaded_device(spec)
        if device is placement.REPLICATED:
            if kwargs.get("synchronization") == tf.VariableSynchronization.ON_READ:
                raise ValueError(
                    f"Variable {spec.path!r} has synchronization=ON_READ and would be "
                    f"replicated (placement.REPLICATED, or created beside a replicated "
                    f"variable); ON_READ state lives on a parameter device."
                )
            return self._create_replicated(next_creator, kwargs, spec, name, dtype)
        variable = self._create_below(next_creator, kwargs, device, name, placed_as_is=True)
        if placed.of(variable) is not None:
            return variable  # a creator below returned a variable already placed
        if dtype is None:
            _check_aggregation_dtype(name, aggregation, variable.dtype)
        if spec.shape is None:
            spec = dataclasses.replace(spec, shape=tuple(variable.shape.as_list()))
        wrapped = self._wrap(variable, spec)
        self._register([wrapped])
        return wrapped

    def _loaded_device(self, spec):
        """The parameter device of a variable made without an initial value, which the policy
        would replicate.

        TensorFlow's SavedModel loader (`tf.saved_model.load`, `keras.layers.TFSMLayer`) makes
        its variables so: a creator below this one makes an `UninitializedVariable` of the
        saved shape, whose value the loader then restores. The loaded functions capture each
        variable's handle once, at load, so a replicated variable's copies could not be read
        replica by replica (every replica would read copy 0, and only copy 0 would have a
        gradient). It lives on a parameter device, as every variable does under all-on-ps:
        `hybrid()` places it as it places a table (balanced over its parameter devices,
        `placement.as_loaded`), another policy on the home parameter device.
        """
        loaded = placement.as_loaded(self.policy, spec)
        if loaded is not None:
            return self.place(loaded)
        if self._home is None:
            raise ValueError(
                f"Variable {spec.path!r} has no initial value (a SavedModel being loaded) and "
                f"the placement policy {self.policy!r} replicates it; this creator has no "
                f"parameter device to place it on."
            )
        return self._home

    def _rows_per_shard(self, spec, kwargs, colocate_with):
        """Rows per shard for the variable `spec` describes, or None to keep it whole."""
        if colocate_with is not None and colocate_with.slot_rows is not None:
            optimizer = _keras_internals.creating_optimizer()
            full = tuple(colocate_with.shape.as_list())
            if optimizer is None and spec.shape is not None and tuple(spec.shape) != full:
                raise ValueError(
                    f"Variable {spec.path!r} (shape {spec.shape}) is created beside sharded "
                    f"variable {colocate_with.name[:-2]!r} (colocate_vars_with), so it is "
                    f"sharded like it and needs its shape {full}."
                )
            if optimizer is not None and (
                not isinstance(optimizer, ROW_WISE_OPTIMIZERS)
                or (spec.shape is not None and tuple(spec.shape) != full)
            ):
                raise ValueError(
                    f"{type(optimizer).__name__} cannot update sharded variable "
                    f"{colocate_with.name[:-2]!r}: dpkeras shards optimizer state like its "
                    f"variable and updates shard by shard, which equals updating the whole "
                    f"variable only for optimizers whose update is row by row. Those are "
                    f"{', '.join(o.__name__ for o in ROW_WISE_OPTIMIZERS)} (and their "
                    f"subclasses). Received a slot {spec.path!r} of shape {spec.shape} for a "
                    f"variable of shape {full}."
                )
            return colocate_with.slot_rows
        if colocate_with is not None:
            return None
        scoped, partitioner, explicit = partitioning.current_partitioner()
        if not scoped:
            partitioner = self.partitioner
        if not explicit and (
            spec.kind not in (VariableKind.WEIGHT, VariableKind.OTHER) or spec.shape is None
        ):
            return None
        if (
            partitioner is None
            or kwargs.get("synchronization") == tf.VariableSynchronization.ON_READ
        ):
            return None
        if not explicit and not placement.cuts(self.policy, spec):
            return None  # hybrid(): the strategy's partitioner cuts tables, the rest replicates
        return partitioning.row_split(partitioner, spec.shape, spec.dtype, spec.path, explicit)

    def _create_sharded(self, next_creator, kwargs, spec, rows, colocate_with):
        n = len(rows)
        offsets = partitioning.offsets(rows)
        specs = [
            dataclasses.replace(
                spec,
                path=f"{spec.path}/part_{i}",
                shape=(r,) + tuple(spec.shape[1:]),
                shard=(i, n),
            )
            for i, r in enumerate(rows)
        ]
        if colocate_with is not None:
            devices = [s.device for s in colocate_with.parts]
        else:
            devices = [self.place(s) for s in specs]  # every device is known before creating
        name = (kwargs.get("name") or "Variable").split(":")[0]
        initial_value = kwargs.get("initial_value")
        with _tf_internals.no_colocation(), tf.init_scope(), tf.device(devices[0]):
            value = initial_value() if callable(initial_value) else initial_value
            value = tf.convert_to_tensor(value, dtype=kwargs.get("dtype"))
            if tuple(value.shape.as_list()) != tuple(spec.shape):
                raise ValueError(
                    f"Variable {spec.path!r}: the initial value has shape "
                    f"{tuple(value.shape.as_list())}, expected {spec.shape}."
                )
            pieces = [value[offsets[i] : offsets[i + 1]] for i in range(n)]
        shards = []
        for i, (piece, device) in enumerate(zip(pieces, devices)):
            shard_kwargs = dict(kwargs, initial_value=piece, name=f"{name}/part_{i}")
            shard_kwargs.update(trainable=False, shape=None, dtype=value.dtype)
            variable = self._create_below(next_creator, shard_kwargs, device, name)
            shards.append(self._wrap(variable, specs[i]))
        sharded = self._wrap_sharded(shards, spec, kwargs)
        self._register(shards)
        return sharded

    def _create_replicated(self, next_creator, kwargs, spec, name, dtype):
        """One copy per compute device, all from one initial value computed once."""
        if not self._compute_devices or self._wrap_replicated is None:
            raise ValueError(f"Variable {spec.path!r}: this creator cannot replicate variables.")
        initial_value = kwargs.get("initial_value")
        with _tf_internals.no_colocation(), tf.init_scope(), tf.device(self._compute_devices[0]):
            value = initial_value() if callable(initial_value) else initial_value
            value = tf.convert_to_tensor(value, dtype=kwargs.get("dtype"))
        copies = []
        for i, device in enumerate(self._compute_devices):
            copy_kwargs = dict(kwargs, initial_value=value, shape=None, dtype=value.dtype)
            if i:
                copy_kwargs["name"] = f"{name.split(':')[0]}/replica_{i}"
            copies.append(self._create_below(next_creator, copy_kwargs, device, name))
        if dtype is None:
            _check_aggregation_dtype(name, kwargs.get("aggregation"), copies[0].dtype)
        if spec.shape is None:
            spec = dataclasses.replace(spec, shape=tuple(copies[0].shape.as_list()))
        wrapped = self._wrap_replicated(copies, spec)
        self._register([wrapped])
        return wrapped
