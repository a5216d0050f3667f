"""Embedding lookups on the parameter device: only the looked-up rows travel to a replica."""

import keras
import tensorflow as tf

from dpkeras import _tf_internals
from dpkeras._variables import replica_step
from dpkeras._variables.sharded import PLACED_TYPES

_dispatchable = []  # [True] once Keras variables are dispatchable (it cannot be undone)


def register():
    """Makes `tf.gather` on a Keras variable call `gather` (see it), through TensorFlow's
    public dispatch API; `dpkeras._patches` registers it while dpkeras is in use.

    The first call also registers `keras.Variable` as a type TensorFlow dispatches on, which
    TensorFlow cannot undo; with no dispatcher registered for it, that changes nothing.
    """
    if not _dispatchable:
        _tf_internals.register_dispatchable_type(keras.Variable)
        _dispatchable.append(True)
    tf.experimental.dispatch_for_api(tf.gather, {"params": keras.Variable})(gather)


def unregister():
    """Undoes `register`: `tf.gather` on a Keras variable is TensorFlow's own again."""
    tf.experimental.unregister_dispatch_for(gather)


def gather(params, indices, validate_indices=None, axis=None, batch_dims=0, name=None):
    """`tf.gather` on a Keras variable: on the parameter device inside a dpkeras replica.

    Keras's `ops.take` (which `Embedding` uses) calls `tf.gather` on the Keras variable, and
    TensorFlow would convert the variable to a dense tensor first, copying the whole table to
    every replica on every step. Inside a dpkeras replica, a gather along axis 0 from a
    `ParameterVariable` runs where the table is, and only its rows are sent; from a sharded
    table (`ShardedParameterVariable`) each shard gathers its own ids. Everywhere else this
    does exactly what `tf.gather` does.
    """
    table = params.value  # the tf.Variable itself unless Keras autocasts this variable
    if (
        isinstance(table, PLACED_TYPES)
        and batch_dims == 0
        and tf.get_static_value(axis if axis is not None else 0) == 0
        and replica_step.current(table.extended) is not None
    ):
        return table.sparse_read(indices, name=name)
    return tf.gather(
        tf.convert_to_tensor(params),
        indices,
        validate_indices=validate_indices,
        axis=axis,
        batch_dims=batch_dims,
        name=name,
    )
