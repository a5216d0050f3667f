"""Where code runs: this thread's variable scopes, and the store that applies there.

Scope state is thread-local, like TF1's graph-level scopes: a scope entered in one thread is
not in effect in another, except in the replica threads of a step it runs (`strategy.run`),
which take it as TF1's towers, built in the caller's graph, did (`dpkeras._carried`). Outside
every scope, code uses the store of the Keras model being
built (if one is), else that of the innermost `with VariableStore():` block, else the
process-wide default store.
"""

import contextlib
import threading
import weakref

import keras

from dpkeras import _keras_internals as internals
from dpkeras._carried import register
from dpkeras.tf1._store import (
    DEFAULT_STORE,
    blocks_opened,
    innermost_store,
    open_blocks,
    store_for_model,
    store_of_model,
)


class _ThreadState(threading.local):
    def __init__(self):
        self.scopes = []  # the VariableScopes entered in this thread, innermost last
        self.bypass = 0  # >0 while get_variable creates its own keras.Variable
        self.creating = 0  # >0 while our creator handles a variable (lower copies pass)
        self.late = []  # layer weights Keras created after a symbolic build (tf1.sharing)
        # store -> (its generation, this thread's root VariableScope of it): see root_scope
        self.roots = weakref.WeakKeyDictionary()


THREAD = _ThreadState()
"""This thread's scopes and the flags of the creator (`dpkeras.tf1._sharing`)."""


def _capture():
    """This thread's scopes, `with VariableStore():` blocks, and root scopes when one reuses,
    for the replica threads of a step it runs; None when a fresh thread would have the same."""
    roots, blocks = dict(THREAD.roots.items()), open_blocks()
    if not THREAD.scopes and not blocks and not any(s.reuse for _, s in roots.values()):
        return None
    return list(THREAD.scopes), roots, blocks


@contextlib.contextmanager
def _restored(state):
    """A replica thread's scopes, blocks and root scopes: those `_capture` took from its
    caller."""
    scopes, roots, blocks = state
    saved = THREAD.scopes, THREAD.roots
    THREAD.scopes, THREAD.roots = list(scopes), weakref.WeakKeyDictionary(roots)
    try:
        with blocks_opened(blocks):
            yield
    finally:
        THREAD.scopes, THREAD.roots = saved


register(_capture, _restored)  # carried into replica threads (`dpkeras._carried`)


def current_scope():
    """The innermost `VariableScope` entered in this thread, or None."""
    return THREAD.scopes[-1] if THREAD.scopes else None


def implicit_store():
    """The store for code outside every variable_scope (see get_variable_store)."""
    model = _model_owning_store()
    if model is not None:
        return store_for_model(model)
    store = innermost_store()
    return DEFAULT_STORE if store is None else store


def _model_owning_store():
    """The outermost model on the Keras name-scope stack that owns, or now gets, a store.

    A model gets a store of its own while it is unbuilt (being built); a built model keeps the
    store it got then. A functional model is built when constructed, after its layers were
    built, so it never gets one and its layers' names stay in the enclosing store.
    """
    for entry in internals.name_scope_stack():
        caller = entry.caller
        if isinstance(caller, keras.Model):
            if store_of_model(caller) is not None:
                return caller
            if not caller.built:
                return caller
    return None


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
    scope = current_scope()
    if scope is not None:
        return scope.store
    return implicit_store()
