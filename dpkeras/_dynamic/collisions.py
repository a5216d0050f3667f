"""The strings behind hashed string ids, kept to count hash collisions."""

import tensorflow as tf

from dpkeras import _device_names as device_names
from dpkeras import _tf_internals


class KeyStrings:
    """For a `key_dtype="string"` layer: the string each id with a row was first seen as.

    A string id is its 63-bit fingerprint (`ids.hash_strings`); two strings with one
    fingerprint would share a row. Each step compares the strings arriving for known ids with
    the ones kept, and counts the mismatches (`DynamicEmbedding.collisions`); the strings of
    evicted ids are forgotten. A table on the index's device, beside it.
    """

    def __init__(self, layer_name, device):
        self.device = device
        with tf.init_scope(), tf.device(device):
            self.table = tf.lookup.experimental.MutableHashTable(
                tf.int64, tf.string, default_value="", name=f"{layer_name}_strings"
            )

    def remake_on(self, task):
        """Makes its table again, empty, if it lived on `task` (restarted); returns how many."""
        if device_names.task_of(device_names.canonical_device(self.device)) != task:
            return 0
        for name, value in _tf_internals.new_table_state(self.table, self.device, "").items():
            setattr(self.table, name, value)
        return 1

    def check(self, ids, strings, known, has_row):
        """Counts `known` ids arriving with another string than the one kept, and keeps the
        strings of ids with a row that have none kept (new rows; rows loaded from a file)."""
        with tf.device(self.device):
            kept = tf.reshape(self.table.lookup(ids), [-1])
            empty = tf.equal(kept, "")
            clash = known & tf.logical_not(empty) & tf.not_equal(kept, strings)
            keep = has_row & (empty | tf.logical_not(known))
            self.table.insert(tf.boolean_mask(ids, keep), tf.boolean_mask(strings, keep))
            return tf.reduce_sum(tf.cast(clash, tf.int64))

    def forget(self, ids):
        """Forgets the strings of `ids` (evicted)."""
        with tf.device(self.device):
            self.table.remove(ids)
