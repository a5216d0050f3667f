"""Embedding lookups on the parameter device: only the looked-up rows travel to a replica."""

import tensorflow as tf

from dpkeras._variables import placed, replica_step


def gather(params, indices, validate_indices=None, axis=None, batch_dims=0, name=None):
    """`tf.gather` on a Keras variable: on the parameter device inside a dpkeras replica.

    Registered with TensorFlow's dispatch API for `tf.gather(params=keras.Variable)` by an
    entry of dpkeras._patches.table while dpkeras is in use.

    Keras's `ops.take` (which `Embedding` uses) calls `tf.gather` on the Keras variable, and
    TensorFlow would convert the variable to a dense tensor first, copying the whole table to
    every replica on every step. Inside a dpkeras replica, a gather along axis 0 from a
    `ParameterVariable` runs where the table is, and only its rows are sent; from a sharded
    table (`ShardedParameterVariable`) each shard gathers its own ids. Everywhere else this
    does exactly what `tf.gather` does.
    """
    table = params.value  # the tf.Variable itself unless Keras autocasts this variable
    if (
        placed.of(table) is not None
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
