"""Keras training features, each a small training run, for the "What is exact" table.

`run(feature, strategy)` builds a small model with that feature (under `strategy`'s scope if
one is given), trains it on 48 examples in global batches of 12 (4 per replica on 3 replicas),
and returns its weights, loss history and evaluate result, all from the same initial weights.
`compare` turns two runs into a verdict. Used in-process for dpkeras and in a subprocess for
MirroredStrategy (tests/test_exact_matrix.py).
"""

import re

import keras
import numpy as np

L = keras.layers
RNG = np.random.RandomState(0)
X = RNG.rand(48, 6).astype("float32")
Y = RNG.randint(0, 3, 48)
TOKENS = np.where(RNG.rand(48, 5) < 0.3, 0, RNG.randint(1, 20, (48, 5))).astype("int32")


def _dense(optimizer=None, metrics=("accuracy",), loss=None):
    model = keras.Sequential([keras.Input((6,)), L.Dense(8, activation="relu"), L.Dense(3)])
    model.compile(
        optimizer=optimizer or keras.optimizers.SGD(0.1),
        metrics=list(metrics),
        loss=loss or keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


def _multi_io():
    a, b = keras.Input((6,), name="a"), keras.Input((6,), name="b")
    h = L.Dense(8, activation="relu")(L.Concatenate()([a, b]))
    model = keras.Model([a, b], [L.Dense(3, name="c")(h), L.Dense(1, name="r")(h)])
    model.compile(
        optimizer=keras.optimizers.SGD(0.1),
        loss=[keras.losses.SparseCategoricalCrossentropy(from_logits=True), "mse"],
    )
    return model


def _masking():
    model = keras.Sequential(
        [
            keras.Input((5,), dtype="int32"),
            L.Embedding(20, 4, mask_zero=True),
            L.GlobalAveragePooling1D(),
            L.Dense(3),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.SGD(0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


def _synchronized_batchnorm():
    model = keras.Sequential(
        [
            keras.Input((6,)),
            L.Dense(8),
            L.BatchNormalization(synchronized=True),
            L.Activation("relu"),
            L.Dense(3),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.SGD(0.1),
        metrics=["accuracy"],
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


class _ActivityLoss(L.Layer):
    def call(self, x):
        self.add_loss(0.01 * keras.ops.mean(x**2))
        return x


def _add_loss():
    model = keras.Sequential(
        [keras.Input((6,)), L.Dense(8, kernel_regularizer="l2"), _ActivityLoss(), L.Dense(3)]
    )
    model.compile(
        optimizer=keras.optimizers.SGD(0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


# feature -> (build, fit keyword arguments, data kind)
FEATURES = {
    "steps_per_execution": (lambda: _with(_dense(), steps_per_execution=2), {}, "dense"),
    "jit_compile": (lambda: _with(_dense(), jit_compile=True), {}, "dense"),
    "sample_weight": (_dense, {"sample_weight": np.linspace(0.2, 2.0, 48)}, "dense"),
    "class_weight": (_dense, {"class_weight": {0: 1.0, 1: 2.0, 2: 0.5}}, "dense"),
    "add_loss_and_regularizers": (_add_loss, {}, "dense"),
    "multi_input_output": (_multi_io, {}, "multi"),
    "auc_metric": (
        lambda: _dense(
            metrics=[keras.metrics.AUC(from_logits=True)],
            loss=keras.losses.CategoricalCrossentropy(from_logits=True),
        ),
        {},
        "onehot",
    ),
    "ema": (
        lambda: _dense(keras.optimizers.SGD(0.1, use_ema=True, ema_overwrite_frequency=2)),
        {},
        "dense",
    ),
    "weight_decay": (lambda: _dense(keras.optimizers.AdamW(0.01, weight_decay=0.1)), {}, "dense"),
    "clipnorm": (lambda: _dense(keras.optimizers.SGD(0.1, clipnorm=0.05)), {}, "dense"),
    "gradient_accumulation": (
        lambda: _dense(keras.optimizers.SGD(0.1, gradient_accumulation_steps=2)),
        {},
        "dense",
    ),
    "masking": (_masking, {}, "tokens"),
    # Statistics over the global batch (an all-reduce among the replicas), as on one device.
    "synchronized_batchnorm": (_synchronized_batchnorm, {}, "dense"),
    "validation": (_dense, {"validation_data": (X[:12], Y[:12])}, "dense"),
    "callbacks": (_dense, {"callbacks": "lr_schedule"}, "dense"),
}
FEATURES["uneven_batches"] = (_dense, {"batch_size": 10}, "dense")  # 10 over 3: 4/3/3
FEATURES["generator"] = (_dense, {}, "generator")
# mixed_float16 is compared at float16's precision, like tests/test_semantics.py.
TOLERANCE = {"mixed_precision": (1e-3, 2e-4)}
FEATURES["mixed_precision"] = (_dense, {}, "dense")


def _with(model, **compile_changes):
    model.compile(
        optimizer=model.optimizer, loss=model.loss, metrics=["accuracy"], **compile_changes
    )
    return model


def _batches():
    for i in range(4):
        yield X[i * 12 : (i + 1) * 12], Y[i * 12 : (i + 1) * 12]


def _data(kind):
    if kind == "multi":
        return {"a": X, "b": X[::-1].copy()}, (Y, X[:, :1])
    if kind == "tokens":
        return TOKENS, Y
    if kind == "onehot":
        return X, np.eye(3, dtype="float32")[Y]
    return X, Y


def run(feature, strategy=None, keep=None):
    """Trains `feature`'s model; returns `{"weights", "history", "evaluate"}` as lists (the
    history has every key `fit` logs: loss, metrics, validation loss and metrics). The model
    is appended to the list `keep`, if given."""
    build, fit_kwargs, kind = FEATURES[feature]
    fit_kwargs = dict(fit_kwargs)
    if fit_kwargs.get("callbacks") == "lr_schedule":
        fit_kwargs["callbacks"] = [
            keras.callbacks.LearningRateScheduler(lambda epoch, lr: lr * 0.5)
        ]
    if feature == "mixed_precision":
        keras.config.set_dtype_policy("mixed_float16")
    try:
        keras.utils.set_random_seed(7)
        if strategy is None:
            model = build()
        else:
            with strategy.scope():
                model = build()
        batch_size = fit_kwargs.pop("batch_size", 12)
        if kind == "generator":  # a Python generator cannot be rewound
            history = model.fit(_batches(), steps_per_epoch=4, epochs=1, verbose=0).history
            evaluation = model.evaluate(_batches(), verbose=0)
        else:
            x, y = _data(kind)
            history = model.fit(
                x, y, batch_size=batch_size, epochs=2, shuffle=False, verbose=0, **fit_kwargs
            ).history
            evaluation = model.evaluate(x, y, batch_size=batch_size, verbose=0)
    finally:
        keras.config.set_dtype_policy("float32")
    if keep is not None:
        keep.append(model)
    return {
        "weights": [w.tolist() for w in model.get_weights()],
        # A metric made again in one process is renamed (`auc`, `auc_1`): keys without it.
        "history": {
            re.sub(r"_\d+$", "", key): [float(v) for v in values] for key, values in history.items()
        },
        "evaluate": np.ravel(evaluation).astype(float).tolist(),
    }


def compare(feature, expected, actual):
    """`("exact", max relative difference)` within tolerance, else `("differs", ...)`.

    Compares the weights, every history key (a key one run logs and the other does not
    differs) and `evaluate`."""
    rtol, atol = TOLERANCE.get(feature, (1e-5, 1e-6))
    if sorted(expected["history"]) != sorted(actual["history"]):
        return "differs", float("inf")
    worst, exact = 0.0, True
    pairs = list(zip(expected["weights"], actual["weights"]))
    pairs += [(expected["history"][key], actual["history"][key]) for key in expected["history"]]
    pairs += [(expected["evaluate"], actual["evaluate"])]
    for e, a in pairs:
        e, a = np.asarray(e, dtype="float64"), np.asarray(a, dtype="float64")
        difference = np.abs(a - e)
        worst = max(worst, float(np.max(difference / np.maximum(np.abs(e), 1e-6))))
        exact = exact and bool(np.all(difference <= atol + rtol * np.abs(e)))
    return ("exact" if exact else "differs"), worst
