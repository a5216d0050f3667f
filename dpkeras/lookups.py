"""Embedding lookups on the parameter device: only the looked-up rows travel to a replica.

Keras's `ops.take` (which `Embedding` uses) calls `tf.gather` on the Keras variable; TensorFlow
would convert the variable to a dense tensor first, copying the whole table to every replica on
every step. dpkeras registers a `tf.gather` dispatcher for Keras variables (public API:
`tf.experimental.dispatch_for_api`): inside a dpkeras replica, a gather along axis 0 from a
`ParameterVariable` runs where the table is, and only its rows are sent; from a sharded table
(`ShardedParameterVariable`) each shard gathers its own ids. Everywhere else the dispatcher
does exactly what `tf.gather` did.
"""

import keras
import tensorflow as tf

from dpkeras import _tf_internals, replica_step
from dpkeras.sharded_variables import PLACED_TYPES

__all__ = []

_tf_internals.register_dispatchable_type(keras.Variable)


@tf.experimental.dispatch_for_api(tf.gather, {"params": keras.Variable})
def _gather(params, indices, validate_indices=None, axis=None, batch_dims=0, name=None):
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
