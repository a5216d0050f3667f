"""The benchmark's models and their synthetic data, generated in-process (no downloads).

Each model is a realistic shape for its kind, scaled by `size` (1.0 is the default run):

- `mlp`: a 784-512-512-10 classifier (MNIST-shaped), 0.67M parameters in 6 variables.
- `resnet`: a ResNet-style CNN on 32x32x3 images, three residual stages with
  BatchNormalization, whose moving statistics are `aggregation=NONE` variables.
- `recommender`: a click model over a 100k x 32 item table and a 10k x 32 user table, with an MLP
  on top; the tables get sparse (`IndexedSlices`) gradients, updated by Adagrad.
- `transformer`: a 2-layer Transformer encoder over 64 tokens from a 5k vocabulary, with Dropout
  (whose `SeedGenerator` state is a variable too).
- `dlrm`: DLRM-DCNv2 on Criteo Kaggle's shape: 13 dense features through a bottom MLP, 26
  categorical features, one table each with Criteo Kaggle's cardinality capped at
  `200_000 * size` rows (1,483,115 rows, 90.5 MiB at dim 16 and size 1; 33.8M rows, 2.06 GiB
  uncapped from size 51), Zipf ids (exponent 1.1, popular ids scattered over the table), three
  DCNv2 cross layers and a top MLP; keras-rs's `DistributedEmbedding` and `FeatureCross` when
  keras-rs is installed, the same computation from Keras layers when not. Adagrad, as keras-rs's
  DLRM example.

Every model is compiled with a metric, so the transfers counted include whatever metrics cost.
"""

import dataclasses

import numpy as np

__all__ = [
    "MODELS",
    "ModelSpec",
    "build",
    "synthetic_data",
    "id_features",
    "lookup_rows",
    "table_bytes",
]


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
    "dlrm": ModelSpec(
        "dlrm",
        "DLRM-DCNv2, 26 Criteo Kaggle tables (rows capped at 200k x size), Zipf ids",
        "binary_crossentropy",
        "binary_accuracy",
        _optimizer("Adagrad", learning_rate=0.05),
        960,
        10,
        1e-4,
        _EXACT + " (Adagrad: as long as repeated ids' squares are summed as on one device)",
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
_POSITION_EMBEDDING = {}  # Keras module name -> the class


def _position_embedding_class(keras):
    """A layer adding a learned position vector to each token (defined once per Keras)."""
    if keras.__name__ not in _POSITION_EMBEDDING:

        class PositionEmbedding(keras.layers.Layer):
            def build(self, input_shape):
                self.table = self.add_weight(
                    shape=tuple(input_shape[1:]), initializer="random_normal", name="table"
                )

            def call(self, x):
                return x + self.table

        _POSITION_EMBEDDING[keras.__name__] = PositionEmbedding
    return _POSITION_EMBEDDING[keras.__name__]


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


# Criteo Kaggle (Display Advertising Challenge): distinct values of C1..C26 (33,762,577 in all).
CRITEO_KAGGLE_CARDINALITIES = (
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
    27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
)  # fmt: skip
DLRM_ROW_CAP = 200_000
DLRM_DIM = 16
DLRM_DENSE = 13
DLRM_ZIPF = 1.1


def dlrm_rows(size):
    """Rows of the 26 tables: Criteo Kaggle's cardinalities capped at `DLRM_ROW_CAP * size`."""
    cap = _scaled(DLRM_ROW_CAP, size, 16)
    return [min(c, cap) for c in CRITEO_KAGGLE_CARDINALITIES]


def _keras_rs(keras, wanted=True):
    """The keras_rs module when `wanted`, installed and `keras` is Keras 3 (keras-rs is built on
    it); else raises ImportError."""
    if not wanted or keras.__name__ != "keras":
        raise ImportError("keras-rs not wanted, or not with this Keras")
    import keras_rs

    return keras_rs


def _dlrm_embeddings(keras, size, inputs, keras_rs=True):
    """The 26 embedded features, `(batch, DLRM_DIM)` each, from keras-rs or Keras."""
    rows = dlrm_rows(size)
    try:
        keras_rs = _keras_rs(keras, keras_rs)
    except ImportError:
        return [
            keras.layers.Flatten()(keras.layers.Embedding(n, DLRM_DIM, name=f"cat_{i}_table")(x))
            for i, (n, x) in enumerate(zip(rows, inputs))
        ]
    features = {}
    for i, n in enumerate(rows):
        table = keras_rs.layers.TableConfig(
            name=f"cat_{i}_table",
            vocabulary_size=n,
            embedding_dim=DLRM_DIM,
            initializer=keras.initializers.RandomUniform(-0.05, 0.05, seed=i),
            combiner="sum",
            placement="auto",
        )
        features[f"cat_{i}"] = keras_rs.layers.FeatureConfig(
            f"cat_{i}", table, (None, 1), (None, DLRM_DIM)
        )
    embedded = keras_rs.layers.DistributedEmbedding(features, name="embedding")(
        {f"cat_{i}": x for i, x in enumerate(inputs)}
    )
    return [embedded[f"cat_{i}"] for i in range(len(rows))]


_CROSS = {}  # Keras module name -> the fallback FeatureCross class


def _cross_layer(keras, keras_rs=True):
    """keras-rs's `FeatureCross` (DCNv2), or the same computation as a Keras layer."""
    try:
        keras_rs = _keras_rs(keras, keras_rs)

        return lambda i: keras_rs.layers.FeatureCross(projection_dim=64, name=f"cross_{i}")
    except ImportError:
        pass
    if keras.__name__ not in _CROSS:

        class FeatureCross(keras.layers.Layer):
            """DCNv2's cross layer: `x0 * (V(U x) + b) + x`, U and V of rank 64."""

            def build(self, input_shape):
                width = input_shape[-1]
                self.down = keras.layers.Dense(64, use_bias=False)
                self.up = keras.layers.Dense(width)
                self.down.build(input_shape)
                self.up.build(input_shape[:-1] + (64,))

            def call(self, x0, x):
                return x0 * self.up(self.down(x)) + x

        _CROSS[keras.__name__] = FeatureCross
    return lambda i: _CROSS[keras.__name__](name=f"cross_{i}")


def _dlrm(keras, size, keras_rs=True):
    layers = keras.layers
    dense = keras.Input((DLRM_DENSE,), name="dense_features")
    ids = [keras.Input((1,), dtype="int32", name=f"cat_{i}") for i in range(26)]
    bottom = layers.Dense(64, activation="relu")(dense)
    bottom = layers.Dense(DLRM_DIM, activation="relu")(bottom)
    x0 = layers.Concatenate()([bottom] + _dlrm_embeddings(keras, size, ids, keras_rs))
    cross = _cross_layer(keras, keras_rs)
    x = x0
    for i in range(3):
        x = cross(i)(x0, x)
    top = layers.Dense(256, activation="relu")(x)
    top = layers.Dense(64, activation="relu")(top)
    outputs = layers.Dense(1, activation="sigmoid")(top)
    return keras.Model(
        {"dense_features": dense, **{f"cat_{i}": t for i, t in enumerate(ids)}}, outputs
    )


def _zipf_ids(rng, rows, n):
    """`n` ids in `[0, rows)`, id rank k drawn with probability proportional to k^-1.1, the
    ranks scattered over the table by a fixed permutation (hashed ids are not sorted by
    popularity)."""
    weights = np.arange(1, rows + 1, dtype=np.float64) ** -DLRM_ZIPF
    cdf = np.cumsum(weights)
    ranks = np.searchsorted(cdf, rng.random(n) * cdf[-1])
    return rng.permutation(rows)[np.minimum(ranks, rows - 1)].astype(np.int32)


def _dlrm_data(rng, examples, size):
    dense = np.log1p(rng.exponential(3.0, (examples, DLRM_DENSE))).astype(np.float32)
    x = {"dense_features": dense}
    score = dense @ rng.standard_normal(DLRM_DENSE).astype(np.float32) * 0.3
    for i, rows in enumerate(dlrm_rows(size)):
        ids = _zipf_ids(rng, rows, examples)
        x[f"cat_{i}"] = ids[:, None]
        score += np.where((ids.astype(np.int64) * 40503 + i) % 7 < 3, 0.4, -0.3)
    y = (score + rng.normal(0, 1, examples) > np.median(score)).astype(np.float32)
    return x, y[:, None]


def id_features(name, size=1.0):
    """`{input name: (table name, row width)}` of a model's embedding lookups ({} for none)."""
    if name == "recommender":
        return {"item": ("item_table", 32), "user": ("user_table", 32)}
    if name == "dlrm":
        return {f"cat_{i}": (f"cat_{i}_table", DLRM_DIM) for i in range(26)}
    return {}


def lookup_rows(name, x, batch_size, replicas, size=1.0, steps=None):
    """What a step's lookups need, from the ids themselves (independent of any strategy).

    Averaged over the first `steps` global batches (all by default), for float32 rows:

    - `ids_per_replica_per_step`, `id_row_bytes_per_replica_per_step`: every id a replica
      looks up, and its rows' bytes: what crosses when each id's row is pulled.
    - `distinct_ids_per_replica_per_step`, `distinct_row_bytes_per_replica_per_step`: each
      table's distinct ids within a replica's share: what crosses when each distinct row is
      pulled once per replica.
    - `distinct_ids_per_step`, `distinct_row_bytes_per_step`: distinct ids in the global batch,
      per table: what crosses when each distinct row is pulled once per step.

    Returns {} for a model without lookups.
    """
    features = id_features(name, size)
    if not features:
        return {}
    batches = len(next(iter(x.values()))) // batch_size
    batches = min(batches, steps or batches)
    share = batch_size // replicas
    keys = ("ids", "ids_bytes", "replica", "replica_bytes", "step", "step_bytes")
    totals = dict.fromkeys(keys, 0)
    for b in range(batches):
        start = b * batch_size
        per_table = {}
        for feature, (table, width) in features.items():
            per_table.setdefault(table, (width, []))[1].append(
                np.asarray(x[feature][start : start + batch_size]).reshape(batch_size, -1)
            )
        for width, blocks in per_table.values():
            ids = np.concatenate(blocks, axis=1)
            distinct_step = len(np.unique(ids))
            totals["step"] += distinct_step
            totals["step_bytes"] += distinct_step * width * 4
            for r in range(replicas):
                mine = ids[r * share : (r + 1) * share]
                totals["ids"] += mine.size
                totals["ids_bytes"] += mine.size * width * 4
                distinct = len(np.unique(mine))
                totals["replica"] += distinct
                totals["replica_bytes"] += distinct * width * 4
    per_replica_step = batches * replicas
    return {
        "ids_per_replica_per_step": totals["ids"] / per_replica_step,
        "id_row_bytes_per_replica_per_step": totals["ids_bytes"] / per_replica_step,
        "distinct_ids_per_replica_per_step": totals["replica"] / per_replica_step,
        "distinct_row_bytes_per_replica_per_step": totals["replica_bytes"] / per_replica_step,
        "distinct_ids_per_step": totals["step"] / batches,
        "distinct_row_bytes_per_step": totals["step_bytes"] / batches,
    }


def table_bytes(name, size=1.0):
    """Bytes of a model's embedding tables (float32), without optimizer slots; 0 for none."""
    if name == "dlrm":
        return sum(dlrm_rows(size)) * DLRM_DIM * 4
    if name == "recommender":
        return sum(_table_sizes(size)) * 32 * 4
    return 0


_BUILDERS = {
    "mlp": _mlp,
    "resnet": _resnet,
    "recommender": _recommender,
    "transformer": _transformer,
    "dlrm": _dlrm,
}


def build(name, size=1.0, keras_module=None, keras_rs=True):
    """Builds (does not compile) model `name` at `size`; call under the strategy's scope.

    `keras_module`: the Keras to build with (default: Keras 3, `import keras`); `tf_keras`
    builds the same model in TensorFlow's Keras 2 (its DLRM from Keras layers: keras-rs is
    built on Keras 3). `keras_rs=False`: the DLRM from Keras layers under Keras 3 too.
    """
    if keras_module is None:
        import keras as keras_module
    if name not in _BUILDERS:
        raise ValueError(f"Unknown model {name!r}. Valid models: {', '.join(MODELS)}")
    if name == "dlrm":
        return _dlrm(keras_module, size, keras_rs=keras_rs)
    return _BUILDERS[name](keras_module, size)


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
    if name == "dlrm":
        return _dlrm_data(rng, examples, size)
    if name == "transformer":
        x = rng.integers(0, _VOCABULARY, (examples, _SEQUENCE), dtype=np.int32)
        return x, noisy(np.sum(x < _VOCABULARY // 2, axis=1) > _SEQUENCE // 2, 2)
    raise ValueError(f"Unknown model {name!r}. Valid models: {', '.join(MODELS)}")
