"""Sharded variables: one table cut into shards on several parameter devices (issue 11).

Replicas run on /cpu:1 and /cpu:2; the parameter devices are /cpu:0 and /cpu:3. Every
comparison is with plain Keras on one device, unsharded, from the same initial weights.
"""

import re

import keras
import numpy as np
import pytest
import tensorflow as tf

import dpkeras
from dpkeras._variables import partitioning
from dpkeras._variables.sharded import ShardedParameterVariable
from dpkeras.testing import assert_weights_close

P = tf.distribute.experimental.partitioners
REPLICAS = ["/cpu:1", "/cpu:2"]
PARAMETER_DEVICES = ["/cpu:0", "/cpu:3"]
ROWS, DIM = 60, 4


def _strategy(partitioner, replicas=REPLICAS, parameter_device=PARAMETER_DEVICES):
    return dpkeras.get_strategy(replicas, parameter_device, partitioner=partitioner)


def _build(rows=ROWS, dim=DIM, optimizer="adam", seed=3):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((5,), dtype="int32")
    x = keras.layers.Embedding(rows, dim, name="table")(inputs)
    x = keras.layers.GlobalAveragePooling1D()(x)
    outputs = keras.layers.Dense(3, name="head")(x)
    model = keras.Model(inputs, outputs)
    opt = {
        "sgd": lambda: keras.optimizers.SGD(0.5),
        "adagrad": lambda: keras.optimizers.Adagrad(0.5),
        "adam": lambda: keras.optimizers.Adam(0.05),
    }.get(optimizer, lambda: optimizer)()
    model.compile(optimizer=opt, loss="mse", metrics=["mae"])
    return model


def _data(n=48, rows=ROWS, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, rows, (n, 5)).astype("int32")
    return x, rng.normal(size=(n, 3)).astype("float32")


def _table(model):
    return model.get_layer("table").embeddings.value


# -- the row split ---------------------------------------------------------------------------


def test_rows_are_cut_into_contiguous_blocks_the_first_getting_the_extra_rows():
    assert partitioning.row_split(P.FixedShardsPartitioner(3), (10, 4), "float32", "t", False) == [
        4,
        3,
        3,
    ]
    assert partitioning.offsets([4, 3, 3]) == [0, 4, 7, 10]
    # One shard, or a partitioner that leaves the variable whole: not sharded.
    assert partitioning.row_split(P.FixedShardsPartitioner(1), (10,), "float32", "t", False) is None
    assert partitioning.row_split(None, (10,), "float32", "t", True) is None
    small = P.MinSizePartitioner(min_shard_bytes=1 << 20, max_shards=4)
    assert partitioning.row_split(small, (10, 4), "float32", "t", False) is None


@pytest.mark.parametrize(
    "answer, message",
    [
        (lambda shape, dtype: [2], "expected a list of 2 positive ints"),
        (lambda shape, dtype: [0, 1], "every count must be at least 1"),
        (lambda shape, dtype: [-2, 1], "every count must be at least 1"),
        (lambda shape, dtype: [2.5, 1], "expected a list of 2 positive ints"),
        (lambda shape, dtype: "two", "expected a list of 2 positive ints"),
        (lambda shape, dtype: [1, 2], "cuts along axis 0 only"),
        (lambda shape, dtype: [11, 1], "asks for 11 shards of variable 't', which has only 10"),
    ],
)
def test_an_invalid_split_is_an_error_naming_the_variable_and_the_answer(answer, message):
    with pytest.raises(ValueError, match=message) as e:
        partitioning.row_split(answer, (10, 4), "float32", "t", False)
    assert "'t'" in str(e.value)


def test_a_scalar_is_an_error_when_asked_for_and_left_whole_by_a_strategy_partitioner():
    with pytest.raises(ValueError, match="'step' is a scalar and cannot be partitioned"):
        partitioning.row_split(P.FixedShardsPartitioner(2), (), "float32", "step", True)
    assert partitioning.row_split(P.FixedShardsPartitioner(2), (), "int64", "step", False) is None


def test_a_partitioner_that_raises_is_reported_with_the_variable():
    def broken(shape, dtype):
        raise RuntimeError("no")

    with pytest.raises(ValueError, match=r"failed for variable 't' \(shape \(10, 4\), float32\)"):
        partitioning.row_split(broken, (10, 4), "float32", "t", False)


@pytest.mark.parametrize("make", [dpkeras.ParameterDeviceStrategy, dpkeras.get_strategy])
def test_a_partitioner_that_is_not_callable_is_refused_by_the_strategy(make):
    with pytest.raises(ValueError, match=r"Received: 2 \(of type int\)"):
        make(REPLICAS, PARAMETER_DEVICES, partitioner=2)
    with pytest.raises(ValueError, match="partitioner must be one of"):
        with dpkeras.scope(REPLICAS, PARAMETER_DEVICES, partitioner="fixed"):
            pass


# -- Keras sees one variable -----------------------------------------------------------------


def test_keras_sees_one_variable_of_the_full_shape():
    plain = _build()
    with dpkeras.scope(REPLICAS, PARAMETER_DEVICES, partitioner=P.FixedShardsPartitioner(3)):
        model = _build()
    table = _table(model)
    assert isinstance(table, ShardedParameterVariable)
    assert table.rows == (20, 20, 20)
    assert [tuple(w.shape) for w in model.weights] == [tuple(w.shape) for w in plain.weights]
    assert [w.path for w in model.weights] == [w.path for w in plain.weights]
    assert model.count_params() == plain.count_params()
    lines = []
    model.summary(print_fn=lines.append)
    assert any(f"{ROWS * DIM:,}" in line for line in lines)
    # The same seed gives the same initial numbers: the value is made whole, then cut.
    assert_weights_close(plain.get_weights(), model.get_weights(), rtol=0, atol=0)
    new = [w + 1 for w in plain.get_weights()]
    model.set_weights(new)
    assert_weights_close(new, model.get_weights(), rtol=0, atol=0)
    np.testing.assert_array_equal(table.shards[1].numpy(), new[0][20:40])


def test_a_20000_row_table_and_its_adam_slots_split_in_half_over_two_devices():
    partitioner = P.MinSizePartitioner(min_shard_bytes=256 << 10, max_shards=2)
    with dpkeras.scope(REPLICAS, PARAMETER_DEVICES, partitioner=partitioner):
        model = _build(rows=20000, dim=32)
        model.optimizer.build(model.trainable_variables)
    rows = dpkeras.placement_report(model).rows
    table = [r for r in rows if "table" in r.path]
    assert len(table) == 6  # the table, its momentum and its velocity, 2 shards each
    for r in table:
        assert r.path.rsplit("/", 1)[1] in ("part_0", "part_1")
        assert r.shape == (10000, 32)
    by_device = {}
    for r in table:
        by_device[r.device] = by_device.get(r.device, 0) + r.bytes
    assert by_device == {"/cpu:0": 3 * 10000 * 32 * 4, "/cpu:3": 3 * 10000 * 32 * 4}
    # The small head is not cut (below min_shard_bytes), nor are optimizer scalars.
    assert not any("part_" in r.path for r in rows if "table" not in r.path)
    totals = dpkeras.placement_report(model).totals
    assert abs(totals["/cpu:0"][1] - totals["/cpu:3"][1]) < 2 * 3 * 32 * 4 + 10_000


def test_an_odd_row_count_splits_within_one_row():
    with dpkeras.scope(REPLICAS, PARAMETER_DEVICES, partitioner=P.FixedShardsPartitioner(2)):
        model = _build(rows=20001)
    assert _table(model).rows == (10001, 10000)


def test_shards_follow_the_placement_policy_which_sees_each_as_a_variable():
    seen = []

    def policy(spec):
        seen.append(spec)
        return "/cpu:3" if spec.path.endswith("part_1") else "/cpu:0"

    strategy = _strategy(P.FixedShardsPartitioner(2), parameter_device=policy)
    with strategy.scope():
        model = _build()
    table = _table(model)
    assert [s.device.endswith("CPU:0") for s in table.shards] == [True, False]
    specs = [s for s in seen if s.path.startswith("table/")]
    assert [(s.path, s.shape, s.shard) for s in specs[:2]] == [
        ("table/embeddings/part_0", (30, DIM), (0, 2)),
        ("table/embeddings/part_1", (30, DIM), (1, 2)),
    ]


def test_round_robin_and_greedy_spread_a_variables_shards_over_the_devices():
    for parameter_device in (
        dpkeras.placement.round_robin(PARAMETER_DEVICES),
        PARAMETER_DEVICES,  # greedy_by_size
    ):
        with _strategy(P.FixedShardsPartitioner(2), parameter_device=parameter_device).scope():
            keras.utils.set_random_seed(0)
            tf.Variable(tf.zeros([4]))  # an unequal start: greedy alone would stack the shards
            big = tf.Variable(tf.zeros([1000, 8]))
        devices = {s.device[-5:] for s in big.shards}
        assert devices == {"CPU:0", "CPU:3"}, parameter_device


# -- training equals one unsharded device ----------------------------------------------------


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "adam"])
@pytest.mark.parametrize("shards", [2, 3])
def test_training_a_sharded_table_equals_one_unsharded_device(optimizer, shards):
    x, y = _data()
    plain = _build(optimizer=optimizer)
    initial = plain.get_weights()
    expected = plain.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0).history
    with dpkeras.scope(REPLICAS, PARAMETER_DEVICES, partitioner=P.FixedShardsPartitioner(shards)):
        model = _build(optimizer=optimizer)
    model.set_weights(initial)
    history = model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0).history
    assert len(_table(model).shards) == shards
    assert_weights_close(plain.get_weights(), model.get_weights())
    for key in expected:
        np.testing.assert_allclose(history[key], expected[key], rtol=1e-5)
    assert_weights_close(
        [v.numpy() for v in plain.optimizer.variables],
        [v.numpy() for v in model.optimizer.variables],
    )


@pytest.mark.parametrize(
    "optimizer",
    [
        lambda: keras.optimizers.AdamW(0.05, weight_decay=0.1, use_ema=True, global_clipnorm=0.5),
        lambda: keras.optimizers.SGD(0.5, clipnorm=0.01),
        lambda: keras.optimizers.Adam(0.05, gradient_accumulation_steps=2),
    ],
    ids=["adamw-ema-global-clipnorm", "sgd-clipnorm", "adam-accumulation"],
)
def test_decay_ema_clipping_and_accumulation_equal_one_device_when_sharded(optimizer):
    x, y = _data()

    plain = _build(optimizer=optimizer())
    initial = plain.get_weights()
    plain.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    with dpkeras.scope(REPLICAS, PARAMETER_DEVICES, partitioner=P.FixedShardsPartitioner(2)):
        model = _build(optimizer=optimizer())
    model.set_weights(initial)
    model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    assert_weights_close(plain.get_weights(), model.get_weights())


def test_a_custom_loop_gets_a_sparse_gradient_per_lookup_and_the_same_rows():
    strategy = _strategy(P.FixedShardsPartitioner(3))
    with strategy.scope():
        table = tf.Variable(tf.reshape(tf.range(ROWS * DIM, dtype=tf.float32), (ROWS, DIM)))
    ids = tf.constant([[59, 0], [21, 20]])
    expected = tf.gather(table.numpy(), ids)

    @tf.function
    def step():
        def replica_fn():
            with tf.GradientTape() as tape:
                looked_up = [
                    tf.gather(table, ids),
                    tf.nn.embedding_lookup(table, ids),
                    keras.ops.take(table, ids, axis=0),
                ]
                loss = tf.add_n([tf.reduce_sum(r) for r in looked_up])
            grad = tape.gradient(loss, table)
            return looked_up, grad

        return strategy.run(replica_fn)

    looked_up, grad = step()
    for rows in looked_up:
        np.testing.assert_array_equal(strategy.experimental_local_results(rows)[0], expected)
    g = strategy.experimental_local_results(grad)[0]
    assert isinstance(g, tf.IndexedSlices)
    np.testing.assert_array_equal(tf.convert_to_tensor(g).numpy()[59], np.full(DIM, 3.0))
    assert tf.convert_to_tensor(g).numpy()[1].sum() == 0


@pytest.mark.parametrize("optimizer", [keras.optimizers.Adafactor, keras.optimizers.Lamb])
def test_an_optimizer_that_is_not_row_wise_is_refused_before_training(optimizer):
    with dpkeras.scope(REPLICAS, PARAMETER_DEVICES, partitioner=P.FixedShardsPartitioner(2)):
        model = _build(optimizer=optimizer())
        with pytest.raises(ValueError, match=f"{optimizer.__name__} cannot update sharded"):
            model.optimizer.build(model.trainable_variables)


# -- transfers -------------------------------------------------------------------------------


def test_a_step_moves_looked_up_rows_never_the_table_or_a_shard():
    partitioner = P.FixedShardsPartitioner(2)
    with dpkeras.scope(REPLICAS, PARAMETER_DEVICES, partitioner=partitioner):
        model = _build(rows=4000, dim=16, optimizer="adam")
    x, y = _data(n=32, rows=4000)
    report = dpkeras.train_step_transfers(model, x, y)
    shard_bytes = 2000 * 16 * 4
    assert max(t.bytes for t in report.transfers) < shard_bytes / 10
    tables = [t for t in report.transfers if t.shape and t.shape[0] in (4000, 2000)]
    assert tables == []
    # A tensor of unknown shape counts 0 bytes, so the checks above would miss a table sent
    # with a dynamic shape: every float tensor of unknown shape a replica receives must be
    # the output of a gather on a parameter device (looked-up rows), nothing else.
    unknown = [
        t
        for t in report.transfers
        if t.destination in REPLICAS and t.dtype == "float32" and None in (t.shape or (0,))
    ]
    assert unknown, report.transfers
    assert all(
        t.source in PARAMETER_DEVICES and re.search(r"/Gather(_\d+)?$", t.tensor) for t in unknown
    ), unknown
    # What the replicas receive of the table: rows of width 16 (a count known only at run
    # time, so shaped (None, 16)).
    rows = [t for t in report.transfers if t.destination in ("/cpu:1", "/cpu:2")]
    assert any(t.shape == (None, 16) for t in rows)
    # Each replica sends each shard its own gradient rows: no rows pass between the two
    # parameter devices on their way to the shard that holds them.
    between = [
        t
        for t in report.transfers
        if {t.source, t.destination} == {"/cpu:0", "/cpu:3"} and t.shape == (None, 16)
    ]
    assert between == []
    to_shards = [t for t in report.transfers if t.destination in ("/cpu:0", "/cpu:3")]
    assert {t.destination for t in to_shards if t.shape == (None, 16)} == {"/cpu:0", "/cpu:3"}


# -- files -----------------------------------------------------------------------------------


def _sharded(shards, seed=3):
    if shards == 1:
        return _build(seed=seed)
    with dpkeras.scope(REPLICAS, PARAMETER_DEVICES, partitioner=P.FixedShardsPartitioner(shards)):
        return _build(seed=seed)


@pytest.mark.parametrize("source, target", [(2, 3), (3, 1), (1, 2)])
def test_weights_files_move_across_shard_counts_and_plain_keras(tmp_path, source, target):
    x, _ = _data()
    a = _sharded(source)
    a.fit(*_data(), batch_size=16, epochs=1, verbose=0)
    a.save_weights(tmp_path / "w.weights.h5")
    b = _sharded(target, seed=11)
    b.load_weights(tmp_path / "w.weights.h5")
    assert_weights_close(a.get_weights(), b.get_weights(), rtol=0, atol=0)
    np.testing.assert_allclose(b.predict(x, verbose=0), a.predict(x, verbose=0), atol=1e-6)


def test_a_keras_file_of_a_sharded_model_loads_in_plain_keras(tmp_path):
    x, y = _data()
    model = _sharded(2)
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    model.save(tmp_path / "m.keras")
    plain = keras.models.load_model(tmp_path / "m.keras")
    assert_weights_close(model.get_weights(), plain.get_weights(), rtol=0, atol=0)
    np.testing.assert_allclose(plain.predict(x, verbose=0), model.predict(x, verbose=0), atol=1e-6)
    with dpkeras.scope(REPLICAS, PARAMETER_DEVICES, partitioner=P.FixedShardsPartitioner(3)):
        again = keras.models.load_model(tmp_path / "m.keras")
    assert _table(again).rows == (20, 20, 20)
    assert_weights_close(model.get_weights(), again.get_weights(), rtol=0, atol=0)


def test_a_checkpoint_moves_across_shard_counts_with_optimizer_state(tmp_path):
    x, y = _data()
    source = _sharded(2)
    source.fit(x, y, batch_size=16, epochs=1, verbose=0)
    path = tf.train.Checkpoint(model=source, optimizer=source.optimizer).write(tmp_path / "c")
    for shards in (3, 1):
        target = _sharded(shards, seed=11)
        strategy = tf.distribute.get_strategy() if shards == 1 else target.distribute_strategy
        with strategy.scope():
            target.optimizer.build(target.trainable_variables)
        tf.train.Checkpoint(model=target, optimizer=target.optimizer).read(path).assert_consumed()
        assert_weights_close(source.get_weights(), target.get_weights(), rtol=0, atol=0)
        assert_weights_close(
            [v.numpy() for v in source.optimizer.variables],
            [v.numpy() for v in target.optimizer.variables],
            rtol=0,
            atol=0,
        )


def test_savedmodel_export_of_a_sharded_variable_says_what_works_instead(tmp_path):
    model = _sharded(2)
    with pytest.raises(NotImplementedError, match="load it outside dpkeras.scope"):
        tf.saved_model.save(model, str(tmp_path / "saved"))
    # What the message says works: .keras, loaded in plain Keras, exports.
    x, _ = _data()
    model.save(tmp_path / "m.keras")
    plain = keras.models.load_model(tmp_path / "m.keras")
    plain.export(str(tmp_path / "served"), verbose=False)
    served = tf.saved_model.load(str(tmp_path / "served"))
    np.testing.assert_allclose(served.serve(x), model.predict(x, verbose=0), atol=1e-6)


# -- errors lose nothing ---------------------------------------------------------------------


def test_an_invalid_partition_creates_nothing():
    strategy = _strategy(lambda shape, dtype: [0] + [1] * (len(shape) - 1))
    before = len(strategy.extended.variables())
    with strategy.scope():
        with pytest.raises(ValueError, match="every count must be at least 1"):
            tf.Variable(tf.zeros([8, 2]), name="bad")
    assert len(strategy.extended.variables()) == before


def test_writes_and_scatters_reach_the_right_shards():
    strategy = _strategy(P.FixedShardsPartitioner(3))
    with strategy.scope():
        v = tf.Variable(tf.zeros([7, 2]))
    assert v.rows == (3, 2, 2)
    v.assign(tf.reshape(tf.range(14, dtype=tf.float32), (7, 2)))
    v.scatter_add(tf.IndexedSlices(tf.ones([3, 2]), tf.constant([6, 0, 3])))
    v.assign_sub(tf.ones([7, 2]))
    expected = np.arange(14, dtype="float32").reshape(7, 2) - 1
    expected[[6, 0, 3]] += 1
    np.testing.assert_array_equal(v.numpy(), expected)
    np.testing.assert_array_equal(v.shards[2].numpy(), expected[5:])
    with pytest.raises(ValueError, match=r"Cannot assign a value of shape \(6, 2\)"):
        v.assign(tf.zeros([6, 2]))
    with pytest.raises(NotImplementedError, match="scatter_nd_update is not supported"):
        v.scatter_nd_update([[0, 0]], [1.0])


# -- TF1's partitioner= ----------------------------------------------------------------------


def test_get_variable_partitioner_cuts_that_variable():
    with dpkeras.scope(REPLICAS, PARAMETER_DEVICES), dpkeras.VariableStore():
        with dpkeras.variable_scope("emb"):
            table = dpkeras.get_variable(
                "table", [10, 4], partitioner=P.FixedShardsPartitioner(3), initializer="ones"
            )
            whole = dpkeras.get_variable("bias", [10], initializer="zeros")
    assert table.path == "emb/table" and tuple(table.shape) == (10, 4)
    assert table.value.rows == (4, 3, 3)
    assert not isinstance(whole.value, ShardedParameterVariable)
    np.testing.assert_array_equal(table.numpy(), np.ones((10, 4)))


def test_variable_scope_partitioner_cuts_layers_and_get_variables_but_not_scalars():
    with dpkeras.scope(REPLICAS, PARAMETER_DEVICES), dpkeras.VariableStore():
        with dpkeras.variable_scope("net", partitioner=P.FixedShardsPartitioner(2)) as scope:
            layer = keras.layers.Dense(3, name="fc")
            layer.build((None, 6))
            step = dpkeras.get_variable("step", [], dtype="int64", initializer="zeros")
            with dpkeras.variable_scope("inner"):
                inner = dpkeras.get_variable("w", [4, 2])
        with dpkeras.variable_scope(scope, reuse=dpkeras.AUTO_REUSE):
            again = dpkeras.get_variable("fc_like", [4], initializer="zeros", partitioner=None)
    assert scope.partitioner is not None
    assert layer.kernel.value.rows == (3, 3) and layer.bias.value.rows == (2, 1)
    assert not isinstance(step.value, ShardedParameterVariable)  # scalars stay whole
    assert inner.value.rows == (2, 2)  # nested scopes inherit it
    assert again.value.rows == (2, 2)  # so does re-entering the scope object


def test_tf1_partitioner_errors_create_nothing():
    with dpkeras.scope(REPLICAS, PARAMETER_DEVICES) as strategy, dpkeras.VariableStore() as store:
        before = len(strategy.extended.variables())
        with pytest.raises(ValueError, match="'s' is a scalar and cannot be partitioned"):
            dpkeras.get_variable("s", [], partitioner=P.FixedShardsPartitioner(2))
        with pytest.raises(ValueError, match="asks for 5 shards of variable 't'"):
            dpkeras.get_variable("t", [4, 2], partitioner=lambda shape, dtype: [5, 1])
        with pytest.raises(ValueError, match=r"get_variable\(partitioner=...\) must be one of"):
            dpkeras.get_variable("u", [4, 2], partitioner=3)
        with pytest.raises(ValueError, match="partitioner must be one of"):
            with dpkeras.variable_scope("bad", partitioner="two"):
                pass
        assert len(strategy.extended.variables()) == before
        assert store.paths() == []


def test_tf1_partitioner_outside_dpkeras_is_an_error_not_ignored():
    with dpkeras.VariableStore():
        with pytest.raises(ValueError, match=r"partitioner=.* needs dpkeras.scope\(\)"):
            dpkeras.get_variable("t", [4, 2], partitioner=P.FixedShardsPartitioner(2))
        with dpkeras.variable_scope("net", partitioner=P.FixedShardsPartitioner(2)):
            with pytest.raises(ValueError, match=r"needs dpkeras.scope\(\)"):
                keras.layers.Dense(3).build((None, 4))


def test_a_variable_colocated_with_a_sharded_one_must_have_its_shape():
    strategy = _strategy(P.FixedShardsPartitioner(2))
    with strategy.scope():
        table = tf.Variable(tf.zeros([6, 2]))
        with strategy.extended.colocate_vars_with(table):
            twin = tf.Variable(tf.ones([6, 2]))
            with pytest.raises(ValueError, match=r"is created beside sharded variable .* \(6, 2\)"):
                tf.Variable(tf.zeros([3]), name="odd")
    assert twin.rows == table.rows
    assert [s.device for s in twin.shards] == [s.device for s in table.shards]
