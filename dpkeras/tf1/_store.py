"""The variable store: each name-keyed variable's entry, by full path.

A `VariableStore` maps paths (`towers/Layer/kernel`) to entries: the variable, its kind (model,
regular or local), shape, dtype and the strategy it was created under. Which store code uses is
decided in `dpkeras.tf1._state`; this module holds the stores themselves, the stores of models
being built, and the `with VariableStore():` blocks of each thread.
"""

import contextlib
import dataclasses
import threading
import weakref

import keras

from dpkeras import _keras_internals as internals


class _AutoReuse:
    """The type of `AUTO_REUSE`; it has exactly one instance."""

    def __repr__(self):
        return "dpkeras.AUTO_REUSE"

    def __reduce__(self):
        return "AUTO_REUSE"


AUTO_REUSE = _AutoReuse()
"""`reuse=AUTO_REUSE` creates a variable when its name is new and reuses it otherwise."""

# The kinds of variable a store holds (see dpkeras.tf1._collections).
MODEL = "model"
REGULAR = "regular"
LOCAL = "local"


@dataclasses.dataclass(eq=False)
class Entry:
    """One variable of a store: its path, kind and what creating it returned."""

    path: str
    kind: str
    shape: tuple
    dtype: str
    strategy: object
    # What the next variable creator returned when a Keras layer created the variable.
    raw: object = None
    # The keras.Variable that every user of the path gets; for a variable that a Keras layer
    # created, found in that layer once it has tracked it (see dpkeras.tf1._sharing).
    keras_variable: object = None
    # What get_variable & co. return for the path (a LocalVariable for local variables).
    wrapper: object = None
    # A weak reference to the Keras layer that created the variable, and how many other
    # layers have reused it (see dpkeras.tf1._sharing).
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
        self.lock = threading.RLock()  # held while an entry is looked up and added
        self._entries = {}
        self.generation = 0  # one more at each clear(): the root scopes of before are stale

    def __enter__(self):
        _BLOCKS.stores.append(self)
        return self

    def __exit__(self, *exc_info):
        stores = _BLOCKS.stores
        for index in range(len(stores) - 1, -1, -1):
            if stores[index] is self:
                del stores[index]
                break

    def paths(self):
        """Returns the full paths of the variables in the store, in creation order."""
        with self.lock:
            return list(self._entries)

    def clear(self):
        """Forgets every name in the store, and whether its root scope reuses."""
        with self.lock:
            self._entries.clear()
            self.generation += 1

    def __len__(self):
        with self.lock:
            return len(self._entries)

    def __contains__(self, path):
        with self.lock:
            return path in self._entries

    def __repr__(self):
        return f"<VariableStore with {len(self)} variables>"

    def lookup(self, path):
        """The entry of `path`, or None (call with `lock` held)."""
        return self._entries.get(path)

    def add(self, entry):
        """Adds `entry` under its path (call with `lock` held)."""
        self._entries[entry.path] = entry

    def entries(self):
        """Every entry, in creation order."""
        with self.lock:
            return list(self._entries.values())

    def find(self, variable):
        """Returns the entry holding `variable` (any wrapper of it), or None."""
        for entry in self.entries():
            if entry.wrapper is not None and entry.wrapper is variable:
                return entry
            if same_variable(entry.variable, variable):
                return entry
        return None


def same_variable(a, b):
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


class _Blocks(threading.local):
    def __init__(self):
        self.stores = []  # the `with VariableStore()` blocks of this thread, innermost last


_BLOCKS = _Blocks()
DEFAULT_STORE = VariableStore()
"""The store of top-level code outside every `with VariableStore():` block and model."""
_MODEL_STORES = weakref.WeakKeyDictionary()
_MODEL_STORES_LOCK = threading.Lock()


def innermost_store():
    """The store of the innermost `with VariableStore():` block of this thread, or None."""
    return _BLOCKS.stores[-1] if _BLOCKS.stores else None


def open_blocks():
    """The stores of this thread's open `with VariableStore():` blocks, innermost last."""
    return list(_BLOCKS.stores)


@contextlib.contextmanager
def blocks_opened(stores):
    """This thread's blocks are `stores` (from `open_blocks`) for the duration: a replica
    thread's, taken from the thread that runs the step (`dpkeras.tf1._state`)."""
    saved, _BLOCKS.stores = _BLOCKS.stores, list(stores)
    try:
        yield
    finally:
        _BLOCKS.stores = saved


def store_of_model(model):
    """The store a model got while it was built (see `store_for_model`), or None."""
    with _MODEL_STORES_LOCK:
        return _MODEL_STORES.get(model)


def store_for_model(model):
    """The store that belongs to `model`, made on first use."""
    with _MODEL_STORES_LOCK:
        store = _MODEL_STORES.get(model)
        if store is None:
            store = _MODEL_STORES[model] = VariableStore()
        return store
