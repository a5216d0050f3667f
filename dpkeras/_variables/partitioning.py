"""How a variable is cut into shards: TensorFlow's partitioners, validated, and the row split
(how many rows each shard holds, and a tensor's or a list of ids' part of each shard)."""

import contextlib
import threading

import tensorflow as tf

_state = threading.local()


def as_partitioner(partitioner, what="partitioner"):
    """`partitioner` if it is None or callable, else a ValueError naming what was received."""
    if partitioner is None or callable(partitioner):
        return partitioner
    raise ValueError(
        f"{what} must be one of tf.distribute.experimental.partitioners (such as "
        f"FixedShardsPartitioner(2)) or a callable (shape, dtype) -> list of partitions per "
        f"axis, or None. Received: {partitioner!r} (of type {type(partitioner).__name__})"
    )


@contextlib.contextmanager
def partitioner_scope(partitioner, explicit=False):
    """Variables created in this block (on this thread) are cut by `partitioner`.

    Args:
        partitioner: the partitioner, or None (no partitioning in the block).
        explicit: True when one variable is asked for by name (`get_variable(partitioner=)`):
            it is cut whatever its kind, and a scalar is an error. False for a scope
            (`variable_scope(partitioner=)`), which cuts layer weights of rank 1 or more, as
            the strategy's partitioner does.
    """
    as_partitioner(partitioner)
    saved = getattr(_state, "stack", ())
    _state.stack = saved + ((partitioner, explicit),)
    try:
        yield
    finally:
        _state.stack = saved


def current_partitioner():
    """`(True, P, explicit)` inside a `partitioner_scope`, else `(False, None, False)`."""
    stack = getattr(_state, "stack", ())
    return (True, *stack[-1]) if stack else (False, None, False)


def row_split(partitioner, shape, dtype, path, explicit):
    """Rows per shard for a variable of `shape`, as `partitioner` asks; `None`: do not shard.

    A partitioner is one of TensorFlow's `tf.distribute.experimental.partitioners`
    (`FixedShardsPartitioner`, `MinSizePartitioner`, `MaxSizePartitioner`) or any callable with
    their signature, `partitioner(shape: tf.TensorShape, dtype: tf.DType) -> [int per axis]`.
    dpkeras cuts along axis 0 only, into contiguous blocks of rows ("div" ids, as TensorFlow does):
    the first `rows % n` shards get one row more. A 10-row table in 3 shards holds rows 0-3, 4-6
    and 7-9; row 5 is row 1 of shard 1.

    Where a partitioner comes from, innermost first: `partitioner_scope(P)` (what TF1's
    `get_variable(partitioner=...)` and `variable_scope(partitioner=...)` set), then the
    strategy's `partitioner=` (applied to the layers' weights, not to optimizer state, metrics or
    random seeds). No partitioner means no sharding.

    Args:
        partitioner: the callable, or None.
        shape: tuple of int, the full shape.
        dtype: the variable's dtype.
        path: the variable's path, for messages.
        explicit: whether the user asked for this variable to be partitioned (TF1's
            `partitioner=`); a scalar is then an error rather than left whole.

    Raises:
        ValueError: for a scalar (when explicit), an unknown shape, a partitioner that fails
            or returns anything but one positive int per axis with 1 on every axis but the
            first, or more shards than rows.
    """
    if partitioner is None:
        return None
    if shape is None or any(d is None for d in shape):
        raise ValueError(
            f"Variable {path!r} cannot be partitioned: its shape {shape} is not fully known. "
            f"Give it a shape, or create it outside the partitioner's scope."
        )
    if len(shape) == 0:
        if explicit:
            raise ValueError(
                f"Variable {path!r} is a scalar and cannot be partitioned by {partitioner!r}; "
                f"only variables of rank 1 or more are cut (along axis 0)."
            )
        return None
    try:
        parts = partitioner(tf.TensorShape(shape), tf.as_dtype(dtype))
    except Exception as e:  # a user callable may raise anything: say which variable
        raise ValueError(
            f"The partitioner {partitioner!r} failed for variable {path!r} (shape {shape}, "
            f"{tf.as_dtype(dtype).name}): {type(e).__name__}: {e}"
        ) from e
    expected = f"a list of {len(shape)} positive ints (one per axis, 1 on every axis but axis 0)"
    try:
        raw = list(parts)
        parts = [int(p) for p in raw]
        exact = all(isinstance(p, bool) is False and int(p) == p for p in raw)
    except (TypeError, ValueError):
        parts, exact = parts, False
    if not exact or len(parts) != len(shape):
        raise ValueError(
            f"The partitioner {partitioner!r} returned {parts!r} for variable {path!r} of "
            f"shape {shape}; expected {expected}."
        )
    if any(p < 1 for p in parts):
        raise ValueError(
            f"The partitioner {partitioner!r} returned {parts!r} for variable {path!r}: "
            f"every count must be at least 1; expected {expected}."
        )
    if any(p != 1 for p in parts[1:]):
        raise ValueError(
            f"The partitioner {partitioner!r} returned {parts!r} for variable {path!r}: "
            f"dpkeras cuts along axis 0 only; expected {expected}."
        )
    n, rows = parts[0], shape[0]
    if n > rows:
        raise ValueError(
            f"The partitioner {partitioner!r} asks for {n} shards of variable {path!r}, "
            f"which has only {rows} rows (shape {shape}); a shard needs at least one row."
        )
    if n == 1:
        return None
    base, extra = divmod(rows, n)
    return [base + (1 if i < extra else 0) for i in range(n)]


def offsets(rows_per_shard):
    """`[0, r0, r0 + r1, ..., total]`: shard i holds rows `offsets[i]:offsets[i + 1]`."""
    out = [0]
    for r in rows_per_shard:
        out.append(out[-1] + r)
    return out


def row_slice(x, lo, hi):
    """Rows `lo:hi` of a dense tensor or of `tf.IndexedSlices` (ids made local), at the source."""
    device = getattr(x.values if isinstance(x, tf.IndexedSlices) else x, "device", "") or None
    with tf.device(device):
        if isinstance(x, tf.IndexedSlices):
            keep = tf.logical_and(x.indices >= lo, x.indices < hi)
            shape = tf.concat([tf.constant([hi - lo], x.dense_shape.dtype), x.dense_shape[1:]], 0)
            return tf.IndexedSlices(
                tf.boolean_mask(x.values, keep),
                tf.boolean_mask(x.indices, keep) - tf.cast(lo, x.indices.dtype),
                shape,
            )
        return x[lo:hi]


def partition_ids(flat_ids, offsets):
    """Per shard: the local ids of `flat_ids` it holds, and their positions in `flat_ids`."""
    n = len(offsets) - 1
    bounds = tf.constant(offsets[1:-1], dtype=flat_ids.dtype)
    shard = tf.searchsorted(bounds, flat_ids, side="right", out_type=tf.int32)
    local = flat_ids - tf.gather(tf.constant(offsets[:-1], dtype=flat_ids.dtype), shard)
    positions = tf.range(tf.size(flat_ids))
    return tf.dynamic_partition(local, shard, n), tf.dynamic_partition(positions, shard, n)
