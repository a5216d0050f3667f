"""Name-keyed variable sharing for Keras 3: `variable_scope`, `get_variable`, `AUTO_REUSE`.

TensorFlow 1 shared variables by name: `tf.variable_scope(name, reuse=...)` prefixed names,
`tf.get_variable` created a variable or, in a reusing scope, returned the existing one, and
`tf.layers.conv2d(..., name='Layer', reuse=True)` built a second layer on the first one's kernel
and bias. This module gives that a Keras 3 home on an explicit `tf.variable_creator_scope`:

```python
import keras
import numpy as np
import dpkeras

x1 = np.ones((2, 8, 8, 3), "float32")
x2 = np.zeros((2, 8, 8, 3), "float32")
with dpkeras.variable_scope("towers") as scope:
    tower1 = keras.layers.Conv2D(4, 3, name="Layer")
    y1 = tower1(x1)
with dpkeras.variable_scope(scope, reuse=True):
    tower2 = keras.layers.Conv2D(4, 3, name="Layer")
    y2 = tower2(x2)
assert tower2.kernel is tower1.kernel  # one keras.Variable, listed once by any model
```

Names. A variable made by `get_variable(name)` is called `<scope path>/<name>`; a weight that a
Keras layer creates while it is built inside a scope is called
`<scope path>/<layer name>/<weight name>` (with the names of any enclosing layers that are built
inside the scope too): `towers/Layer/kernel` above. Name scopes (`tf.name_scope`,
`keras.name_scope`) do not change these names, as in TF1; layers built outside every
`variable_scope` are not affected at all.

Sharing is real: the second layer holds the first layer's `keras.Variable` object, so a model
that contains both lists it once in `trainable_weights`, its optimizer keeps one set of slots,
and `.keras` files and checkpoints restore one variable.

The variable store. The names live in a `VariableStore`. A top-level `variable_scope` entered
while a Keras model is being built (a subclassed model's `build()`, a `Sequential` model) uses a
store that belongs to that model, so building a second instance, or `keras.models.load_model`,
makes new variables rather than colliding with or silently sharing the first instance's. Other
top-level code (TF1-style functions, and functional models, whose layers are built before the
model exists) uses the store of the innermost `with VariableStore():` block, or else one
process-wide default store. Nested scopes use their enclosing scope's store, and re-entering a
scope object uses that scope's store.

Build inside the scope. Keras creates a layer's variables when the layer is built. When it
builds an unbuilt model symbolically (the first call of an unbuilt model inside `fit`, or of a
model without a `build()` method) it creates them only after the scope has exited, where they
cannot be shared by name; `variable_scope` then raises and says to build the model first.
"""

import contextlib
import dataclasses
import difflib
import re
import threading
import warnings
import weakref

import keras
import numpy as np
import tensorflow as tf

from dpkeras import _keras_internals as internals
from dpkeras import partitioning

__all__ = [
    "AUTO_REUSE",
    "VariableScope",
    "VariableStore",
    "get_variable",
    "get_variable_store",
    "variable_scope",
]


class _AutoReuse:
    """The type of `AUTO_REUSE`; it has exactly one instance."""

    def __repr__(self):
        return "dpkeras.AUTO_REUSE"

    def __reduce__(self):
        return "AUTO_REUSE"


AUTO_REUSE = _AutoReuse()
"""`reuse=AUTO_REUSE` creates a variable when its name is new and reuses it otherwise."""

_REUSE_VALUES = "True, False, None (inherit) or dpkeras.AUTO_REUSE"
_NAME_COMPONENT = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_.\-]*")

# The kinds of variable a store holds (see dpkeras.variable_collections).
MODEL = "model"
REGULAR = "regular"
LOCAL = "local"


class VariableScope:
    """A named scope for variables, as yielded by `with variable_scope(...) as scope`.

    Keep the object to re-enter the same scope later, which is safer than repeating its name:
    `variable_scope(scope, reuse=True)` enters `scope.name` wherever it is written.

    Attributes:
        name: str, the full path of the scope, such as `"model/conv1"`.
        reuse: `True` (only reuse), `False` (only create) or `AUTO_REUSE` (create when missing).
        store: the `VariableStore` the scope's variables live in.
        partitioner: the partitioner of the variables created in it (see `dpkeras.partitioning`),
            or None.

    Example:

    ```python
    import dpkeras

    with dpkeras.variable_scope("model") as scope:
        w = dpkeras.get_variable("w", shape=(3,))
        scope.reuse_variables()
        assert dpkeras.get_variable("w", shape=(3,)) is w
    ```
    """

    def __init__(self, name, reuse, store, parent=None, partitioner=None):
        self._name = name
        self._reuse = reuse
        self._store = store
        self._parent = parent
        self._partitioner = partitioner

    @property
    def name(self):
        return self._name

    @property
    def reuse(self):
        return self._reuse

    @property
    def store(self):
        return self._store

    @property
    def partitioner(self):
        return self._partitioner

    def reuse_variables(self):
        """Makes this scope reuse variables from now on, as `reuse=True` would have."""
        self._reuse = True

    def __repr__(self):
        return f"VariableScope(name={self._name!r}, reuse={self._reuse!r})"


@dataclasses.dataclass(eq=False)
class _Entry:
    """One variable of a store: its path, kind and what creating it returned."""

    path: str
    kind: str
    shape: tuple
    dtype: str
    strategy: object
    # What the next variable creator returned when a Keras layer created the variable.
    raw: object = None
    # The keras.Variable that every user of the path gets; for a variable that a Keras layer
    # created, found in that layer once it has tracked it (see _Share).
    keras_variable: object = None
    # What get_variable & co. return for the path (a LocalVariable for local variables).
    wrapper: object = None
    # A weak reference to the Keras layer that created the variable, and how many other
    # layers have reused it (see _name_apart).
    owner: object = None
    sharers: int = 0

    @property
    def variable(self):
        """The tf.Variable users hold: what the outermost variable creator returned.

        That is the value of the shared keras.Variable once it is known: when a creator
        above ours (such as `dpkeras.scope()` entered inside a variable_scope) wraps what ours
        returned, reusing hands that creator its own wrapper back.
        """
        if self.keras_variable is not None:
            underlying = internals.underlying_variable(self.keras_variable)
            if underlying is not None:
                return underlying
        return self.raw

    @property
    def public(self):
        """The object handed to users for this path."""
        if self.wrapper is not None:
            return self.wrapper
        if self.keras_variable is not None:
            return self.keras_variable
        return self.raw


class VariableStore:
    """The variables that `get_variable` and Keras layers created, keyed by full path.

    `with VariableStore():` makes a fresh store the one that top-level code in this thread
    uses until the block ends, like entering a new graph in TF1; it is how tests and notebooks
    start over. Call `clear()` on `get_variable_store()` to forget the names in the current
    store (the variables themselves live on in the models that hold them);
    `keras.utils.clear_session()` does not.

    Example:

    ```python
    import dpkeras

    with dpkeras.VariableStore() as store:
        dpkeras.get_variable("w", shape=(2,))
        assert store.paths() == ["w"]
    with dpkeras.VariableStore():
        dpkeras.get_variable("w", shape=(2,))  # a new store: no clash with the first "w"
    ```
    """

    def __init__(self):
        self._lock = threading.RLock()
        self._entries = {}

    def __enter__(self):
        _STATE.stores.append(self)
        return self

    def __exit__(self, *exc_info):
        stores = _STATE.stores
        for index in range(len(stores) - 1, -1, -1):
            if stores[index] is self:
                del stores[index]
                break

    def paths(self):
        """Returns the full paths of the variables in the store, in creation order."""
        with self._lock:
            return list(self._entries)

    def clear(self):
        """Forgets every name in the store."""
        with self._lock:
            self._entries.clear()

    def __len__(self):
        with self._lock:
            return len(self._entries)

    def __contains__(self, path):
        with self._lock:
            return path in self._entries

    def __repr__(self):
        return f"<VariableStore with {len(self)} variables>"

    def _lookup(self, path):
        return self._entries.get(path)

    def _add(self, entry):
        self._entries[entry.path] = entry

    def _all_entries(self):
        with self._lock:
            return list(self._entries.values())

    def _find(self, variable):
        """Returns the entry holding `variable` (any wrapper of it), or None."""
        for entry in self._all_entries():
            if entry.wrapper is not None and entry.wrapper is variable:
                return entry
            if _same_variable(entry.variable, variable):
                return entry
        return None


class _ThreadState(threading.local):
    def __init__(self):
        self.scopes = []  # the VariableScopes entered in this thread, innermost last
        self.stores = []  # the `with VariableStore()` blocks of this thread, innermost last
        self.bypass = 0  # >0 while get_variable creates its own keras.Variable
        self.creating = 0  # >0 while our creator handles a variable (lower copies pass)
        self.late = []  # layer weights Keras created after a symbolic build (see _create...)


_STATE = _ThreadState()
_DEFAULT_STORE = VariableStore()
_MODEL_STORES = weakref.WeakKeyDictionary()
_MODEL_STORES_LOCK = threading.Lock()


def get_variable_store():
    """Returns the `VariableStore` that `get_variable` would use here.

    That is the store of the innermost `variable_scope`; outside every scope, the store of the
    Keras model being built (if one is), else that of the innermost `with VariableStore():`
    block, else the process-wide default store.

    Example:

    ```python
    import dpkeras

    with dpkeras.VariableStore() as store:
        assert dpkeras.get_variable_store() is store
    ```
    """
    scope = _current_scope()
    if scope is not None:
        return scope.store
    return _implicit_store()


@contextlib.contextmanager
def variable_scope(name_or_scope, reuse=None, partitioner=None):
    """Opens a variable scope: prefixes names, and decides whether variables are reused.

    Inside the scope, `get_variable(name)` names its variable `<scope>/<name>`, and a Keras
    layer built inside it names its weights `<scope>/<layer name>/<weight name>`. Whether an
    existing name is reused or is an error depends on `reuse`. Works the same with and
    without `dpkeras.scope()`, entered in either order.

    Args:
        name_or_scope: str or VariableScope. A name (`"conv1"`, or a path `"model/conv1"`)
            nests inside the current scope; a scope object re-enters that scope's full path
            and store wherever it is written.
        reuse: `True` reuses variables and fails for a name that does not exist; `False`
            creates them and fails for a name that exists; `AUTO_REUSE` creates a variable
            when its name is new and reuses it otherwise; `None` inherits: from the scope
            object when one is given, else from the enclosing scope (outermost: `False`).
            Defaults to `None`.
        partitioner: cut the variables created in the scope (layer weights and
            `get_variable`s of rank 1 or more) into shards over the parameter devices: one of
            `tf.distribute.experimental.partitioners` or a callable like one (TF1's
            `partitioner=`). Needs `dpkeras.scope()`. `None` inherits the enclosing scope's
            (or the scope object's). See docs/sharding.md. Defaults to `None`.

    Yields:
        The `VariableScope`, with `.name`, `.reuse` and `.reuse_variables()`.

    Raises:
        ValueError: for an invalid name or `reuse` value.
        RuntimeError: when Keras is building a model symbolically, where layers' variables
            would be created after the scope has exited (see the module docstring).

    Example:

    ```python
    import keras
    import dpkeras

    def conv_relu(x, kernel_shape):
        w = dpkeras.get_variable("weights", kernel_shape)
        b = dpkeras.get_variable("biases", kernel_shape[-1:], initializer="zeros")
        return keras.ops.relu(keras.ops.conv(x, w, padding="same") + b)

    x = keras.ops.ones((1, 8, 8, 3))
    with dpkeras.variable_scope("model") as scope:
        with dpkeras.variable_scope("conv1"):
            y1 = conv_relu(x, (3, 3, 3, 4))
    with dpkeras.variable_scope(scope, reuse=True):
        with dpkeras.variable_scope("conv1"):
            y2 = conv_relu(x, (3, 3, 3, 4))  # the same model/conv1/weights and biases
    ```
    """
    reuse = _validate_reuse(reuse)
    partitioner = partitioning.as_partitioner(partitioner)
    parent = _current_scope()
    if partitioner is None:
        inherited = name_or_scope if isinstance(name_or_scope, VariableScope) else parent
        partitioner = inherited.partitioner if inherited is not None else None
    if isinstance(name_or_scope, VariableScope):
        path = name_or_scope.name
        store = name_or_scope.store
        mode = name_or_scope.reuse if reuse is None else reuse
    elif isinstance(name_or_scope, str):
        _validate_name(name_or_scope, "variable_scope", "name_or_scope")
        path = _join(parent.name if parent else "", name_or_scope)
        store = parent.store if parent else _implicit_store()
        if reuse is not None:
            mode = reuse
        else:
            mode = parent.reuse if parent else False
    else:
        raise TypeError(
            "variable_scope() takes a scope name (str) or a VariableScope object to "
            f"re-enter. Received: name_or_scope={name_or_scope!r} "
            f"(of type {type(name_or_scope).__name__})"
        )
    scope = VariableScope(path, mode, store, parent=parent, partitioner=partitioner)

    stateless = internals.in_stateless_scope()
    deferred_before = set()
    if stateless:
        _check_not_building_symbolically(scope)
        deferred_before = {id(v) for v in internals.deferred_variables()}

    parent_path, _, leaf = path.rpartition("/")
    with contextlib.ExitStack() as context:
        # Every scope installs the creator (the topmost copy acts, see _create_variable), so a
        # scope is in effect even where the creator stack differs from the one its enclosing
        # scope was entered on (another default tf.Graph).
        context.enter_context(tf.variable_creator_scope(_create_variable))
        # Also a Keras name scope, so that `keras.Variable.path` shows the variable's name.
        context.enter_context(keras.name_scope(leaf, caller=scope, override_parent=parent_path))
        if partitioner is not None:
            context.enter_context(partitioning.partitioner_scope(partitioner))
        _STATE.scopes.append(scope)
        try:
            yield scope
        finally:
            _STATE.scopes.pop()
    _process_pending()
    if stateless:
        _check_nothing_deferred(scope, deferred_before)
    if _STATE.late:
        late, _STATE.late[:] = list(_STATE.late), []
        raise RuntimeError(_late_message(scope, late))


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
        device: str, a device for the new variable, such as `"/CPU:0"`. Defaults to `None`
            (wherever variables go: the parameter device under `dpkeras.scope()`).
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
            variable whose shape is unknown, or partitioning a scalar, by an invalid split or
            outside `dpkeras.scope()` (before anything is created).

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
    return _get_or_create(
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


# ---------------------------------------------------------------------------------------------
# Scope and store resolution.


def _current_scope():
    return _STATE.scopes[-1] if _STATE.scopes else None


def _implicit_store():
    """The store for code outside every variable_scope (see get_variable_store)."""
    model = _model_owning_store()
    if model is not None:
        with _MODEL_STORES_LOCK:
            store = _MODEL_STORES.get(model)
            if store is None:
                store = _MODEL_STORES[model] = VariableStore()
        return store
    if _STATE.stores:
        return _STATE.stores[-1]
    return _DEFAULT_STORE


def _model_owning_store():
    """The outermost model on the Keras name-scope stack that owns, or now gets, a store.

    A model gets a store of its own while it is unbuilt (being built); a built model keeps the
    store it got then. A functional model is built when constructed, after its layers were
    built, so it never gets one and its layers' names stay in the enclosing store.
    """
    for entry in internals.name_scope_stack():
        caller = entry.caller
        if isinstance(caller, keras.Model):
            with _MODEL_STORES_LOCK:
                if caller in _MODEL_STORES:
                    return caller
            if not caller.built:
                return caller
    return None


def _store_of_model(model):
    with _MODEL_STORES_LOCK:
        return _MODEL_STORES.get(model)


# ---------------------------------------------------------------------------------------------
# The variable creator: Keras layers' weights inside a scope.


def _create_variable(next_creator, **kwargs):
    """The `tf.variable_creator_scope` creator that every variable_scope installs.

    The topmost copy handles the variable; copies below it (from enclosing scopes) pass.
    """
    if _STATE.bypass or _STATE.creating:
        return next_creator(**kwargs)
    _STATE.creating += 1
    try:
        return _create_scoped_variable(next_creator, kwargs)
    finally:
        _STATE.creating -= 1


def _create_scoped_variable(next_creator, kwargs):
    _process_pending()
    scope = _current_scope()
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
    path = _join(_join(scope.name, layer_path), leaf)
    what = f"Keras layer '{layer.name}' ({type(layer).__name__}) creating weight '{leaf}'"
    if scope.partitioner is not None:
        _check_can_partition(what, scope.partitioner)
    store = scope.store
    with store._lock:
        entry = store._lookup(path)
        if entry is None:
            if scope.reuse is True:
                raise _missing_error(what, path, scope)
            variable = next_creator(**kwargs)
            entry = _Entry(
                path=path,
                kind=MODEL,
                shape=tuple(variable.shape.as_list()),
                dtype=_dtype_name(variable.dtype),
                strategy=tf.distribute.get_strategy(),
                raw=variable,
            )
            entry.owner = weakref.ref(layer)
            store._add(entry)
            _add_pending(_Share(entry, layer))
            return variable
        if scope.reuse is False:
            raise _exists_error(what, entry, scope)
        dtype = kwargs.get("dtype")
        _check_reuse(
            what,
            entry,
            shape=_initial_value_shape(kwargs),
            dtype=None if dtype is None else _dtype_name(dtype),
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
    _STATE.late.append(weight)
    warnings.warn(_late_message(scope, [weight]), RuntimeWarning, stacklevel=3)
    return next_creator(**kwargs)


def _initializing_deferred_variables():
    """Whether Keras is creating variables it declared inside a StatelessScope that ended."""
    return not internals.in_stateless_scope() and bool(internals.deferred_variables())


def _late_message(scope, weights):
    return (
        f"dpkeras.variable_scope('{scope.name}'): Keras created weights {weights[:5]} only "
        "after building a model symbolically (as it does for a model without a build() "
        "method inside fit(), evaluate() or predict()), when the layers that declared them "
        "were no longer known, so they were not shared by name and are not in the variable "
        "store. Build the model inside the scope before training: give it a "
        "build(input_shape) method that builds its layers inside dpkeras.variable_scope and "
        "call model.build(input_shape), or call the model once on a batch of data."
    )


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


# ---------------------------------------------------------------------------------------------
# Deduplication: one keras.Variable per shared path.


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
            v for v in internals.tracked_variables(layer) if _same_variable(v, entry.variable)
        ]
        if not wrappers:
            return False
        if entry.keras_variable is None:
            entry.keras_variable = wrappers[0]
        for wrapper in wrappers:
            if wrapper is not entry.keras_variable:
                internals.replace_tracked_variable(layer, wrapper, entry.keras_variable)
        return True


_PENDING = []
_PENDING_LOCK = threading.RLock()


def _add_pending(item):
    with _PENDING_LOCK:
        _PENDING.append(item)


def _process_pending():
    """Applies every pending _Share whose layer has tracked its weight by now."""
    with _PENDING_LOCK:
        if not _PENDING:
            return
        remaining = [item for item in list(_PENDING) if not item.apply()]
        _PENDING[:] = remaining


def _same_variable(a, b):
    """Whether a and b are the same variable: identical, or wrappers of one resource."""
    if a is None or b is None:
        return False
    if isinstance(a, keras.Variable):
        a = internals.underlying_variable(a)
    if isinstance(b, keras.Variable):
        b = internals.underlying_variable(b)
    if a is b:
        return True
    try:
        handle_a = a.handle
        handle_b = b.handle
    except (AttributeError, ValueError, RuntimeError):
        return False
    return handle_a is handle_b


# ---------------------------------------------------------------------------------------------
# get_variable and friends.


def _get_or_create(
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
    _process_pending()
    _validate_name(name, "get_variable", "name")
    partitioner = partitioning.as_partitioner(partitioner, "get_variable(partitioner=...)")
    scope = _current_scope()
    store = scope.store if scope is not None else _implicit_store()
    mode = scope.reuse if scope is not None else False
    path = _join(scope.name if scope is not None else "", name)
    what = f"get_variable('{path}')"
    dtype = _standardize_dtype(what, dtype)
    with store._lock:
        entry = store._lookup(path)
        if entry is None:
            if mode is True:
                raise _missing_error(what, path, scope)
            value, shape = _resolve_initializer(what, initializer, shape, dtype)
            with _partitioned(what, path, partitioner, shape, dtype):
                keras_variable = _new_keras_variable(
                    path, value, shape, dtype, trainable and kind != LOCAL, device
                )
            if regularizer is not None:
                keras_variable.regularizer = _as_regularizer(what, regularizer)
            entry = _Entry(
                path=path,
                kind=kind,
                shape=shape,
                dtype=dtype,
                strategy=tf.distribute.get_strategy(),
                keras_variable=keras_variable,
            )
            if wrap is not None:
                entry.wrapper = wrap(keras_variable)
            store._add(entry)
            return entry.public
        if mode is False:
            raise _exists_error(what, entry, scope)
        if shape is None and _is_value(initializer):
            shape = _value_shape(initializer)
        _check_reuse(
            what,
            entry,
            shape=None if shape is None else _standardize_shape(what, shape),
            dtype=dtype,
        )
        if entry.keras_variable is None:
            _process_pending()
        if entry.keras_variable is None:
            # A Keras layer created it and has not tracked its wrapper yet: make the shared
            # wrapper now; the layer's own is swapped for it when it is tracked (see _Share).
            entry.keras_variable = keras.Variable(entry.variable)
        return entry.public


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
    _check_can_partition(what, partitioner)
    partitioning.row_split(partitioner, shape, dtype, path, explicit)  # raises if invalid
    return partitioning.partitioner_scope(partitioner, explicit=explicit)


def _check_can_partition(what, partitioner):
    if getattr(tf.distribute.get_strategy().extended, "partitioner", False) is False:
        raise ValueError(
            f"{what}: partitioner={partitioner!r} needs dpkeras.scope() (or a "
            f"ParameterDeviceStrategy's scope), which places the shards on the parameter "
            f"devices. Received it under {tf.distribute.get_strategy()!r}."
        )


def _new_keras_variable(path, value, shape, dtype, trainable, device):
    parent, _, leaf = path.rpartition("/")
    with contextlib.ExitStack() as context:
        if device is not None:
            context.enter_context(tf.device(device))
        if parent and not _keras_path_is_scope(parent):
            # So that keras.Variable.path is the full path, wherever this is called from.
            grandparent, _, parent_leaf = parent.rpartition("/")
            context.enter_context(keras.name_scope(parent_leaf, override_parent=grandparent))
        _STATE.bypass += 1
        try:
            return keras.Variable(
                initializer=value, shape=shape, dtype=dtype, trainable=trainable, name=leaf
            )
        finally:
            _STATE.bypass -= 1


def _keras_path_is_scope(path):
    """Whether the innermost Keras name scope is the current variable scope, named `path`."""
    scope = _current_scope()
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
        shape = _standardize_shape(what, shape)
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


# ---------------------------------------------------------------------------------------------
# Validation and errors.


def _validate_reuse(reuse):
    if reuse is AUTO_REUSE or reuse is None or reuse is True or reuse is False:
        return reuse
    if reuse is tf.compat.v1.AUTO_REUSE:
        return AUTO_REUSE
    raise ValueError(
        f"variable_scope(reuse=...) must be {_REUSE_VALUES}. Received: reuse={reuse!r}"
    )


def _validate_name(name, function, argument):
    valid = isinstance(name, str) and all(
        _NAME_COMPONENT.fullmatch(part) for part in name.split("/")
    )
    if not valid:
        raise ValueError(
            f"{function}(): {argument} must be a non-empty name made of letters, digits and "
            "'_', '.', '-', with '/' between nested names (such as 'model/conv1'). "
            f"Received: {argument}={name!r}"
        )


def _standardize_shape(what, shape):
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)
    try:
        dims = tuple(tf.TensorShape(shape).as_list())
    except (TypeError, ValueError) as error:
        raise ValueError(
            f"{what}: shape must be an int or a sequence of ints. Received: shape={shape!r}"
        ) from error
    if any(d is None for d in dims):
        raise ValueError(
            f"{what}: shape must be fully defined (no None dimensions). Received: shape={shape!r}"
        )
    return dims


def _standardize_dtype(what, dtype):
    try:
        return keras.backend.standardize_dtype(dtype)
    except ValueError as error:
        raise ValueError(f"{what}: invalid dtype. Received: dtype={dtype!r}") from error


def _dtype_name(dtype):
    if isinstance(dtype, tf.DType):
        dtype = dtype.base_dtype.name
    return keras.backend.standardize_dtype(dtype)


def _join(prefix, name):
    return f"{prefix}/{name}" if prefix and name else prefix or name


def _scope_description(scope):
    if scope is None:
        return "outside every dpkeras.variable_scope, where variables are only created"
    return f"scope '{scope.name}' has reuse={scope.reuse!r}"


def _missing_error(what, path, scope):
    store = scope.store if scope is not None else _implicit_store()
    paths = store.paths()
    leaf = path.rpartition("/")[2]
    close = difflib.get_close_matches(path, paths, n=5, cutoff=0.6)
    close += [p for p in paths if p.rpartition("/")[2] == leaf and p not in close][:5]
    if close:
        listing = "Close names: " + ", ".join(repr(p) for p in close) + "."
    elif paths:
        listing = f"None of the {len(paths)} names in the store is close to it."
    else:
        listing = "The variable store is empty."
    return ValueError(
        f"{what}: variable '{path}' does not exist, and {_scope_description(scope)}, which "
        f"only reuses existing variables. {listing} Create it first (reuse=False or None), or "
        "use reuse=dpkeras.AUTO_REUSE to create it when it is missing."
    )


def _exists_error(what, entry, scope):
    hint = ""
    parent = scope._parent if scope is not None else None
    if parent is not None and parent.reuse is not False:
        hint = (
            f" (The enclosing scope '{parent.name}' has reuse={parent.reuse!r}, but reuse=False "
            "on an inner scope is explicit; pass reuse=None to inherit.)"
        )
    return ValueError(
        f"{what}: variable '{entry.path}' already exists (shape {entry.shape}, "
        f"{entry.dtype}), and {_scope_description(scope)}, which only creates variables. To "
        "share it, enter the scope with reuse=True or dpkeras.AUTO_REUSE (or call "
        "scope.reuse_variables()); to make a distinct variable, use another name or scope."
        f"{hint}"
    )


def _check_reuse(what, entry, shape, dtype):
    if shape is not None and tuple(shape) != tuple(entry.shape):
        raise ValueError(
            f"{what}: cannot reuse variable '{entry.path}' with shape {tuple(shape)}: it was "
            f"created with shape {tuple(entry.shape)}. A reused variable keeps the shape and "
            "dtype it was created with."
        )
    if dtype is not None and dtype != entry.dtype:
        raise ValueError(
            f"{what}: cannot reuse variable '{entry.path}' with dtype {dtype}: it was created "
            f"with dtype {entry.dtype}. A reused variable keeps the shape and dtype it was "
            "created with."
        )
    strategy = tf.distribute.get_strategy()
    if tf.distribute.has_strategy() and strategy is not entry.strategy:
        raise ValueError(
            f"{what}: variable '{entry.path}' was created under {_describe(entry.strategy)} "
            f"and is being reused under {_describe(strategy)}. Variables shared by name must "
            "live under one strategy: build every user of it inside the same dpkeras.scope()."
        )


def _describe(strategy):
    if strategy is None or type(strategy).__name__ == "_DefaultDistributionStrategy":
        return "no strategy"
    return f"strategy {strategy!r}"


def _check_not_building_symbolically(scope):
    """Raises when the scope is entered while Keras traces an unbuilt layer symbolically.

    Raising before anything is declared is safe even where Keras catches the error: on an
    eager first call it then builds the model by running it eagerly, inside the scopes.
    """
    layers = [
        entry.caller
        for entry in internals.name_scope_stack()
        if isinstance(entry.caller, keras.layers.Layer)
    ]
    if layers and not layers[-1].built:
        layer = layers[-1]
        raise RuntimeError(
            f"dpkeras.variable_scope('{scope.name}') was entered while Keras builds "
            f"'{layer.name}' ({type(layer).__name__}) symbolically, as it does for an unbuilt "
            "model on its first call inside fit(), evaluate() or predict(), or for a model "
            "without a build() method. Keras creates the variables of such a build only after "
            "this scope has exited, so they could not be shared by name. Build the model "
            "inside the scope before training: give it a build(input_shape) method that "
            "builds its layers inside dpkeras.variable_scope and call "
            "model.build(input_shape), or call the model once on a batch of data."
        )


def _check_nothing_deferred(scope, before):
    created = [v for v in internals.deferred_variables() if id(v) not in before]
    ours = {id(e.keras_variable) for e in scope.store._all_entries()}
    deferred = [v for v in created if id(v) not in ours]
    if deferred:
        names = ", ".join(repr(v.path) for v in deferred[:5])
        raise RuntimeError(
            f"dpkeras.variable_scope('{scope.name}'): Keras declared variables {names} while "
            "tracing symbolically, and creates them only after this scope has exited, so "
            "they cannot be shared by name. Build the layers that create them before this "
            "point: call `layer.build(input_shape)` or the layer on a batch of data inside "
            "the scope."
        )
