"""A hash table cut by id over several devices: the index of a sharded `DynamicEmbedding`."""

import tensorflow as tf

from dpkeras import _device_names as device_names
from dpkeras import _tf_internals


class ShardedHashTable:
    """`tf.lookup.experimental.MutableHashTable`s, one per device, each holding the ids with
    `id % len(devices)` equal to its position: an id's entry lives on one device, and a
    lookup, insert or removal sends each table only its own ids.

    It offers the part of `MutableHashTable`'s interface the index uses (`lookup`, `insert`,
    `remove`, `export`, `size`). With one device it is that one table, with no partitioning.

    Args:
        devices: list of device strings, one table each (CPU devices: TensorFlow's hash tables
            have CPU kernels only).
        value_dtype: the values' dtype (keys are int64).
        default_value: what an absent id looks up.
        name: the tables' name; shard i > 0 is `<name>_<i>`.
    """

    def __init__(self, devices, value_dtype, default_value, name):
        self.devices = list(devices)
        self.default_value = default_value
        self.tables = []
        for i, device in enumerate(self.devices):
            with tf.init_scope(), tf.device(device):
                self.tables.append(
                    tf.lookup.experimental.MutableHashTable(
                        tf.int64,
                        value_dtype,
                        default_value=default_value,
                        name=name if i == 0 else f"{name}_{i}",
                        # Not shared by name: an eager table's shared name is "table_<n>", n
                        # counted per process, so a client that made its tables in the same
                        # order as a killed client before it, on the same ps task, was given
                        # that client's table (its ids, counts and rows) instead of a new one.
                        experimental_is_anonymous=True,
                    )
                )

    def remake_on(self, task):
        """Makes the tables that lived on `task` (restarted: they are gone) again, empty;
        returns how many. Their entries then come from a backup."""
        made = 0
        for table, device in zip(self.tables, self.devices):
            if device_names.task_of(device_names.canonical_device(device)) == task:
                for name, value in _tf_internals.new_table_state(
                    table, device, self.default_value
                ).items():
                    setattr(table, name, value)
                made += 1
        return made

    def _each(self, ids):
        """`(table, device, its ids, their positions in ids)` for each table."""
        n = len(self.tables)
        owner = tf.cast(tf.math.floormod(ids, n), tf.int32)
        parts = tf.dynamic_partition(ids, owner, n)
        positions = tf.dynamic_partition(tf.range(tf.size(ids)), owner, n)
        return zip(self.tables, self.devices, parts, positions)

    def lookup(self, ids):
        """Values of `ids` (a vector), the default for absent ones; each table on its device."""
        if len(self.tables) == 1:
            return self.tables[0].lookup(ids)
        found, positions = [], []
        for table, device, part, where in self._each(ids):
            with tf.device(device):
                found.append(table.lookup(part))
            positions.append(where)
        return tf.dynamic_stitch(positions, found)

    def insert(self, ids, values):
        """Sets `ids` (a vector) to `values`, each in its table."""
        if len(self.tables) == 1:
            return self.tables[0].insert(ids, values)
        ops = []
        for table, device, part, where in self._each(ids):
            with tf.device(device):
                ops.append(table.insert(part, tf.gather(values, where)))
        return tf.group(ops)

    def remove(self, ids):
        """Removes `ids` (a vector), each from its table."""
        if len(self.tables) == 1:
            return self.tables[0].remove(ids)
        ops = []
        for table, device, part, _ in self._each(ids):
            with tf.device(device):
                ops.append(table.remove(part))
        return tf.group(ops)

    def export(self):
        """`(keys, values)` of every table, concatenated."""
        exported = []
        for table, device in zip(self.tables, self.devices):
            with tf.device(device):
                exported.append(table.export())
        return (
            tf.concat([keys for keys, _ in exported], 0),
            tf.concat([values for _, values in exported], 0),
        )

    def size(self):
        """How many ids the tables hold."""
        sizes = []
        for table, device in zip(self.tables, self.devices):
            with tf.device(device):
                sizes.append(table.size())
        return tf.add_n(sizes)
