"""`variable_scope`: a named scope that prefixes variable names and decides their reuse.

TF1's `tf.variable_scope(name, reuse=...)`, on Keras 3: entering a scope installs the creator
of `dpkeras.tf1._sharing` and a Keras name scope, so `get_variable(name)` names its variable
`<scope>/<name>` and a layer built inside names its weights `<scope>/<layer>/<weight>`.
"""

import contextlib

import keras
import tensorflow as tf

from dpkeras import _keras_internals as internals
from dpkeras._compat_scopes import refuse_tf_variable_scope
from dpkeras._variables import partitioning
from dpkeras.tf1._errors import join_path, late_message, validate_name, validate_reuse
from dpkeras.tf1._sharing import create_variable, process_pending
from dpkeras.tf1._state import THREAD, current_scope, implicit_store


class VariableScope:
    """A named scope for variables, as yielded by `with variable_scope(...) as scope`.

    Keep the object to re-enter the same scope later, which is safer than repeating its name:
    `variable_scope(scope, reuse=True)` enters `scope.name` wherever it is written.

    Attributes:
        name: str, the full path of the scope, such as `"model/conv1"`. reuse: `True` (only reuse),
        `False` (only create) or `AUTO_REUSE` (create when missing). store: the `VariableStore` the
        scope's variables live in. partitioner: the partitioner of the variables created in it (see
        `dpkeras._variables.partitioning`),
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
    def parent(self):
        """The scope this one was entered in, or None."""
        return self._parent

    @property
    def partitioner(self):
        return self._partitioner

    def reuse_variables(self):
        """Makes this scope reuse variables from now on, as `reuse=True` would have.

        On the root scope (`get_variable_scope()` outside every scope) it lasts, in this
        thread, until the store is cleared: as in TF1, where the graph's root scope then
        reused for good. Re-enter the root (`variable_scope(get_variable_scope())`) to keep it
        to a block.
        """
        self._reuse = True

    def __repr__(self):
        return f"VariableScope(name={self._name!r}, reuse={self._reuse!r})"


def root_scope(store=None):
    """This thread's root scope (name `""`) of `store` (default: the store top-level code uses).

    Each store has one per thread, as each TF1 graph had one: `with VariableStore():` starts
    with a root that creates, and `store.clear()` forgets whether the root reused.
    """
    store = implicit_store() if store is None else store
    found = THREAD.roots.get(store)
    if found is None or found[0] != store.generation:
        found = THREAD.roots[store] = (store.generation, VariableScope("", False, store))
    return found[1]


def get_variable_scope():
    """Returns the current variable scope: the innermost one entered, else the root scope.

    TF1's `tf.get_variable_scope()`. Outside every `variable_scope` it is the root scope, named
    `""`, of the store top-level code uses here (see `get_variable_store`); its
    `reuse_variables()` makes the `get_variable` calls after it at top level, and the scopes
    entered after it, reuse. Like every scope, it is this thread's.

    Example, TF1's tower loop (each tower after the first reuses the first's variables):

    ```python
    import keras
    import dpkeras

    def tower(x):
        with dpkeras.variable_scope("fc"):
            w = dpkeras.get_variable("weights", (3, 2))
        return keras.ops.matmul(x, w)

    with dpkeras.variable_scope(dpkeras.get_variable_scope()):  # keeps the reuse to this block
        for i in range(2):
            with keras.name_scope(f"tower_{i}"):
                y = tower(keras.ops.ones((1, 3)))
            dpkeras.get_variable_scope().reuse_variables()
    assert dpkeras.get_variable_store().paths() == ["fc/weights"]
    ```
    """
    scope = current_scope()
    return scope if scope is not None else root_scope()


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
        RuntimeError: inside a `tf.compat.v1.variable_scope`, which dpkeras does not follow
            (TensorFlow 2 neither names nor shares Keras variables by it; use this function
            instead); and when Keras is building a model symbolically, where layers'
            variables would be created after the scope has exited; build the model inside
            the scope (`model.build(input_shape)`, or call it once on a batch).

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
    reuse = validate_reuse(reuse)
    partitioner = partitioning.as_partitioner(partitioner)
    parent = current_scope()
    if partitioner is None:
        inherited = name_or_scope if isinstance(name_or_scope, VariableScope) else parent
        partitioner = inherited.partitioner if inherited is not None else None
    if isinstance(name_or_scope, VariableScope):
        path = name_or_scope.name
        store = name_or_scope.store
        mode = name_or_scope.reuse if reuse is None else reuse
    elif isinstance(name_or_scope, str):
        validate_name(
            name_or_scope,
            "variable_scope",
            "name_or_scope",
            hint=" To re-enter the root scope, pass dpkeras.get_variable_scope() at top level.",
        )
        path = join_path(parent.name if parent else "", name_or_scope)
        store = parent.store if parent else implicit_store()
        if reuse is not None:
            mode = reuse
        else:
            mode = (parent or root_scope(store)).reuse
    else:
        raise TypeError(
            "variable_scope() takes a scope name (str) or a VariableScope object to "
            f"re-enter. Received: name_or_scope={name_or_scope!r} "
            f"(of type {type(name_or_scope).__name__})"
        )
    refuse_tf_variable_scope(f"dpkeras.variable_scope('{path}') is entered")
    scope = VariableScope(path, mode, store, parent=parent, partitioner=partitioner)

    stateless = internals.in_stateless_scope()
    deferred_before = set()
    if stateless:
        _check_not_building_symbolically(scope)
        deferred_before = {id(v) for v in internals.deferred_variables()}

    parent_path, _, leaf = path.rpartition("/")
    with contextlib.ExitStack() as context:
        # Every scope installs the creator (the topmost copy acts, see create_variable), so a
        # scope is in effect even where the creator stack differs from the one its enclosing
        # scope was entered on (another default tf.Graph).
        context.enter_context(tf.variable_creator_scope(create_variable))
        # Also a Keras name scope, so that `keras.Variable.path` shows the variable's name.
        # The root scope (path "") adds no name: its variables are named as at top level.
        if path:
            context.enter_context(keras.name_scope(leaf, caller=scope, override_parent=parent_path))
        if partitioner is not None:
            context.enter_context(partitioning.partitioner_scope(partitioner))
        THREAD.scopes.append(scope)
        try:
            yield scope
        finally:
            THREAD.scopes.pop()
    process_pending()
    if stateless:
        _check_nothing_deferred(scope, deferred_before)
    if THREAD.late:
        late, THREAD.late[:] = list(THREAD.late), []
        raise RuntimeError(late_message(scope, late))


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
    ours = {id(e.keras_variable) for e in scope.store.entries()}
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
