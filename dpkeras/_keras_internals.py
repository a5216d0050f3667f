"""The Keras internals dpkeras relies on, in one place, each with the reason.

A `tf.variable_creator_scope` creator sees only what `tf.Variable(...)` receives: Keras passes
the leaf name (`kernel`) and a callable initial value. Placement policies and the placement
report need the Keras path, the shape, and whether a layer, an optimizer, a metric or a seed
generator is creating the variable. Keras 3 has no public way to ask; these functions do it
with Keras-private state, tested against the Keras version pinned in pyproject.toml.
"""

import keras
from keras.src.backend.common import global_state

__all__ = []


def name_scope_stack():
    """The entries of this thread's Keras name-scope stack, outermost first.

    Each entry has `.name` and `.caller`: a layer, optimizer, metric or seed generator pushes
    one with itself as caller while it creates variables. `keras.name_scope` is public; the
    stack it maintains is not (`current_path()` gives only the joined names).
    """
    return list(global_state.get_global_attribute("name_scope_stack") or ())


def keras_variable_being_initialized(initial_value):
    """The `keras.Variable` whose callable `initial_value` this is, else None.

    Keras initialises with `lambda: initializer(self._shape, dtype=self._dtype)`; the creator
    cannot know the shape without calling it, which would draw random numbers. The lambda's
    closure holds the Keras variable, whose shape is known.
    """
    for cell in getattr(initial_value, "__closure__", None) or ():
        try:
            content = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if isinstance(content, keras.Variable):
            return content
    return None
