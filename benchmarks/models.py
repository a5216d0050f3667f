"""The benchmark's models and their synthetic data, generated in-process (no downloads).

Each model is a realistic shape for its kind, scaled by `size` (1.0 is the default run):

- `mlp`: a 784-512-512-10 classifier (MNIST-shaped), 0.67M parameters in 6 variables.
- `resnet`: a ResNet-style CNN on 32x32x3 images, three residual stages with
  BatchNormalization, whose moving statistics are `aggregation=NONE` variables.
- `recommender`: a click model over a 100k x 32 item table and a 10k x 32 user table, with an MLP
  on top; the tables get sparse (`IndexedSlices`) gradients, updated by Adagrad.
- `transformer`: a 2-layer Transformer encoder over 64 tokens from a 5k vocabulary, with Dropout
  (whose `SeedGenerator` state is a variable too).

Every model is compiled with a metric, so the transfers counted include whatever metrics cost.
"""

import dataclasses

import numpy as np

__all__ = ["MODELS", "ModelSpec", "build", "synthetic_data"]


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """How to build, compile, feed and check one benchmark model.

    Attributes:
        name: str, the `--models` name.
        description: str, one line for tables.
        loss, metric: str, what `model.compile` gets.
        optimizer: dict, a Keras optimizer config for `keras.optimizers.get` (a fresh one per
            model). Plain SGD with momentum where it is the usual choice: it is also the
            optimizer under which a wrong gradient shows in the loss (Adam and Adagrad are
            nearly invariant to the gradient's scale).
        batch_size: int, the default global batch (divisible by 1, 2, 3, 4, 6 and 8).
        steps: int, the default timed steps per repeat (about a second on 2 CPU cores).
        loss_tolerance: float, how far (relative) a correct strategy's loss over the first
            steps may be from one device's, and (`tolerance_reason`) why.
    """

    name: str
    description: str
    loss: str
    metric: str
    optimizer: dict
    batch_size: int
    steps: int
    loss_tolerance: float
    tolerance_reason: str


_EXACT = "same data, same initial weights: only the order of floating-point sums differs"


def _optimizer(name, **config):
    return {"class_name": name, "config": config}


MODELS = {
    "mlp": ModelSpec(
        "mlp",
        "MLP 784-512-512-10",
        "sparse_categorical_crossentropy",
        "accuracy",
        _optimizer("SGD", learning_rate=0.01, momentum=0.9),
        240,
        30,
        1e-4,
        _EXACT,
    ),
    "resnet": ModelSpec(
        "resnet",
        "ResNet-style CNN, 32x32x3, BatchNormalization",
        "sparse_categorical_crossentropy",
        "accuracy",
        _optimizer("SGD", learning_rate=0.02, momentum=0.9),
        120,
        10,
        2e-3,
        "BatchNormalization normalises each replica's share of the batch",
    ),
    "recommender": ModelSpec(
        "recommender",
        "recommender, 100k x 32 item table, sparse updates",
        "binary_crossentropy",
        "binary_accuracy",
        _optimizer("Adagrad", learning_rate=0.05),
        960,
        20,
        1e-4,
        _EXACT,
    ),
    "transformer": ModelSpec(
        "transformer",
        "2-layer Transformer encoder, 64 tokens, Dropout",
        "sparse_categorical_crossentropy",
        "accuracy",
        _optimizer("Adam", learning_rate=1e-3),
        48,
        10,
        0.1,
        "Dropout masks come from each strategy's own random streams "
        "(MirroredStrategy repeats one mask on every replica)",
    ),
}


def _scaled(n, size, minimum=1):
    return max(minimum, int(round(n * size)))


def _mlp(keras, size):
    width = _scaled(512, size, 4)
    inputs = keras.Input((784,), name="pixels")
    h = keras.layers.Dense(width, activation="relu")(inputs)
    h = keras.layers.Dense(width, activation="relu")(h)
    outputs = keras.layers.Dense(10, activation="softmax")(h)
    return keras.Model(inputs, outputs, name="mlp")


def _residual_block(keras, x, filters, stride):
    layers = keras.layers
    shortcut = x
    h = layers.Conv2D(filters, 3, strides=stride, padding="same", use_bias=False)(x)
    h = layers.BatchNormalization()(h)
    h = layers.ReLU()(h)
    h = layers.Conv2D(filters, 3, padding="same", use_bias=False)(h)
    h = layers.BatchNormalization()(h)
    if stride != 1 or shortcut.shape[-1] != filters:
        shortcut = layers.Conv2D(filters, 1, strides=stride, use_bias=False)(shortcut)
        shortcut = layers.BatchNormalization()(shortcut)
    return layers.ReLU()(layers.Add()([h, shortcut]))


def _resnet(keras, size):
    layers = keras.layers
    base = _scaled(16, size, 2)
    inputs = keras.Input((32, 32, 3), name="image")
    h = layers.Conv2D(base, 3, strides=2, padding="same", use_bias=False)(inputs)  # 16x16
    h = layers.BatchNormalization()(h)
    h = layers.ReLU()(h)
    h = _residual_block(keras, h, base, 1)
    h = _residual_block(keras, h, 2 * base, 2)  # 8x8
    h = _residual_block(keras, h, 4 * base, 2)  # 4x4
    h = layers.GlobalAveragePooling2D()(h)
    outputs = layers.Dense(10, activation="softmax")(h)
    return keras.Model(inputs, outputs, name="resnet")


def _table_sizes(size):
    return _scaled(100_000, size, 16), _scaled(10_000, size, 16)


def _recommender(keras, size):
    layers = keras.layers
    items, users = _table_sizes(size)
    item = keras.Input((1,), dtype="int32", name="item")
    user = keras.Input((1,), dtype="int32", name="user")
    item_vec = layers.Flatten()(layers.Embedding(items, 32, name="item_table")(item))
    user_vec = layers.Flatten()(layers.Embedding(users, 32, name="user_table")(user))
    h = layers.Concatenate()([item_vec, user_vec])
    h = layers.Dense(64, activation="relu")(h)
    h = layers.Dense(32, activation="relu")(h)
    outputs = layers.Dense(1, activation="sigmoid")(h)
    return keras.Model([item, user], outputs, name="recommender")


_SEQUENCE, _VOCABULARY = 64, 5000
_POSITION_EMBEDDING = []


def _position_embedding_class(keras):
    """A layer adding a learned position vector to each token (defined once, lazily)."""
    if not _POSITION_EMBEDDING:

        class PositionEmbedding(keras.layers.Layer):
            def build(self, input_shape):
                self.table = self.add_weight(
                    shape=tuple(input_shape[1:]), initializer="random_normal", name="table"
                )

            def call(self, x):
                return x + self.table

        _POSITION_EMBEDDING.append(PositionEmbedding)
    return _POSITION_EMBEDDING[0]


def _transformer(keras, size):
    layers = keras.layers
    d_model = _scaled(64, size, 8)
    heads = 4
    tokens = keras.Input((_SEQUENCE,), dtype="int32", name="tokens")
    h = layers.Embedding(_VOCABULARY, d_model)(tokens)
    h = _position_embedding_class(keras)(name="positions")(h)
    for _ in range(2):
        attention = layers.MultiHeadAttention(heads, max(1, d_model // heads), dropout=0.1)(h, h)
        h = layers.LayerNormalization()(h + layers.Dropout(0.1)(attention))
        ff = layers.Dense(2 * d_model, activation="relu")(h)
        ff = layers.Dense(d_model)(ff)
        h = layers.LayerNormalization()(h + layers.Dropout(0.1)(ff))
    h = layers.GlobalAveragePooling1D()(h)
    h = layers.Dropout(0.1)(h)
    outputs = layers.Dense(2, activation="softmax")(h)
    return keras.Model(tokens, outputs, name="transformer")


_BUILDERS = {
    "mlp": _mlp,
    "resnet": _resnet,
    "recommender": _recommender,
    "transformer": _transformer,
}


def build(name, size=1.0):
    """Builds (does not compile) model `name` at `size`; call under the strategy's scope."""
    import keras

    if name not in _BUILDERS:
        raise ValueError(f"Unknown model {name!r}. Valid models: {', '.join(MODELS)}")
    return _BUILDERS[name](keras, size)


def synthetic_data(name, examples, size=1.0, seed=0):
    """Deterministic `(x, y)` numpy arrays for model `name`, with a learnable signal.

    The labels depend on the inputs (a fixed random teacher), so the loss falls during the run
    and a strategy that computes the wrong update shows a different final loss; 10% of the
    classification labels are replaced by random ones, so the loss stays well above zero and
    relative differences stay meaningful.
    """
    rng = np.random.default_rng(seed)

    def noisy(labels, classes):
        flip = rng.random(len(labels)) < 0.1
        return np.where(flip, rng.integers(0, classes, len(labels)), labels).astype(np.int32)

    if name == "mlp":
        x = rng.random((examples, 784), dtype=np.float32)
        teacher = rng.standard_normal((784, 10)).astype(np.float32)
        return x, noisy(np.argmax((x - 0.5) @ teacher, axis=1), 10)
    if name == "resnet":
        x = rng.random((examples, 32, 32, 3), dtype=np.float32)
        colour = np.argmax(x.mean(axis=(1, 2)), axis=1)
        top_brighter = x[:, :16].mean(axis=(1, 2, 3)) > x[:, 16:].mean(axis=(1, 2, 3))
        return x, noisy(colour * 3 + top_brighter, 10)
    if name == "recommender":
        items, users = _table_sizes(size)
        # Zipf-like popularity: a few items get most of the traffic, as in real logs.
        item = np.minimum(rng.zipf(1.3, examples) - 1, items - 1).astype(np.int32)
        user = rng.integers(0, users, examples, dtype=np.int32)
        y = ((item * 7 + user * 3) % 5 < 2).astype(np.float32)
        return {"item": item[:, None], "user": user[:, None]}, y[:, None]
    if name == "transformer":
        x = rng.integers(0, _VOCABULARY, (examples, _SEQUENCE), dtype=np.int32)
        return x, noisy(np.sum(x < _VOCABULARY // 2, axis=1) > _SEQUENCE // 2, 2)
    raise ValueError(f"Unknown model {name!r}. Valid models: {', '.join(MODELS)}")
