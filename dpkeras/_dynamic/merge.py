"""One training step's ids from every replica, deduplicated per task, then once for the index.

The merging itself is `dpkeras._variables.task_pulls.Union`, as for every lookup's per-task
pull; this module adds what the index needs beside the ids: how often each was seen, and,
for string ids, the string each id keeps and how many arrived with another.
"""

import tensorflow as tf

from dpkeras._variables import task_pulls


def _seen(union, counts):
    """How often each id of `union.ids` was seen, from each part's `counts` (one per id)."""
    if union.where is None:
        return counts[0]
    with tf.device(union.device):
        return tf.math.unsorted_segment_sum(tf.concat(counts, 0), union.where, tf.size(union.ids))


def _first_strings(union, strings):
    """`(string kept, clashes)`: the first string of each id of `union.ids`, from each part's
    `strings` (one per id), and how many ids arrived with another string (None for one part:
    a part's ids are distinct, each with one string)."""
    if union.where is None:
        return strings[0], None
    with tf.device(union.device):
        return _first_of(tf.concat(strings, 0), union.where, tf.size(union.ids))


def _first_of(strings, where, size):
    """`(string kept, clashes)` of `size` ids, from `strings` and each one's id `where`."""
    first = tf.math.unsorted_segment_min(tf.range(tf.size(where, out_type=tf.int64)), where, size)
    kept = tf.gather(strings, first)
    clashes = tf.reduce_sum(tf.cast(tf.gather(kept, where) != strings, tf.int64))
    return kept, clashes


def distinct(ids, strings=None):
    """One replica's distinct ids, where each id went, counts; with `strings` (the strings
    hashed to `ids`) the first string of each and how many ids carried another."""
    union, where = tf.unique(ids, out_idx=tf.int64)
    seen = tf.math.unsorted_segment_sum(tf.ones_like(ids), where, tf.size(union))
    if strings is None:
        return union, where, seen, None, None
    return (union, where, seen, *_first_of(strings, where, tf.size(union)))


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
        ids: int64, the distinct ids (on `device`; with one task, where that task merged them).
        seen: int64, how often each was seen in the step.
        strings: the string of each id (first seen), or None.
        clashes: int64 scalar, ids that arrived with a string other than the one kept, or None.
    """

    def __init__(self, strategy, ids, counts, device, strings=None):
        by_task = task_pulls.by_task(strategy, ids)
        self._tasks = [task for _, task in by_task]
        seen, kept, clashes = [], [], []
        for replicas, task in by_task:
            seen.append(_seen(task, [counts[r] for r in replicas]))
            if strings is not None:
                string, clash = _first_strings(task, [strings[r] for r in replicas])
                kept.append(string)
                clashes.append(clash)
        self._step = task_pulls.Union([task.ids for task in self._tasks], device)
        self.ids = self._step.ids
        self.seen = _seen(self._step, seen)
        self.strings = self.clashes = None
        if strings is not None:
            self.strings, clash = _first_strings(self._step, kept)
            clashes = [c for c in clashes + [clash] if c is not None]
            with tf.device(device):
                self.clashes = tf.add_n(clashes) if clashes else tf.constant(0, tf.int64)

    def per_replica(self, rows):
        """Splits `rows` (one per id of `ids`) back into each replica's rows, in order."""
        task_rows = self._step.split(rows)
        return [mine for task, r in zip(self._tasks, task_rows) for mine in task.split(r)]
