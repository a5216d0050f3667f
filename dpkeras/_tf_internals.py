"""Every private TensorFlow import dpkeras makes, in one place, each with its reason.

The public `tf.distribute` API lets users *use* a strategy, not *write* one: a strategy's
extended class, its replica threads, its distributed datasets and its value containers are all
private. Keeping those imports here means a TensorFlow upgrade breaks one file, and
`pyproject.toml` pins the TensorFlow minor version this file was checked against.
"""

# A new strategy must derive its extended class from StrategyExtendedV1: `Strategy.run` and
# `merge_call` reach `call_for_each_replica` and `_use_merge_call`, which only V1 defines.
# UpdateContext marks "inside extended.update" exactly as TF's own strategies do, so that code
# checking `tf.distribute.in_cross_replica_context()` behaves the same under dpkeras.
from tensorflow.python.distribute.distribute_lib import (  # noqa: F401
    InputContext,
    InputReplicationMode,
    StrategyExtendedV1,
    StrategyV1,
    UpdateContext,
    ValueContext,
)

# `Strategy.run` in TF strategies is a thread per replica, lock-stepped at `merge_call`
# (mirrored_run). It also turns a `tf.function` replica fn into one function holding all
# replicas, which Keras's TF trainer relies on. Writing our own would duplicate ~400 lines of
# delicate threading; CentralStorageStrategy reuses it in the same way.
from tensorflow.python.distribute.mirrored_run import (  # noqa: F401
    call_for_each_replica,
)

# Distributed datasets (rebatching a global batch into per-replica batches, prefetching to the
# compute devices, DistributedIterator) have no public constructor.
from tensorflow.python.distribute.input_util import (  # noqa: F401
    get_distributed_dataset,
    get_distributed_datasets_from_function,
)
from tensorflow.python.distribute.input_lib import InputWorkers  # noqa: F401

# PerReplica / Mirrored are what `strategy.run` returns and `experimental_local_results`
# unpacks; the public type `tf.distribute.DistributedValues` cannot be constructed.
from tensorflow.python.distribute.values import Mirrored, PerReplica  # noqa: F401
from tensorflow.python.distribute.distribute_utils import regroup, select_replica  # noqa: F401

# The global batch size tf.data will split over replicas, read from the dataset graph the same
# way TF's own rebatching does, so that a bad batch size fails before training.
from tensorflow.python.data.experimental.ops.distribute import (  # noqa: F401
    compute_batch_size,
)

# A cached replica-side read of a variable must be registered on the GradientTape as a read of
# that variable (ResourceVariable._read_variable_op does the same with this call); there is no
# public way to add an edge to the tape.
from tensorflow.python.eager.record import record_operation  # noqa: F401

# The variable class dpkeras hands to Keras is a ResourceVariable sharing the handle of the one
# the creator chain made; BaseResourceVariable is the only class with a handle-taking
# constructor.
from tensorflow.python.ops.resource_variable_ops import (  # noqa: F401
    BaseResourceVariable,
    is_resource_variable,
)

# Counting the tensors a traced step sends between devices needs the partitioned graphs TF
# actually runs; only the eager context's run-metadata switch exposes them.
from tensorflow.python.eager import context as _context


def enable_run_metadata():
    """Starts recording partition graphs of functions instantiated from now on."""
    _context.enable_run_metadata()


def export_and_disable_run_metadata():
    """Returns the recorded `RunMetadata` proto and stops recording."""
    try:
        return _context.export_run_metadata()
    finally:
        _context.disable_run_metadata()


def context_initialized():
    """Whether TensorFlow has already initialised its devices in this process."""
    return _context.context()._initialized  # pylint: disable=protected-access
