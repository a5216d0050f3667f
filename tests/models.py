"""Small models and data shared by the tests: one builder per layer kind the issue names."""

import keras
import numpy as np

from dpkeras import _keras_internals

# Keras 3.10+ keeps a metric's state synchronised on read across replicas; under Keras 3.8-3.9
# the loss and metrics `fit` and `evaluate` log under any tf.distribute strategy (MirroredStrategy
# too) are not one device's, while the weights are (tests/test_equivalence.py compares dpkeras's
# logs with MirroredStrategy's there).
LOGS_AS_ONE_DEVICE = _keras_internals.keras_minor() >= (3, 10)

L = keras.layers


def make_data(kind, n, seed=0):
    """Synthetic `(x, y)` for model `kind`, 4 classes."""
    rng = np.random.RandomState(seed)
    y = rng.randint(0, 4, n)
    if kind in ("lstm", "gru"):
        return rng.rand(n, 5, 8).astype("float32"), y
    if kind == "embedding":
        return rng.randint(0, 50, (n, 6)).astype("int32"), y
    if kind == "conv2d":
        return rng.rand(n, 8, 8, 3).astype("float32"), y
    return rng.rand(n, 12).astype("float32"), y


def build_model(kind, optimizer="adam", seed=7, metrics=("accuracy",)):
    """A compiled model whose first layer is of `kind`; same weights for the same seed."""
    keras.utils.set_random_seed(seed)
    body = {
        "dense": [keras.Input((12,)), L.Dense(16, activation="relu"), L.Dense(4)],
        "batchnorm": [keras.Input((12,)), L.Dense(16), L.BatchNormalization(), L.Dense(4)],
        "dropout": [keras.Input((12,)), L.Dense(16), L.Dropout(0.5), L.Dense(4)],
        "lstm": [keras.Input((5, 8)), L.LSTM(6), L.Dense(4)],
        "gru": [keras.Input((5, 8)), L.GRU(6), L.Dense(4)],
        "embedding": [
            keras.Input((6,), dtype="int32"),
            L.Embedding(50, 8),
            L.GlobalAveragePooling1D(),
            L.Dense(4),
        ],
        "conv2d": [keras.Input((8, 8, 3)), L.Conv2D(4, 3), L.Flatten(), L.Dense(4)],
    }[kind]
    model = keras.Sequential(body)
    opt = (
        {"adam": lambda: keras.optimizers.Adam(0.01), "sgd": lambda: keras.optimizers.SGD(0.1)}[
            optimizer
        ]()
        if isinstance(optimizer, str)
        else optimizer
    )
    model.compile(
        optimizer=opt,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=list(metrics),
    )
    return model


def train(kind, strategy=None, n=288, batch_size=96, epochs=2, optimizer="adam"):
    """Builds (under `strategy` if given) and fits; returns (model, history, evaluate)."""
    x, y = make_data(kind, n)
    if strategy is None:
        model = build_model(kind, optimizer)
    else:
        with strategy.scope():
            model = build_model(kind, optimizer)
    history = model.fit(x, y, batch_size=batch_size, epochs=epochs, shuffle=False, verbose=0)
    evaluation = model.evaluate(x, y, batch_size=batch_size, verbose=0)
    return model, history.history, evaluation


def assert_copies_identical(model):
    """Every replicated variable of `model` (and of its optimizer) has bit-identical copies."""
    import dpkeras

    values = [v.value for v in model.variables + model.optimizer.variables]
    replicated = [v for v in values if isinstance(v, dpkeras.ReplicatedVariable)]
    assert replicated, "no replicated variable"
    for v in replicated:
        arrays = [c.numpy() for c in v.copies]
        for i, a in enumerate(arrays[1:], 1):
            assert np.array_equal(a, arrays[0]), f"{v.name}: copy {i} differs from copy 0"
