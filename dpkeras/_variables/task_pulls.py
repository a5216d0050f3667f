"""A worker's replicas pull each distinct id's row once: lookups merged per task of a cluster.

On a cluster whose workers run several replicas (GPUs), each replica's distinct ids would be
sent to the table, and their rows back, once per replica: an id two GPUs of one worker both
look up would cross the network twice. Here the replicas of one task merge their distinct ids
on the task's host CPU (a `merge_call`), the union crosses once, and each replica receives its
own rows from the host. On one machine, and on a cluster whose workers run one replica each,
nothing is merged: each replica's rows are already the fewest its link can carry.

`Union` is the merge itself (concatenate, unique, and split the rows back), the one
implementation of it: `DynamicEmbedding`'s step ids (`dpkeras._dynamic.merge`) merge per task
and then once more for the index with it.
"""

import functools

import tensorflow as tf

from dpkeras import _device_names as device_names
from dpkeras._variables import dedup


class Union:
    """Vectors of distinct ids merged on one device: their union, and each vector's way back.

    Two replicas of one task with ids `[7, 3]` and `[3, 9]` give `ids` `[7, 3, 9]` (first
    seen first); `split(rows)` of the union's rows `[r7, r3, r9]` is `[[r7, r3], [r3, r9]]`.
    One vector is its own union: nothing runs, and `split` returns the rows as they are.

    Args:
        parts: list of vectors of distinct ids (each replica's, or each task's union).
        device: where the union is made and the rows split back (a task's host CPU).

    Attributes:
        ids: the distinct ids of all `parts`, in first-seen order.
        where: int64, for each id of the concatenated parts its position in `ids`; None for
            one part.
        device: as given.
    """

    def __init__(self, parts, device):
        self.device = device
        if len(parts) == 1:
            self.ids, self.where, self._sizes = parts[0], None, None
            return
        with tf.device(device):
            self.ids, self.where = tf.unique(tf.concat(parts, 0), out_idx=tf.int64)
            self._sizes = [tf.size(p) for p in parts]

    def split(self, rows):
        """Each part's rows (a list, in order) from `rows`, one row per id of `ids`."""
        if self.where is None:
            return [rows]
        with tf.device(self.device):
            return [tf.gather(rows, w) for w in tf.split(self.where, self._sizes)]


def by_task(strategy, per_replica):
    """`[(replica ids, Union)]`, one per task of `strategy`'s replicas: the `Union` of their
    vectors `per_replica` (a list in replica order) on the task's host CPU. One replica is one
    task: nothing to merge, and no device asked for (the default strategy has none)."""
    if len(per_replica) == 1:
        return [([0], Union(per_replica, None))]
    devices = strategy.extended.worker_devices[: len(per_replica)]
    return [
        (replicas, Union([per_replica[r] for r in replicas], host))
        for replicas, host in device_names.replicas_by_task(devices)
    ]


def applies(extended):
    """Whether `extended` merges lookups per task: on a cluster, some task runs 2+ replicas."""
    return extended.cluster_spec is not None and any(
        len(replicas) > 1 for replicas, _ in device_names.replicas_by_task(extended.worker_devices)
    )


def lookup(extended, gather, indices, name=None):
    """In a replica: the rows of `indices`, each distinct id pulled once (once per task where
    `applies`), expanded to the shape of `indices` where the replica computes.

    Args:
        extended: the `ParameterDeviceExtended`.
        gather: callable, a vector of distinct ids -> their rows, gathered where they live.
        indices: the ids looked up (any shape).
        name: the result's name.
    """
    ids, positions = dedup.unique_ids(indices)
    pulled = rows(extended, gather, ids) if applies(extended) else gather(ids)
    return dedup.expand_rows(pulled, positions, indices, name=name)


def rows(extended, gather, ids):
    """In a replica: the rows of this replica's distinct `ids`, pulled once per task.

    Args:
        extended: the `ParameterDeviceExtended`.
        gather: callable, a vector of distinct ids -> their rows, gathered where they live.
        ids: this replica's distinct ids (a vector).
    """
    ctx = tf.distribute.get_replica_context()
    replica = tf.get_static_value(ctx.replica_id_in_sync_group)
    # `gather` in a closure: merge_call would regroup a per-replica argument.
    pull = functools.partial(_pull, gather=gather)
    return ctx.merge_call(pull, args=(ids,))[int(replica or 0)]


def _pull(strategy, ids, gather):
    """Each replica's rows (a list in replica order); a task's replicas share one pull."""
    tasks = by_task(strategy, list(strategy.experimental_local_results(ids)))
    return [mine for _, task in tasks for mine in task.split(gather(task.ids))]
