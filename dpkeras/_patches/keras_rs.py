"""keras-rs tables placed on "sparsecore" are refused by name under a dpkeras scope.

keras-rs's `DistributedEmbedding` places each table by its `TableConfig.placement`:
"sparsecore" needs a TPUStrategy on a TPU with SparseCore; "auto" and "default_device" give
one `keras.layers.Embedding` (keras-rs's `EmbedReduce`) per table, whose variable dpkeras keeps
on the parameter devices, sharded by the strategy's partitioner. dpkeras runs no TPU, so while
a dpkeras scope is entered a table on "sparsecore" is an error naming the tables, the
features that use them and the placements that work (keras-rs's own error names none).

Installed while a dpkeras scope is entered (counted across nesting and threads), if keras-rs
is imported by then; the wrapper acts only when the current strategy is dpkeras's.
"""

import contextlib
import threading

import tensorflow as tf

from dpkeras import _keras_internals
from dpkeras._extended.extended import ParameterDeviceExtended

_lock = threading.Lock()
_depth = 0
_restore = None

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


def _refuse_under_dpkeras(original, layer, feature_configs, table_stacking):
    strategy = tf.distribute.get_strategy()
    if isinstance(strategy.extended, ParameterDeviceExtended):
        raise sparsecore_refusal(feature_configs, strategy)
    return original(layer, feature_configs, table_stacking)


def installed():
    """Whether the wrapper is in place of keras-rs's method now."""
    with _lock:
        return _restore is not None


@contextlib.contextmanager
def installed_during(scope):
    """Enters `scope` with the wrapper installed (if keras-rs is imported); removes it when
    the last such scope is left."""
    global _depth, _restore
    with _lock:
        _depth += 1
        if _restore is None:
            _restore = _keras_internals.wrap_keras_rs_sparsecore_init(_refuse_under_dpkeras)
    try:
        with scope as entered:
            yield entered
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _restore is not None:
                _restore()
                _restore = None
