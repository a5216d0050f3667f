"""TensorFlow's `tf.compat.v1.variable_scope` around dpkeras's variables: refused by name.

In TensorFlow 2 that scope neither prefixes a Keras variable's name nor shares it (in eager
mode every such scope reuses as AUTO_REUSE, and only `tf.compat.v1.get_variable` reads it).
dpkeras's TF1 layer has scopes of its own (`dpkeras.variable_scope`), so a TensorFlow scope
around `dpkeras.get_variable`, a `dpkeras.variable_scope` or a Keras layer's weights under
dpkeras would be ignored without a word: `reuse=True` there would share nothing.
"""

import tensorflow as tf


def refuse_tf_variable_scope(what):
    """Raises RuntimeError when a `tf.compat.v1.variable_scope` is in effect in this thread.

    Args:
        what: str, what dpkeras is doing there, such as "dpkeras.get_variable('w') is called".
    """
    name = tf.compat.v1.get_variable_scope().name  # "" outside every scope (per thread)
    if not name:
        return
    raise RuntimeError(
        f"{what} inside tf.compat.v1.variable_scope('{name}'), which dpkeras does not "
        f"follow: in TensorFlow 2 that scope neither prefixes a Keras variable's name nor "
        f"shares it (its reuse=True acts as AUTO_REUSE, read only by "
        f"tf.compat.v1.get_variable), so nothing here would be named '{name}/...' or shared. "
        f"Use dpkeras.variable_scope('{name}', reuse=...) instead: the same name and reuse "
        f"(True, False or dpkeras.AUTO_REUSE), followed by dpkeras.get_variable and by the "
        f"Keras layers built inside it."
    )
