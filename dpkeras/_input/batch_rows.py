"""The rows of a batch, whatever its components: dense, ragged or sparse tensors, or None.

A Keras batch may hold a `tf.RaggedTensor` (multi-hot ids), a `tf.SparseTensor`, an optional
input given as None, and scalars beside dense tensors. Counting a replica's examples
(`keras_steps.gradient_weights`) and cutting a global batch into the replicas' slices
(`dpkeras._input.shares`, and each input host's pipeline, `dpkeras._input.sharding`) all need
each component's rows: this module is the one answer to "how many rows, and rows lo..hi" for
every kind.
"""

import tensorflow as tf


def is_dense_batch(x):
    """Whether `x` is a dense tensor with a batch dimension (of known rank, not a scalar)."""
    return isinstance(x, tf.Tensor) and x.shape.rank not in (None, 0)


def has_rows(x):
    """Whether `x` has a batch dimension: a ragged or sparse tensor, or a dense batch."""
    return isinstance(x, (tf.RaggedTensor, tf.SparseTensor)) or is_dense_batch(x)


def in_batch(x):
    """Whether `x` is cut with the rows of a batch it is part of: a ragged or sparse tensor, or
    a dense tensor that is not a scalar. Its rank may be unknown: an input pipeline's batch
    (read from files, say) has rows whatever its static shape says."""
    if isinstance(x, tf.Tensor):
        return x.shape.rank != 0
    return isinstance(x, (tf.RaggedTensor, tf.SparseTensor))


def first_in_batch(structure):
    """The first component of a batch `structure` (flattened) that `in_batch`, or None."""
    return next((x for x in tf.nest.flatten(structure) if in_batch(x)), None)


def static_rows(x):
    """The number of rows of `x` when its shape says it, else None."""
    rows = x.shape[0]
    return rows if isinstance(rows, int) else None


def rows(x, out_type=tf.int32):
    """The number of rows of `x` (a tensor of `out_type`)."""
    if isinstance(x, tf.RaggedTensor):
        return tf.cast(x.nrows(), out_type)
    if isinstance(x, tf.SparseTensor):
        return tf.cast(x.dense_shape[0], out_type)
    return tf.shape(x, out_type=out_type)[0]


def device_of(x):
    """The device of `x`'s row structure."""
    if isinstance(x, tf.RaggedTensor):
        return x.row_splits.device
    if isinstance(x, tf.SparseTensor):
        return x.indices.device
    return x.device


def slice_rows(x, lo, hi):
    """Rows `lo`..`hi - 1` of `x`; None and values without rows (scalars) as they are.

    A `SparseTensor` cannot be indexed with `[lo:hi]`: it is cut with `tf.sparse.slice`, its
    other dimensions whole, and keeps its static shape but the rows.
    """
    if isinstance(x, tf.SparseTensor):
        lo, hi = tf.cast(lo, tf.int64), tf.cast(hi, tf.int64)
        rest = x.dense_shape[1:]
        start = tf.concat([[lo], tf.zeros_like(rest)], 0)
        piece = tf.sparse.slice(x, start, tf.concat([[hi - lo], rest], 0))
        piece.set_shape(tf.TensorShape([None]).concatenate(x.shape[1:]))
        return piece
    return x[lo:hi] if in_batch(x) else x


def slice_batch(batch, lo, hi):
    """`slice_rows` of every component of `batch` (a nest; None kept as None)."""
    return tf.nest.map_structure(lambda x: slice_rows(x, lo, hi), batch)


def static_rows_of_spec(element_spec):
    """The rows every element of a dataset of batches has, from its `element_spec`: those of
    the first component that has rows (a dense, ragged or sparse spec that is not a scalar),
    when its spec says them; else None."""
    for spec in tf.nest.flatten(element_spec):
        shape = getattr(spec, "shape", None)
        if isinstance(spec, tf.TypeSpec) and shape is not None and shape.rank != 0:
            rows = None if shape.rank is None else tf.TensorShape(shape)[0]
            return rows if isinstance(rows, int) else None
    return None


def with_rows(batch, rows):
    """`batch` (a nest) with the dense components that have rows known to have `rows` rows
    (a static shape: an `Identity` where it is called, in an input pipeline's map; ragged,
    sparse, None and scalars as they are)."""

    def known(x):
        if is_dense_batch(x) and static_rows(x) is None:
            x = tf.identity(x)
            x.set_shape([rows, *x.shape[1:]])
        return x

    return tf.nest.map_structure(known, batch)
