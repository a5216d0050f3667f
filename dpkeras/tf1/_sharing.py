"""Keras layers built in a variable scope: their weights named, created once, and shared.

`create_variable` is the `tf.variable_creator_scope` creator every `variable_scope` installs. A
weight a Keras layer creates inside a scope is named `<scope>/<layer>/<weight>`; a layer built
under reuse gets the first layer's variable, and then holds the first layer's `keras.Variable`
object itself (`_Share`), so a model lists a shared variable once and its optimizer keeps one
set of slots. TF1 towers that build "the same" layer name once per tower are named apart
(`conv`, `conv_1`) so a functional model accepts them, still over one set of variables.
"""

import threading
import warnings
import weakref

import keras
import numpy as np
import tensorflow as tf

from dpkeras import _keras_internals as internals
from dpkeras._compat_scopes import refuse_tf_variable_scope
from dpkeras._patches import shared_weights
from dpkeras.tf1._errors import (
    check_can_partition,
    check_reuse,
    dtype_name,
    exists_error,
    join_path,
    late_message,
    missing_error,
)
from dpkeras.tf1._state import THREAD, current_scope
from dpkeras.tf1._store import MODEL, Entry, same_variable


def create_variable(next_creator, **kwargs):
    """The `tf.variable_creator_scope` creator that every variable_scope installs.

    The topmost copy handles the variable; copies below it (from enclosing scopes) pass.
    """
    if THREAD.bypass or THREAD.creating:
        return next_creator(**kwargs)
    THREAD.creating += 1
    try:
        return _create_scoped_variable(next_creator, kwargs)
    finally:
        THREAD.creating -= 1


def _create_scoped_variable(next_creator, kwargs):
    process_pending()
    scope = current_scope()
    leaf = kwargs.get("name")
    if scope is None or not leaf:
        return next_creator(**kwargs)
    leaf = leaf.split(":")[0]
    if _initializing_deferred_variables():
        return _create_late_variable(next_creator, kwargs, scope, leaf)
    found = _creating_layer(scope)
    if found is None:
        # Not a layer's weight (a raw tf.Variable, a seed generator, an optimizer or metric
        # variable): never shared by name, as tf.Variable never was in TF1.
        return next_creator(**kwargs)
    layer, layer_path = found
    path = join_path(join_path(scope.name, layer_path), leaf)
    what = f"Keras layer '{layer.name}' ({type(layer).__name__}) creating weight '{leaf}'"
    refuse_tf_variable_scope(f"{what} in dpkeras.variable_scope('{scope.name}')")
    if scope.partitioner is not None:
        check_can_partition(what, scope.partitioner)
    store = scope.store
    with store.lock:
        entry = store.lookup(path)
        if entry is None:
            if scope.reuse is True:
                raise missing_error(what, path, scope, store)
            variable = next_creator(**kwargs)
            entry = Entry(
                path=path,
                kind=MODEL,
                shape=tuple(variable.shape.as_list()),
                dtype=dtype_name(variable.dtype),
                strategy=tf.distribute.get_strategy(),
                raw=variable,
            )
            entry.owner = weakref.ref(layer)
            store.add(entry)
            _add_pending(_Share(entry, layer))
            return variable
        if scope.reuse is False:
            raise exists_error(what, entry, scope)
        dtype = kwargs.get("dtype")
        check_reuse(
            what,
            entry,
            shape=_initial_value_shape(kwargs),
            dtype=None if dtype is None else dtype_name(dtype),
        )
        variable = entry.variable
        if variable is None:
            raise RuntimeError(
                f"{what}: variable '{path}' exists but has no value yet: it was declared while "
                "Keras traced a model symbolically. Build the model before reusing its "
                "variables (call `model.build(input_shape)` or the model on a batch)."
            )
        _name_apart(entry, layer)
        _add_pending(_Share(entry, layer))
        return variable


def _name_apart(entry, layer):
    """Renames `layer` `<name>_<k>` when it reuses the variables of a layer of its own name.

    TF1 towers build "the same" layer once per tower, under one reusing scope and a name scope
    per tower (`Replica1/conv`, `Replica2/conv`). Keras names have no name scopes, and a
    functional model refuses two layers of one name, so the second tower's layer is renamed
    `conv_1` (the third `conv_2`, ...): the model builds, and the layers share one set of
    variables. Keras's own suffix for duplicate names is the same.
    """
    owner = entry.owner() if entry.owner is not None else None
    if owner is None or owner is layer or owner.name != layer.name:
        return
    entry.sharers += 1
    _SHARED_NAMES[layer] = layer.name  # its later weights keep the shared path
    layer.name = f"{owner.name}_{entry.sharers}"


# A layer renamed by _name_apart -> the name its variables' paths keep using.
_SHARED_NAMES = weakref.WeakKeyDictionary()


def _creating_layer(scope):
    """Returns (layer, path of layers inside `scope`) for a weight being created, or None.

    The Keras name-scope stack holds an entry for `scope` (pushed by variable_scope) and, above
    it, one for each layer being built inside the scope (pushed by Keras with the layer as
    caller) and for plain name scopes (no caller), which do not count.
    """
    stack = internals.name_scope_stack()
    start = None
    for index in range(len(stack) - 1, -1, -1):
        if stack[index].caller is scope:
            start = index + 1
            break
    if start is None:
        return None
    names = []
    innermost = None
    for entry in stack[start:]:
        if entry.caller is None:
            continue
        if entry.caller is innermost:
            continue  # a layer renamed by _name_apart: Keras pushed its scope again
        innermost = entry.caller
        if isinstance(innermost, keras.layers.Layer):
            names.append(_SHARED_NAMES.get(innermost, entry.name))
    if not isinstance(innermost, keras.layers.Layer):
        return None
    return innermost, "/".join(names)


def _create_late_variable(next_creator, kwargs, scope, leaf):
    """Creates, unshared, a variable Keras declared during a symbolic build that has ended.

    The layer that declared it is no longer on the name-scope stack, so its name is unknown
    and it must not be shared: reusing by a wrong name would hand two layers one variable
    through two wrappers. Raising here would leave Keras's deferred variables half created
    (Keras may catch the error and go on with uninitialised weights), so a layer weight is
    created unshared, with a warning now and an error when the scope exits.
    """
    declared = internals.keras_variable_being_created(kwargs.get("initial_value"))
    found = _creating_layer(scope)
    if declared is not None and declared.trainable and declared.path.startswith(scope.name + "/"):
        weight = declared.path
    elif found is not None:
        weight = f"{found[0].name}/{leaf}" if declared is None else declared.path
    else:
        return next_creator(**kwargs)  # not a layer's weight (a metric's, say)
    THREAD.late.append(weight)
    warnings.warn(late_message(scope, [weight]), RuntimeWarning, stacklevel=3)
    return next_creator(**kwargs)


def _initializing_deferred_variables():
    """Whether Keras is creating variables it declared inside a StatelessScope that ended."""
    return not internals.in_stateless_scope() and bool(internals.deferred_variables())


def _initial_value_shape(kwargs):
    shape = kwargs.get("shape")
    if shape is not None and tf.TensorShape(shape).is_fully_defined():
        return tuple(tf.TensorShape(shape).as_list())
    value = kwargs.get("initial_value")
    if value is None:
        return None
    if callable(value):
        keras_variable = internals.keras_variable_being_created(value)
        if keras_variable is not None:
            return tuple(tf.TensorShape(keras_variable.shape).as_list())
        with tf.init_scope():
            value = value()
    shape = getattr(value, "shape", None)
    if shape is None:
        shape = np.shape(value)
    return tuple(tf.TensorShape(shape).as_list())


class _Share:
    """Makes `layer` hold the entry's keras.Variable once it has tracked its own wrapper."""

    def __init__(self, entry, layer):
        self.entry = entry
        self.layer_ref = weakref.ref(layer)

    def apply(self):
        layer = self.layer_ref()
        if layer is None:
            return True
        entry = self.entry
        wrappers = [
            v for v in internals.tracked_variables(layer) if same_variable(v, entry.variable)
        ]
        if not wrappers:
            return False
        if entry.keras_variable is None:
            entry.keras_variable = wrappers[0]
        for wrapper in wrappers:
            if wrapper is not entry.keras_variable:
                shared_weights.hold(layer, wrapper, entry.keras_variable)
        return True


class _Pending(threading.local):
    def __init__(self):
        self.items = []  # this thread's _Shares not applied yet


_PENDING = _Pending()


def _add_pending(item):
    _PENDING.items.append(item)


def process_pending():
    """Applies every pending share of this thread whose layer has tracked its weight by now.

    A layer tracks a weight only after the creator has returned it, so the swap to the shared
    `keras.Variable` (`_Share`) waits until the next variable is created or a scope is left, in
    the thread that built the layer: pending shares are per thread, like the scopes.
    """
    if _PENDING.items:
        _PENDING.items[:] = [item for item in list(_PENDING.items) if not item.apply()]
