"""A worker's replicas pull each distinct id's row once: lookups merged per task of a cluster.

On a cluster whose workers run several replicas (GPUs), each replica's distinct ids would be
sent to the table, and their rows back, once per replica: an id two GPUs of one worker both
look up would cross the network twice. Here the replicas of one task merge their distinct ids
on the task's host CPU (a `merge_call`), the union crosses once, and each replica receives its
own rows from the host. On one machine, and on a cluster whose workers run one replica each,
nothing is merged: each replica's rows are already the fewest its link can carry.
"""

import functools

import tensorflow as tf

from dpkeras import _device_names as device_names
from dpkeras._variables import dedup


def replicas_by_task(extended):
    """`[(replica ids, host CPU)]`: consecutive replicas on one task (the order is the input's:
    replicas are grouped by task)."""
    return device_names.replicas_by_host(extended.worker_devices)


def applies(extended):
    """Whether `extended` merges lookups per task: on a cluster, some task runs 2+ replicas."""
    return extended.cluster_spec is not None and any(
        len(replicas) > 1 for replicas, _ in replicas_by_task(extended)
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
    per_replica = list(strategy.experimental_local_results(ids))
    out = []
    for replicas, host in replicas_by_task(strategy.extended):
        mine = [per_replica[r] for r in replicas]
        if len(mine) == 1:
            out.append(gather(mine[0]))
            continue
        with tf.device(host):
            union, where = tf.unique(tf.concat(mine, 0))
        pulled = gather(union)
        with tf.device(host):
            parts = tf.split(where, [tf.size(i) for i in mine])
            out += [tf.gather(pulled, part) for part in parts]
    return out
