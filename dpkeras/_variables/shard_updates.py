"""Summing and updating a sharded variable shard by shard, where each shard lives.

The optimizer's path, one of three write modules (one concept each): `writes` is a
`ParameterVariable`'s writes by kind in a replica, `sharded_writes` a sharded variable's
`assign` and `scatter_*` cut into its shards. Cutting tensors and ids by rows is
`partitioning`'s.
"""

import keras
import tensorflow as tf

from dpkeras import _tf_internals
from dpkeras._cache import GraphCache
from dpkeras._variables import partitioning, pieces

_sums = GraphCache()  # name of a summed gradient -> (rows per shard, the per-shard sums)


def _key(x):
    return x.values if isinstance(x, tf.IndexedSlices) else x


def sum_by_shard(variable, components, reduce_components):
    """The sum of per-replica gradients of `variable`, made shard by shard where each lives.

    Each replica cuts its gradient into the shards' rows (sparse: each shard's ids) on its own
    device, and each shard's rows are summed on the shard's device: a row travels once, from
    the replica to the device that holds it. The result is one full-shape gradient (what
    Keras's clipping and update see); `shard_arguments` hands each shard its own sum, so an
    update uses the per-shard sums and the joined one is only computed if something else
    (clipping) reads it.

    Args:
        variable: the `ShardedParameterVariable`.
        components: list of per-replica gradients (tensors or `tf.IndexedSlices`).
        reduce_components: `ReductionLedger.reduce_components`.
    """
    sums = []
    for i, shard in enumerate(variable.shards):
        lo, hi = variable.offsets[i], variable.offsets[i + 1]
        sums.append(
            reduce_components(
                "SUM", [partitioning.row_slice(c, lo, hi) for c in components], shard.device
            )
        )
    if all(isinstance(s, tf.IndexedSlices) for s in sums):
        joined = tf.IndexedSlices(
            tf.concat([s.values for s in sums], 0),
            tf.concat([s.indices + lo for s, lo in zip(sums, variable.offsets)], 0),
            tf.constant(variable.shape.as_list()),
        )
    else:
        joined = tf.concat([tf.convert_to_tensor(s) for s in sums], 0)
    if not tf.executing_eagerly():
        key = _key(joined)
        _sums.set(key.name, (variable.rows, sums), graph=key.graph)
    return joined


def _own_sum(x, rows, index):
    key = _key(x)
    if not isinstance(key, tf.Tensor) or tf.executing_eagerly():
        return None
    found = _sums.get(key.name, graph=key.graph)
    return found[1][index] if found is not None and found[0] == rows else None


def shard_arguments(variable, index, structure):
    """`structure` with each full-variable-shaped tensor or gradient cut to shard `index`."""
    lo, hi = variable.offsets[index], variable.offsets[index + 1]
    full = variable.shape

    def cut(x):
        own = (
            _own_sum(x, variable.rows, index)
            if isinstance(x, (tf.Tensor, tf.IndexedSlices))
            else None
        )
        if own is not None:
            return own
        if isinstance(x, tf.IndexedSlices):
            return partitioning.row_slice(x, lo, hi)
        if isinstance(x, tf.Tensor) and x.shape.rank and x.shape.is_compatible_with(full):
            return partitioning.row_slice(x, lo, hi)
        return x

    return tf.nest.map_structure(cut, structure)


def update_by_shard(variable, fn, args, kwargs):
    """`fn(variable, *args, **kwargs)` once per shard, on its device, in update context.

    Full-shape tensors and gradients in `args`/`kwargs` are cut to the shard's rows
    (`shard_arguments`), and inside, `variable` and every variable sharded like it (its
    optimizer slots) act as that shard (`pieces.shard`), so Keras's update step, weight decay
    and EMA run unchanged on shard-sized tensors.

    Returns:
        A tuple of what `fn` returned for each shard, with TensorFlow ops and tensors only.
    """
    results = []
    for i, shard in enumerate(variable.shards):
        shard_args = shard_arguments(variable, i, args)
        shard_kwargs = shard_arguments(variable, i, kwargs)
        with (
            tf.device(shard.device),
            _tf_internals.UpdateContext(shard.device),
            pieces.shard(variable, i),
        ):
            results.append(fn(variable, *shard_args, **shard_kwargs))
    return tuple(r for r in tf.nest.flatten(results) if isinstance(r, (tf.Tensor, tf.Operation)))


# Optimizers whose update of a variable is row by row (elementwise, with scalar state), so that
# updating shard by shard equals updating the whole variable. Not Adafactor, Lamb or Muon: they
# factor or normalise over the whole variable.
ROW_WISE_OPTIMIZERS = (
    keras.optimizers.SGD,
    keras.optimizers.Adam,
    keras.optimizers.AdamW,
    keras.optimizers.Adagrad,
    keras.optimizers.RMSprop,
    keras.optimizers.Adadelta,
    keras.optimizers.Adamax,
    keras.optimizers.Nadam,
    keras.optimizers.Ftrl,
    keras.optimizers.Lion,
)
