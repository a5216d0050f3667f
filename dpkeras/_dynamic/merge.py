"""One training step's ids from every replica, deduplicated per task, then once for the index."""

import tensorflow as tf

from dpkeras import _device_names as device_names


def _runs(strategy, n):
    """Consecutive replicas on the same task, as `[(replica ids, task CPU or None)]`."""
    if n == 1:
        return [([0], None)]
    return device_names.replicas_by_host(strategy.extended.worker_devices[:n])


def _unique_counts(ids, counts, strings=None):
    """Distinct ids, where each input went, total counts; with `strings` (one per id) also
    the string of each distinct id's first occurrence and how many inputs carried another."""
    union, where = tf.unique(tf.concat(ids, 0), out_idx=tf.int64)
    total = tf.math.unsorted_segment_sum(tf.concat(counts, 0), where, tf.size(union))
    if strings is None:
        return union, where, total, None, None
    strings = tf.concat(strings, 0)
    first = tf.math.unsorted_segment_min(
        tf.range(tf.size(where, out_type=tf.int64)), where, tf.size(union)
    )
    kept = tf.gather(strings, first)
    clashes = tf.reduce_sum(tf.cast(tf.gather(kept, where) != strings, tf.int64))
    return union, where, total, kept, clashes


def distinct(ids, strings=None):
    """One replica's distinct ids, where each id went, counts; with `strings` (the strings
    hashed to `ids`) the first string of each and how many ids carried another."""
    return _unique_counts([ids], [tf.ones_like(ids)], None if strings is None else [strings])


class StepIds:
    """The distinct ids of one step over every replica, in the order of the global batch.

    Each replica's distinct ids (with how often it saw each) are deduplicated again per task,
    on the task's CPU, so a worker sends each distinct id once however many replicas it runs;
    the tasks' ids are deduplicated once more on the index's device. Replicas are taken in
    order, so `ids` is in first-seen order of the global batch, as one device would see it.

    With `strings` (string ids hashed to `ids`: per replica, the string of each id), the
    merge keeps the first string of each id and counts the ids that arrived with another
    string (a hash collision across replicas or tasks).

    Attributes:
        ids: int64, the distinct ids (on `device`).
        seen: int64, how often each was seen in the step.
        strings: the string of each id (first seen), or None.
        clashes: int64 scalar, ids that arrived with a string other than the one kept, or None.
    """

    def __init__(self, strategy, ids, counts, device, strings=None):
        self._runs = _runs(strategy, len(ids))
        self._device = device
        self._task_ids = []
        clashes = []
        for replicas, host in self._runs:
            with tf.device(host):
                union, where, total, kept, clash = _unique_counts(
                    [ids[r] for r in replicas],
                    [counts[r] for r in replicas],
                    None if strings is None else [strings[r] for r in replicas],
                )
            sizes = [tf.size(ids[r]) for r in replicas]
            self._task_ids.append((union, where, total, sizes, kept))
            clashes.append(clash)
        with tf.device(device):
            self.ids, self._where, self.seen, self.strings, clash = _unique_counts(
                [t[0] for t in self._task_ids],
                [t[2] for t in self._task_ids],
                None if strings is None else [t[4] for t in self._task_ids],
            )
            self.clashes = None if strings is None else tf.add_n(clashes + [clash])

    def per_replica(self, rows):
        """Splits `rows` (one per id of `ids`) back into each replica's rows, in order."""
        with tf.device(self._device):
            per_task = tf.split(self._where, [tf.size(t[0]) for t in self._task_ids])
            task_rows = [tf.gather(rows, where) for where in per_task]
        out = []
        for (_, host), (_, where, _, sizes, _), mine in zip(self._runs, self._task_ids, task_rows):
            with tf.device(host):
                out += [tf.gather(mine, w) for w in tf.split(where, sizes)]
        return out
