"""Each distinct id crosses once: deduplicated lookups and summed gradient rows.

A batch of 64 x 8 ids drawn from 16 distinct ids: by default each replica sends its distinct
ids to the table and receives one row per distinct id; the weights equal one device for every
optimizer (gradient rows of repeats are summed before they cross only where that keeps
Keras's numbers: SGD without clipping). `deduplicate="sum"` is TF1's semantics (repeats summed
before every optimizer); `deduplicate=False` sends every repeat.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import dpkeras
from dpkeras.testing import assert_weights_close

ROWS, DIM = 2000, 16
REPLICAS = ["/cpu:1", "/cpu:2", "/cpu:3"]
SHARDED = tf.distribute.experimental.partitioners.FixedShardsPartitioner(2)


def _data(n=192, distinct=16, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.choice(rng.permutation(ROWS)[:distinct], (n, 8)).astype("int32")
    y = rng.normal(size=(n, 1)).astype("float32")
    return x, y


class _SignSGD(keras.optimizers.SGD):
    """A user's SGD whose update is not linear in the gradient: each gradient row moves its
    row by the row's sign, so Keras 3 on one device moves a repeated id once per repeat."""

    def update_step(self, gradient, variable, learning_rate):
        lr = keras.ops.cast(learning_rate, variable.dtype)
        if isinstance(gradient, tf.IndexedSlices):
            signs = tf.sign(gradient.values)
            self.assign_sub(variable, tf.IndexedSlices(lr * signs, gradient.indices))
        else:
            self.assign_sub(variable, lr * tf.sign(gradient))


def _optimizer(name):
    return {
        "sgd": lambda: keras.optimizers.SGD(0.5),
        "momentum": lambda: keras.optimizers.SGD(0.2, momentum=0.9, nesterov=True),
        "adam": lambda: keras.optimizers.Adam(0.01),
        "adagrad": lambda: keras.optimizers.Adagrad(0.1),
        "sgd_clipnorm": lambda: keras.optimizers.SGD(0.5, clipnorm=0.01),
        # above every row of _data's gradients, below the sum of an id's rows
        "sgd_clipvalue": lambda: keras.optimizers.SGD(0.5, clipvalue=0.006),
        "sgd_global_clipnorm": lambda: keras.optimizers.SGD(0.5, global_clipnorm=0.01),
        "sign_sgd": lambda: _SignSGD(0.001, name="sign_sgd"),
    }[name]()


def _build(optimizer, table=None):
    keras.utils.set_random_seed(1)
    inputs = keras.Input((8,), dtype="int32")
    embed = table or keras.layers.Embedding(ROWS, DIM, name="table")
    x = keras.layers.GlobalAveragePooling1D()(embed(inputs))
    model = keras.Model(inputs, keras.layers.Dense(1)(x))
    model.compile(optimizer=_optimizer(optimizer), loss="mse")
    return model


def _fit(model, x, y):
    history = model.fit(x, y, batch_size=64, epochs=2, verbose=0, shuffle=False)
    return history.history["loss"]


def _strategy(deduplicate, partitioner=None, replicas=REPLICAS):
    return dpkeras.get_strategy(replicas, "/cpu:0", None, partitioner, deduplicate)


@pytest.mark.parametrize(
    "optimizer",
    ["sgd", "momentum", "adam", "adagrad", "sgd_clipnorm", "sgd_global_clipnorm", "sign_sgd"],
)
@pytest.mark.parametrize("partitioner", [None, SHARDED], ids=["plain", "sharded"])
def test_by_default_every_optimizer_equals_one_device(optimizer, partitioner):
    """Repeated ids' gradient rows are summed before they cross only under SGD without
    clipping: clipping by global norm sees each repeat's row in Keras 3, and an SGD of the
    user's that overrides `update_step` (here by the sign of each row) may not be linear."""
    x, y = _data()
    reference = _build(optimizer)
    expected_loss = _fit(reference, x, y)
    with _strategy(True, partitioner).scope():
        model = _build(optimizer)
    loss = _fit(model, x, y)
    assert_weights_close(reference.get_weights(), model.get_weights(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(loss, expected_loss, rtol=1e-5)


def test_without_deduplication_one_replica_under_sgd_is_one_device_bit_for_bit():
    """On one replica, `deduplicate=False` gives Keras's own bits under SGD (every repeat's
    row subtracted one after the other, as Keras does); the default sums a repeated id's rows
    first, which is exact within rounding (docs/sharding.md)."""
    x, y = _data()
    reference = _build("sgd")
    expected_loss = _fit(reference, x, y)
    with _strategy(False, replicas=REPLICAS[:1]).scope():
        model = _build("sgd")
    assert _fit(model, x, y) == expected_loss
    for a, b in zip(reference.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(a, b)


class _DenseGradientEmbedding(keras.layers.Layer):
    """An Embedding whose gradient is dense (a one-hot matmul): one summed row per id, as
    tf.keras and TF1 optimizers saw a lookup's gradient after summing repeated ids."""

    def build(self, input_shape):
        self.embeddings = self.add_weight(
            shape=(ROWS, DIM), initializer="uniform", name="embeddings"
        )

    def call(self, ids):
        return keras.ops.matmul(keras.ops.one_hot(ids, ROWS), self.embeddings)


@pytest.mark.parametrize("optimizer", ["adam", "adagrad"])
def test_sum_gives_tf1_semantics_for_optimizers_that_square_the_gradient(optimizer):
    """Under "sum", Adam and Adagrad square the summed row of each id (a dense gradient's
    numbers), for 1 and 3 replicas alike, which differs from Keras's own numbers."""
    x, y = _data()
    tf1_reference = _build(optimizer, _DenseGradientEmbedding(name="table"))
    _fit(tf1_reference, x, y)
    keras_reference = _build(optimizer)
    _fit(keras_reference, x, y)
    for replicas in (REPLICAS[:1], REPLICAS):
        with _strategy("sum", replicas=replicas).scope():
            model = _build(optimizer)
        _fit(model, x, y)
        assert_weights_close(tf1_reference.get_weights(), model.get_weights(), atol=2e-6)
    table_gap = np.abs(keras_reference.get_weights()[0] - model.get_weights()[0]).max()
    assert table_gap > 1e-4, "the choice must change the numbers, or it is not a choice"


@pytest.mark.parametrize("optimizer", ["sgd_clipvalue", "sgd_clipnorm"])
def test_clipping_sees_each_repeated_id_s_rows_as_one_device_does(optimizer):
    """Keras 3 on one device clips a lookup's gradient as it comes, one row per looked-up
    position (`clip_by_value` / `clip_by_norm` of the IndexedSlices, repeats included), and the
    update then sums an id's clipped rows: clip, then sum. Summing an id's rows first and
    clipping the sum (TF1's order: a dense gradient, as `deduplicate="sum"` gives) changes the
    numbers: with clipvalue=0.006, each row is under the clip (about 0.005 at most in the first
    epoch) while an id's rows sum to up to 0.03.
    3 replicas with the default deduplication must clip what one device clips."""
    x, y = _data()
    reference = _build(optimizer)
    _fit(reference, x, y)
    sum_then_clip = _build(optimizer, _DenseGradientEmbedding(name="table"))
    _fit(sum_then_clip, x, y)
    with _strategy(True).scope():
        model = _build(optimizer)
    _fit(model, x, y)
    assert_weights_close(reference.get_weights(), model.get_weights(), rtol=1e-6, atol=1e-7)
    gap = np.abs(reference.get_weights()[0] - sum_then_clip.get_weights()[0]).max()
    assert gap > 1e-4, "the two orders must give other numbers here, or this tells nothing"


def _ids_sent_to_the_table(optimizer, deduplicate):
    """Names of the id tensors the replicas send the parameter device in one training step
    (the partitioned graph's transfers): the lookup's ids and the gradient's indices."""
    x, y = _data()
    with _strategy(deduplicate).scope():
        model = _build(optimizer)
    report = dpkeras.train_step_transfers(model, x[:64], y[:64])
    return [
        t.tensor.rsplit("/", 1)[-1]
        for t in report.transfers
        if t.destination == "/cpu:0"
        and t.dtype in ("int32", "int64")
        and ("table" in t.tensor or "Unique" in t.tensor)
    ]


def test_under_sgd_each_replica_sends_only_its_distinct_ids_both_ways():
    """One tensor of distinct ids per replica, shared by the lookup and the gradient's rows."""
    sent = _ids_sent_to_the_table("sgd", True)
    assert len(sent) == len(REPLICAS) and all(n.startswith("Unique") for n in sent), sent


def test_under_adam_the_lookup_sends_distinct_ids_and_the_gradient_every_repeat():
    sent = _ids_sent_to_the_table("adam", True)
    unique = [n for n in sent if n.startswith("Unique")]
    assert len(unique) == len(REPLICAS) and len(sent) == 2 * len(REPLICAS), sent


def test_without_deduplication_every_id_is_sent_both_ways():
    sent = _ids_sent_to_the_table("sgd", False)
    assert len(sent) == 2 * len(REPLICAS), sent
    assert not any(n.startswith("Unique") for n in sent), sent


def test_deduplicated_lookups_equal_plain_ones_outside_training():
    x, _ = _data(n=12)
    with _strategy(True).scope():
        model = _build("sgd")
    strategy = _strategy(True)
    table = model.get_layer("table")

    @tf.function
    def lookup(ids):
        return strategy.run(table, args=(ids,))

    rows = strategy.experimental_local_results(lookup(tf.constant(x[:4])))[0]
    np.testing.assert_array_equal(rows, np.take(table.embeddings.numpy(), x[:4], axis=0))


ON, OFF, SUM = dpkeras.Deduplicate.ON, dpkeras.Deduplicate.OFF, dpkeras.Deduplicate.SUM


@pytest.mark.parametrize(
    "value, expected",
    [(None, ON), (True, ON), (False, OFF), ("sum", SUM), (ON, ON), (OFF, OFF), (SUM, SUM)],
)
def test_the_mode_is_the_argument_or_on(value, expected):
    assert _strategy(value).deduplicate is expected


@pytest.mark.parametrize("raw, expected", [("0", OFF), ("1", ON), ("sum", SUM)])
def test_the_environment_sets_the_mode(monkeypatch, raw, expected):
    monkeypatch.setenv("DPKERAS_DEDUPLICATE", raw)
    assert dpkeras.ParameterDeviceStrategy(REPLICAS[:1], "/cpu:0").deduplicate is expected
    explicit = dpkeras.ParameterDeviceStrategy(REPLICAS[:1], "/cpu:0", deduplicate=True)
    assert explicit.deduplicate is ON


@pytest.mark.parametrize("bad", ["yes", 2, "SUM "])
def test_a_bad_mode_is_refused_naming_it(bad):
    with pytest.raises(ValueError, match=r"deduplicate must be True, False or 'sum'.*Received"):
        dpkeras.ParameterDeviceStrategy(REPLICAS[:1], "/cpu:0", deduplicate=bad)


def test_a_bad_environment_value_is_refused_naming_it(monkeypatch):
    monkeypatch.setenv("DPKERAS_DEDUPLICATE", "maybe")
    with pytest.raises(ValueError, match=r"DPKERAS_DEDUPLICATE must be .*'maybe'"):
        dpkeras.ParameterDeviceStrategy(REPLICAS[:1], "/cpu:0")
