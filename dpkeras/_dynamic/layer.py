"""`DynamicEmbedding`: a Keras embedding layer whose rows follow the ids it sees."""

import keras
import numpy as np
import tensorflow as tf

from dpkeras import _keras_internals
from dpkeras._dynamic import collisions, initial, merge, policy, slots
from dpkeras._dynamic import ids as id_types
from dpkeras._dynamic import index as row_index


def _remake_tables_on(self, task):
    """Makes its hash tables that lived on `task` of the cluster again, empty, after that task
    restarted and lost them (`dpkeras._patches.lost_tasks`); returns how many. Their entries
    then come from a backup, with the rest of the model. (`DynamicEmbedding.remake_on`.)"""
    parts = [part for part in (self._index, self._strings) if part is not None]
    return sum(part.remake_on(task) for part in parts)


@keras.saving.register_keras_serializable(package="dpkeras")
class DynamicEmbedding(keras.layers.Layer):
    """An embedding of ids from an unbounded space: a row per id seen, up to `capacity` rows.

    Ids are non-negative integers, or strings (`key_dtype="string"`, hashed to 63-bit ints).
    An id -> row hash table lives beside the rows (the `embeddings` weight; under dpkeras on
    its parameter device, sharded like any table if a partitioner cuts it). In training
    (`training=True`, as in `fit`):

    - a known id reads its row, which trains as an `Embedding` row does (sparse gradient);
    - an unknown id is counted; once seen `min_count` times it gets a free row, initialised
      from the id and the seed alone (`initial_vectors`), with its optimizer slots reset;
      until then it maps to zeros and trains nothing;
    - each row keeps its id's count and last-seen step (training calls of the layer);
    - with no free row, `eviction` frees one: `"lfu"` the least often seen, `"lru"` the least
      recently seen, `"ttl"` the same (and `evict()` frees rows unseen for `ttl_steps`). With
      `eviction=None` a full table is an error naming the layer and its capacity.

    Outside training, ids without a row map to zeros and nothing changes. Under dpkeras with
    N replicas the replicas' distinct ids are merged in replica order, so rows, counts and
    evictions are those of one device on the same global batch.

    Args:
        output_dim: int, the width of a row.
        capacity: int, the number of rows (allocated up front).
        min_count: int, sightings before an id gets a row.
        eviction: None, "lfu", "lru" or "ttl".
        ttl_steps: int, with eviction="ttl": rows unseen for longer are expired by `evict()`.
        embeddings_initializer: RandomUniform ("uniform", the default, as `Embedding`),
            RandomNormal, TruncatedNormal, Zeros, Ones or Constant.
        key_dtype: "int64" or "string".
        seed: int, the seed of new rows; default the initializer's seed, else drawn from
            Python's `random` (seeded by `keras.utils.set_random_seed`).
    """

    def __init__(
        self,
        output_dim,
        capacity,
        *,
        min_count=1,
        eviction=None,
        ttl_steps=None,
        embeddings_initializer="uniform",
        key_dtype="int64",
        seed=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        policy.check(eviction, ttl_steps, min_count, capacity, output_dim)
        self.output_dim = output_dim
        self.capacity = capacity
        self.min_count = min_count
        self.eviction = eviction
        self.ttl_steps = ttl_steps
        self.key_dtype = id_types.check_key_dtype(key_dtype)
        self.embeddings_initializer = keras.initializers.get(embeddings_initializer)
        self._initial_rows = initial.rows_initializer(self.embeddings_initializer)
        self.seed = initial.initializer_seed(self.embeddings_initializer, seed)
        self._slot_resetter = slots.SlotResetter()
        self._index = None

    # -- state --------------------------------------------------------------------------------

    def build(self, input_shape=None):
        self.embeddings = self.add_weight(
            shape=(self.capacity, self.output_dim), initializer="zeros", name="embeddings"
        )
        # Attributes (not only tracked weights), so that tf.train.Checkpoint saves them.
        self.row_ids = self._bookkeeping((self.capacity,), -1, "row_ids")
        self.counts = self._bookkeeping((self.capacity,), 0, "counts")
        self.last_seen = self._bookkeeping((self.capacity,), 0, "last_seen")
        self.step_count = self._bookkeeping((), 0, "step")
        self.rows_used = self._bookkeeping((), 0, "used")
        vectors = [self.row_ids, self.counts, self.last_seen, self.step_count, self.rows_used]
        rows = _keras_internals.underlying_variable(self.embeddings)
        self._index = row_index.RowIndex(
            self.name,
            self.capacity,
            self.min_count,
            self.eviction,
            [row_index.table_device(v.device) for v in getattr(rows, "shards", [rows])],
            [_keras_internals.underlying_variable(v) for v in vectors],
        )
        # Attributes, so that tf.train.Checkpoint saves and restores the tables too (one per
        # shard of the rows: `index_table`, `index_table_1`, ...).
        for i, table in enumerate(self._index.table.tables):
            setattr(self, "index_table" + (f"_{i}" if i else ""), table)
        if self._index.pending is not None:
            for i, table in enumerate(self._index.pending.tables):
                setattr(self, "pending_table" + (f"_{i}" if i else ""), table)
        self._strings = None
        if self.key_dtype == "string":
            self.collision_count = self._bookkeeping((), 0, "collisions")
            self._strings = collisions.KeyStrings(self.name, self._index.device)
            self._index.on_evict = self._strings.forget
            self.strings_table = self._strings.table

    def _bookkeeping(self, shape, value, name):
        return self.add_weight(
            shape=shape,
            initializer=keras.initializers.Constant(value),
            dtype="int64",
            trainable=False,
            name=name,
        )

    @property
    def size(self):
        """How many ids have a row now (an int, eagerly)."""
        return int(self._index.size())

    @property
    def collisions(self):
        """String ids only: mismatches found between strings with one 63-bit fingerprint (an
        int, eagerly). Each step compares, per fingerprint, every replica's strings with the
        first of the step, and that one with the string the row was first given; zero means
        every string seen so far has had a row of its own."""
        if self._strings is None:
            raise ValueError(f"DynamicEmbedding {self.name!r} has integer ids: no collisions")
        return int(self.collision_count.numpy())

    # -- calling ------------------------------------------------------------------------------

    def call(self, inputs, training=None):
        if isinstance(inputs, tf.RaggedTensor):
            # Multi-hot ids (a varying number per example): the ids are the flat values, and
            # their vectors keep the ragged rows, as `Embedding` does: `[batch, None, dim]`.
            return inputs.with_flat_values(self.call(inputs.flat_values, training=training))
        inputs = tf.convert_to_tensor(inputs)
        ids = id_types.as_int64(self.name, self.key_dtype, inputs)
        strings = tf.reshape(inputs, [-1]) if self._strings is not None else None
        distinct = merge.distinct(tf.reshape(ids, [-1]), strings)
        where = distinct[1]
        if training:
            rows = self._train_rows(*distinct[:1], *distinct[2:])
        else:
            rows = self._index.lookup(distinct[0])
        # One row index per looked-up position, as a plain Embedding reads: repeated ids then
        # reach the optimizer as Keras gives them (Adam squares each repeat), and under dpkeras
        # the lookup still pulls each distinct row once (its deduplication).
        vectors = self._read_rows(tf.gather(rows, where))
        out = tf.reshape(vectors, tf.concat([tf.shape(ids), [self.output_dim]], 0))
        return tf.cast(out, self.compute_dtype)

    def _read_rows(self, rows):
        """Rows' vectors, zeros for -1; the rows weight is read by `ops.take`, so under dpkeras
        only the rows travel, and ids without a row have no gradient at all."""
        admitted = tf.where(rows >= 0)
        vectors = keras.ops.take(self.embeddings, tf.gather_nd(rows, admitted), axis=0)
        shape = tf.stack([tf.size(rows, out_type=tf.int64), self.output_dim])
        return tf.scatter_nd(admitted, vectors, shape)

    def _train_rows(self, unique, seen, strings, clashes):
        self._slot_resetter.discover()
        if self.trainable and not self._slot_resetter.known:
            raise ValueError(
                f"DynamicEmbedding {self.name!r} is called with training=True outside "
                f"Model.fit, and it does not know the optimizer that trains it: a row handed to "
                f"a new id would keep the optimizer's state of the id evicted from it (Adam's "
                f"moments, for one). Call {self.name}.track_optimizer(optimizer), with the "
                f"optimizer built, before the first training step (track_optimizer(None) if "
                f"no optimizer trains it), or train with model.fit."
            )
        args = (unique, seen) if strings is None else (unique, seen, strings, clashes)
        ctx = tf.distribute.get_replica_context()
        if ctx is None:  # cross-replica context: one call for the whole batch
            return self._merge_update(tf.distribute.get_strategy(), *args)[0]
        replica = int(tf.get_static_value(ctx.replica_id_in_sync_group) or 0)
        return ctx.merge_call(self._merge_update, args=args)[replica]

    def _merge_update(self, strategy, unique, seen, strings=None, clashes=None):
        """Updates the index once for every replica's ids; returns each replica's rows.

        The replicas' distinct ids are merged in replica order (the order of the global batch;
        `merge.StepIds`), so each distinct id is looked up and inserted once, and rows are
        handed out in the order one device would hand them out.
        """
        plan = self._slot_resetter.plan(self.embeddings)
        local = strategy.experimental_local_results
        step_ids = merge.StepIds(
            strategy,
            list(local(unique)),
            list(local(seen)),
            self._index.device,
            None if strings is None else list(local(strings)),
        )

        def initialise(new_ids, new_rows):
            vectors = self.initial_vectors(new_ids, as_ids=True)
            rows = _keras_internals.underlying_variable(self.embeddings)
            rows.scatter_update(tf.IndexedSlices(tf.cast(vectors, rows.dtype), new_rows))
            slots.reset_rows(plan, new_rows, vectors)

        with tf.device(self._index.device):
            known = self._index.lookup(step_ids.ids) >= 0 if strings is not None else None
            rows = self._index.update(step_ids.ids, step_ids.seen, initialise)
            if strings is not None:
                found = self._strings.check(step_ids.ids, step_ids.strings, known, rows >= 0)
                total = tf.add_n(list(local(clashes)) + [step_ids.clashes, found])
                self.collision_count.assign_add(total)
        return step_ids.per_replica(rows)

    def initial_vectors(self, ids, as_ids=False):
        """The vector a new row for each of `ids` starts from (a function of id and seed).

        `ids` are the layer's ids (ints or strings); `as_ids=True` takes int64 ids already
        hashed. A plain `Embedding` whose rows are `initial_vectors` of its ids trains like
        this layer.
        """
        ids = tf.convert_to_tensor(ids)
        if not as_ids:
            ids = id_types.as_int64(self.name, self.key_dtype, ids)
        return self._initial_rows(
            self.seed, tf.reshape(ids, [-1]), self.output_dim, tf.as_dtype(self.variable_dtype)
        )

    def compute_output_shape(self, input_shape):
        return tuple(input_shape) + (self.output_dim,)

    def compute_output_spec(self, inputs):
        # Ragged ids give ragged vectors (`call`), as Keras's `Embedding` says of its output.
        return keras.KerasTensor(
            self.compute_output_shape(inputs.shape),
            dtype=self.compute_dtype,
            ragged=getattr(inputs, "ragged", False),
        )

    # -- eviction and optimizers --------------------------------------------------------------

    def evict(self, count=None):
        """Frees rows now; returns how many. Their ids map to zeros until admitted again.

        `eviction="ttl"`: every row unseen for more than `ttl_steps` steps (`count` must be
        None). `"lfu"` / `"lru"`: the `count` least often / least recently seen rows.
        """
        if self.eviction is None:
            raise ValueError(f"DynamicEmbedding {self.name!r} has eviction=None: nothing to evict")
        index = self._index
        with tf.device(index.device):
            row_ids = tf.convert_to_tensor(index.row_ids)
            last_seen = tf.convert_to_tensor(index.last_seen)
            if self.eviction == "ttl":
                if count is not None:
                    raise ValueError("evict() with eviction='ttl' takes no count")
                rows = policy.expired(row_ids, last_seen, index.step.read_value(), self.ttl_steps)
            else:
                if not isinstance(count, int) or isinstance(count, bool) or count < 0:
                    raise ValueError(f"evict() needs count, an int >= 0. Received: {count!r}")
                everything = tf.ones_like(row_ids, tf.bool)
                counts = tf.convert_to_tensor(index.counts)
                rows = policy.victims(self.eviction, row_ids, counts, last_seen, everything, count)
            return index.evict(rows)

    remake_on = _remake_tables_on

    def track_optimizer(self, optimizer):
        """Resets `optimizer`'s slots of rows handed to new ids (needed in custom loops only;
        `fit` finds the model's optimizer). Call it, with the optimizer built, before the
        first training step is traced. `None` says that no optimizer trains the rows: a
        training call outside `fit` refuses until one of these calls is made."""
        self._slot_resetter.track(optimizer, told=True)

    # -- files --------------------------------------------------------------------------------

    def save_own_variables(self, store):
        """The weights (`row_ids` is the index), then the ids waiting for admission."""
        super().save_own_variables(store)
        n = len(self.weights)
        keys, seen = self._index.pending_state()
        store[f"{n}"] = np.asarray(keys).reshape(-1).astype("int64")
        store[f"{n + 1}"] = np.asarray(seen).reshape(-1).astype("int64")

    def load_own_variables(self, store):
        """Loads the weights and rebuilds the hash table from `row_ids`."""
        weights = self.weights
        if len(store.keys()) not in (len(weights), len(weights) + 2):
            raise ValueError(
                f"DynamicEmbedding {self.name!r} expects {len(weights)} weights (and the "
                f"pending ids) in the file; received {len(store.keys())} entries"
            )
        for i, v in enumerate(weights):
            v.assign(store[f"{i}"])
        n = len(weights)
        if f"{n}" in list(store.keys()):
            self._index.load_pending(np.asarray(store[f"{n}"]), np.asarray(store[f"{n + 1}"]))
        self._index.rebuild()

    def get_config(self):
        config = super().get_config()
        config.update(
            output_dim=self.output_dim,
            capacity=self.capacity,
            min_count=self.min_count,
            eviction=self.eviction,
            ttl_steps=self.ttl_steps,
            embeddings_initializer=keras.initializers.serialize(self.embeddings_initializer),
            key_dtype=self.key_dtype,
            seed=self.seed,
        )
        return config
