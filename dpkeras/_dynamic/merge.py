"""One training step's ids from every replica, deduplicated per task, then once for the index."""

import tensorflow as tf


def _task(device):
    """The CPU of the task of `device` (where a worker's replicas' ids are deduplicated)."""
    spec = tf.DeviceSpec.from_string(device)
    return spec.replace(device_type="CPU", device_index=0).to_string()


def _runs(strategy, n):
    """Consecutive replicas on the same task, as `[(replica ids, task CPU or None)]`."""
    if n == 1:
        return [([0], None)]
    runs = []
    for replica, device in enumerate(strategy.extended.worker_devices[:n]):
        host = _task(device)
        if runs and runs[-1][1] == host:
            runs[-1][0].append(replica)
        else:
            runs.append(([replica], host))
    return runs


def _unique_counts(ids, counts):
    union, where = tf.unique(tf.concat(ids, 0), out_idx=tf.int64)
    total = tf.math.unsorted_segment_sum(tf.concat(counts, 0), where, tf.size(union))
    return union, where, total


class StepIds:
    """The distinct ids of one step over every replica, in the order of the global batch.

    Each replica's distinct ids (with how often it saw each) are deduplicated again per task,
    on the task's CPU, so a worker sends each distinct id once however many replicas it runs;
    the tasks' ids are deduplicated once more on the index's device. Replicas are taken in
    order, so `ids` is in first-seen order of the global batch, as one device would see it.

    Attributes:
        ids: int64, the distinct ids (on `device`).
        seen: int64, how often each was seen in the step.
    """

    def __init__(self, strategy, ids, counts, device):
        self._runs = _runs(strategy, len(ids))
        self._device = device
        self._task_ids = []
        for replicas, host in self._runs:
            with tf.device(host):
                union, where, total = _unique_counts(
                    [ids[r] for r in replicas], [counts[r] for r in replicas]
                )
            sizes = [tf.size(ids[r]) for r in replicas]
            self._task_ids.append((union, where, total, sizes))
        with tf.device(device):
            self.ids, self._where, self.seen = _unique_counts(
                [t[0] for t in self._task_ids], [t[2] for t in self._task_ids]
            )

    def per_replica(self, rows):
        """Splits `rows` (one per id of `ids`) back into each replica's rows, in order."""
        with tf.device(self._device):
            per_task = tf.split(self._where, [tf.size(t[0]) for t in self._task_ids])
            task_rows = [tf.gather(rows, where) for where in per_task]
        out = []
        for (_, host), (_, where, _, sizes), mine in zip(self._runs, self._task_ids, task_rows):
            with tf.device(host):
                out += [tf.gather(mine, w) for w in tf.split(where, sizes)]
        return out
