"""Each replica receives each variable at most once per step, counted from the partitioned graph."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import dpkeras
from dpkeras.testing import cpu_strategy
from tests.models import build_model, make_data

L = keras.layers


def _shared_layer_model():
    """A Dense layer called twice: its kernel is read twice per step."""
    inputs = keras.Input((12,))
    shared = L.Dense(12, activation="tanh")
    outputs = L.Dense(4)(shared(shared(inputs)))
    model = keras.Model(inputs, outputs)
    model.compile(
        optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    return model


def _weight_reads(report, replica):
    """Transfers to `replica` of model/optimizer weights (not metric state)."""
    return [
        t
        for t in report.transfers
        if t.destination == replica and t.source == "/cpu:0" and not t.of_the_batch
    ]


@pytest.mark.parametrize("replicas", [2, 3])
def test_at_most_one_tensor_per_variable_per_replica(replicas):
    with cpu_strategy(replicas).scope():
        model = _shared_layer_model()
    x, y = make_data("dense", 96)
    report = dpkeras.train_step_transfers(model, x, y, batch_size=96)
    read_variables = (
        len(model.trainable_variables)
        + len(model.optimizer.variables)
        + sum(len(m.variables) for m in model.metrics)
    )
    for replica in cpu_strategy(replicas).extended.worker_devices:
        short = dpkeras._device_names.short_device(replica)
        received = _weight_reads(report, short)
        names = [t.tensor for t in received]
        assert len(received) <= read_variables, names
        # The four trainable tensors arrive once each, although the kernel is used twice.
        float_matrices = [t for t in received if t.shape and len(t.shape) >= 1]
        assert len(float_matrices) == len(model.trainable_variables), names
    # Gradients go back once per trainable variable per replica, nothing else is large.
    for replica in cpu_strategy(replicas).extended.worker_devices:
        replica = dpkeras._device_names.short_device(replica)
        back = [t for t in report.transfers if t.source == replica and t.shape]
        assert len(back) == len(model.trainable_variables)


@pytest.mark.parametrize("replicas", [2, 3])
def test_each_replica_receives_its_share_of_the_batch_once(replicas):
    """On CPU replicas the step reads the whole batch on the host and cuts it: each replica
    receives its rows of x and of y, once, and nothing more of the batch."""
    strategy = cpu_strategy(replicas)
    with strategy.scope():
        model = build_model("dense", metrics=())
    x, y = make_data("dense", 96)
    report = dpkeras.train_step_transfers(model, x, y, batch_size=96)
    rows = 96 // replicas
    for replica in strategy.extended.worker_devices:
        short = dpkeras._device_names.short_device(replica)
        shares = [t for t in report.batch_shares if t.destination == short]
        assert sorted(t.shape for t in shares) == [(rows,), (rows, 12)], shares
        assert {t.source for t in shares} == {"/cpu:0"}
        assert sum(t.bytes for t in shares) == rows * (12 * 4 + 8)


def test_central_storage_sends_each_use_separately():
    """The predecessor, on the same model: a tensor per use, so more than dpkeras."""
    strategy = tf.distribute.experimental.CentralStorageStrategy(
        ["/cpu:1", "/cpu:2"], parameter_device="/cpu:0"
    )
    with strategy.scope():
        model = _shared_layer_model()
    x, y = make_data("dense", 96)
    css = dpkeras.train_step_transfers(model, x, y, batch_size=96)
    keras.backend.clear_session()
    with cpu_strategy(2).scope():
        model = _shared_layer_model()
    ours = dpkeras.train_step_transfers(model, x, y, batch_size=96)
    for replica in ("/cpu:1", "/cpu:2"):  # CentralStorage's batch crosses in its iterator
        assert ours.to_device(replica, batch=False)[0] < css.to_device(replica)[0]
        assert ours.to_device(replica, batch=False)[1] < css.to_device(replica)[1]


def test_report_counts_match_the_model():
    with cpu_strategy(2).scope():
        model = build_model("dense")
    x, y = make_data("dense", 96)
    report = dpkeras.train_step_transfers(model, x, y, batch_size=96)
    weight_bytes = sum(v.numpy().nbytes for v in model.trainable_variables)
    for replica in ("/cpu:1", "/cpu:2"):
        received = [t for t in _weight_reads(report, replica) if t.shape]
        assert sum(t.bytes for t in received) == weight_bytes
    assert set(report.devices) == {"/cpu:0", "/cpu:1", "/cpu:2"}
    summary = report.summary()
    assert summary["/cpu:0 -> /cpu:1"][1] >= weight_bytes


def test_the_report_names_what_only_run_time_sizes():
    """Deduplicated lookups send a row count known at run time: listed, counted as 0 bytes."""
    with cpu_strategy(2).scope():
        model = keras.Sequential(
            [
                keras.Input((4,), dtype="int32"),
                keras.layers.Embedding(500, 8, name="table"),
                keras.layers.GlobalAveragePooling1D(),
                keras.layers.Dense(1),
            ]
        )
        model.compile(optimizer="sgd", loss="mse")
    x = np.random.RandomState(0).randint(0, 500, (16, 4)).astype("int32")
    report = dpkeras.train_step_transfers(model, x, np.zeros(16))
    rows = [t for t in report.sized_at_run_time if t.dtype == "float32" and "table" in t.tensor]
    assert {t.destination for t in rows} == {"/cpu:1", "/cpu:2"}, report.sized_at_run_time
    assert all(t.bytes == 0 and t.shape == (None, 8) for t in rows)
    assert report.summary()["sized at run time (not counted)"][0] == len(report.sized_at_run_time)


def test_report_requires_a_step_traced_inside():
    with pytest.raises(ValueError, match="No multi-device function was instantiated"):
        with dpkeras.record_transfers() as recorder:
            pass
        recorder.report()


@pytest.mark.parametrize("replicas", [1, 2])
def test_counters_are_incremented_where_they_live(replicas):
    """Keras's `iterations.assign_add(1)` is `assign(iterations + 1)`; dpkeras applies it as an
    assign_add on the parameter device, so no replica receives the int64 count."""
    strategy = cpu_strategy(replicas)
    with strategy.scope():
        model = build_model("dense", metrics=())
    x, y = make_data("dense", 96)
    report = dpkeras.train_step_transfers(model, x, y, batch_size=96)
    for replica in strategy.extended.worker_devices:
        received = _weight_reads(report, dpkeras._device_names.short_device(replica))
        assert not [t for t in received if t.dtype == "int64"], received
        # The 4 weights, and the loss tracker's total and count.
        assert len(received) == len(model.trainable_variables) + 2, [t.tensor for t in received]
    assert int(model.optimizer.iterations.numpy()) == 1
