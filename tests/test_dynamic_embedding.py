"""`dpkeras.layers.DynamicEmbedding`: rows follow ids, equal a plain Embedding, admit, evict,
save, refuse bad input; on one device, under dpkeras with 2 replicas, sharded."""

import contextlib
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import dpkeras
from dpkeras import _keras_internals
from dpkeras.layers import DynamicEmbedding
from dpkeras.testing import cpu_strategy, run_python

DIM = 4


def _model(capacity=32, optimizer="sgd", name="de", **kwargs):
    ids = keras.Input((3,), dtype="int64")
    layer = DynamicEmbedding(DIM, capacity, name=name, seed=7, **kwargs)
    x = keras.layers.Flatten()(layer(ids))
    model = keras.Model(ids, keras.layers.Dense(1, name="head")(x))
    model.compile(optimizer=optimizer, loss="mse")
    return model, layer


def _reference(dynamic_layer, first_seen, head_weights, optimizer):
    """A plain Embedding with a row per id in first-seen order, initialised as the layer does."""
    ids = keras.Input((3,), dtype="int64")
    embedding = keras.layers.Embedding(len(first_seen), DIM)
    x = keras.layers.Flatten()(embedding(ids))
    head = keras.layers.Dense(1)
    model = keras.Model(ids, head(x))
    model.compile(optimizer=optimizer, loss="mse")
    embedding.set_weights([dynamic_layer.initial_vectors(np.array(first_seen)).numpy()])
    head.set_weights(head_weights)
    return model, embedding


def _stream(n=24, seed=0, unique_per_batch=False, batch=6):
    rng = np.random.default_rng(seed)
    if unique_per_batch:  # Adam squares repeated ids separately: no repeat in a global batch
        pool = rng.choice(10**12, size=30, replace=False)
        x = np.stack([rng.choice(pool, 3 * batch, replace=False) for _ in range(n // batch)])
        x = x.reshape(n, 3)
    else:
        x = rng.choice(rng.choice(10**12, size=20, replace=False), size=(n, 3))
    y = rng.normal(size=(n, 1)).astype("float32")
    return x.astype("int64"), y


def _first_seen(x):
    return list(dict.fromkeys(x.reshape(-1).tolist()))


def _by_id(layer):
    rows, row_ids = layer.embeddings.numpy(), layer.get_weights()[1]
    return {int(i): rows[r] for r, i in enumerate(row_ids) if i >= 0}


def _train_both(strategy, optimizer, unique_per_batch, batch=6):
    x, y = _stream(unique_per_batch=unique_per_batch, batch=batch)
    with strategy.scope() if strategy else _null():
        model, layer = _model(optimizer=optimizer)
    head = model.get_layer("head").get_weights()
    reference, embedding = _reference(layer, _first_seen(x), head, optimizer)
    model.fit(x, y, batch_size=batch, epochs=2, shuffle=False, verbose=0)
    position = {i: j for j, i in enumerate(_first_seen(x))}
    positions = np.vectorize(position.get)(x).astype("int64")
    reference.fit(positions, y, batch_size=batch, epochs=2, shuffle=False, verbose=0)
    return x, model, layer, reference, embedding


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


@pytest.mark.parametrize(
    "replicas, optimizer, unique",
    [
        (0, "sgd", False),
        (0, "adam", True),
        (0, "adam", False),
        (2, "sgd", False),
        (2, "adam", True),
        (2, "adam", False),
    ],
)
def test_training_equals_a_plain_embedding_with_rows_in_first_seen_order(
    replicas, optimizer, unique
):
    strategy = cpu_strategy(replicas) if replicas else None
    x, model, layer, reference, embedding = _train_both(strategy, optimizer, unique)
    first_seen = _first_seen(x)
    row_ids = layer.get_weights()[1]
    assert row_ids[: len(first_seen)].tolist() == first_seen  # rows in first-seen order
    trained = _by_id(layer)
    expected = embedding.get_weights()[0]
    for j, i in enumerate(first_seen):
        np.testing.assert_allclose(trained[i], expected[j], atol=1e-5)
    np.testing.assert_allclose(
        model.get_layer("head").get_weights()[0], reference.layers[-1].get_weights()[0], atol=1e-5
    )
    counts = dict(zip(row_ids.tolist(), layer.get_weights()[2].tolist()))
    ids, seen = np.unique(x, return_counts=True)
    assert all(counts[int(i)] == 2 * int(c) for i, c in zip(ids, seen))  # two epochs


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_under_hybrid_placement_the_table_stays_on_the_parameter_device(optimizer):
    """placement.hybrid(): the rows, the index and the bookkeeping on /cpu:0, the head
    replicated on the two replicas' devices; the same numbers as a plain Embedding."""
    strategy = dpkeras.get_strategy(["/cpu:1", "/cpu:2"], dpkeras.placement.hybrid())
    x, model, layer, reference, embedding = _train_both(strategy, optimizer, False)
    assert all(v.value.device.endswith("CPU:0") for v in layer.variables)
    head = model.get_layer("head")
    assert all(isinstance(v.value, dpkeras.ReplicatedVariable) for v in head.variables)
    trained = _by_id(layer)
    expected = embedding.get_weights()[0]
    for j, i in enumerate(_first_seen(x)):
        np.testing.assert_allclose(trained[i], expected[j], atol=1e-5)
    np.testing.assert_allclose(
        head.get_weights()[0], reference.layers[-1].get_weights()[0], atol=1e-5
    )


def test_sharded_rows_under_two_replicas_train_as_one_device():
    partitioner = tf.distribute.experimental.partitioners.FixedShardsPartitioner(2)
    strategy = dpkeras.ParameterDeviceStrategy(
        ["/cpu:1", "/cpu:2"], ["/cpu:0", "/cpu:3"], partitioner=partitioner
    )
    x, y = _stream(unique_per_batch=True)  # Adagrad squares repeats across replicas apart
    with strategy.scope():
        sharded, layer = _model(optimizer="adagrad")
    assert len(_keras_internals.underlying_variable(layer.embeddings).shards) == 2
    tables = [layer.index_table, layer.index_table_1]  # the index is cut by id like the rows
    assert [t.resource_handle.device[-5:] for t in tables] == ["CPU:0", "CPU:3"]
    keras.utils.set_random_seed(1234)
    plain, plain_layer = _model(optimizer="adagrad")
    plain.set_weights(sharded.get_weights())
    for model in (sharded, plain):
        model.fit(x, y, batch_size=6, epochs=2, shuffle=False, verbose=0)
    for a, b in zip(sharded.get_weights(), plain.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-5)


def _trained_in_two_shards():
    """`(x, y, model, layer)`: a DynamicEmbedding (min_count 2, Adagrad) whose rows are cut
    into 2 shards, trained one epoch on `_stream()` by 2 replicas."""
    partitioner = tf.distribute.experimental.partitioners.FixedShardsPartitioner(2)
    strategy = dpkeras.ParameterDeviceStrategy(
        ["/cpu:1", "/cpu:2"], ["/cpu:0", "/cpu:3"], partitioner=partitioner
    )
    x, y = _stream()
    with strategy.scope():
        model, layer = _model(optimizer="adagrad", min_count=2)
    model.fit(x, y, batch_size=6, epochs=1, shuffle=False, verbose=0)
    return x, y, model, layer


def test_a_sharded_index_keeps_each_id_in_its_own_shard_and_checkpoints_every_shard(tmp_path):
    """Rows in 2 shards: ids with id % 2 == i are in table i (admitted and pending alike),
    and a checkpoint restores both tables."""
    x, y, model, layer = _trained_in_two_shards()
    admitted = [layer.index_table.export()[0].numpy(), layer.index_table_1.export()[0].numpy()]
    pending = [layer.pending_table.export()[0].numpy(), layer.pending_table_1.export()[0].numpy()]
    for shard in (0, 1):
        assert len(admitted[shard]) and set(admitted[shard] % 2) == {shard}
        assert set(pending[shard] % 2) <= {shard}
    assert layer.size == sum(len(a) for a in admitted)
    path = tf.train.Checkpoint(model=model).save(str(tmp_path / "ckpt"))
    with model.distribute_strategy.scope():
        fresh, fresh_layer = _model(optimizer="adagrad", min_count=2)
    tf.train.Checkpoint(model=fresh).restore(path).assert_existing_objects_matched()
    assert sorted(fresh_layer.index_table_1.export()[0].numpy()) == sorted(admitted[1])
    assert fresh_layer.size == layer.size
    np.testing.assert_allclose(fresh.predict(x, verbose=0), model.predict(x, verbose=0), atol=1e-6)


def test_a_new_rows_vector_depends_on_its_id_and_seed_only():
    a = DynamicEmbedding(DIM, 8, seed=5).initial_vectors(np.array([3, 10**15, 7]))
    b = DynamicEmbedding(DIM, 8, seed=5).initial_vectors(np.array([7, 3]))
    np.testing.assert_array_equal(a.numpy()[[2, 0]], b.numpy())
    c = DynamicEmbedding(DIM, 8, seed=6).initial_vectors(np.array([7, 3]))
    assert not np.allclose(b, c)
    assert np.all(np.abs(a) <= 0.05)  # "uniform", Embedding's default: U(-0.05, 0.05)
    normal = DynamicEmbedding(512, 8, seed=1, embeddings_initializer="truncated_normal")
    values = normal.initial_vectors(np.arange(64)).numpy()
    assert np.abs(values).max() <= 0.1 and abs(values.std() - 0.044) < 0.004


def _ragged_trained(strategy=None):
    """Ragged multi-hot ids (1 to 5 per example) into a mean, 14 rows in batches of 6, 6, 2."""
    keras.utils.set_random_seed(1)
    rng = np.random.RandomState(0)
    pool = rng.randint(0, 2**62, 12)
    x = tf.ragged.constant([rng.choice(pool, rng.randint(1, 6)).tolist() for _ in range(14)])
    y = rng.normal(size=(14, 1)).astype("float32")
    with strategy.scope() if strategy else contextlib.nullcontext():
        ids = keras.Input((None,), dtype="int64", ragged=True)
        layer = DynamicEmbedding(DIM, 64, name="de", seed=5, min_count=2)
        vectors = layer(ids)
        pooled = keras.layers.GlobalAveragePooling1D()(vectors)
        model = keras.Model(ids, keras.layers.Dense(1)(pooled))
        model.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse")
    history = model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(6), epochs=2, verbose=0)
    return model, layer, vectors, x, history.history["loss"]


def test_ragged_ids_give_ragged_vectors_and_train_as_one_device():
    model, layer, vectors, x, history = _ragged_trained()
    assert vectors.ragged and vectors.shape == (None, None, DIM)
    out = layer(x[:3])
    assert isinstance(out, tf.RaggedTensor)
    np.testing.assert_array_equal(out.flat_values, layer(x[:3].flat_values))
    assert layer.size > 0
    replicated, replicated_layer, _, _, replicated_history = _ragged_trained(cpu_strategy(3))
    assert replicated_layer.size == layer.size
    np.testing.assert_allclose(replicated_history, history, rtol=1e-5)
    for a, b in zip(model.get_weights(), replicated.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-6)


def test_an_id_seen_fewer_than_min_count_times_maps_to_zeros_and_trains_nothing():
    model, layer = _model(min_count=3)
    x = np.array([[1, 2, 2], [1, 1, 5]], "int64")
    model.fit(x[:1], np.ones((1, 1)), verbose=0)  # 1 once, 2 twice: none admitted
    assert layer.size == 0
    np.testing.assert_array_equal(layer(x, training=False).numpy(), np.zeros((2, 3, DIM)))
    model.fit(x[1:], np.ones((1, 1)), verbose=0)  # 1 now seen three times
    assert layer.size == 1 and layer.get_weights()[1][0] == 1
    assert layer.get_weights()[2][0] == 3  # its count includes the sightings before admission
    model.fit(x[:1], np.ones((1, 1)), verbose=0)  # 2 now seen three times too
    assert sorted(_by_id(layer)) == [1, 2]


def _fill(layer, model, batches):
    for ids in batches:
        model.fit(np.array([ids], "int64"), np.ones((1, 1)), verbose=0)


@pytest.mark.parametrize("eviction, gone", [("lfu", 30), ("lru", 10), ("ttl", 10)])
def test_a_full_table_evicts_by_policy_and_the_reused_row_starts_afresh(eviction, gone):
    kwargs = {"ttl_steps": 100} if eviction == "ttl" else {}
    frozen = keras.optimizers.Adagrad(learning_rate=0.0)  # gradients depend on nothing trained
    model, layer = _model(capacity=3, optimizer=frozen, eviction=eviction, **kwargs)
    # 10 seen first and twice, 20 three times, 30 once and last
    _fill(layer, model, [[10, 20, 20], [10, 20, 30]])
    before = {int(i): r for r, i in enumerate(layer.get_weights()[1])}
    _fill(layer, model, [[40, 20, 20]])  # 40 needs a row
    ids = layer.get_weights()[1].tolist()
    assert gone not in ids and ids[before[gone]] == 40
    assert layer.get_weights()[2][before[gone]] == 1  # its count restarted
    assert layer.get_weights()[3][before[gone]] == 3  # last seen at step 3
    np.testing.assert_array_equal(
        layer.embeddings.numpy()[before[gone]], layer.initial_vectors(np.array([40]))[0]
    )
    # its accumulator restarted at Adagrad's 0.1: as in a fresh model seeing the same batch
    fresh, fresh_layer = _model(capacity=3, optimizer=keras.optimizers.Adagrad(0.0))
    fresh.get_layer("head").set_weights(model.get_layer("head").get_weights())
    _fill(fresh_layer, fresh, [[40, 20, 20]])

    def accumulator(m, lay):
        (acc,) = [v for v in m.optimizer.variables if v.name == "de_embeddings_accumulator"]
        return acc.numpy()[lay.get_weights()[1].tolist().index(40)]

    np.testing.assert_allclose(accumulator(model, layer), accumulator(fresh, fresh_layer))


@pytest.mark.parametrize("eviction", ["lru", "ttl"])
def test_a_full_table_frees_the_least_recently_seen_row_neither_the_lowest_nor_the_newest(
    eviction,
):
    """Each id last seen at a step of its own (no ties to break by row): 10 (row 0) seen again
    at step 4, 20 (row 1) last at step 2, 30 (row 2) at step 3. A new id takes 20's row; the
    next new id then takes 30's, the least recently seen of the rows left."""
    kwargs = {"ttl_steps": 100} if eviction == "ttl" else {}
    model, layer = _model(capacity=3, eviction=eviction, **kwargs)
    _fill(layer, model, [[10, 10, 10], [20, 20, 20], [30, 30, 30], [10, 10, 10]])
    assert layer.get_weights()[1].tolist() == [10, 20, 30]
    assert layer.get_weights()[3].tolist() == [4, 2, 3]  # last seen
    _fill(layer, model, [[40, 40, 40]])
    assert layer.get_weights()[1].tolist() == [10, 40, 30]
    _fill(layer, model, [[50, 50, 50]])
    assert layer.get_weights()[1].tolist() == [10, 40, 50]
    assert layer.get_weights()[3].tolist() == [4, 5, 6]
    assert sorted(_by_id(layer)) == [10, 40, 50] and layer.size == 3


@pytest.mark.parametrize("replicas", [0, 2])
def test_a_reused_row_restarts_every_adam_slot(replicas):
    """Adam keeps two slots per row, its first and second moments: a row handed to a new id
    restarts both, so the new id's moments after its first step are a fresh model's on the
    same batch, not the evicted id's carried over. Learning rate 0: the gradients depend on
    nothing trained."""
    strategy = cpu_strategy(replicas) if replicas else None
    with strategy.scope() if strategy else _null():
        model, layer = _model(capacity=3, optimizer=keras.optimizers.Adam(0.0), eviction="lru")
    slots = ("de_embeddings_momentum", "de_embeddings_velocity")

    def moments(m, row):
        found = {v.name: v.numpy()[row] for v in m.optimizer.variables if v.name in slots}
        return [found[name] for name in slots]

    def fit(m, batch):
        m.fit(np.array(batch, "int64"), np.ones((2, 1)), batch_size=2, verbose=0)

    fit(model, [[10, 20, 30], [10, 20, 30]])
    fit(model, [[20, 30, 20], [30, 20, 30]])  # 10 (row 0) is now the least recently seen
    assert all(np.all(m != 0) for m in moments(model, 0))  # 10's moments
    fit(model, [[40, 20, 30], [40, 20, 30]])
    assert layer.get_weights()[1].tolist() == [40, 20, 30]
    with strategy.scope() if strategy else _null():
        fresh, fresh_layer = _model(capacity=3, optimizer=keras.optimizers.Adam(0.0))
    fresh.get_layer("head").set_weights(model.get_layer("head").get_weights())
    fit(fresh, [[40, 20, 30], [40, 20, 30]])
    assert fresh_layer.get_weights()[1].tolist()[0] == 40
    for got, expected in zip(moments(model, 0), moments(fresh, 0)):
        np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_evict_on_a_schedule_frees_rows_by_ttl_and_by_count():
    model, layer = _model(capacity=8, eviction="ttl", ttl_steps=2)
    _fill(layer, model, [[1, 2, 3], [1, 4, 4], [1, 5, 5], [1, 6, 6]])
    assert int(layer.evict()) == 2  # 2 and 3 last seen at step 1, now step 4
    assert sorted(_by_id(layer)) == [1, 4, 5, 6]
    np.testing.assert_array_equal(layer(np.array([[2, 3, 3]]), training=False), 0.0)
    lfu, lfu_layer = _model(capacity=8, eviction="lfu")
    _fill(lfu_layer, lfu, [[1, 1, 2], [1, 3, 3], [2, 4, 4]])
    assert int(lfu_layer.evict(2)) == 2 and sorted(_by_id(lfu_layer)) == [1, 4]
    with pytest.raises(ValueError, match="eviction=None"):
        _model(name="off")[1].evict(1)


def test_a_full_table_without_eviction_fails_naming_it_and_inserts_nothing():
    model, layer = _model(capacity=4, name="items")
    _fill(layer, model, [[1, 2, 3]])
    before = [w.copy() for w in layer.get_weights()]
    with pytest.raises(
        tf.errors.InvalidArgumentError, match="items.{0,3} is full: capacity 4 rows"
    ):
        _fill(layer, model, [[4, 5, 1]])
    assert layer.size == 3
    for a, b in zip(before[1:], layer.get_weights()[1:]):
        np.testing.assert_array_equal(a, b)


def test_negative_ids_fail_before_anything_is_inserted():
    model, layer = _model()
    with pytest.raises(tf.errors.InvalidArgumentError, match="negative id"):
        _fill(layer, model, [[4, -5, 1]])
    assert layer.size == 0 and int(layer.get_weights()[4]) == 0


def test_ids_of_the_wrong_type_are_refused_naming_the_layer():
    layer = DynamicEmbedding(DIM, 8, name="users")
    with pytest.raises(TypeError, match="'users' has key_dtype='int64' and expects integers"):
        layer(tf.constant([["a"]]))
    with pytest.raises(TypeError, match="expects strings. Received ids of dtype int64"):
        DynamicEmbedding(DIM, 8, key_dtype="string")(tf.constant([[1]], tf.int64))
    with pytest.raises(TypeError, match="float32"):
        layer(tf.constant([[1.0]]))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"eviction": "fifo"}, "eviction must be one of"),
        ({"eviction": "ttl"}, "needs ttl_steps"),
        ({"ttl_steps": 3}, "ttl_steps applies to eviction='ttl' only"),
        ({"min_count": 0}, "min_count must be an int >= 1"),
        ({"key_dtype": "int32"}, "key_dtype must be one of"),
        ({"embeddings_initializer": "glorot_uniform"}, "GlorotUniform"),
    ],
)
def test_bad_arguments_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DynamicEmbedding(DIM, 8, **kwargs)


def test_string_ids_are_hashed_to_63_bit_ids():
    ids = keras.Input((2,), dtype="string")
    layer = DynamicEmbedding(DIM, 8, key_dtype="string", seed=1)
    model = keras.Model(ids, keras.layers.Dense(1)(keras.layers.Flatten()(layer(ids))))
    model.compile(optimizer="sgd", loss="mse")
    x = np.array([["user:1", "user:2"], ["user:2", "user:3"]], dtype=object)
    model.fit(tf.constant(x), np.ones((2, 1)), verbose=0)
    assert layer.size == 3
    fingerprints = tf.bitcast(tf.fingerprint(tf.constant(["user:2"])), tf.int64).numpy()
    assert (fingerprints[0] & (2**63 - 1)) in layer.get_weights()[1].tolist()
    np.testing.assert_array_equal(
        layer.initial_vectors(tf.constant(["user:9"])),
        layer.initial_vectors(tf.constant([fingerprints[0] * 0 + hash_of("user:9")]), as_ids=True),
    )


def hash_of(text):
    bits = tf.bitcast(tf.fingerprint(tf.constant([text])), tf.int64).numpy()[0]
    return int(bits) & (2**63 - 1)


# -- files ----------------------------------------------------------------------------------


def _trained(strategy=None, **kwargs):
    x, y = _stream()
    with strategy.scope() if strategy else _null():
        model, layer = _model(optimizer="adam", min_count=2, **kwargs)
    model.fit(x, y, batch_size=6, verbose=0)
    return model, layer, x


def _same_state(a, b):
    for u, v in zip(a.get_weights(), b.get_weights()):
        np.testing.assert_array_equal(u, v)
    la, lb = a.get_layer("de"), b.get_layer("de")
    assert la.size == lb.size
    pa, pb = (
        np.sort(np.asarray(t[0]).reshape(-1))
        for t in (la._index.pending_state(), lb._index.pending_state())
    )
    np.testing.assert_array_equal(pa, pb)


def test_save_weights_and_load_weights_carry_the_index_and_pending_ids(tmp_path):
    model, layer, x = _trained(cpu_strategy(2))
    path = str(tmp_path / "m.weights.h5")
    model.save_weights(path)
    fresh, fresh_layer = _model(optimizer="adam", min_count=2)
    fresh.load_weights(path)
    _same_state(model, fresh)
    np.testing.assert_allclose(fresh.predict(x, verbose=0), model.predict(x, verbose=0), atol=1e-6)


def test_weights_files_of_a_sharded_index_hold_every_shard_s_ids(tmp_path):
    """Rows in 2 shards cut the index into 2 hash tables (ids with id % 2 == i in table i),
    admitted and pending ids alike. A weights file holds both tables' ids: loaded into a fresh
    model, and into the trained model after it admitted more ids, each table holds exactly the
    ids it held when saved."""
    x, y, model, layer = _trained_in_two_shards()
    once = np.array([[7, 8, 9], [100, 101, 102]], "int64")  # each seen once: pending
    model.fit(once, np.ones((2, 1)), batch_size=2, verbose=0)

    def index(lay):
        tables = (lay.index_table, lay.index_table_1, lay.pending_table, lay.pending_table_1)
        return [sorted(t.export()[0].numpy().tolist()) for t in tables]

    saved = index(layer)
    assert all(saved) and [set(np.array(ids) % 2) for ids in saved] == [{0}, {1}] * 2
    path = str(tmp_path / "m.weights.h5")
    model.save_weights(path)
    with model.distribute_strategy.scope():
        fresh, fresh_layer = _model(optimizer="adagrad", min_count=2)
    fresh.load_weights(path)
    assert index(fresh_layer) == saved
    np.testing.assert_allclose(fresh.predict(x, verbose=0), model.predict(x, verbose=0), atol=1e-6)
    model.fit(np.array([[10**13, 10**13 + 1, 7]] * 2), np.ones((2, 1)), batch_size=2, verbose=0)
    assert index(layer) != saved
    model.load_weights(path)  # the ids admitted since are forgotten in both tables
    assert index(layer) == saved


def test_a_checkpoint_restores_the_index_tables(tmp_path):
    model, layer, x = _trained()
    path = tf.train.Checkpoint(model=model).save(str(tmp_path / "ckpt"))
    fresh, fresh_layer = _model(optimizer="adam", min_count=2)
    tf.train.Checkpoint(model=fresh).restore(path).assert_existing_objects_matched()
    _same_state(model, fresh)
    np.testing.assert_allclose(fresh.predict(x, verbose=0), model.predict(x, verbose=0), atol=1e-6)


def test_backup_and_restore_resumes_with_the_index(tmp_path):
    x, y = _stream()
    backup = keras.callbacks.BackupAndRestore(str(tmp_path / "backup"), delete_checkpoint=False)
    with cpu_strategy(2).scope():
        model, layer = _model(optimizer="adam", min_count=2)
    model.fit(x, y, batch_size=6, epochs=1, callbacks=[backup], verbose=0)
    with cpu_strategy(2).scope():
        resumed, resumed_layer = _model(optimizer="adam", min_count=2)
    resumed.fit(x, y, batch_size=6, epochs=1, callbacks=[backup], verbose=0)  # restores only
    _same_state(model, resumed)


def test_a_keras_file_loads_without_a_strategy_and_maps_unseen_ids_to_zeros(tmp_path):
    model, layer, x = _trained(cpu_strategy(2))
    path = str(tmp_path / "m.keras")
    model.save(path)
    expected = model.predict(np.concatenate([x[:2], [[10**14, 1, 2]]]), verbose=0)
    np.save(str(tmp_path / "x.npy"), np.concatenate([x[:2], [[10**14, 1, 2]]]))
    np.save(str(tmp_path / "expected.npy"), expected)
    out = run_python(f"""
        import numpy as np, keras, tensorflow as tf
        import dpkeras.layers  # registers dpkeras>DynamicEmbedding; no strategy, no scope
        model = keras.models.load_model({path!r})
        assert not tf.distribute.has_strategy()
        x = np.load({str(tmp_path / "x.npy")!r})
        got = model.predict(x, verbose=0)
        np.testing.assert_allclose(got, np.load({str(tmp_path / "expected.npy")!r}), atol=1e-6)
        layer = model.get_layer("de")
        unseen = float(np.abs(layer(x[2:], training=False)[0, 0]).sum())
        print(type(layer).__name__, layer.size, unseen)
    """)
    assert out.split() == ["DynamicEmbedding", str(layer.size), "0.0"]


# -- internals ------------------------------------------------------------------------------


def test_the_training_model_is_found_from_inside_its_train_step():
    found = []

    class Probe(keras.layers.Layer):
        def call(self, x):
            found.append(_keras_internals.training_model())
            return x

    ids = keras.Input((2,))
    model = keras.Model(ids, keras.layers.Dense(1)(Probe()(ids)))
    model.compile(optimizer="sgd", loss="mse")
    model.fit(np.ones((2, 2)), np.ones((2, 1)), verbose=0)
    assert found[0] is None and found[-1] is model  # building it; then in fit's train_step
    assert _keras_internals.training_model() is None


def test_a_custom_loop_resets_the_slots_of_a_tracked_optimizer():
    layer = DynamicEmbedding(DIM, 2, eviction="lru", seed=3)
    optimizer = keras.optimizers.Adagrad(initial_accumulator_value=0.5)
    layer.build()
    optimizer.build([layer.embeddings])
    layer.track_optimizer(optimizer)

    @tf.function
    def step(ids):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(layer(ids, training=True))
        optimizer.apply([tape.gradient(loss, layer.embeddings)], [layer.embeddings])

    for ids in ([[1, 2]], [[1, 3]]):  # 3 evicts 2 (least recently seen)
        step(tf.constant(ids, tf.int64))
    accumulator = optimizer.variables[-1].numpy()
    row = layer.get_weights()[1].tolist().index(3)
    np.testing.assert_allclose(accumulator[row], 0.5 + 1.0, rtol=1e-6)  # reset, then one step
    np.testing.assert_allclose(accumulator[1 - row], 0.5 + 2.0, rtol=1e-6)  # id 1: two steps
    assert os.environ.get("TF_CONFIG") is None


def test_a_custom_loop_that_names_no_optimizer_is_refused_before_anything_changes():
    layer = DynamicEmbedding(DIM, 2, eviction="lru", seed=3, name="items")
    layer.build()
    before = [w.copy() for w in layer.get_weights()]
    with pytest.raises(ValueError) as raised:
        layer(tf.constant([[1, 2]], tf.int64), training=True)
    assert (  # Keras's call wrapper adds the arguments around it
        "DynamicEmbedding 'items' is called with training=True outside Model.fit, and it does "
        "not know the optimizer that trains it"
    ) in str(raised.value)
    assert "items.track_optimizer(optimizer)" in str(raised.value)
    for a, b in zip(before, layer.get_weights()):
        np.testing.assert_array_equal(a, b)  # no id admitted, nothing changed
    layer.track_optimizer(None)  # no optimizer trains these rows: told, so it trains
    layer(tf.constant([[1, 2]], tf.int64), training=True)
    assert sorted(layer.get_weights()[1].tolist()) == [1, 2]


def test_step_ids_are_deduplicated_per_task_then_once_in_global_batch_order(monkeypatch):
    from types import SimpleNamespace

    from dpkeras import _device_names as device_names
    from dpkeras._dynamic.merge import StepIds

    tasks = [f"/job:worker/replica:0/task:{t}/device:CPU:{i}" for t in (0, 1) for i in (0, 1)]
    assert [r for r, _ in device_names.replicas_by_task(tasks)] == [[0, 1], [2, 3]]
    # Two "tasks" this process has: /cpu:1 and /cpu:2 stand for the CPUs of two workers.
    monkeypatch.setattr(
        device_names, "replicas_by_task", lambda devices: [([0, 1], "/cpu:1"), ([2, 3], "/cpu:2")]
    )
    devices = ["/cpu:1", "/cpu:1", "/cpu:2", "/cpu:2"]
    strategy = SimpleNamespace(extended=SimpleNamespace(worker_devices=devices))
    ids = [[7, 3], [3, 9], [9, 1], [7, 5]]  # each replica's distinct ids, in its order
    counts = [[1, 2], [1, 1], [3, 1], [1, 1]]
    step = StepIds(
        strategy,
        [tf.constant(i, tf.int64) for i in ids],
        [tf.constant(c, tf.int64) for c in counts],
        "/cpu:0",
    )
    assert step.ids.numpy().tolist() == [7, 3, 9, 1, 5]  # first seen in the global batch
    assert step.seen.numpy().tolist() == [2, 3, 4, 1, 1]
    # what each task sends to the index: its replicas' ids, each once
    sent = [t.ids.numpy().tolist() for t in step._tasks]
    assert sent == [[7, 3, 9], [9, 1, 7, 5]]
    rows = tf.constant([70, 30, 90, 10, 50], tf.int64)  # a row per id of step.ids
    back = [r.numpy().tolist() for r in step.per_replica(rows)]
    assert back == [[70, 30], [30, 90], [90, 10], [70, 50]]


def test_string_collisions_are_counted_within_a_batch_across_replicas_and_over_time(
    monkeypatch,
):
    from dpkeras._dynamic import ids as id_types

    # A weak hash stands in for a fingerprint collision: strings of one length collide.
    monkeypatch.setattr(id_types, "hash_strings", lambda s: tf.cast(tf.strings.length(s), tf.int64))
    with cpu_strategy(2).scope():
        ids = keras.Input((2,), dtype="string")
        layer = DynamicEmbedding(DIM, 8, key_dtype="string", seed=1, eviction="lru")
        model = keras.Model(ids, keras.layers.Dense(1)(keras.layers.Flatten()(layer(ids))))
        model.compile(optimizer="sgd", loss="mse")

    def fit(rows):
        model.fit(tf.constant(rows), np.ones((len(rows), 1)), batch_size=len(rows), verbose=0)

    fit([["a", "bb"], ["a", "ccc"]])  # no clash: a, bb, ccc
    assert layer.collisions == 0 and layer.size == 3
    # xx has bb's hash. Replica 0 keeps xx, replica 1 brings bb: one mismatch in the step;
    # the step's xx against the row's kept bb: one more.
    fit([["a", "xx"], ["bb", "bb"]])
    assert layer.collisions == 2
    # yy then bb in replica 0 (one), zz in replica 1 against yy (one), yy against bb (one)
    fit([["yy", "bb"], ["zz", "a"]])
    assert layer.collisions == 5 and layer.size == 3
    assert layer(tf.constant([["a", "qq"]]), training=False).shape == (1, 2, DIM)


def test_integer_layers_have_no_collision_count():
    with pytest.raises(ValueError, match="integer ids: no collisions"):
        _model()[1].collisions  # noqa: B018
