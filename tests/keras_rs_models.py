"""Small keras-rs models and their data, for tests/test_keras_rs.py (in-process and on a cluster).

Every initializer is seeded: keras-rs seeds its default table initializer once, at import, so
`keras.utils.set_random_seed` does not fix a table's first values.

- `features_model`: one `DistributedEmbedding` over three tables, one per combiner (sum, mean,
  sqrtn), with multi-hot features and one table shared by two features; `DotInteraction` over
  the feature vectors, `FeatureCross` over their concatenation, a Dense head.
- `TinyDlrm`: the DLRM-DCNv2 shape of keras-rs's examples/ml_perf/model.py, small: a bottom
  MLP over dense features, a `DistributedEmbedding` of one-hot and multi-hot categorical
  features, a stack of `FeatureCross` layers (DCNv2) over their concatenation, a top MLP with a
  sigmoid. Inputs are nested: `{"dense": ..., "sparse": {feature: ids}}`.
"""

import keras
import keras_rs
import numpy as np

EXAMPLES, BATCH = 48, 12
DIM = 4
# feature -> (table, ids per example); tables: name -> (rows, combiner)
FEATURE_TABLES = {"rows_sum": (50, "sum"), "rows_mean": (80, "mean"), "rows_sqrtn": (30, "sqrtn")}
FEATURES = {
    "clicks": ("rows_sum", 3),
    "views": ("rows_mean", 4),
    "cart": ("rows_mean", 2),  # shares rows_mean with views
    "tags": ("rows_sqrtn", 2),
}
DLRM_TABLES = {"cat_big": (96, "sum"), "cat_small": (12, "sum"), "cat_multi": (60, "mean")}
DLRM_FEATURES = {
    "cat_big": ("cat_big", 1),
    "cat_small": ("cat_small", 1),
    "cat_multi": ("cat_multi", 3),
}
DENSE = 4


def _normal(seed):
    return keras.initializers.RandomNormal(stddev=0.5, seed=seed)


def _glorot(seed):
    return keras.initializers.GlorotUniform(seed=seed)


def table_configs(tables, table_optimizer="adam", placement="auto"):
    """`{name: TableConfig}`, each with its own seeded initializer."""
    return {
        name: keras_rs.layers.TableConfig(
            name=name,
            vocabulary_size=rows,
            embedding_dim=DIM,
            initializer=_normal(10 + i),
            optimizer=table_optimizer,
            combiner=combiner,
            placement=placement,
        )
        for i, (name, (rows, combiner)) in enumerate(sorted(tables.items()))
    }


def feature_configs(features, tables):
    """`{feature: FeatureConfig}`; one id per example is a 1-D feature (no reduction)."""
    configs = {}
    for name, (table, ids) in features.items():
        shape = (None,) if ids == 1 else (None, ids)
        configs[name] = keras_rs.layers.FeatureConfig(name, tables[table], shape, (None, DIM))
    return configs


def compile_model(model, optimizer, loss):
    optimizers = {
        "sgd": lambda: keras.optimizers.SGD(0.2),
        "adam": lambda: keras.optimizers.Adam(0.02),
    }
    model.compile(optimizer=optimizers[optimizer](), loss=loss)
    return model


def features_model(optimizer="sgd", table_optimizer="adam", placement="auto"):
    """The keras-rs layers model (see the module docstring), compiled."""
    configs = feature_configs(FEATURES, table_configs(FEATURE_TABLES, table_optimizer, placement))
    inputs = {
        name: keras.Input((ids,), dtype="int32", name=name) for name, (_, ids) in FEATURES.items()
    }
    embedded = keras_rs.layers.DistributedEmbedding(configs, name="embedding")(inputs)
    vectors = [embedded[name] for name in sorted(FEATURES)]
    pairs = keras_rs.layers.DotInteraction()(vectors)
    x = keras.layers.Concatenate()(vectors + [pairs])
    x = keras_rs.layers.FeatureCross(projection_dim=3, kernel_initializer=_glorot(1))(x, x)
    outputs = keras.layers.Dense(1, kernel_initializer=_glorot(2))(x)
    return compile_model(keras.Model(inputs, outputs), optimizer, "mse")


class TinyDlrm(keras.Model):
    """DLRM-DCNv2 in small: bottom MLP, keras-rs embeddings, DCNv2 cross layers, top MLP."""

    def __init__(self, cross_layers=2, **kwargs):
        super().__init__(**kwargs)
        self.bottom = [keras.layers.Dense(8, "relu", kernel_initializer=_glorot(3))]
        self.bottom.append(keras.layers.Dense(DIM, "relu", kernel_initializer=_glorot(4)))
        configs = feature_configs(DLRM_FEATURES, table_configs(DLRM_TABLES))
        self.embedding = keras_rs.layers.DistributedEmbedding(configs, name="embedding")
        self.cross = [
            keras_rs.layers.FeatureCross(projection_dim=4, kernel_initializer=_glorot(5 + i))
            for i in range(cross_layers)
        ]
        self.top = [
            keras.layers.Dense(8, "relu", kernel_initializer=_glorot(8)),
            keras.layers.Dense(1, "sigmoid", kernel_initializer=_glorot(9)),
        ]

    def call(self, inputs):
        dense = inputs["dense"]
        for layer in self.bottom:
            dense = layer(dense)
        embedded = self.embedding(inputs["sparse"])
        x0 = keras.ops.concatenate([dense] + [embedded[k] for k in sorted(embedded)], axis=-1)
        x = x0
        for layer in self.cross:
            x = layer(x0, x)
        for layer in self.top:
            x = layer(x)
        return x


def dlrm_model(optimizer="sgd"):
    return compile_model(TinyDlrm(name="tiny_dlrm"), optimizer, "binary_crossentropy")


def _ids(rng, features, tables, distinct):
    """`{feature: ids}` for `EXAMPLES` examples. With `distinct`, no id repeats within a global
    batch of `BATCH` in any table (features sharing a table included)."""
    out = {name: np.zeros((EXAMPLES, ids), "int32") for name, (_, ids) in features.items()}
    for start in range(0, EXAMPLES, BATCH):
        for table, (rows, _) in tables.items():
            users = [(n, ids) for n, (t, ids) in features.items() if t == table]
            needed = sum(ids for _, ids in users) * BATCH
            pool = rng.permutation(rows) if distinct else rng.integers(0, rows, needed)
            assert len(pool) >= needed, f"table {table} has too few rows for distinct ids"
            taken = 0
            for name, ids in users:
                block = pool[taken : taken + ids * BATCH].reshape(BATCH, ids)
                out[name][start : start + BATCH] = block
                taken += ids * BATCH
    return {n: v[:, 0] if features[n][1] == 1 else v for n, v in out.items()}


def features_data(distinct=False, seed=0):
    rng = np.random.default_rng(seed)
    x = _ids(rng, FEATURES, FEATURE_TABLES, distinct)
    return x, rng.normal(size=(EXAMPLES, 1)).astype("float32")


def dlrm_data(distinct=False, seed=0):
    rng = np.random.default_rng(seed)
    sparse = _ids(rng, DLRM_FEATURES, DLRM_TABLES, distinct)
    dense = rng.normal(size=(EXAMPLES, DENSE)).astype("float32")
    y = (dense[:, :1] + (sparse["cat_small"][:, None] % 2) > 0.5).astype("float32")
    return {"dense": dense, "sparse": sparse}, y


MODELS = {"features": (features_model, features_data), "dlrm": (dlrm_model, dlrm_data)}


def train(name, optimizer="sgd", strategy=None, distinct=False, epochs=2):
    """Builds model `name` (under `strategy`'s scope if given), trains it on its data in global
    batches of `BATCH` without shuffling; returns `(model, history dict)`."""
    build, data = MODELS[name]
    keras.utils.set_random_seed(7)
    if strategy is None:
        model = build(optimizer)
    else:
        with strategy.scope():
            model = build(optimizer)
    x, y = data(distinct)
    history = model.fit(x, y, batch_size=BATCH, epochs=epochs, shuffle=False, verbose=0)
    return model, history.history
