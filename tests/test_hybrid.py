"""`placement.REPLICATED` and `placement.hybrid()` on one machine: dense variables with a copy
on every compute device, all-reduced among them; tables on the parameter device.

3 replicas on /cpu:1-3, tables on /cpu:0. Exact as everything else (the "What is exact" table
under hybrid placement: tests/test_exact_matrix.py); BatchNormalization,
Dropout and seeds give what all-on-the-parameter-device gives; the copies stay bit-identical
(after training, resuming, loading); checkpoints and `.keras` files move between placements.
"""

import contextlib
import re

import keras
import numpy as np
import pytest
import tensorflow as tf

import dpkeras
from dpkeras import placement
from dpkeras._extended import all_reduce
from dpkeras.layers import DynamicEmbedding
from dpkeras.testing import assert_weights_close, cpu_strategy
from tests.gpu import needs_gpus
from tests.models import assert_copies_identical, build_model, make_data, train


def _hybrid(replicas=3):
    return cpu_strategy(replicas, placement.hybrid())


def test_hybrid_places_tables_on_the_parameter_device_and_replicates_the_rest():
    with _hybrid().scope():
        model = build_model("embedding")
        model.optimizer.build(model.trainable_variables)
    report = dpkeras.placement_report(model)

    def row(pattern):  # paths carry numbers when a model is made again in a process
        (found,) = [r for r in report.rows if re.fullmatch(pattern, r.path)]
        return found

    assert row(r"sequential(_\d+)?/embedding(_\d+)?/embeddings").device == "/cpu:0"
    assert row(r"adam(_\d+)?/.*embeddings_momentum").device == "/cpu:0"
    kernel = row(r"sequential(_\d+)?/dense(_\d+)?/kernel")
    assert kernel.device == "replicated"
    assert kernel.copies == ("/cpu:1", "/cpu:2", "/cpu:3")
    assert row(r"adam(_\d+)?/.*dense(_\d+)?_kernel_velocity").device == "replicated"
    assert row(r"adam(_\d+)?/iteration").device == "replicated"
    assert report.totals["/cpu:1"][1] >= 3 * kernel.bytes  # the kernel and its two slots
    # A replicated variable counts on every copy's device: /cpu:1 to /cpu:3 hold the same.
    replicated = [r for r in report.rows if r.device == "replicated"]
    for device in ("/cpu:1", "/cpu:2", "/cpu:3"):
        assert report.totals[device] == (len(replicated), sum(r.bytes for r in replicated))
    assert repr(_hybrid().extended.placement_policy) == "hybrid([/cpu:0])"
    assert _hybrid() is _hybrid()  # hybrid() == hybrid(): one strategy


@pytest.mark.parametrize("kind", ["batchnorm", "dropout"])
def test_batchnorm_and_dropout_train_as_on_the_parameter_device(kind):
    """BatchNormalization's moving statistics (aggregation NONE: replica 0's write) and Dropout's
    seeds (replica 0's state, each replica its own masks) as with every variable on /cpu:0."""
    # SGD: Adam would magnify the float noise of the Dense bias before BatchNormalization
    # (its gradient is zero but for rounding, which differs between a ring and one sum).
    on_ps, history_ps, eval_ps = train(kind, cpu_strategy(3), optimizer="sgd")
    hybrid, history, evaluation = train(kind, _hybrid(), optimizer="sgd")
    assert_weights_close(on_ps.get_weights(), hybrid.get_weights(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(history["loss"], history_ps["loss"], rtol=1e-5)
    np.testing.assert_allclose(evaluation, eval_ps, rtol=1e-5)
    assert_copies_identical(hybrid)


def test_gradients_are_all_reduced_among_the_compute_devices_not_through_the_parameter_device():
    """One collective per device per step for the whole dense model (packed), and nothing of a
    dense layer reaches /cpu:0: it receives only the metrics' scalars. Nothing crosses between
    two compute devices but inside the collective: each device's sum stays on that device."""
    with _hybrid().scope():
        model = build_model("dense")
    x, y = make_data("dense", 96)
    report = dpkeras.train_step_transfers(model, x, y, batch_size=96)
    dense_bytes = sum(int(np.prod(v.shape)) * 4 for v in model.trainable_variables)
    for device in _hybrid().extended.worker_devices:
        assert report.collectives_on(device) == (1, dense_bytes), report.summary()
    tensors, received = report.to_device("/cpu:0", batch=False)
    metric_scalars = sum(len(m.variables) for m in model.metrics)
    assert tensors <= 3 * metric_scalars and received <= 4 * 3 * metric_scalars, report.summary()
    sent = [t for t in report.transfers if t.source == "/cpu:0" and not t.of_the_batch]
    assert sum(t.bytes for t in sent) <= 4 * 3 * metric_scalars, sent
    between = [t for t in report.transfers if "/cpu:0" not in (t.source, t.destination)]
    assert not between, between


def test_tables_send_rows_and_dense_layers_all_reduce():
    with _hybrid().scope():
        model = build_model("embedding")
    x, y = make_data("embedding", 96)
    report = dpkeras.train_step_transfers(model, x, y, batch_size=96)
    dense = model.layers[-1]
    # To and from /cpu:0: the table's rows and their gradients, the metrics; no dense tensor.
    dense_shapes = {tuple(v.shape) for v in dense.variables}
    at_the_table = [t for t in report.transfers if "/cpu:0" in (t.source, t.destination)]
    assert not [t for t in at_the_table if t.shape in dense_shapes], at_the_table
    dense_bytes = sum(int(np.prod(v.shape)) * 4 for v in dense.trainable_variables)
    for device in _hybrid().extended.worker_devices:
        assert report.collectives_on(device) == (1, dense_bytes), report.summary()


def test_copies_stay_identical_under_writes_from_outside_a_step():
    with _hybrid().scope():
        model = build_model("dense")
    kernel = model.layers[0].kernel
    kernel.assign(np.ones(kernel.shape, "float32"))
    kernel.assign_add(np.full(kernel.shape, 2.0, "float32"))
    model.set_weights([w + 1 for w in model.get_weights()])
    assert_copies_identical(model)
    np.testing.assert_array_equal(kernel.numpy(), np.full(kernel.shape, 4.0, "float32"))


def test_keras_files_move_between_placements(tmp_path):
    model, _, evaluation = train("batchnorm", _hybrid())
    path = str(tmp_path / "hybrid.keras")
    model.save(path)
    plain = keras.models.load_model(path)
    assert_weights_close(model.get_weights(), plain.get_weights(), rtol=0, atol=0)
    with cpu_strategy(3).scope():
        on_ps = keras.models.load_model(path)
    assert_weights_close(model.get_weights(), on_ps.get_weights(), rtol=0, atol=0)
    on_ps.save(str(tmp_path / "on_ps.keras"))
    with _hybrid().scope():
        back = keras.models.load_model(str(tmp_path / "on_ps.keras"))
    assert_weights_close(model.get_weights(), back.get_weights(), rtol=0, atol=0)
    assert_copies_identical(back)
    x, y = make_data("batchnorm", 288)
    np.testing.assert_allclose(back.evaluate(x, y, batch_size=96, verbose=0), evaluation, 1e-6)


def test_export_serves_the_same_predictions(tmp_path):
    model = train("batchnorm", _hybrid())[0]
    x, _ = make_data("batchnorm", 32)
    expected = model.predict(x, batch_size=32, verbose=0)
    model.export(str(tmp_path / "exported"), verbose=False)
    served = tf.saved_model.load(str(tmp_path / "exported"))
    np.testing.assert_allclose(served.serve(x).numpy(), expected, rtol=1e-5, atol=1e-6)


class _Counter(keras.layers.Layer):
    """Counts its calls in a non-trainable variable (Keras's own export test's layer)."""

    def build(self, input_shape):
        self.count = self.add_variable((), "zeros", "int32", trainable=False)

    def call(self, inputs):
        self.count.assign_add(1)
        return inputs, self.count.value


class _TwoSteps(tf.Module):
    """Adds 1 twice per call with tf.Variable.assign_add (not Keras's assign(v + 1))."""

    def __init__(self):
        self.v = tf.Variable(1.0)

    @tf.function(input_signature=[])
    def bump(self):
        self.v.assign_add(1.0)
        self.v.assign_add(1.0)
        return self.v.read_value()


@pytest.mark.parametrize("placed", ["all-on-ps", "hybrid"])
def test_an_export_writes_its_state_once_per_call_as_with_every_variable_on_the_ps(
    tmp_path, placed
):
    """A SavedModel of a model whose state is replicated holds one variable per replicated one
    (copy 0's value) and its functions, traced outside a replica, write it once per write: a
    counter counts, Dropout's seed moves, `assign_add` adds once (Keras's saved_model_test
    and tfsm_layer_test). In the process, the copies stay identical."""
    strategy = _hybrid(2) if placed == "hybrid" else cpu_strategy(2)
    x = np.ones((3, 4), "float32")
    with strategy.scope():
        counter = keras.Sequential([keras.Input((4,)), _Counter()])
        counter(x)
        module = _TwoSteps()
        assert float(module.bump()) == 3.0
        keras.utils.set_random_seed(1)
        dropout = keras.Sequential([keras.Input((4,)), keras.layers.Dropout(0.5)])
        archive = keras.export.ExportArchive()
        archive.track(dropout)
        archive.add_endpoint(
            "train", lambda x: dropout(x, training=True), [tf.TensorSpec((None, 4))]
        )
        archive.write_out(str(tmp_path / "dropout"), verbose=False)
    count = counter.layers[0].count.value
    assert isinstance(count, dpkeras.ReplicatedVariable) == (placed == "hybrid")
    for variable, value in ((count, 1), (module.v, 3.0)):
        for copy in getattr(variable, "copies", [variable]):
            assert copy.numpy() == value
    counter.export(str(tmp_path / "counter"), verbose=False)
    tf.saved_model.save(module, str(tmp_path / "module"))
    served = tf.saved_model.load(str(tmp_path / "counter"))
    assert [int(served.serve(x)[1]) for _ in range(3)] == [2, 3, 4]
    served = tf.saved_model.load(str(tmp_path / "module"))
    assert [float(served.bump()) for _ in range(3)] == [5.0, 7.0, 9.0]
    served = tf.saved_model.load(str(tmp_path / "dropout"))
    first, second = served.train(tf.ones((64, 4))), served.train(tf.ones((64, 4)))
    assert not np.array_equal(first.numpy(), second.numpy())


@pytest.mark.parametrize("direction", ["ps_to_hybrid", "hybrid_to_ps"])
def test_checkpoints_restore_into_either_placement(tmp_path, direction):
    source, target = (cpu_strategy(3), _hybrid())
    if direction == "hybrid_to_ps":
        source, target = target, source
    model = train("embedding", source, epochs=1)[0]
    checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer)
    path = checkpoint.save(str(tmp_path / "ckpt"))
    with target.scope():
        restored = build_model("embedding", seed=99)
        restored.optimizer.build(restored.trainable_variables)
    tf.train.Checkpoint(model=restored, optimizer=restored.optimizer).restore(
        path
    ).assert_existing_objects_matched()
    assert_weights_close(model.get_weights(), restored.get_weights(), rtol=0, atol=0)
    for a, b in zip(model.optimizer.variables, restored.optimizer.variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.path)
    if direction == "ps_to_hybrid":
        assert_copies_identical(restored)
    # And both go on training alike.
    x, y = make_data("embedding", 96)
    a = model.fit(x, y, batch_size=96, epochs=1, verbose=0, shuffle=False).history["loss"]
    b = restored.fit(x, y, batch_size=96, epochs=1, verbose=0, shuffle=False).history["loss"]
    np.testing.assert_allclose(a, b, rtol=1e-5)


class _Interrupt(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        if epoch == 2:
            raise KeyboardInterrupt


def test_backup_and_restore_resumes_exactly(tmp_path):
    x, y = make_data("batchnorm", 192)
    with _hybrid().scope():
        straight = build_model("batchnorm")
    straight.fit(x, y, batch_size=48, epochs=4, verbose=0, shuffle=False)
    backup = str(tmp_path / "backup")
    with _hybrid().scope():
        first = build_model("batchnorm")
    with pytest.raises(KeyboardInterrupt):
        first.fit(
            x,
            y,
            batch_size=48,
            epochs=4,
            verbose=0,
            shuffle=False,
            callbacks=[keras.callbacks.BackupAndRestore(backup), _Interrupt()],
        )
    with _hybrid().scope():
        resumed = build_model("batchnorm", seed=99)
    resumed.fit(
        x,
        y,
        batch_size=48,
        epochs=4,
        verbose=0,
        shuffle=False,
        callbacks=[keras.callbacks.BackupAndRestore(backup)],
    )
    assert int(resumed.optimizer.iterations.numpy()) == 16
    assert_weights_close(straight.get_weights(), resumed.get_weights(), rtol=1e-6, atol=1e-7)
    assert_copies_identical(resumed)


def test_a_custom_loop_with_replicated_variables():
    """`strategy.run` with `optimizer.apply_gradients`: the same sums as one device."""
    x, y = make_data("dense", 96)
    reference = build_model("dense", optimizer="sgd")
    with _hybrid().scope():
        model = build_model("dense", optimizer="sgd")
    model.set_weights(reference.get_weights())
    loss_fn = keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction="sum_over_batch_size"
    )

    def one_device_step():
        with tf.GradientTape() as tape:
            loss = loss_fn(y, reference(x, training=True))
        grads = tape.gradient(loss, reference.trainable_variables)
        reference.optimizer.apply_gradients(zip(grads, reference.trainable_variables))

    strategy = _hybrid()
    dataset = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices((x, y)).batch(96)
    )

    @tf.function
    def step(batch):
        def replica(features, labels):
            with tf.GradientTape() as tape:
                per_example = keras.losses.sparse_categorical_crossentropy(
                    labels, model(features, training=True), from_logits=True
                )
                loss = tf.reduce_sum(per_example) / 96.0
            grads = tape.gradient(loss, model.trainable_variables)
            model.optimizer.apply_gradients(zip(grads, model.trainable_variables))

        strategy.run(replica, args=batch)

    for batch in dataset:
        step(batch)
    one_device_step()
    assert_weights_close(reference.get_weights(), model.get_weights(), rtol=1e-5, atol=1e-6)
    assert_copies_identical(model)


def test_optimizer_state_on_the_parameter_device_beside_replicated_weights():
    """A policy of one's own: weights (and so their slots) replicated, the optimizer's own
    state (the iteration count Adam's bias correction reads) on /cpu:0. The optimizer's pass
    for each copy reads the count before pass 0 increments it, once."""

    def policy(spec):
        return "/cpu:0" if spec.kind in ("optimizer", "metric") else placement.REPLICATED

    strategy = dpkeras.get_strategy(["/cpu:1", "/cpu:2", "/cpu:3"], policy)
    expected, history, evaluation = train("dense")
    model, got, got_evaluation = train("dense", strategy)
    assert model.optimizer.iterations.value.device.endswith("CPU:0")
    assert int(model.optimizer.iterations.numpy()) == int(expected.optimizer.iterations.numpy())
    assert_weights_close(expected.get_weights(), model.get_weights(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["loss"], history["loss"], rtol=1e-5)
    np.testing.assert_allclose(got_evaluation, evaluation, rtol=1e-5)
    assert_copies_identical(model)


def test_replicated_refuses_metric_state_and_shards():
    def everything_replicated(spec):
        return placement.REPLICATED

    strategy = dpkeras.ParameterDeviceStrategy(
        ["/cpu:1", "/cpu:2"], parameter_device=everything_replicated
    )
    with strategy.scope():
        with pytest.raises(ValueError, match=r"REPLICATED for metric state 'mean/total'"):
            keras.metrics.Mean()
    sharded = dpkeras.ParameterDeviceStrategy(
        ["/cpu:1", "/cpu:2"],
        parameter_device=everything_replicated,
        partitioner=tf.distribute.experimental.partitioners.FixedShardsPartitioner(2),
    )
    with sharded.scope():
        with pytest.raises(ValueError, match=r"REPLICATED for shard .*part_0"):
            keras.layers.Embedding(10, 4).build((None, 3))
    assert not [v for v in sharded.extended.variables() if "embedding" in v.name]


def test_hybrid_arguments_are_checked():
    with pytest.raises(ValueError, match=r"not a valid regular expression"):
        placement.hybrid(tables="(")
    with pytest.raises(ValueError, match=r"tables=\.\.\.\) takes a regular expression"):
        placement.hybrid(tables=3)
    with pytest.raises(ValueError, match=r"must be given to a strategy"):
        placement.hybrid()(placement.VariableSpec("x", (1,), "float32", True, "weight"))
    policy = placement.hybrid("/cpu:0", tables=r"dense_1/")
    spec = placement.VariableSpec("seq/dense_1/kernel", (4, 4), "float32", True, "weight")
    assert policy(spec) == "/job:localhost/replica:0/task:0/device:CPU:0"
    other = placement.VariableSpec("seq/dense/kernel", (4, 4), "float32", True, "weight")
    assert policy(other) is placement.REPLICATED


def test_tables_given_to_an_unbound_hybrid_stay_on_the_parameter_device():
    """`hybrid(tables=...)` bound by the strategy keeps its `tables=`; it is part of what
    makes two hybrid() policies equal, so other `tables=` give another strategy."""
    named = cpu_strategy(3, placement.hybrid(tables=r"/kernel$"))
    assert named is cpu_strategy(3, placement.hybrid(tables=r"/kernel$"))
    assert named is not cpu_strategy(3, placement.hybrid(tables=r"/bias$"))
    assert named is not _hybrid()
    assert repr(named.extended.placement_policy) == "hybrid([/cpu:0], tables='/kernel$')"
    with named.scope():
        model = build_model("dense")
    for v in model.weights:
        replicated = isinstance(v.value, dpkeras.ReplicatedVariable)
        assert replicated == v.path.endswith("/bias"), v.path
        if not replicated:
            assert v.value.device.endswith("CPU:0"), (v.path, v.value.device)


def test_a_subclass_of_a_table_layer_is_a_table():
    """A user's `class MyTable(DynamicEmbedding)`: its rows and bookkeeping on /cpu:0."""

    class MyTable(DynamicEmbedding):
        pass

    with _hybrid().scope():
        layer = MyTable(4, 8, name="mine")
        layer.build((None, 1))
    assert len(layer.variables) > 1
    for v in layer.variables:
        assert not isinstance(v.value, dpkeras.ReplicatedVariable), v.path
        assert v.value.device.endswith("CPU:0"), (v.path, v.value.device)


def test_sum_and_mean_writes_in_a_replica_are_reduced():
    """`assign_add` and `assign` inside `strategy.run`, replica r writing r + 1, on variables
    with aggregation SUM and MEAN, replicated and on the parameter device: the replicas'
    values are reduced, as MirroredStrategy's variables are (the same numbers), and every copy
    holds the result. A Keras variable's `assign_add(x)` is `assign(v + x)`: with SUM its
    replicas' values sum to 3 * 10 + 6."""
    strategy = cpu_strategy(3, placement.hybrid(tables=r"on_ps"))
    variables = {}
    with strategy.scope():
        for where in ("replicated", "on_ps"):
            for how in ("SUM", "MEAN"):
                aggregation = getattr(tf.VariableAggregation, how)
                variables[where, how, "tf"] = tf.Variable(
                    10.0, name=f"{where}_tf_{how}", aggregation=aggregation
                )
                variables[where, how, "keras"] = keras.Variable(
                    10.0, name=f"{where}_keras_{how}", aggregation=how.lower()
                )

    def step(method):
        def replica():
            context = tf.distribute.get_replica_context()
            value = tf.cast(context.replica_id_in_sync_group, tf.float32) + 1.0
            for v in variables.values():
                getattr(v, method)(value)

        tf.function(lambda: strategy.run(replica))()
        got = {}
        for key, v in variables.items():
            value = v.value if isinstance(v, keras.Variable) else v
            assert isinstance(value, dpkeras.ReplicatedVariable) == (key[0] == "replicated")
            copies = value.copies if key[0] == "replicated" else [value]
            got[key] = sorted({float(c.numpy()) for c in copies})
        return got

    added = {"SUM": {"tf": [16.0], "keras": [36.0]}, "MEAN": {"tf": [12.0], "keras": [12.0]}}
    assert step("assign_add") == {k: added[k[1]][k[2]] for k in variables}
    assigned = {"SUM": [6.0], "MEAN": [2.0]}
    assert step("assign") == {k: assigned[k[1]] for k in variables}


def test_jit_compile_runs_without_xla_and_says_so_once(caplog):
    x, y = make_data("dense", 96)
    with _hybrid().scope():
        model = build_model("dense")
        model.compile(
            optimizer="sgd",
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            jit_compile=True,
        )
        second = build_model("dense")  # once per model: a second model is told too
        second.compile(optimizer="sgd", loss="mse", jit_compile=True)
    with caplog.at_level("WARNING", logger="dpkeras"):
        model.fit(x, y, batch_size=48, epochs=1, verbose=0)
        model.fit(x, y, batch_size=48, epochs=1, verbose=0)
        model.evaluate(x, y, batch_size=48, verbose=0)
        model.predict(x, batch_size=48, verbose=0)
        second.predict(x, batch_size=48, verbose=0)
    said = [r.getMessage() for r in caplog.records if "without XLA" in r.getMessage()]
    assert len(said) == 2, said
    assert f"{model.name!r}" in said[0] and f"{second.name!r}" in said[1], said
    assert model.jit_compile is True and second.jit_compile is True  # the user's setting


def test_eager_steps_all_reduce_too():
    """`run_eagerly=True`: no collective can run op by op; each device sums, identically."""
    x, y = make_data("dense", 96)
    expected = build_model("dense")
    expected.fit(x, y, batch_size=48, epochs=1, verbose=0, shuffle=False)
    with _hybrid().scope():
        model = build_model("dense")
        model.compile(
            optimizer=keras.optimizers.Adam(0.01),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            run_eagerly=True,
        )
    model.fit(x, y, batch_size=48, epochs=1, verbose=0, shuffle=False)
    assert_weights_close(expected.get_weights(), model.get_weights(), rtol=1e-5, atol=1e-6)
    assert_copies_identical(model)


@pytest.mark.parametrize("mode", ["eager", "traced"])
def test_each_device_sums_on_itself_and_keeps_its_sum(mode):
    """The all-reduce run eagerly and traced: device i's sum is made on device i (no device
    sends its sum to the others; counted per step in the test of the all-reduce above)."""
    devices = _hybrid().extended.worker_devices
    tokens = []
    for device in devices:
        with tf.device(device):
            tokens.append(tf.Variable(0.0).handle)
    made_on = []

    def sums():
        parts = []
        for i, device in enumerate(devices):
            with tf.device(device):
                parts.append(tf.fill([2], float(i + 1)))
        (out,) = all_reduce.sum_per_copy([parts], devices, tokens, [(2,)])
        made_on.extend(t.device for t in out)
        return out

    out = sums() if mode == "eager" else tf.function(sums)()
    assert [tf.DeviceSpec.from_string(d) for d in made_on] == [
        tf.DeviceSpec.from_string(d) for d in devices
    ]
    for total in out:
        np.testing.assert_array_equal(total.numpy(), [6.0, 6.0])


def test_no_device_joins_the_all_reduce_before_every_replica_has_its_gradients():
    """Each device's collective comes after every replica's gradients (their ops are among its
    ancestors): a replica whose step fails stops every collective before it starts, since a
    collective cancelled midway leaves the worker's collectives aborted for later steps."""
    devices = _hybrid().extended.worker_devices
    tokens = []
    for device in devices:
        with tf.device(device):
            tokens.append(tf.Variable(0.0).handle)

    def sums():
        parts = []
        for i, device in enumerate(devices):
            with tf.device(device):
                parts.append(tf.fill([2], float(i + 1), name=f"gradient_{i}"))
        return all_reduce.sum_per_copy([parts], devices, tokens, [(2,)])

    graph = tf.function(sums).get_concrete_function().graph
    collectives = [op for op in graph.get_operations() if op.type == "CollectiveReduceV2"]
    assert len(collectives) == len(devices)
    for collective in collectives:
        ancestors, pending = set(), [collective]
        while pending:
            op = pending.pop()
            for parent in [t.op for t in op.inputs] + list(op.control_inputs):
                if parent.name not in ancestors:
                    ancestors.add(parent.name)
                    pending.append(parent)
        assert {f"gradient_{i}" for i in range(len(devices))} <= ancestors, collective.device


@needs_gpus(2)
def test_on_gpus_dense_layers_all_reduce_with_nccl():
    gpus = [d.name for d in tf.config.list_logical_devices("GPU")]
    strategy = dpkeras.get_strategy(gpus[:2], placement.hybrid())
    expected = train("embedding")[0]
    model = train("embedding", strategy)[0]
    assert_weights_close(expected.get_weights(), model.get_weights(), rtol=1e-4, atol=1e-5)
    assert_copies_identical(model)


def _sequence_model(kind):
    keras.utils.set_random_seed(5)
    layers = keras.layers
    body = {
        "dense": [keras.Input((3, 4)), layers.Dense(2)],
        "einsum_dense": [
            keras.Input((3, 4)),
            layers.EinsumDense("abc,cd->abd", output_shape=(None, 2), bias_axes="d"),
        ],
        "embedding_dense": [
            keras.Input((3,), dtype="int32"),
            layers.Embedding(20, 4),
            layers.Dense(2),
        ],
        "spectral_normalization": [
            keras.Input((3, 4)),
            layers.SpectralNormalization(layers.Dense(2)),
        ],
    }[kind]
    model = keras.Sequential(body)
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    return model


@pytest.mark.parametrize(
    "kind", ["dense", "einsum_dense", "embedding_dense", "spectral_normalization"]
)
def test_layers_on_sequences_train_through_a_partial_last_batch(kind):
    """A Dense kernel's gradient on rank-3 input comes through a reshape of the batch
    dimensions: in the step traced for the partial last batch (10 samples, batches of 4) its
    static shape is (None, 2). It is the kernel's shape, which the all-reduce takes."""
    rng = np.random.RandomState(0)
    if kind == "embedding_dense":
        x = rng.randint(0, 20, (10, 3)).astype("int32")
    else:
        x = rng.rand(10, 3, 4).astype("float32")
    y = rng.rand(10, 3, 2).astype("float32")
    reference = _sequence_model(kind)
    expected = reference.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0)
    with _hybrid(2).scope():
        model = _sequence_model(kind)
    history = model.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0)
    assert_weights_close(reference.get_weights(), model.get_weights(), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(history.history["loss"], expected.history["loss"], rtol=1e-6)
    assert_copies_identical(model)


def test_a_gradient_of_another_shape_than_its_replicated_variable_is_refused():
    devices = _hybrid(2).extended.worker_devices
    with pytest.raises(
        ValueError,
        match=r"gradient of a replicated variable of shape \(3,\) has shape \(2,\); a gradient "
        r"has its variable's shape",
    ):
        all_reduce.sum_per_copy([[tf.ones([2]), tf.ones([2])]], devices, [None, None], [(3,)])


def test_a_gradient_of_unknown_static_shape_is_checked_on_its_device_when_it_runs():
    """The all-reduce gives a gradient of partly unknown static shape its variable's shape with
    a check that runs in the step, on the replica's device (not a reshape, which would take a
    gradient of the same size and another shape; not on the device in scope, the parameter
    device, which the gradient would cross to and back)."""
    device = _hybrid(2).extended.worker_devices[0]
    ps = _hybrid(2).extended.parameter_devices[0]

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.float32)])
    def summed(gradient):
        with tf.device(ps):
            return all_reduce.sum_per_copy([[gradient]], [device], [None], [(4, 1)])[0][0]

    out = summed(tf.ones([4, 1]))
    assert out.shape == (4, 1)
    np.testing.assert_array_equal(out.numpy(), np.ones([4, 1], "float32"))
    with pytest.raises(tf.errors.InvalidArgumentError):
        summed(tf.ones([1, 4]))  # the size of a (4, 1) gradient, another shape
    graph = summed.get_concrete_function().graph
    on_ps = [f"{op.type} {op.name}" for op in graph.get_operations() if op.device == ps]
    assert not on_ps, on_ps


PS = "/job:localhost/replica:0/task:0/device:CPU:0"


def _through_a_saved_model(path, strategy, x, y):
    """A head trained on a TFSMLayer of the SavedModel at `path`, built under `strategy` (None:
    one device): (the weights after fit, the loaded variables' devices)."""
    with strategy.scope() if strategy is not None else contextlib.nullcontext():
        keras.utils.set_random_seed(2)
        inputs = keras.Input((4,))
        loaded = keras.layers.TFSMLayer(path, trainable=True)
        model = keras.Model(inputs, keras.layers.Dense(1)(loaded(inputs)))
        model.compile(keras.optimizers.SGD(0.1), "mse")
    devices = [v.value.device for v in loaded.variables]
    model.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0)
    return model.get_weights(), devices


def test_a_saved_model_loads_in_a_hybrid_scope_as_with_every_variable_on_the_ps(tmp_path):
    """TensorFlow's loader makes its variables without an initial value (it restores them
    after), and its functions capture each variable's handle once: the loaded variables live on
    the parameter device, as under all-on-ps, and serve, and train through a TFSMLayer, as on one
    device."""
    keras.utils.set_random_seed(1)
    saved = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(2)])
    path = str(tmp_path / "saved_model")
    saved.export(path, verbose=0)
    rng = np.random.RandomState(0)
    x, y = rng.rand(8, 4).astype("float32"), rng.rand(8, 1).astype("float32")
    expected = saved.predict(x, verbose=0)
    for strategy in (_hybrid(2), cpu_strategy(2)):
        with strategy.scope():
            restored = tf.saved_model.load(path)
        assert {v.device for v in restored.variables} == {PS}
        assert not any(isinstance(v, dpkeras.ReplicatedVariable) for v in restored.variables)
        np.testing.assert_array_equal(restored.serve(x).numpy(), expected)
    # hybrid() places them as it places tables: balanced over its parameter devices.
    with cpu_strategy(2, placement.hybrid(["/cpu:0", "/cpu:3"])).scope():
        restored = tf.saved_model.load(path)
    assert {v.device for v in restored.variables} == {PS, PS.replace("CPU:0", "CPU:3")}
    np.testing.assert_array_equal(restored.serve(x).numpy(), expected)
    reference, _ = _through_a_saved_model(path, None, x, y)
    for strategy in (_hybrid(2), cpu_strategy(2)):
        weights, devices = _through_a_saved_model(path, strategy, x, y)
        assert set(devices) == {PS}
        assert_weights_close(reference, weights, rtol=1e-6, atol=1e-7)


def test_one_replica_trains_as_one_device():
    """One compute device: each replicated variable has one copy, and is still summed per copy
    (its own kind's answer, `sum_gradient` None), not left without a gradient."""
    strategy = dpkeras.get_strategy(["/cpu:1"], placement.hybrid())
    expected, history, _ = train("dense")
    model, got, _ = train("dense", strategy)
    assert isinstance(model.trainable_variables[0].value, dpkeras.ReplicatedVariable)
    assert_weights_close(expected.get_weights(), model.get_weights(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["loss"], history["loss"], rtol=1e-5)


def test_a_saved_model_loads_under_a_by_path_policy_answering_replicated(tmp_path):
    """Not under hybrid() alone: a policy of by_path with a REPLICATED default places a loaded
    SavedModel's variables (made without an initial value) on its home parameter device, and
    they serve as saved."""
    keras.utils.set_random_seed(1)
    saved = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(2)])
    path = str(tmp_path / "saved_model")
    saved.export(path, verbose=0)
    x = np.random.RandomState(0).rand(8, 4).astype("float32")
    expected = saved.predict(x, verbose=0)
    policy = placement.by_path({r"embedding": "/cpu:0"}, default=placement.REPLICATED)
    with cpu_strategy(2, policy).scope():
        restored = tf.saved_model.load(path)
    assert {v.device for v in restored.variables} == {PS}
    assert not any(isinstance(v, dpkeras.ReplicatedVariable) for v in restored.variables)
    np.testing.assert_array_equal(restored.serve(x).numpy(), expected)
