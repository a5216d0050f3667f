"""Placement policies: which parameter device holds each variable.

TF1 placed variables with a device function (`tf.device(fn)` returning the CPU for variable ops),
with `tf.device`, and with `replica_device_setter`'s round-robin or greedy byte-size balancing
over parameter servers. dpkeras gives each of these a small value you pass as
`parameter_device`:

```python
import re
from dpkeras import placement

dpkeras.scope(parameter_device="/cpu:0")                          # one device
dpkeras.scope(parameter_device=["/gpu:0", "/gpu:1"])             # greedy_by_size over both
dpkeras.scope(parameter_device=placement.round_robin(["/gpu:0", "/gpu:1"]))
dpkeras.scope(parameter_device=placement.by_path({r"embedding": "/cpu:0"}, default="/gpu:0"))
dpkeras.scope(parameter_device=lambda spec: "/cpu:0" if spec.kind == "optimizer" else "/gpu:0")
dpkeras.scope(parameter_device=placement.hybrid())  # tables on /cpu:0 (or the ps), the rest
                                                    # replicated on the compute devices
dpkeras.scope(parameter_device=tf.compat.v1.train.replica_device_setter(ps_tasks=2))  # a cluster
```

A policy is any callable `(VariableSpec) -> device string`: the successor of the TF1 device
function. It may also answer `placement.REPLICATED`: the variable then has a copy on every
compute device, as MirroredStrategy's variables do, its gradient is all-reduced among the
compute devices (worker to worker on a cluster, never through a parameter device or the
client) and the optimizer updates every copy (`dpkeras._variables.replicated`).

A policy is asked once per variable, when the variable is created, in creation order, so the
same model and policy give the same placement in every run and process. Optimizer slots are
not asked: they live with the variable they belong to.
"""

import dataclasses
import enum
import itertools
import re
import threading
from typing import Protocol

import keras
import tensorflow as tf

from dpkeras import _keras_internals, _tf_internals
from dpkeras import _sizes as sizes
from dpkeras._device_names import canonical_device, short_device

__all__ = [
    "VariableKind",
    "VariableSpec",
    "PlacementPolicy",
    "REPLICATED",
    "Partitioner",
    "Policy",
    "single",
    "round_robin",
    "greedy_by_size",
    "by_path",
    "hybrid",
    "as_policy",
    "device_function",
    "describe_variable",
    "KINDS",
]


class VariableKind(str, enum.Enum):
    """What a variable is for, as a placement policy and dpkeras see it.

    A `str`: `spec.kind == "weight"` holds for `VariableKind.WEIGHT`.
    """

    WEIGHT = "weight"  # a layer's variable
    OPTIMIZER = "optimizer"  # an optimizer's own state (its slots follow their variable)
    METRIC = "metric"  # metric state (synchronization ON_READ)
    SEED = "seed"  # random-number state of a `keras.random.SeedGenerator`
    OTHER = "other"  # anything else (a plain `tf.Variable`, say)

    def __str__(self):
        return self.value

    def __format__(self, spec):
        return format(self.value, spec)


KINDS = tuple(VariableKind)


class _Replicated:
    """The answer a placement policy gives for a variable that lives on every compute device."""

    _instance = None

    def __new__(cls):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self):
        return "dpkeras.placement.REPLICATED"

    def __reduce__(self):
        return (_Replicated, ())


REPLICATED = _Replicated()
"""What a policy returns for a variable with a copy on every compute device (see the module
docstring). Metric state (`synchronization=ON_READ`) and the shards of a partitioned variable
cannot be replicated: the creator refuses them with a ValueError naming the variable."""


@dataclasses.dataclass(frozen=True)
class VariableSpec:
    """What a placement policy knows about a variable about to be created.

    Attributes:
        path: str, the Keras path, such as `"sequential/dense/kernel"` or `"adam/iteration"`.
        shape: tuple of int (None for unknown dimensions), or None when the creator cannot
            know it (a `tf.Variable` with a callable initial value and no `shape`).
        dtype: str, such as `"float32"`.
        trainable: bool.
        kind: a `VariableKind` (a str): `"weight"`, `"optimizer"`, `"metric"`, `"seed"` or
            `"other"`.
        shard: `(i, n)` when this is shard i of a variable cut into n shards (its path is
            then `<variable path>/part_<i>` and its shape the shard's), else None.
        layer: str, the class name of the innermost Keras layer creating it (for a slot, the
            layer of its variable is not known: None), or None.
        table: bool, whether it is an embedding table: created by a layer whose class, or a
            base class, is named `...Embedding` (Keras's `Embedding`, dpkeras's
            `DynamicEmbedding`), or a weight named `embeddings` (Keras's name for a table,
            which keras-rs's tables also carry, created outside any layer's call).
    """

    path: str
    shape: tuple
    dtype: str
    trainable: bool
    kind: VariableKind
    shard: tuple = None
    layer: str = None
    table: bool = False

    @property
    def nbytes(self):
        """Size in bytes (0 if the shape is not fully known)."""
        return sizes.nbytes(self.shape, self.dtype)


class PlacementPolicy(Protocol):
    """What `parameter_device=` accepts as a policy: asked once per variable for its device.

    Any callable of this shape works (a function, a lambda, a `Policy`). It is called when the
    variable is created, in creation order; it may raise, which fails the creation with a
    ValueError naming the variable.
    """

    def __call__(self, spec: VariableSpec) -> str:
        """Returns the device (such as `"/cpu:0"`) that holds the variable `spec` describes."""


class Partitioner(Protocol):
    """What `partitioner=` accepts: TensorFlow's partitioners' signature.

    `tf.distribute.experimental.partitioners.FixedShardsPartitioner`, `MinSizePartitioner` and
    `MaxSizePartitioner` are partitioners; so is any callable of this shape.
    """

    def __call__(self, shape: tf.TensorShape, dtype: tf.DType) -> list:
        """Returns the number of partitions per axis (dpkeras cuts axis 0 only)."""


class Policy:
    """Base class of the policies in this module: a callable with known candidate devices.

    Subclasses implement `place(spec)`; `devices` lists every device it may return, in canonical
    form, so the strategy can validate them before anything is created.
    """

    def __init__(self, device_list, name):
        if isinstance(device_list, str) or not device_list:
            raise ValueError(
                f"{name}() needs a non-empty list of devices, such as ['/gpu:0', '/gpu:1']. "
                f"Received: {device_list!r}"
            )
        canonical = [canonical_device(d) for d in device_list]
        if len(set(canonical)) != len(canonical):
            raise ValueError(f"{name}() lists a device twice. Received: {list(device_list)!r}")
        self.devices = tuple(canonical)
        self._name = name
        self._lock = threading.Lock()

    def __call__(self, spec):
        with self._lock:
            return self.place(spec)

    def place(self, spec):
        raise NotImplementedError

    def __repr__(self):
        return f"{self._name}([{', '.join(short_device(d) for d in self.devices)}])"


class _Single(Policy):
    def place(self, spec):
        return self.devices[0]

    def __repr__(self):
        return repr(short_device(self.devices[0]))


class _RoundRobin(Policy):
    def __init__(self, device_list):
        super().__init__(device_list, "round_robin")
        self._next = itertools.cycle(self.devices)

    def place(self, spec):
        return next(self._next)


class _GreedyBySize(Policy):
    def __init__(self, device_list):
        super().__init__(device_list, "greedy_by_size")
        self.loads = {d: 0 for d in self.devices}
        self._taken = []  # devices holding earlier shards of the variable being sharded

    def place(self, spec):
        candidates = self.devices
        if spec.shard is not None:
            index, _ = spec.shard
            if index == 0 or len(self._taken) == len(self.devices):
                self._taken = []
            candidates = [d for d in self.devices if d not in self._taken]
        device = min(candidates, key=lambda d: self.loads[d])  # first on ties
        self.loads[device] += spec.nbytes
        if spec.shard is not None:
            self._taken.append(device)
        return device


class _Replicate:
    """The policy a `REPLICATED` rule or default of `by_path` stands for: every variable it is
    asked about is `REPLICATED`."""

    devices = ()

    def __call__(self, spec):
        return REPLICATED

    def __repr__(self):
        return repr(REPLICATED)


def _rule(value, what):
    """A rule's value (or a default) of `by_path` as a policy: a device, a list, a policy, or
    `REPLICATED`."""
    if value is REPLICATED:
        return _Replicate()
    try:
        return as_policy(value)
    except ValueError:
        raise ValueError(
            f"by_path(): {what} must be a device string, a list of devices, a placement policy "
            f"or placement.REPLICATED. Received: {value!r} (of type {type(value).__name__})"
        ) from None


class _ByPath(Policy):
    def __init__(self, rules, default):
        if not isinstance(rules, dict) or not rules:
            raise ValueError(
                f"by_path() needs a dict {{regex: device}}, such as "
                f"{{r'embedding': '/cpu:0'}}. Received: {rules!r}"
            )
        self._rules = []
        for pattern, device in rules.items():
            try:
                compiled = re.compile(pattern)
            except re.error as e:
                raise ValueError(
                    f"by_path(): {pattern!r} is not a valid regular expression: {e}"
                ) from None
            self._rules.append((compiled, _rule(device, f"the rule {pattern!r}")))
        self._default = None if default is None else _rule(default, "default")
        candidates = [d for _, p in self._rules for d in getattr(p, "devices", ())]
        if self._default is not None:
            candidates += list(getattr(self._default, "devices", ()))
        replicates = [p for _, p in self._rules if isinstance(p, _Replicate)]
        replicates += [self._default] if isinstance(self._default, _Replicate) else []
        if replicates and not candidates:
            raise ValueError(
                f"by_path() answers placement.REPLICATED but names no device: metric state "
                f"and the shards of a partitioned variable cannot be replicated and need one. "
                f"Add a rule or a default with a device. Received: rules={rules!r}, "
                f"default={default!r}"
            )
        # A policy of callables alone names no device: the strategy's default holds reductions.
        self.devices, self._name, self._lock = (), "by_path", threading.Lock()
        if candidates:
            super().__init__(list(dict.fromkeys(candidates)), "by_path")
        self._cannot_replicate = _GreedyBySize(list(self.devices)) if replicates else None

    def place(self, spec):
        device = self._answer(spec)
        if device is REPLICATED and self._cannot_replicate is not None:
            if spec.kind is VariableKind.METRIC or spec.shard is not None:
                return self._cannot_replicate.place(spec)
        return device

    def _answer(self, spec):
        for pattern, policy in self._rules:
            if pattern.search(spec.path):
                return policy(spec)
        if self._default is None:
            raise ValueError(
                f"no by_path() rule matches {spec.path!r} and there is no default. Rules: "
                f"{[p.pattern for p, _ in self._rules]}"
            )
        return self._default(spec)

    def __repr__(self):
        rules = ", ".join(f"{p.pattern!r}: {d!r}" for p, d in self._rules)
        return f"by_path({{{rules}}}, default={self._default!r})"


def single(device):
    """Every variable on `device`."""
    return _Single([device], "single")


def round_robin(device_list):
    """Variables to `device_list` in turn, in creation order (TF1's default device setter)."""
    return _RoundRobin(device_list)


def greedy_by_size(device_list):
    """Each variable to the device with the fewest bytes so far (TF1's greedy load balancer).

    Decided as variables are created, so the largest load is at most the ideal (total / number
    of devices) plus the largest variable. Optimizer slots follow their variable and are not
    counted. The shards of a partitioned variable go to distinct devices, each to the least
    loaded device its variable's earlier shards do not use (round-robin by load), so a table
    in as many shards as devices is spread over all of them.
    """
    return _GreedyBySize(device_list)


def by_path(rules, default=None):
    """The first regex (searched in the Keras path) that matches decides the device.

    A rule or the default may be `REPLICATED`: the variables it matches get a copy on every
    compute device (`by_path({r"embedding": "/job:ps/task:0"}, default=REPLICATED)`). Metric
    state and the shards of a partitioned variable cannot be replicated: those it matches go
    to the devices the other rules name (spread by `greedy_by_size`).

    Args:
        rules: dict `{regex: device, policy or REPLICATED}`, tried in order.
        default: device, policy or `REPLICATED` for paths no rule matches; without it such a
            path is an error.
    """
    return _ByPath(rules, default)


class _Hybrid(Policy):
    def __init__(self, device_list, tables):
        if tables is not None and not isinstance(tables, str):
            raise ValueError(
                f"hybrid(tables=...) takes a regular expression (a str) searched in each "
                f"variable's path. Received: {tables!r}"
            )
        try:
            self._tables = None if tables is None else re.compile(tables)
        except re.error as e:
            raise ValueError(
                f"hybrid(): {tables!r} is not a valid regular expression: {e}"
            ) from None
        if device_list is None:  # bound to the strategy's parameter devices (`bind`)
            self.devices, self._name, self._lock = (), "hybrid", threading.Lock()
            self._balance = None
        else:
            device_list = [device_list] if isinstance(device_list, str) else device_list
            super().__init__(device_list, "hybrid")
            self._balance = _GreedyBySize(list(self.devices))

    @property
    def bound(self):
        """Whether it knows its parameter devices (`hybrid()` without devices learns them from
        the strategy: `/cpu:0` on one machine, every ps task's CPU on a cluster)."""
        return bool(self.devices)

    def bind(self, device_list):
        """This policy with `device_list` as its parameter devices."""
        return _Hybrid(list(device_list), None if self._tables is None else self._tables.pattern)

    def is_table(self, spec):
        """Whether `spec` is a table (kept on the parameter devices): the one decision of
        table-ness, from what the creator saw (`spec.table`), a shard, or `tables=`."""
        return bool(
            spec.table
            or spec.shard is not None
            or (self._tables is not None and self._tables.search(spec.path))
        )

    def place(self, spec):
        if not self.devices:
            raise ValueError(
                "hybrid() without devices must be given to a strategy (dpkeras.scope("
                "parameter_device=placement.hybrid())), which binds it to its parameter devices."
            )
        if self.is_table(spec) or spec.kind is VariableKind.METRIC:
            return self._balance.place(spec)
        return REPLICATED

    @property
    def settings(self):
        """`(devices, tables pattern)`: two hybrid() policies with equal settings are equal."""
        return (self.devices, None if self._tables is None else self._tables.pattern)

    def __eq__(self, other):
        # Two hybrid() policies with the same settings are one: dpkeras.get_strategy (and
        # scope()) then finds the strategy made for the first.
        return isinstance(other, _Hybrid) and self.settings == other.settings

    def __hash__(self):
        return hash(("hybrid",) + self.settings)

    def __repr__(self):
        devices = ", ".join(short_device(d) for d in self.devices)
        tables = "" if self._tables is None else f", tables={self._tables.pattern!r}"
        return f"hybrid([{devices}]{tables})" if self.devices else f"hybrid({tables[2:]})"


def hybrid(device_list=None, tables=None):
    """Tables on the parameter devices, everything else replicated on the compute devices.

    As the systems that train large recommenders do (TorchRec, HugeCTR/SOK, PERSIA, Monolith):
    an embedding table is large and each step touches a few of its rows, so it lives on the
    parameter devices (spread by `greedy_by_size`, sharded by the strategy's partitioner, each
    distinct id sent once); a dense layer is small and each step needs all of it, so every
    compute device holds a copy and the copies' gradients are all-reduced among the compute
    devices, worker to worker on a cluster. A parameter device (a ps) then carries only rows.

    Tables: variables of layers whose class (or a base class) is named `...Embedding`
    (`spec.table`), shards of partitioned variables, and paths `tables` matches. Metric state
    also stays on the parameter devices (it is read and written by every replica: replicating
    it would need an all-reduce per update). Everything else (weights, optimizer state, random
    seeds) is `REPLICATED`; optimizer slots follow their variable. A SavedModel loaded in the
    scope (`tf.saved_model.load`, `keras.layers.TFSMLayer`) keeps its variables on the
    parameter devices, as tables: its functions capture one handle per variable.

    Args:
        device_list: the parameter devices (a device or a list), or None: the strategy's
            (`/cpu:0` on one machine, every ps task's CPU on a cluster).
        tables: optional regex, searched in each variable's path, naming more tables.
    """
    return _Hybrid(device_list, tables)


class _VariableOp:
    """What a TF1 device function is asked about for a variable: a stand-in of its op.

    A `VarHandleOp` (TF2's variable op, in TF1's `STANDARD_PS_OPS`) named by the variable's
    path, with no device of its own: `.type`, `.name`, `.device` and `.node_def` (a
    `tf.compat.v1.NodeDef` with the variable's `dtype` and `shape` attributes, for a
    `ps_strategy` that balances by bytes), as an `Operation` has them.
    """

    type = "VarHandleOp"
    device = ""

    def __init__(self, spec):
        self.name = spec.path
        self.node_def = tf.compat.v1.NodeDef(op=self.type, name=spec.path)
        self.node_def.attr["dtype"].type = tf.as_dtype(spec.dtype).as_datatype_enum
        if spec.shape is not None:
            self.node_def.attr["shape"].shape.CopyFrom(tf.TensorShape(spec.shape).as_proto())
        # Its one output holds the variable's value, as a TF1 `VariableV2`'s did: what a load
        # function of a `ps_strategy` (tf_cnn_benchmarks' `byte_size_load_fn`) reads.
        self.outputs = [_VariableValue(tf.as_dtype(spec.dtype), tf.TensorShape(spec.shape))]

    def get_attr(self, name):
        """The op's attribute `name` (`dtype`, `shape`), as `Operation.get_attr` gives it."""
        if name not in self.node_def.attr:
            raise ValueError(f"Operation {self.name!r} has no attr named {name!r}.")
        value = self.node_def.attr[name]
        return tf.as_dtype(value.type) if name == "dtype" else value.shape

    def __repr__(self):
        return f"<VarHandleOp {self.name!r}>"


class _VariableValue:
    """The output of a `_VariableOp`: the variable's dtype and shape, as a `Tensor` has them."""

    def __init__(self, dtype, shape):
        self.dtype = dtype
        self.shape = shape

    def get_shape(self):
        return self.shape


class _DeviceFunction:
    """A TF1 device function (of an op) asked about each variable's stand-in op."""

    devices = ()  # it names no device before it is asked: the strategy's default holds sums

    def __init__(self, function):
        self.function = function
        self._lock = threading.Lock()

    def __call__(self, spec):
        with self._lock:  # TF1's round robin counts in the function: one variable at a time
            return self.function(_VariableOp(spec))

    def __repr__(self):
        if _tf_internals.is_replica_device_setter(self.function):
            return "placement.device_function(replica_device_setter(...))"
        return f"placement.device_function({self.function!r})"


def device_function(function):
    """A TF1 device function as a placement policy: it is asked about each variable's op.

    TF1 placed variables with a function of the op (`tf.device(fn)`), such as what
    `tf.compat.v1.train.replica_device_setter(ps_tasks=2)` returns or one that answers the
    parameter device for `op.type in ("VariableV2", "VarHandleOp")`. This policy calls it once
    per variable, in creation order (as TF1 did per variable op), with a stand-in of the
    variable's op: a `VarHandleOp` named by the variable's path, with no device, whose
    `.node_def` carries its dtype and shape, as its one output (`.outputs[0].dtype`,
    `.get_shape()`) and `.get_attr` do. So `replica_device_setter` places variables round
    robin over the ps tasks (`/job:ps/task:0`, `/job:ps/task:1`, ...), or by its `ps_strategy=`.
    `parameter_device=` takes `replica_device_setter`'s function as it is; wrap any other.

    Example:

    ```python
    from dpkeras import placement

    def variables_on_cpu(op):
        return "/cpu:0" if op.type in ("VariableV2", "VarHandleOp") else "/cpu:1"

    policy = placement.device_function(variables_on_cpu)  # dpkeras.scope(parameter_device=policy)
    ```
    """
    if isinstance(function, _DeviceFunction):
        return function
    if not callable(function):
        raise ValueError(
            f"device_function() takes a TF1 device function, a callable of an op returning a "
            f"device. Received: {function!r} (of type {type(function).__name__})"
        )
    return _DeviceFunction(function)


def is_hybrid(policy):
    """Whether `policy` is a `hybrid()` policy."""
    return isinstance(policy, _Hybrid)


def cuts(policy, spec):
    """Whether the strategy's partitioner may cut the variable `spec` describes under `policy`:
    any variable, except under `hybrid()`, which cuts tables only (the rest is replicated)."""
    return not isinstance(policy, _Hybrid) or policy.is_table(spec)


def as_loaded(policy, spec):
    """The spec `policy` places a variable made without an initial value under (a SavedModel
    being loaded), when it would replicate it: `hybrid()` places it as a table; None for every
    other policy (the creator then uses the home parameter device)."""
    return dataclasses.replace(spec, table=True) if isinstance(policy, _Hybrid) else None


def bind_to(policy, device_list):
    """`policy`, bound to `device_list` if it is a `hybrid()` that does not know its devices."""
    if isinstance(policy, _Hybrid) and not policy.bound:
        return policy.bind(device_list)
    return policy


def as_policy(parameter_device):
    """Turns what `parameter_device` accepts into a callable policy.

    A string is `single`, a list or tuple is `greedy_by_size`, what TF1's
    `replica_device_setter` returned is `device_function` of it, a callable is used as it is.
    (`parameter_device="hybrid"`, and the `hybrid` function not called, are `hybrid()`:
    `dpkeras._config` resolves them.)
    """
    if parameter_device is REPLICATED:
        raise ValueError(
            "parameter_device=placement.REPLICATED would replicate metric state too, which "
            "lives on a parameter device. Use placement.hybrid() (tables and metric state on "
            "the parameter devices, everything else replicated), or a policy answering "
            "REPLICATED for some variables, such as placement.by_path({r'embedding': "
            "'/cpu:0'}, default=placement.REPLICATED). Received: "
            "parameter_device=dpkeras.placement.REPLICATED"
        )
    name = getattr(parameter_device, "__name__", None)
    if name in _FACTORIES and parameter_device is globals()[name]:
        raise ValueError(
            f"parameter_device=placement.{name} is the function that makes a policy, not a "
            f"policy: call it, such as placement.{name}({_FACTORIES[name]}). Received: "
            f"parameter_device={parameter_device!r}"
        )
    if isinstance(parameter_device, str):
        return single(parameter_device)
    if isinstance(parameter_device, (list, tuple)):
        return greedy_by_size(list(parameter_device))
    if _tf_internals.is_replica_device_setter(parameter_device):
        return device_function(parameter_device)  # TF1's device function of an op
    if callable(parameter_device):
        return parameter_device
    raise ValueError(
        f"parameter_device must be a device string, a list of devices, or a placement policy "
        f"(a callable taking a dpkeras.placement.VariableSpec and returning a device). "
        f"Received: {parameter_device!r} (of type {type(parameter_device).__name__})"
    )


# The functions that make a policy, by name, with an example of their arguments: passed
# without calling them, `as_policy` refuses them by name (`hybrid`, which needs no argument,
# is resolved to `hybrid()` by `dpkeras._config`).
_FACTORIES = {
    "single": "'/cpu:0'",
    "round_robin": "['/gpu:0', '/gpu:1']",
    "greedy_by_size": "['/gpu:0', '/gpu:1']",
    "by_path": "{r'embedding': '/cpu:0'}, default='/gpu:0'",
}


# Keras's SeedGenerator names its state variable so (keras/src/random/seed_generator.py).
SEED_STATE_NAME = "seed_generator_state"


# Who creates a variable (innermost first) decides its kind.
_KIND_OF_CALLER = (
    (keras.random.SeedGenerator, VariableKind.SEED),
    (keras.metrics.Metric, VariableKind.METRIC),
    (keras.optimizers.Optimizer, VariableKind.OPTIMIZER),
    (keras.layers.Layer, VariableKind.WEIGHT),
)


def _kind(leaf, synchronization, callers):
    if synchronization == tf.VariableSynchronization.ON_READ:
        return VariableKind.METRIC
    for caller in reversed(callers):
        for owner, kind in _KIND_OF_CALLER:
            if isinstance(caller, owner):
                return kind
    return VariableKind.SEED if leaf.startswith(SEED_STATE_NAME) else VariableKind.OTHER


def describe_variable(kwargs):
    """The `VariableSpec` of a variable from the keyword arguments its creator receives."""
    name = kwargs.get("name") or "Variable"
    leaf = name.split(":")[0]
    stack = _keras_internals.name_scope_stack()
    prefix = "/".join(entry.name for entry in stack if entry.name)
    path = f"{prefix}/{leaf}" if prefix and not leaf.startswith(prefix + "/") else leaf
    initial_value = kwargs.get("initial_value")
    keras_variable = _keras_internals.keras_variable_being_created(initial_value)
    if keras_variable is not None:
        shape, dtype = tuple(keras_variable.shape), keras_variable.dtype
        path = keras_variable.path or path
    elif kwargs.get("shape") is not None:
        shape = tuple(tf.TensorShape(kwargs["shape"]).as_list())
        dtype = kwargs.get("dtype") or "float32"
    elif callable(initial_value):  # calling it could draw random numbers twice: shape unknown
        shape, dtype = None, kwargs.get("dtype") or "float32"
    else:
        tensor = tf.convert_to_tensor(initial_value, dtype=kwargs.get("dtype"))
        shape, dtype = tuple(tensor.shape.as_list()), tensor.dtype
    trainable = kwargs.get("trainable")
    trainable = True if trainable is None else bool(trainable)
    callers = [entry.caller for entry in stack if entry.caller is not None]
    kind = _kind(leaf, kwargs.get("synchronization"), callers)
    layer = next((c for c in reversed(callers) if isinstance(c, keras.layers.Layer)), None)
    return VariableSpec(
        path=path,
        shape=shape,
        dtype=tf.as_dtype(dtype).name,
        trainable=trainable,
        kind=kind,
        layer=None if layer is None else type(layer).__name__,
        table=(kind is VariableKind.WEIGHT and _is_table_layer(layer))
        or (kind in (VariableKind.WEIGHT, VariableKind.OTHER) and path.endswith("/embeddings")),
    )


def _is_table_layer(layer):
    """Whether `layer`'s class, or a base class, is an embedding layer (named `...Embedding`)."""
    return layer is not None and any(c.__name__.endswith("Embedding") for c in type(layer).__mro__)
