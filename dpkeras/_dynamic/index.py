"""The id -> row index of a `DynamicEmbedding` and the per-row bookkeeping beside the rows."""

import tensorflow as tf

from dpkeras._dynamic import policy
from dpkeras._dynamic.tables import ShardedHashTable

_NO_ROW = -1


def table_device(variable_device):
    """The device for a hash table beside a variable on `variable_device`.

    TensorFlow's hash tables have CPU kernels only: a table beside rows on a GPU goes to the
    CPU of the same task (a ps task's CPU on a cluster).
    """
    if not variable_device:
        return "/cpu:0"
    spec = tf.DeviceSpec.from_string(variable_device)
    if (spec.device_type or "").upper() == "CPU":
        return spec.to_string()
    return spec.replace(device_type="CPU", device_index=0).to_string()


class RowIndex:
    """Which row holds which id, and each row's count and last-seen step.

    State, beside the rows:
    - `table`: id -> row, cut by id over `devices` (one `MutableHashTable` per device of the
      rows' shards, `ShardedHashTable`: ids with `id % n == i` on the i-th); ids without a row
      look up -1;
    - `pending`: with `min_count > 1`, id -> times seen, for ids not yet admitted, cut the
      same way;
    - `row_ids`, `counts`, `last_seen` (vectors over rows; -1 is a free row), `step` (training
      calls so far) and `used` (rows below it were ever handed out): Keras weights of the layer
      (on `device`, the first of `devices`), so files and checkpoints hold them; `row_ids` is
      the index inverted, which `rebuild` turns back into `table` after a file is loaded.

    Rows are handed out in first-seen order (row 0 to the first id) until `used` reaches the
    capacity; then free rows (freed by eviction) are reused, lowest first, and with an eviction
    policy, rows not seen in this step are evicted to make room.
    """

    def __init__(self, layer_name, capacity, min_count, eviction, devices, weights):
        self.layer_name = layer_name
        self.capacity = capacity
        self.min_count = min_count
        self.eviction = eviction
        self.devices = list(devices)
        self.device = self.devices[0]
        self.row_ids, self.counts, self.last_seen, self.step, self.used = weights
        self.on_evict = None  # called with the ids losing their row, if set
        self.table = ShardedHashTable(self.devices, tf.int64, _NO_ROW, f"{layer_name}_index")
        self.pending = (
            ShardedHashTable(self.devices, tf.int64, 0, f"{layer_name}_pending")
            if min_count > 1
            else None
        )

    def remake_on(self, task):
        """Makes its hash tables that lived on `task` (restarted) again, empty; returns how
        many. (Its rows and counts are variables, made again with the strategy's.)"""
        made = self.table.remake_on(task)
        return made + (0 if self.pending is None else self.pending.remake_on(task))

    # -- reading ------------------------------------------------------------------------------

    def lookup(self, ids):
        """Rows of `ids` (int64), -1 for ids without a row. Changes nothing."""
        with tf.device(self.device):
            return tf.reshape(self.table.lookup(ids), [-1])

    def size(self):
        """How many ids have a row."""
        with tf.device(self.device):
            return self.table.size()

    # -- training -----------------------------------------------------------------------------

    def update(self, ids, seen, on_new_rows):
        """Records one training step's distinct `ids`, each seen `seen` times; returns rows.

        Known ids count their sightings and take this step as last seen. Unknown ids count
        toward `min_count`; those reaching it get a row, and `on_new_rows(ids, rows)`
        initialises those rows (the vectors and the optimizer's slots). Ids still below
        `min_count` get -1. When there is no room and no eviction policy, the step fails
        with an error naming the layer and its capacity, and nothing is inserted.
        """
        with tf.device(self.device):
            step = self.step.read_value() + 1
            found = tf.reshape(self.table.lookup(ids), [-1])
            hit = found >= 0
            seen_before = self._pending_seen(ids, hit)
            total = seen_before + seen
            admit = tf.logical_not(hit) & (total >= self.min_count)
            new_ids = tf.boolean_mask(ids, admit)
            check = self._check_room(tf.size(new_ids, out_type=tf.int64))
            with tf.control_dependencies([check]):
                hit_rows = tf.boolean_mask(found, hit)
                touched = [
                    self.counts.scatter_add(_slices(tf.boolean_mask(seen, hit), hit_rows)),
                    self.last_seen.scatter_update(
                        _slices(tf.fill(tf.shape(hit_rows), step), hit_rows)
                    ),
                ]
                self._remember_pending(ids, total, hit, admit)
                touched.append(self.step.assign(step))
            with tf.control_dependencies(touched):
                new_rows = self._allocate(tf.size(new_ids, out_type=tf.int64), step)
            self.table.insert(new_ids, new_rows)
            self._claim(new_rows, new_ids, tf.boolean_mask(total, admit), step)
            on_new_rows(new_ids, new_rows)
            positions = tf.where(admit)
            rows = tf.tensor_scatter_nd_update(tf.where(hit, found, _NO_ROW), positions, new_rows)
            return tf.identity(rows)

    def _pending_seen(self, ids, hit):
        if self.pending is None:
            return tf.zeros_like(ids)
        return tf.where(hit, tf.zeros_like(ids), tf.reshape(self.pending.lookup(ids), [-1]))

    def _remember_pending(self, ids, total, hit, admit):
        if self.pending is None:
            return
        waiting = tf.logical_not(hit | admit)
        self.pending.insert(tf.boolean_mask(ids, waiting), tf.boolean_mask(total, waiting))
        self.pending.remove(tf.boolean_mask(ids, admit))

    def _check_room(self, n_new):
        """An assertion that `n_new` rows can be found: free rows, or evictable ones."""
        if self.eviction is None:
            return tf.debugging.assert_less_equal(
                self.used + n_new,
                tf.constant(self.capacity, tf.int64),
                message=(
                    f"DynamicEmbedding {self.layer_name!r} is full: capacity {self.capacity} "
                    f"rows, and eviction is off. Raise capacity or set eviction "
                    f"('lfu', 'lru' or 'ttl'). Nothing was inserted in this step"
                ),
            )
        return tf.debugging.assert_less_equal(
            n_new,
            tf.constant(self.capacity, tf.int64),
            message=(
                f"DynamicEmbedding {self.layer_name!r}: more new ids in one step than its "
                f"capacity of {self.capacity} rows. Nothing was inserted in this step"
            ),
        )

    def _allocate(self, n, step):
        """`n` rows for new ids: never-used rows first, then free rows, then evicted ones."""
        used = self.used.read_value()
        fits = used + n <= self.capacity
        if self.eviction is None:
            rows = tf.range(used, used + n)
        else:
            rows = tf.cond(
                fits, lambda: tf.range(used, used + n), lambda: self._reuse_rows(n, step)
            )
        self.used.assign(tf.minimum(used + n, self.capacity))
        return rows

    def _reuse_rows(self, n, step):
        row_ids = tf.convert_to_tensor(self.row_ids)
        free = tf.where(row_ids < 0)[:, 0]
        short = tf.maximum(n - tf.size(free, out_type=tf.int64), 0)
        last_seen = tf.convert_to_tensor(self.last_seen)
        evicted = policy.victims(
            self.eviction,
            row_ids,
            tf.convert_to_tensor(self.counts),
            last_seen,
            last_seen < step,
            short,
        )
        check = tf.debugging.assert_equal(
            tf.size(evicted, out_type=tf.int64),
            short,
            message=(
                f"DynamicEmbedding {self.layer_name!r}: every one of its {self.capacity} rows "
                f"was seen in this step; none can be evicted for the new ids"
            ),
        )
        with tf.control_dependencies([check]):
            self._forget(tf.gather(row_ids, evicted))
            return tf.concat([free[: n - short], evicted], 0)

    def _forget(self, ids):
        self.table.remove(ids)
        if self.on_evict is not None:
            self.on_evict(ids)

    def _claim(self, rows, ids, seen, step):
        self.row_ids.scatter_update(_slices(ids, rows))
        self.counts.scatter_update(_slices(seen, rows))
        self.last_seen.scatter_update(_slices(tf.fill(tf.shape(rows), step), rows))

    # -- eviction on a schedule, and files ---------------------------------------------------

    def evict(self, rows):
        """Frees `rows`: their ids lose their row (and look up the default vector)."""
        with tf.device(self.device):
            ids = tf.gather(tf.convert_to_tensor(self.row_ids), rows)
            self._forget(ids)
            self.row_ids.scatter_update(
                _slices(tf.fill(tf.shape(rows), tf.constant(-1, tf.int64)), rows)
            )
            self.counts.scatter_update(_slices(tf.zeros_like(rows), rows))
            self.last_seen.scatter_update(_slices(tf.zeros_like(rows), rows))
            return tf.size(rows)

    def rebuild(self):
        """Makes `table` hold exactly what `row_ids` says (after weights were loaded)."""
        with tf.device(self.device):
            keys, _ = self.table.export()
            self.table.remove(keys)
            row_ids = tf.convert_to_tensor(self.row_ids)
            rows = tf.where(row_ids >= 0)[:, 0]
            self.table.insert(tf.gather(row_ids, rows), rows)

    def pending_state(self):
        """`(ids, times seen)` of the ids waiting for admission (empty without min_count)."""
        if self.pending is None:
            empty = tf.zeros([0], tf.int64)
            return empty, empty
        with tf.device(self.device):
            return self.pending.export()

    def load_pending(self, ids, seen):
        """Replaces the ids waiting for admission."""
        if self.pending is None:
            return
        with tf.device(self.device):
            keys, _ = self.pending.export()
            self.pending.remove(keys)
            self.pending.insert(tf.constant(ids, tf.int64), tf.constant(seen, tf.int64))


def _slices(values, rows):
    return tf.IndexedSlices(values, rows)
