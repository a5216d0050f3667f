"""`get_variable`: create a variable by name in the current scope, or reuse it.

Also the one place that creates the variables of `dpkeras.tf1._collections` (`variable`,
`model_variable`, `local_variable`): each kind goes through `get_or_create`.
"""

import contextlib

import keras
import numpy as np
import tensorflow as tf

from dpkeras import _keras_internals as internals
from dpkeras import _tf_internals
from dpkeras._compat_scopes import refuse_tf_variable_scope
from dpkeras._device_names import canonical_device, short_device
from dpkeras._extended.creator import named_device
from dpkeras._variables import partitioning
from dpkeras.tf1._errors import (
    check_can_partition,
    check_reuse,
    exists_error,
    join_path,
    missing_error,
    standardize_dtype,
    standardize_shape,
    validate_name,
)
from dpkeras.tf1._scopes import root_scope
from dpkeras.tf1._sharing import process_pending
from dpkeras.tf1._state import THREAD, current_scope
from dpkeras.tf1._store import LOCAL, REGULAR, Entry


def get_variable(
    name,
    shape=None,
    dtype="float32",
    initializer=None,
    regularizer=None,
    trainable=True,
    device=None,
    partitioner=None,
):
    """Creates a variable named `<current scope>/<name>`, or returns it when the scope reuses.

    The result is a `keras.Variable`, so a Keras layer that calls `get_variable` in `build()`
    tracks it like a weight of its own; when several layers get the same variable it is still
    one object, listed once by a model and updated once by its optimizer. Its regularizer's
    loss counts in the loss of any Keras model that holds it, and is listed by
    `dpkeras.regularization_losses()`.

    Args:
        name: str, the variable's name in the current scope; may contain `/`.
        shape: int or tuple of ints. Required for a new variable unless `initializer` is a
            value that implies it. When reusing, checked against the existing variable if
            given. Defaults to `None`.
        dtype: str or dtype. Checked against the existing variable when reusing.
            Defaults to `"float32"`.
        initializer: a Keras initializer (object, name such as `"zeros"`, or callable
            `(shape, dtype)`), or a value (NumPy array, list, tensor or number; a number
            fills `shape`). Defaults to `"glorot_uniform"` for floating dtypes, else zeros.
        regularizer: a Keras regularizer or any callable from the variable to a scalar loss
            (such as `keras.regularizers.L2(0.05)`). Used only when the variable is created.
            Defaults to `None`.
        trainable: bool. Defaults to `True`.
        device: str, a device for the new variable, such as `"/CPU:0"`. Under
            `dpkeras.scope()` it (or a `tf.device` around the call) must be one of the
            strategy's parameter or compute devices, and the variable lives there, as in TF1.
            Defaults to `None` (the placement policy decides).
        partitioner: cut the new variable along axis 0 into shards on the parameter devices
            (TF1's `partitioner=`): one of `tf.distribute.experimental.partitioners` or a
            callable like one. Needs `dpkeras.scope()`. The result is still one
            `keras.Variable` of the full shape (see docs/sharding.md). Defaults to `None`: the
            scope's partitioner, if any (which leaves scalars whole).

    Returns:
        The `keras.Variable` for the path.

    Raises:
        ValueError: when reusing a name that does not exist (listing close names), creating
            one that exists without reuse, reusing with another shape or dtype, creating a
            variable whose shape is unknown, naming a device the strategy does not have, or
            partitioning a scalar, by an invalid split or outside `dpkeras.scope()` (before
            anything is created).

    Example:

    ```python
    import dpkeras

    with dpkeras.variable_scope("foo"):
        v = dpkeras.get_variable("v", [1])
    with dpkeras.variable_scope("foo", reuse=True):
        v1 = dpkeras.get_variable("v", [1])
    assert v1 is v and v.path == "foo/v"
    ```
    """
    return get_or_create(
        name,
        shape=shape,
        dtype=dtype,
        initializer=initializer,
        regularizer=regularizer,
        trainable=trainable,
        device=device,
        kind=REGULAR,
        partitioner=partitioner,
    )


def get_or_create(
    name,
    *,
    shape,
    dtype,
    initializer,
    regularizer,
    trainable,
    device,
    kind,
    wrap=None,
    partitioner=None,
):
    """Creates or reuses the variable `<scope>/<name>` of the given kind (see get_variable)."""
    process_pending()
    validate_name(name, "get_variable", "name")
    refuse_tf_variable_scope(f"dpkeras.get_variable('{name}') is called")
    partitioner = partitioning.as_partitioner(partitioner, "get_variable(partitioner=...)")
    scope = current_scope() or root_scope()  # at top level, the root scope (name "")
    store = scope.store
    mode = scope.reuse
    path = join_path(scope.name, name)
    what = f"get_variable('{path}')"
    dtype = standardize_dtype(what, dtype)
    with store.lock:
        entry = store.lookup(path)
        if entry is None:
            if mode is True:
                raise missing_error(what, path, scope, store)
            value, shape = _resolve_initializer(what, initializer, shape, dtype)
            named = _named_device(what, device)
            cut = _partitioned(what, path, partitioner, shape, dtype)
            if named is not None and not isinstance(cut, contextlib.nullcontext):
                raise ValueError(
                    f"{what}: a partitioned variable's shards go where the placement policy "
                    f"puts them, not on one named device. Received: device "
                    f"{short_device(named)} and a partitioner. Leave the device out, or the "
                    f"partitioner."
                )
            with cut, named_device(named) if named else contextlib.nullcontext():
                keras_variable = _new_keras_variable(
                    path, value, shape, dtype, trainable and kind != LOCAL, device
                )
            if regularizer is not None:
                keras_variable.regularizer = _as_regularizer(what, regularizer)
            entry = Entry(
                path=path,
                kind=kind,
                shape=shape,
                dtype=dtype,
                strategy=tf.distribute.get_strategy(),
                keras_variable=keras_variable,
            )
            if wrap is not None:
                entry.wrapper = wrap(keras_variable)
            store.add(entry)
            return entry.public
        if mode is False:
            raise exists_error(what, entry, scope)
        if shape is None and _is_value(initializer):
            shape = _value_shape(initializer)
        check_reuse(
            what,
            entry,
            shape=None if shape is None else standardize_shape(what, shape),
            dtype=dtype,
        )
        if entry.keras_variable is None:
            process_pending()
        if entry.keras_variable is None:
            # A Keras layer created it and has not tracked its wrapper yet: make the shared
            # wrapper now; the layer's own is swapped for it when it is tracked (see tf1.sharing).
            entry.keras_variable = keras.Variable(entry.variable)
        return entry.public


def _named_device(what, device):
    """The device named for a new variable under a dpkeras strategy, canonical, or None.

    That is `device=`, else the device of a `tf.device` around the call (in cross-replica
    context: a replica's own device scope is the strategy's, not the user's). TF1 placed the
    variable there, and so does dpkeras when it is one of the strategy's devices (a parameter
    or compute device); any other is an error, before anything is created. Under no strategy
    or another one, `device=` and `tf.device` act as TensorFlow makes them (None here).
    """
    strategy = tf.distribute.get_strategy()
    if getattr(strategy.extended, "partitioner", False) is False:  # not a dpkeras strategy
        return None
    received = f"device={device!r}"
    if device is None:
        if not tf.distribute.in_cross_replica_context():
            return None
        device = _tf_internals.device_scope() or None
        received = f"tf.device({device!r}) around it"
    if device is None:
        return None
    devices = list(strategy.extended.parameter_devices) + list(strategy.compute_devices)
    valid = list(dict.fromkeys(devices))
    try:
        canonical = canonical_device(device)
    except ValueError:
        canonical = None
    if canonical not in valid:
        raise ValueError(
            f"{what}: the device named for it is not one of the strategy's devices, where "
            f"dpkeras places a variable a user names a device for (as TF1 did). Received: "
            f"{received}. Valid: {', '.join(short_device(d) for d in valid)} (parameter and "
            f"compute devices); or name none, and the placement policy decides."
        )
    return canonical


def _partitioned(what, path, partitioner, shape, dtype):
    """The context a new variable is created in: cut by `partitioner` if one applies.

    Its own `partitioner=` (explicit: a scalar is an error) or else its scope's. The split is
    checked here, before anything is created; outside `dpkeras.scope()` nothing would place
    the shards, so a partitioner there is an error.
    """
    explicit = partitioner is not None
    if partitioner is None:
        scoped, partitioner, _ = partitioning.current_partitioner()
        if not scoped or partitioner is None:
            return contextlib.nullcontext()
    check_can_partition(what, partitioner)
    partitioning.row_split(partitioner, shape, dtype, path, explicit)  # raises if invalid
    return partitioning.partitioner_scope(partitioner, explicit=explicit)


def _new_keras_variable(path, value, shape, dtype, trainable, device):
    parent, _, leaf = path.rpartition("/")
    with contextlib.ExitStack() as context:
        if device is not None:
            context.enter_context(tf.device(device))
        if parent and not _keras_path_is_scope(parent):
            # So that keras.Variable.path is the full path, wherever this is called from.
            grandparent, _, parent_leaf = parent.rpartition("/")
            context.enter_context(keras.name_scope(parent_leaf, override_parent=grandparent))
        THREAD.bypass += 1
        try:
            return keras.Variable(
                initializer=value, shape=shape, dtype=dtype, trainable=trainable, name=leaf
            )
        finally:
            THREAD.bypass -= 1


def _keras_path_is_scope(path):
    """Whether the innermost Keras name scope is the current variable scope, named `path`."""
    scope = current_scope()
    stack = internals.name_scope_stack()
    return scope is not None and scope.name == path and bool(stack) and stack[-1].caller is scope


def _is_value(initializer):
    if isinstance(initializer, (bool, int, float, complex, list, tuple, np.ndarray, np.generic)):
        return True
    return isinstance(initializer, (tf.Variable, keras.Variable)) or tf.is_tensor(initializer)


def _value_shape(value):
    if isinstance(value, (tf.Variable, keras.Variable)) or tf.is_tensor(value):
        return tuple(tf.TensorShape(value.shape).as_list())
    return tuple(np.shape(value))


def _resolve_initializer(what, initializer, shape, dtype):
    """Returns (what keras.Variable is initialised with, the variable's shape)."""
    if shape is not None:
        shape = standardize_shape(what, shape)
    if _is_value(initializer):
        if isinstance(initializer, (tf.Variable, keras.Variable)) or tf.is_tensor(initializer):
            value = tf.convert_to_tensor(initializer)
        else:
            value = np.asarray(initializer)
        value_shape = _value_shape(value)
        if shape is None or shape == value_shape:
            return value, value_shape
        if value_shape == ():
            return keras.initializers.Constant(value), shape
        raise ValueError(
            f"{what}: the initializer value has shape {value_shape} but shape={shape} was "
            "given. A value initializer sets the shape (or, if it is a number, fills it); "
            "pass a value of the given shape, or leave shape=None."
        )
    if initializer is None:
        floating = "float" in dtype or "complex" in dtype
        initializer = "glorot_uniform" if floating else "zeros"
    try:
        resolved = keras.initializers.get(initializer)
    except ValueError as error:
        raise ValueError(
            f"{what}: could not interpret the initializer. Valid: a Keras initializer (object, "
            "name such as 'zeros', or callable (shape, dtype)), or a value (NumPy array, "
            f"list, tensor or number). Received: initializer={initializer!r}"
        ) from error
    if shape is None:
        raise ValueError(
            f"{what}: the shape of a new variable must be known. Pass shape=..., or an "
            "initializer that implies one (a NumPy array, a tensor, a list or a number). "
            f"Received: shape=None, initializer={initializer!r}"
        )
    return resolved, shape


def _as_regularizer(what, regularizer):
    try:
        return keras.regularizers.get(regularizer)
    except ValueError as error:
        raise ValueError(
            f"{what}: could not interpret the regularizer. Valid: a Keras regularizer "
            "(object, name such as 'l2', config dict) or a callable from the variable to a "
            f"scalar loss. Received: regularizer={regularizer!r}"
        ) from error
