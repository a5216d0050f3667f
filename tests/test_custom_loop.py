"""dpkeras works as a plain `tf.distribute` strategy in a custom training loop.

`strategy.run`, `strategy.reduce`, `strategy.gather`, `experimental_local_results`,
`experimental_distribute_dataset`, `distribute_datasets_from_function` and
`experimental_distribute_values_from_function`, and the tf.distribute semantics of variables
written inside a replica (by aggregation and synchronization), with exact expected numbers.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import dpkeras
from dpkeras.testing import assert_weights_close, cpu_strategy

L = keras.layers
AGG = tf.VariableAggregation
GB = 12  # global batch: splits evenly over 2 and 3 replicas
STEPS = 4


def make_data(n=GB * STEPS, seed=0):
    rng = np.random.RandomState(seed)
    return rng.rand(n, 5).astype("float32"), rng.randint(0, 3, n).astype("int32")


def build(optimizer):
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((5,)), L.Dense(8, activation="relu"), L.Dense(3)])
    opt = {"sgd": lambda: keras.optimizers.SGD(0.1), "adam": lambda: keras.optimizers.Adam(0.01)}[
        optimizer
    ]()
    opt.build(model.trainable_variables)
    return model, opt


_loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)


def make_step_fn(model, optimizer, global_batch=GB):
    """The replica function of the classic TF2 custom loop."""

    def step_fn(batch):
        x, y = batch
        with tf.GradientTape() as tape:
            per_example_loss = _loss_fn(y, model(x, training=True))
            loss = tf.nn.compute_average_loss(per_example_loss, global_batch_size=global_batch)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    return step_fn


def train_one_device(optimizer, n=GB * STEPS, global_batch=GB):
    """The reference: the same loop with no strategy, on whole global batches."""
    x, y = make_data(n)
    model, opt = build(optimizer)
    step = tf.function(make_step_fn(model, opt, global_batch))
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch)
    losses = [float(step(batch)) for batch in ds]
    return model, opt, losses


def train_distributed(strategy, optimizer, make_dist_dataset, global_batch=GB):
    with strategy.scope():
        model, opt = build(optimizer)
    step_fn = make_step_fn(model, opt, global_batch)

    @tf.function
    def train_step(batch):
        per_replica_loss = strategy.run(step_fn, args=(batch,))
        return strategy.reduce("SUM", per_replica_loss, axis=None)

    losses = [float(train_step(batch)) for batch in make_dist_dataset(strategy)]
    return model, opt, losses


def _global_batches(strategy, n=GB * STEPS, global_batch=GB):
    x, y = make_data(n)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch)
    return strategy.experimental_distribute_dataset(ds)


def _from_function(strategy):
    x, y = make_data()

    def dataset_fn(input_context):
        per_replica = input_context.get_per_replica_batch_size(GB)
        assert input_context.num_input_pipelines == 1
        assert input_context.num_replicas_in_sync == strategy.num_replicas_in_sync
        ds = tf.data.Dataset.from_tensor_slices((x, y))
        ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
        return ds.batch(per_replica)

    return strategy.distribute_datasets_from_function(dataset_fn)


def _assert_same_training(reference, distributed, steps=STEPS):
    (m1, o1, l1), (m2, o2, l2) = reference, distributed
    assert len(l2) == steps
    np.testing.assert_allclose(l2, l1, rtol=1e-5)
    assert_weights_close(m1.get_weights(), m2.get_weights())
    assert_weights_close([v.numpy() for v in o1.variables], [v.numpy() for v in o2.variables])
    assert int(o2.iterations.numpy()) == steps
    # Training happened: the weights are not the initial ones.
    fresh, _ = build("sgd")
    assert not np.allclose(fresh.get_weights()[0], m2.get_weights()[0])
    for v in m2.variables + o2.variables:
        assert isinstance(v.value, dpkeras.ParameterVariable)
        assert v.value.device.endswith("CPU:0")


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize("replicas", [2, 3])
def test_custom_loop_equals_one_device(replicas, optimizer):
    reference = train_one_device(optimizer)
    keras.backend.clear_session()
    distributed = train_distributed(cpu_strategy(replicas), optimizer, _global_batches)
    _assert_same_training(reference, distributed)


def test_custom_loop_short_last_batch_equals_one_device():
    """50 examples in global batches of 12 on 3 replicas: the last batch (2 examples) leaves
    replica 2 with none. Scaling by the global batch size keeps it equal to one device."""
    n = GB * STEPS + 2
    reference = train_one_device("adam", n=n)
    keras.backend.clear_session()
    distributed = train_distributed(cpu_strategy(3), "adam", lambda s: _global_batches(s, n=n))
    _assert_same_training(reference, distributed, steps=STEPS + 1)


def test_custom_loop_uneven_global_batch_equals_one_device():
    """Global batch 10 on 3 replicas (4/3/3 examples): a custom loop that scales the loss by
    the global batch size is exact with any split, as under MirroredStrategy."""
    n, global_batch = 40, 10
    reference = train_one_device("sgd", n=n, global_batch=global_batch)
    keras.backend.clear_session()
    distributed = train_distributed(
        cpu_strategy(3),
        "sgd",
        lambda s: _global_batches(s, n=n, global_batch=global_batch),
        global_batch=global_batch,
    )
    _assert_same_training(reference, distributed)


@pytest.mark.parametrize("replicas", [2, 3])
def test_distribute_datasets_from_function_equals_one_device(replicas):
    """One input pipeline batched at the per-replica size: replica i of step k gets examples
    `k*GB + i*b ... k*GB + (i+1)*b - 1` (b = GB / N), so a step covers the same global batch
    as one device's step k, and the results must match."""
    reference = train_one_device("adam")
    keras.backend.clear_session()
    distributed = train_distributed(cpu_strategy(replicas), "adam", _from_function)
    _assert_same_training(reference, distributed)


@pytest.mark.parametrize("replicas", [2, 3])
def test_distributed_datasets_split_global_batches_in_order(replicas):
    """Which examples each replica sees, for both distribution APIs, on the replica's device."""
    strategy = cpu_strategy(replicas)
    b = GB // replicas
    ids = tf.data.Dataset.range(GB * 2)

    def dataset_fn(ctx):
        return ids.shard(ctx.num_input_pipelines, ctx.input_pipeline_id).batch(
            ctx.get_per_replica_batch_size(GB)
        )

    for dist in (
        strategy.experimental_distribute_dataset(ids.batch(GB)),
        strategy.distribute_datasets_from_function(dataset_fn),
    ):
        seen = []
        for batch in dist:
            parts = strategy.experimental_local_results(batch)
            assert len(parts) == replicas
            for i, part in enumerate(parts):
                assert part.device.endswith(f"CPU:{i + 1}"), part.device
            seen.append([p.numpy().tolist() for p in parts])
        expected = [
            [list(range(k * GB + i * b, k * GB + (i + 1) * b)) for i in range(replicas)]
            for k in range(2)
        ]
        assert seen == expected


def test_input_options_without_fetch_to_device():
    """`InputOptions(experimental_fetch_to_device=False)` keeps batches on the host and trains;
    CentralStorageStrategy raises AttributeError on the same call (a typo in TF)."""
    strategy = cpu_strategy(2)
    options = tf.distribute.InputOptions(experimental_fetch_to_device=False)
    x, y = make_data()
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(GB)

    first = next(iter(strategy.experimental_distribute_dataset(ds, options)))
    for part in strategy.experimental_local_results(first[0]):
        assert part.device.endswith("CPU:0"), part.device

    reference = train_one_device("sgd")
    keras.backend.clear_session()
    distributed = train_distributed(
        strategy, "sgd", lambda s: s.experimental_distribute_dataset(ds, options)
    )
    _assert_same_training(reference, distributed)

    css = tf.distribute.experimental.CentralStorageStrategy(
        ["/cpu:1", "/cpu:2"], parameter_device="/cpu:0"
    )
    with pytest.raises(AttributeError, match="experimental_replication_mode"):
        css.experimental_distribute_dataset(ds, options)


# -- reduce, gather, local results, values from function ---------------------------------------


def _replica_id():
    return tf.distribute.get_replica_context().replica_id_in_sync_group


def _in_mode(fn, mode):
    return tf.function(fn) if mode == "function" else fn


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("replicas", [2, 3])
def test_reduce_gather_local_results(replicas, mode):
    strategy = cpu_strategy(replicas)
    n = replicas
    ids = np.arange(1, n + 1, dtype="float32")  # replica i contributes i + 1

    def even():
        r = tf.cast(_replica_id(), tf.float32) + 1.0
        return tf.fill([2], r)  # [r, r]

    def uneven():
        r = _replica_id()
        return tf.range(r + 1, dtype=tf.float32) + 1.0  # replica i: [1, ..., i + 1]

    def compute():
        v = strategy.run(even)
        u = strategy.run(uneven)
        return {
            "local": strategy.experimental_local_results(v),
            "sum": strategy.reduce("SUM", v, axis=None),
            "mean": strategy.reduce(tf.distribute.ReduceOp.MEAN, v, axis=None),
            "sum0": strategy.reduce("SUM", v, axis=0),
            "mean0": strategy.reduce("MEAN", v, axis=0),
            "usum0": strategy.reduce("SUM", u, axis=0),
            "umean0": strategy.reduce("MEAN", u, axis=0),
            "gather": strategy.gather(v, axis=0),
            "ugather": strategy.gather(u, axis=0),
        }

    out = _in_mode(compute, mode)()
    local = out["local"]
    assert len(local) == n
    for i, t in enumerate(local):
        np.testing.assert_array_equal(t.numpy(), [i + 1, i + 1])
        if mode == "eager":
            assert t.device.endswith(f"CPU:{i + 1}"), t.device
    np.testing.assert_array_equal(out["sum"].numpy(), [ids.sum()] * 2)
    np.testing.assert_allclose(out["mean"].numpy(), [ids.mean()] * 2, rtol=1e-7)
    assert float(out["sum0"]) == 2 * ids.sum()
    np.testing.assert_allclose(float(out["mean0"]), ids.mean(), rtol=1e-7)
    uneven_all = np.concatenate([np.arange(1, i + 2) for i in range(n)]).astype("float32")
    assert float(out["usum0"]) == uneven_all.sum()  # 1 + 3 (+ 6)
    np.testing.assert_allclose(float(out["umean0"]), uneven_all.mean(), rtol=1e-7)
    np.testing.assert_array_equal(out["gather"].numpy(), np.repeat(ids, 2))
    np.testing.assert_array_equal(out["ugather"].numpy(), uneven_all)


@pytest.mark.parametrize("replicas", [2, 3])
def test_replica_context_all_reduce_and_all_gather(replicas):
    strategy = cpu_strategy(replicas)

    @tf.function
    def run():
        def replica_fn():
            ctx = tf.distribute.get_replica_context()
            r = tf.cast(ctx.replica_id_in_sync_group, tf.float32) + 1.0
            return (
                ctx.all_reduce("SUM", r),
                ctx.all_reduce("MEAN", r),
                ctx.all_gather(tf.reshape(r, [1]), axis=0),
            )

        return [strategy.experimental_local_results(v) for v in strategy.run(replica_fn)]

    sums, means, gathers = run()
    ids = list(range(1, replicas + 1))
    assert [float(v) for v in sums] == [float(sum(ids))] * replicas
    np.testing.assert_allclose([float(v) for v in means], [np.mean(ids)] * replicas, rtol=1e-7)
    for g in gathers:
        assert g.numpy().tolist() == ids


def test_all_reduce_of_one_captured_tensor_is_that_tensor():
    """A tensor captured in every replica (not per-replica) is one contribution: its SUM is
    itself, as under MirroredStrategy."""
    strategy = cpu_strategy(2)
    captured = tf.constant([1.0, 2.0])

    @tf.function
    def run():
        def replica_fn():
            return tf.distribute.get_replica_context().all_reduce("SUM", captured)

        return strategy.experimental_local_results(strategy.run(replica_fn))

    for result in run():
        assert result.numpy().tolist() == [1.0, 2.0]


def test_reduce_uneven_shapes_without_axis_raises():
    strategy = cpu_strategy(3)
    u = strategy.run(lambda: tf.range(_replica_id() + 1, dtype=tf.float32))
    with pytest.raises(ValueError, match="different shapes"):
        strategy.reduce("SUM", u, axis=None)


@pytest.mark.parametrize("replicas", [2, 3])
def test_distribute_values_from_function(replicas):
    strategy = cpu_strategy(replicas)

    def value_fn(ctx):
        assert ctx.num_replicas_in_sync == replicas
        return tf.constant(10.0) * tf.cast(ctx.replica_id_in_sync_group, tf.float32)

    values = strategy.experimental_distribute_values_from_function(value_fn)
    parts = strategy.experimental_local_results(values)
    assert [float(p) for p in parts] == [10.0 * i for i in range(replicas)]
    for i, p in enumerate(parts):
        assert p.device.endswith(f"CPU:{i + 1}"), p.device

    @tf.function
    def double_and_sum(v):
        doubled = strategy.run(lambda x: x * 2.0 + 1.0, args=(v,))
        return (
            strategy.experimental_local_results(doubled),
            strategy.reduce("SUM", doubled, axis=None),
        )

    doubled, total = double_and_sum(values)
    assert [float(d) for d in doubled] == [20.0 * i + 1.0 for i in range(replicas)]
    assert float(total) == sum(20.0 * i + 1.0 for i in range(replicas))


# -- variables written in replica context ------------------------------------------------------


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("replicas", [2, 3])
def test_aggregated_variable_writes(replicas, mode):
    strategy = cpu_strategy(replicas)
    n = replicas
    with strategy.scope():
        summed = tf.Variable(5.0, aggregation=AGG.SUM)
        mean = tf.Variable(0.0, aggregation=AGG.MEAN)
        mean_add = tf.Variable(1.0, aggregation=AGG.MEAN)
        first = tf.Variable(0.0, aggregation=AGG.ONLY_FIRST_REPLICA)
        plain = tf.Variable(0.0)  # aggregation NONE
    assert plain.aggregation == AGG.NONE
    for v in (summed, mean, mean_add, first, plain):
        assert isinstance(v, dpkeras.ParameterVariable) and v.device.endswith("CPU:0")

    def replica_fn():
        r = tf.cast(_replica_id(), tf.float32)
        before = summed.read_value()
        summed.assign_add(1.0)
        after = summed.read_value()  # a read after the write sees it, in every replica
        mean.assign(r + 1.0)  # 1, 2(, 3)
        mean_add.assign_add(10.0 * (r + 1.0))  # adds the mean: 15 (20)
        first.assign(100.0 * (r + 1.0))
        plain.assign(7.0 * (r + 1.0))
        return before, after

    before, after = _in_mode(lambda: strategy.run(replica_fn), mode)()
    assert [float(b) for b in strategy.experimental_local_results(before)] == [5.0] * n
    assert [float(a) for a in strategy.experimental_local_results(after)] == [5.0 + n] * n
    assert float(summed) == 5.0 + n
    assert float(mean) == (n + 1) / 2  # mean of 1..n
    assert float(mean_add) == 1.0 + 10.0 * (n + 1) / 2
    assert float(first) == 100.0
    assert float(plain) == 7.0  # replica 0's write


@pytest.mark.parametrize("replicas", [2, 3])
def test_none_aggregation_write_inside_cond(replicas):
    """NONE-aggregated writes need no synchronisation, so they are legal in `tf.cond` (as
    Keras's LossScaleOptimizer does); replica 0's write wins, and every replica that reads the
    variable after the write in the same step sees it (one variable, not a copy per replica)."""
    strategy = cpu_strategy(replicas)
    with strategy.scope():
        v = tf.Variable(0.0)
        counter = tf.Variable(0, dtype=tf.int64)  # NONE, like LossScaleOptimizer's step_counter

    @tf.function
    def step(flag):
        def replica_fn():
            r = tf.cast(_replica_id(), tf.float32)
            tf.cond(flag, lambda: v.assign(3.0 * (r + 1.0)), lambda: v.assign(-1.0 - r))
            tf.cond(r > 0.5, lambda: counter.assign_add(10), lambda: counter.assign_add(1))
            return v.read_value()

        return strategy.experimental_local_results(strategy.run(replica_fn))

    assert [float(read) for read in step(tf.constant(True))] == [3.0] * replicas
    assert float(v) == 3.0
    assert int(counter) == 1
    assert [float(read) for read in step(tf.constant(False))] == [-1.0] * replicas
    assert float(v) == -1.0
    assert int(counter) == 2


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("replicas", [2, 3])
def test_on_read_sum_variable(replicas, mode):
    strategy = cpu_strategy(replicas)
    with strategy.scope():
        total = tf.Variable(
            0.0, synchronization=tf.VariableSynchronization.ON_READ, aggregation=AGG.SUM
        )

    def replica_fn():
        total.assign_add(tf.cast(_replica_id(), tf.float32) + 1.0)
        return total.read_value()

    reads = strategy.experimental_local_results(_in_mode(lambda: strategy.run(replica_fn), mode)())
    expected = sum(range(1, replicas + 1))  # 1 + 2 (+ 3)
    assert float(total) == expected
    # dpkeras documents that every replica then reads the same, global value.
    assert [float(r) for r in reads] == [expected] * replicas
    _in_mode(lambda: strategy.run(replica_fn), mode)()
    assert float(total) == 2 * expected


class _CreationSpy:
    def __init__(self):
        self.calls = 0

    def __call__(self, next_creator, **kwargs):
        self.calls += 1
        return next_creator(**kwargs)


@pytest.mark.parametrize("dtype", [tf.int32, tf.int64])
def test_int_mean_variable_raises_before_creation(dtype):
    strategy = cpu_strategy(2)
    spy = _CreationSpy()
    # A creator entered before the strategy scope sits below dpkeras's creator: it sees every
    # variable dpkeras lets through.
    with tf.variable_creator_scope(spy), strategy.scope():
        ok = tf.Variable(1.0, aggregation=AGG.MEAN)
        assert spy.calls == 1 and isinstance(ok, dpkeras.ParameterVariable)
        with pytest.raises(ValueError, match=r"aggregation=MEAN.*not an integer"):
            tf.Variable(1, dtype=dtype, aggregation=AGG.MEAN)
        assert spy.calls == 1
        with pytest.raises(ValueError, match=r"aggregation=MEAN"):
            keras.Variable(1, dtype=dtype.name, aggregation="mean")
        assert spy.calls == 1


def test_int_mean_variable_with_inferred_dtype_raises():
    with cpu_strategy(2).scope(), pytest.raises(ValueError, match=r"int32 and aggregation=MEAN"):
        tf.Variable(3, aggregation=AGG.MEAN)


def test_int_mean_variable_with_inferred_dtype_raises_before_creation():
    spy = _CreationSpy()
    with tf.variable_creator_scope(spy), cpu_strategy(2).scope():
        with pytest.raises(ValueError, match=r"int32 and aggregation=MEAN"):
            tf.Variable(3, aggregation=AGG.MEAN)
    assert spy.calls == 0


# -- optimizer iterations ----------------------------------------------------------------------


def test_optimizer_iterations_count_steps_with_three_replicas():
    strategy = cpu_strategy(3)
    with strategy.scope():
        model, opt = build("adam")
    step_fn = make_step_fn(model, opt)
    assert int(opt.iterations.numpy()) == 0
    x, y = make_data()

    @tf.function
    def train_step(batch):
        strategy.run(step_fn, args=(batch,))

    ds = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices((x, y)).batch(GB)
    )
    for k, batch in enumerate(ds, start=1):
        train_step(batch)
        assert int(opt.iterations.numpy()) == k
    # Keras fit on the same model counts one per step too.
    with strategy.scope():  # compile in the model's scope (outside it is refused)
        model.compile(
            optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        )
    model.fit(x, y, batch_size=GB, epochs=1, steps_per_epoch=3, shuffle=False, verbose=0)
    assert int(opt.iterations.numpy()) == STEPS + 3


def test_eager_custom_loop_without_tf_function():
    """`strategy.run` outside any `tf.function` (eager replica threads) trains too."""
    reference = train_one_device("sgd")
    keras.backend.clear_session()
    strategy = cpu_strategy(2)
    with strategy.scope():
        model, opt = build("sgd")
    step_fn = make_step_fn(model, opt)
    losses = [
        float(strategy.reduce("SUM", strategy.run(step_fn, args=(batch,)), axis=None))
        for batch in _global_batches(strategy)
    ]
    _assert_same_training(reference, (model, opt, losses))
