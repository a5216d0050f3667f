"""Sizes in bytes: one definition for placement, the report, transfer counts and the benchmark."""

import tensorflow as tf


def nbytes(shape, dtype):
    """Bytes a tensor of `shape` and `dtype` holds; 0 when the shape is not fully known.

    Args:
        shape: a `tf.TensorShape`, a tuple or list of ints (None for unknown), or None.
        dtype: anything `tf.as_dtype` accepts.

    Returns:
        int. `nbytes((1000, 64), "float32")` is 256000.
    """
    if shape is None:
        return 0
    count = tf.TensorShape(shape).num_elements()
    return 0 if count is None else count * tf.as_dtype(dtype).size


def human_bytes(n):
    """`256000` -> `'250.0 KB'` (units of 1024, one decimal); `512` -> `'512 B'`."""
    for unit in ("B", "KB", "MB"):
        if n < 1024:
            return f"{n:,} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return f"{n:,.1f} GB"
