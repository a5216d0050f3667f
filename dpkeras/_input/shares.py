"""Each replica's share of a global batch: TensorFlow's split rule, and a whole batch cut by it.

A global batch of b rows over n replicas is cut into n contiguous slices whose sizes differ by at
most one, the larger first (101 over 2: 51, 50; 10 over 4: 3, 3, 2, 2), as TensorFlow's
rebatching cuts it. Two places cut by this one rule: each input host's pipeline on a cluster
(`dpkeras._input.sharding`), and a Keras step handed one whole batch (`cut_whole_batch`), on one
machine or a cluster.
"""

import tensorflow as tf

from dpkeras import _tf_internals
from dpkeras._input import batch_rows

# The name scope of the replicas' shares of a whole batch, cut in the step: what
# `dpkeras.record_transfers` reports as the batch crossing (`Transfer.of_the_batch`).
BATCH_SHARE_SCOPE = "dpkeras_batch_share"


def replica_start(replica, rows, num_replicas):
    """First row of `replica`'s slice of a batch of `rows` rows: TensorFlow's split (sizes
    differ by at most one, larger first: 10 rows over 4 replicas are 3, 3, 2, 2)."""
    per, extra = rows // num_replicas, rows % num_replicas
    return replica * per + min(replica, extra)


def replica_start_in_graph(replica, rows, num_replicas):
    """`replica_start` of integer tensors (one dtype), in a pipeline's or a step's functions."""
    per, extra = rows // num_replicas, rows % num_replicas
    return replica * per + tf.minimum(replica, extra)


def cut_whole_batch(args, kwargs, n, host):
    """`(args, kwargs)` of a Keras step handed one whole batch, as each replica's share of it.

    A Keras step gets a whole batch, not a distributed one, in two ways. Keras's
    `train_on_batch`, `test_on_batch` and `predict_on_batch` pass their batch itself to
    `strategy.run`: under any strategy each of the `n` replicas then ran the step on every
    row, and predict's outputs came back `n` times (6 rows for a batch of 3 on 2 replicas;
    Keras's trainer_test `test_nested_inputs`). And on one machine whose replicas are CPUs,
    Keras's epoch loop reads whole batches from the host (`dpkeras._input.plan`,
    `whole_batches`). Each component with rows (dense, ragged or sparse) becomes a
    `PerReplica` of its contiguous slices, the ones TensorFlow's rebatching would give each
    replica (101 rows over 2: 51, 50); None and scalars stay as they are. Weighting by each
    replica's rows (`keras_steps.gradient_weights`) and concatenating predict's outputs then
    work as for a distributed dataset. A batch of known rows is cut at known rows, so an even
    split keeps its static shape. The cut runs on the batch's device, else (a batch read inside
    a traced step) on `host`, this process's CPU where Keras's iterator is: each replica
    receives its share only.
    """
    first = batch_rows.first_in_batch((args, kwargs))
    if first is None:
        return args, kwargs
    total = batch_rows.static_rows(first) if isinstance(first, tf.Tensor) else None
    if total is not None:
        bounds = [replica_start(r, total, n) for r in range(n + 1)]
    else:
        with tf.device(batch_rows.device_of(first) or host):
            total = batch_rows.rows(first)
            bounds = [replica_start_in_graph(r, total, n) for r in range(n + 1)]

    def shares(x):
        if not batch_rows.in_batch(x):
            return x
        # Cut where the batch is: each replica then receives only its share.
        with tf.device(batch_rows.device_of(x) or host), tf.name_scope(BATCH_SHARE_SCOPE):
            parts = [batch_rows.slice_rows(x, lo, hi) for lo, hi in zip(bounds, bounds[1:])]
        return _tf_internals.regroup(parts, always_wrap=True)

    return tf.nest.map_structure(shares, (args, kwargs))
