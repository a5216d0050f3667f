"""keras-rs tables placed on "sparsecore" are refused by name under a dpkeras scope.

keras-rs's `DistributedEmbedding` places each table by its `TableConfig.placement`:
"sparsecore" needs a TPUStrategy on a TPU with SparseCore; "auto" and "default_device" give
one `keras.layers.Embedding` (keras-rs's `EmbedReduce`) per table, whose variable dpkeras keeps
on the parameter devices, sharded by the strategy's partitioner. dpkeras runs no TPU, so while
a dpkeras scope is entered a table on "sparsecore" is an error naming the tables, the
features that use them and the placements that work (keras-rs's own error names none).

An entry of the table (dpkeras._patches.table), installed with the others once keras-rs is
imported; the wrapper acts only when the current strategy is dpkeras's.
"""

import tensorflow as tf

from dpkeras._extended.extended import extended_of

EXPECTED = (
    "Expected: placement='auto' or 'default_device' (keras-rs's EmbedReduce table, which "
    "dpkeras keeps on its parameter devices and shards with the strategy's partitioner)."
)


def sparsecore_refusal(feature_configs, strategy):
    """The `ValueError` for `feature_configs` (`{path: FeatureConfig}`) placed on "sparsecore"."""
    tables = {}
    for path, config in feature_configs.items():
        name = getattr(getattr(config, "table", None), "name", None) or "(a TPU FeatureConfig)"
        tables.setdefault(name, []).append(path)
    listed = "; ".join(
        f"table {name!r} (features {', '.join(repr(p) for p in paths)})"
        for name, paths in sorted(tables.items())
    )
    return ValueError(
        f"dpkeras cannot place keras-rs tables on SparseCore, which needs a TPUStrategy on a "
        f"TPU with SparseCore: {listed}. Received: placement='sparsecore' under "
        f"{type(strategy).__name__} with replicas "
        f"{', '.join(strategy.extended.worker_devices)}. {EXPECTED}"
    )


def refuse_under_dpkeras(original, layer, feature_configs, table_stacking):
    """Stands in for keras-rs's `DistributedEmbedding._sparsecore_init` (an entry of
    dpkeras._patches.table): under a dpkeras strategy, the `sparsecore_refusal`."""
    strategy = tf.distribute.get_strategy()
    if extended_of(strategy) is not None:
        raise sparsecore_refusal(feature_configs, strategy)
    return original(layer, feature_configs, table_stacking)
