"""Behaviour by kind of variable: metrics, BatchNormalization, Dropout, loss scaling, sparsity."""

import json
import re

import keras
import numpy as np
import pytest
import tensorflow as tf

import dpkeras
from dpkeras.testing import assert_weights_close, cpu_strategy, run_python
from tests.models import build_model, make_data, train


def _on_parameter_device(variable, device="CPU:0"):
    return variable.value.device.endswith(device)


def test_every_kind_of_variable_lives_once_on_the_parameter_device():
    keras.config.set_dtype_policy("mixed_float16")  # adds LossScaleOptimizer state
    strategy = cpu_strategy(3)
    with strategy.scope():
        model = build_model(
            "dropout",
            metrics=("accuracy", keras.metrics.SparseCategoricalCrossentropy(from_logits=True)),
        )
    x, y = make_data("dense", 96)
    model.fit(x, y, batch_size=96, epochs=1, verbose=0)  # creates optimizer slots
    groups = {
        "layer weights": model.weights,
        "optimizer state (slots, iterations, loss scale)": model.optimizer.variables,
        "metric state": [v for m in model.metrics for v in m.variables],
        "seed state": [
            layer.seed_generator.state for layer in model.layers if hasattr(layer, "seed_generator")
        ],
    }
    for name, variables in groups.items():
        assert variables, f"no {name} found: the test would prove nothing"
        for v in variables:
            assert isinstance(v.value, dpkeras.ParameterVariable), (name, v.path)
            assert _on_parameter_device(v), (name, v.path, v.value.device)
    kinds = {v.value.kind for vs in groups.values() for v in vs}
    assert kinds == {"weight", "optimizer", "metric", "seed"}


def test_gradients_are_reduced_on_the_configured_parameter_device():
    strategy = dpkeras.get_strategy(["/cpu:1", "/cpu:2"], parameter_device="/cpu:3")
    with strategy.scope():
        model = build_model("dense")
    x, y = make_data("dense", 96)
    report = dpkeras.train_step_transfers(model, x, y, batch_size=96)
    assert all(_on_parameter_device(v, "CPU:3") for v in model.weights)
    for replica in ("/cpu:1", "/cpu:2"):
        grads = [t for t in report.transfers if t.source == replica and "gradient_tape" in t.tensor]
        assert len(grads) == 4 and all(t.destination == "/cpu:3" for t in grads), grads
        # Only the step's scalar logs (metric results) go to the host for Keras's callbacks.
        to_host = [t for t in report.transfers if t.source == replica and t.destination == "/cpu:0"]
        assert to_host and all(t.shape == () for t in to_host), to_host
    # The host, where Keras's iterator is, sends each replica its share of the batch, no weight.
    from_host = [t for t in report.transfers if t.source == "/cpu:0"]
    assert all(t.of_the_batch for t in from_host), "reads come from /cpu:3 only"
    assert {t.destination for t in from_host} == {"/cpu:1", "/cpu:2"}, from_host


def test_metrics_accumulate_like_one_device():
    """Replica r adds 2 + r. One device seeing the same values: totals 9, 18, 27, mean 3.
    Every replica reports that global mean, not its own value (2, 3 or 4); CentralStorageStrategy
    adds each replica's update more than once."""
    strategy = cpu_strategy(3)
    with strategy.scope():
        metric = keras.metrics.Mean()

    @tf.function
    def step(value):
        def replica_fn():
            ctx = tf.distribute.get_replica_context()
            metric.update_state(value + tf.cast(ctx.replica_id_in_sync_group, tf.float32))
            return metric.result()

        return strategy.run(replica_fn)

    totals, results = [], []
    for _ in range(3):
        per_replica = step(tf.constant(2.0))
        results.append([float(r) for r in strategy.experimental_local_results(per_replica)])
        totals.append(float(metric.total.numpy()))
    assert totals == [9.0, 18.0, 27.0]
    assert results == [[3.0] * 3] * 3  # every replica reports the global value
    assert float(metric.count.numpy()) == 9.0


def test_batchnorm_matches_mirrored_strategy(tmp_path):
    """Each replica normalises with its own batch statistics; replica 0 updates the moving ones,
    which is what MirroredStrategy's primary copy ends with."""
    out = tmp_path / "mirrored.npz"
    run_python(
        f"""
        import sys, numpy as np, tensorflow as tf
        sys.path.insert(0, {str(__import__("pathlib").Path(__file__).parent)!r})
        from tests.models import train
        model = train("batchnorm", tf.distribute.MirroredStrategy(["/cpu:1", "/cpu:2"]))[0]
        np.savez({str(out)!r}, *model.get_weights())
        """,
        cpus=4,
    )
    mirrored = np.load(out)
    mirrored = [mirrored[f"arr_{i}"] for i in range(len(mirrored.files))]
    model = train("batchnorm", cpu_strategy(2))[0]
    assert_weights_close(mirrored, model.get_weights(), rtol=1e-5, atol=1e-5)
    one_device = train("batchnorm")[0]
    moving_mean = [w for w in model.weights if "moving_mean" in w.path][0]
    assert not np.allclose(
        moving_mean.numpy(), [w for w in one_device.weights if "moving_mean" in w.path][0].numpy()
    )


def _dropout_masks(strategy, seed):
    keras.utils.set_random_seed(seed)
    with strategy.scope():
        layer = keras.layers.Dropout(0.5)

    @tf.function
    def step():
        return strategy.run(lambda: layer(tf.ones((1, 64)), training=True))

    first = [r.numpy() for r in strategy.experimental_local_results(step())]
    second = [r.numpy() for r in strategy.experimental_local_results(step())]
    return first, second


def test_dropout_masks_differ_across_replicas_and_steps_and_are_reproducible():
    strategy = cpu_strategy(3)
    first, second = _dropout_masks(strategy, seed=5)
    masks = [tuple((m > 0).ravel()) for m in first + second]
    assert len(set(masks)) == 6, "replicas or steps repeated a Dropout mask"
    again_first, again_second = _dropout_masks(strategy, seed=5)
    for a, b in zip(first + second, again_first + again_second):
        np.testing.assert_array_equal(a, b)


def test_dropout_model_trains_and_is_reproducible():
    losses = [train("dropout", cpu_strategy(2))[1]["loss"] for _ in range(2)]
    assert losses[0] == losses[1]
    assert np.all(np.isfinite(losses[0]))


@pytest.mark.parametrize(
    "policy,atol,optimizer",
    # bfloat16 keeps 8 bits of mantissa: with SGD (not Adam, which normalises a gradient's
    # size away) the tolerance still tells a gradient 3 times too small.
    [("mixed_float16", 2e-4, "adam"), ("mixed_bfloat16", 2e-2, "sgd")],
)
def test_mixed_precision_trains_like_one_device(policy, atol, optimizer):
    keras.config.set_dtype_policy(policy)
    expected, expected_history, _ = train("dense", optimizer=optimizer)
    model, history, _ = train("dense", cpu_strategy(3), optimizer=optimizer)
    assert_weights_close(expected.get_weights(), model.get_weights(), rtol=1e-3, atol=atol)
    np.testing.assert_allclose(history["loss"], expected_history["loss"], rtol=1e-3)
    if policy == "mixed_float16":
        opt, ref = model.optimizer, expected.optimizer
        assert isinstance(opt, keras.optimizers.LossScaleOptimizer)
        assert int(opt.step_counter.numpy()) == int(ref.step_counter.numpy()) == 6
        assert float(opt.dynamic_scale.numpy()) == float(ref.dynamic_scale.numpy())
        assert int(opt.iterations.numpy()) == 6


@pytest.mark.parametrize(
    "bad_rows",
    [slice(None), slice(0, 1), slice(60, 61)],
    ids=["all-replicas", "replica-0", "replica-1"],
)
def test_loss_scale_backs_off_on_overflow_once_per_step(bad_rows):
    """Non-finite gradients on any replica halve the loss scale once and skip the step.

    Keras's LossScaleOptimizer reads replica 0's verdict only (so under MirroredStrategy an
    overflow on replica 1 alone reaches the weights); dpkeras makes the verdict global.
    """
    keras.config.set_dtype_policy("mixed_float16")
    with cpu_strategy(2).scope():
        model = build_model("dense")
    initial = model.get_weights()
    x, y = make_data("dense", 96)
    x[bad_rows, 0] = np.inf
    model.fit(x, y, batch_size=96, epochs=1, shuffle=False, verbose=0)
    assert float(model.optimizer.dynamic_scale.numpy()) == 32768.0 / 2
    assert int(model.optimizer.iterations.numpy()) == 0
    assert int(model.optimizer.step_counter.numpy()) == 0
    for a, b in zip(initial, model.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_mirrored_contrasts_the_readme_states():
    """Pinned, so a TensorFlow or Keras change to them fails here: under MirroredStrategy every
    replica draws the same Dropout mask, and an overflow on replica 1 alone reaches the weights
    (the two tests above show dpkeras doing otherwise)."""
    out = run_python(
        """
        import json
        import keras, numpy as np, tensorflow as tf
        from tests.models import build_model, make_data
        mirrored = tf.distribute.MirroredStrategy(["/cpu:1", "/cpu:2", "/cpu:3"])
        keras.utils.set_random_seed(5)
        with mirrored.scope():
            layer = keras.layers.Dropout(0.5)

        @tf.function
        def step():
            return mirrored.run(lambda: layer(tf.ones((1, 64)), training=True))

        masks = {tuple((r.numpy() > 0).ravel())
                 for r in mirrored.experimental_local_results(step())}
        keras.config.set_dtype_policy("mixed_float16")
        with tf.distribute.MirroredStrategy(["/cpu:1", "/cpu:2"]).scope():
            model = build_model("dense")
        initial = model.get_weights()
        x, y = make_data("dense", 96)
        x[60:61, 0] = np.inf  # a row of replica 1's half
        model.fit(x, y, batch_size=96, epochs=1, shuffle=False, verbose=0)
        print(json.dumps({
            "masks": len(masks),
            "iterations": int(model.optimizer.iterations.numpy()),
            "weights_changed": any(not np.array_equal(a, b)
                                   for a, b in zip(initial, model.get_weights())),
        }))
        """,
        cpus=4,
    )
    assert json.loads(out.strip().splitlines()[-1]) == {
        "masks": 1,
        "iterations": 1,
        "weights_changed": True,
    }


@pytest.mark.parametrize("replicas", [2, 3])
@pytest.mark.parametrize("deduplicate", [False, True])
def test_embedding_rows_travel_not_the_table(replicas, deduplicate):
    """Lookups gather on the parameter device and gradients come back as IndexedSlices: each
    replica receives and returns only its looked-up rows of the 5000 x 64 table. Without
    deduplication the rows' count is static (every id's row); with it, the distinct ids' rows,
    a count known at run time only: then each tensor of run-time size must be a gather's rows
    (or a gradient's), and nothing near the table's size crosses."""
    keras.utils.set_random_seed(0)
    global_batch = 48
    devices = list(cpu_strategy(replicas).extended.worker_devices)
    strategy = dpkeras.get_strategy(devices, "/cpu:0", None, None, deduplicate)
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((4,), dtype="int32"),
                keras.layers.Embedding(5000, 64),
                keras.layers.GlobalAveragePooling1D(),
                keras.layers.Dense(1),
            ]
        )
        model.compile(optimizer="adam", loss="mse")
    x = np.random.RandomState(0).randint(0, 5000, (global_batch, 4)).astype("int32")
    report = dpkeras.train_step_transfers(model, x, np.zeros(global_batch), batch_size=global_batch)
    rows_bytes = global_batch // replicas * 4 * 64 * 4
    for replica in devices:
        short = dpkeras._device_names.short_device(replica)
        received = [t for t in report.transfers if t.destination == short]
        sent = [t for t in report.transfers if t.source == short and t.destination == "/cpu:0"]
        assert max(t.bytes for t in sent) == rows_bytes, [(t.tensor, t.shape) for t in sent]
        if not deduplicate:
            assert max(t.bytes for t in received) == rows_bytes, [
                (t.tensor, t.shape) for t in received
            ]
            assert sum(t.bytes for t in received) < 2 * rows_bytes
            continue
        assert sum(t.bytes for t in received) < rows_bytes, [(t.tensor, t.shape) for t in received]
        sized_at_run_time = [t for t in received if t.shape is None or None in t.shape]
        assert [t.shape for t in sized_at_run_time] == [(None, 64)], sized_at_run_time
        assert re.search(r"/Gather(_\d+)?$", sized_at_run_time[0].tensor), sized_at_run_time


def test_embedding_lookups_outside_replicas_are_unchanged():
    """The tf.gather dispatcher only acts inside a dpkeras replica."""
    table = keras.Variable(np.arange(12, dtype="float32").reshape(6, 2))
    np.testing.assert_array_equal(tf.gather(table, [4, 1]).numpy(), [[8, 9], [2, 3]])
    np.testing.assert_array_equal(
        tf.gather(table, [1], axis=1).numpy().ravel(), np.arange(6) * 2 + 1
    )
    with cpu_strategy(2).scope():
        placed = keras.Variable(np.arange(12, dtype="float32").reshape(6, 2))
    np.testing.assert_array_equal(keras.ops.take(placed, [5], axis=0).numpy(), [[10, 11]])


def test_idiom_13_a_read_after_a_write_in_the_same_step_sees_the_write():
    """TF1 needed `control_dependencies` + `read_value`; here the cached read is dropped."""
    strategy = cpu_strategy(2)
    with strategy.scope():
        v = tf.Variable(1.0, aggregation=tf.VariableAggregation.SUM)

    @tf.function
    def step():
        def replica_fn():
            before = v.read_value()
            v.assign_add(1.0)  # SUM over 2 replicas: +2
            return before, v.read_value(), tf.convert_to_tensor(v) * 1

        return strategy.run(replica_fn)

    before, after, used = (strategy.experimental_local_results(t) for t in step())
    assert [float(b) for b in before] == [1.0, 1.0]
    assert [float(a) for a in after] == [3.0, 3.0]
    assert [float(u) for u in used] == [3.0, 3.0]


def test_idiom_12_initial_values_may_read_other_variables():
    with cpu_strategy(2).scope():
        first = tf.Variable(tf.fill([3], 2.0))
        second = tf.Variable(first * 3.0)
        third = tf.Variable(lambda: first + second)
    assert third.numpy().tolist() == [8.0, 8.0, 8.0]
    assert all(isinstance(v, dpkeras.ParameterVariable) for v in (first, second, third))
