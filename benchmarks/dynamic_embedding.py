r"""DynamicEmbedding on a DLRM-shaped model with raw, unbounded ids.

26 categorical features of raw ids (Zipf-distributed ranks, each hashed with its feature to a
63-bit id: no vocabulary, no cap) and 13 dense features; each categorical feature has its own
`dpkeras.layers.DynamicEmbedding` (dim 16) and the dense features a bottom MLP; a top MLP on
the 27 vectors predicts a click (binary cross-entropy, Adagrad). Reported:

- memory against distinct ids seen: after each window of `--every` steps, the ids holding a
  row (all features), the ids waiting for admission, the process's resident memory (VmRSS)
  and the bytes the tables hold (rows and Adagrad's accumulators are allocated up front at
  `--capacity` rows per feature; the hash index grows by about 40 bytes an id);
- steps/s against the same model with fixed-size `keras.layers.Embedding` tables of
  `--capacity` rows fed `id % capacity` (the hashing trick: collisions merge ids);
- index lookups per second: `tf.lookup` on one feature's filled index, a batch at a time.

    python -m benchmarks.dynamic_embedding                       # dpkeras, 2 replicas
    python -m benchmarks.dynamic_embedding --strategy=none       # plain Keras, one device
    python -m benchmarks.dynamic_embedding --steps=4 --every=2 --capacity=512   # a smoke run

Writes one JSON object to `--out`, and prints tables. Without GPUs the CPU is split into
`replicas + 1` logical devices (replicas on /cpu:1.., variables on /cpu:0).
"""

import json
import os
import sys
import time

from absl import app, flags

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.machine import resident_mib  # noqa: E402

FLAGS = flags.FLAGS

flags.DEFINE_integer("steps", 400, "Timed training steps of each model.")
flags.DEFINE_integer("every", 50, "Steps per window of the memory record.")
flags.DEFINE_integer("replicas", 2, "Compute replicas (dpkeras).")
flags.DEFINE_integer("batch_size", 512, "Global batch size.")
flags.DEFINE_integer("capacity", 1 << 15, "Rows per feature (both models).")
flags.DEFINE_integer("min_count", 1, "DynamicEmbedding's admission threshold.")
flags.DEFINE_enum("eviction", "lru", ["none", "lfu", "lru"], "DynamicEmbedding's eviction.")
flags.DEFINE_float("zipf", 1.1, "Zipf exponent of each feature's ranks (> 1).")
flags.DEFINE_enum("strategy", "dpkeras", ["dpkeras", "none"], "dpkeras, or plain Keras.")
flags.DEFINE_integer("lookup_batch", 1 << 16, "Ids per index lookup call.")
flags.DEFINE_string("out", "results/dynamic_embedding.json", "JSON written here.")
flags.DEFINE_integer("seed", 1234, "Seed of the weights and the data.")

CATEGORICAL, DENSE, DIM = 26, 13, 16


def raw_ids(np, rng, n, zipf):
    """`[n, 26]` raw ids: Zipf ranks per feature, hashed with the feature to 63 bits."""
    ranks = rng.zipf(zipf, size=(n, CATEGORICAL)).astype("uint64")
    x = ranks * np.uint64(0x9E3779B97F4A7C15) + np.arange(CATEGORICAL, dtype="uint64")
    x ^= x >> np.uint64(31)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(29)
    return (x & np.uint64(0x7FFFFFFFFFFFFFFF)).astype("int64")


def batches(np, seed):
    """An endless stream of (features, labels) batches."""
    rng = np.random.RandomState(seed)
    while True:
        ids = raw_ids(np, rng, FLAGS.batch_size, FLAGS.zipf)
        dense = rng.rand(FLAGS.batch_size, DENSE).astype("float32")
        label = (dense[:, 0] + (ids[:, 0] % 7 == 0) > 1.0).astype("float32")[:, None]
        yield {"ids": ids, "dense_features": dense}, label


def build(keras, dynamic):
    """The DLRM-shaped model: per-feature tables, bottom and top MLPs."""
    from dpkeras.layers import DynamicEmbedding

    ids = keras.Input((CATEGORICAL,), dtype="int64", name="ids")
    dense = keras.Input((DENSE,), name="dense_features")
    vectors = [keras.layers.Dense(64, activation="relu")(dense)]
    vectors[0] = keras.layers.Dense(DIM, activation="relu")(vectors[0])
    for f in range(CATEGORICAL):
        column = keras.layers.Lambda(lambda t, f=f: t[:, f : f + 1])(ids)
        if dynamic:
            table = DynamicEmbedding(
                DIM,
                FLAGS.capacity,
                min_count=FLAGS.min_count,
                eviction=None if FLAGS.eviction == "none" else FLAGS.eviction,
                name=f"feature_{f}",
            )
        else:
            column = keras.layers.Lambda(lambda t: t % FLAGS.capacity)(column)
            table = keras.layers.Embedding(FLAGS.capacity, DIM, name=f"feature_{f}")
        vectors.append(keras.layers.Flatten()(table(column)))
    x = keras.layers.Concatenate()(vectors)
    x = keras.layers.Dense(256, activation="relu")(x)
    x = keras.layers.Dense(64, activation="relu")(x)
    model = keras.Model([ids, dense], keras.layers.Dense(1)(x))
    model.compile(
        optimizer=keras.optimizers.Adagrad(0.05),
        loss=keras.losses.BinaryCrossentropy(from_logits=True),
    )
    return model


def table_bytes(model):
    """Bytes of every table weight and optimizer variable of the embeddings."""
    total = 0
    for v in model.weights + model.optimizer.variables:
        if "feature_" in v.path:
            total += int(v.numpy().nbytes)
    return total


def train(model, data, steps, record=None):
    """Trains `steps` steps, `--every` at a time; returns steps/s over the timed windows."""
    elapsed, done = 0.0, 0
    model.fit(data, steps_per_epoch=2, epochs=1, verbose=0)  # trace and warm up
    while done < steps:
        n = min(FLAGS.every, steps - done)
        start = time.perf_counter()
        model.fit(data, steps_per_epoch=n, epochs=1, verbose=0)
        elapsed += time.perf_counter() - start
        done += n
        if record is not None:
            record(done)
    return done / elapsed


def lookups_per_second(tf, layer):
    """Index lookups per second on `layer`'s filled index, `--lookup_batch` ids a call."""
    keys, _ = layer.index_table.export()
    keys = tf.reshape(keys, [-1])
    reps = max(1, FLAGS.lookup_batch // max(1, int(tf.size(keys))) + 1)
    batch = tf.random.shuffle(tf.tile(keys, [reps]))[: FLAGS.lookup_batch]

    @tf.function
    def lookup(ids):
        return tf.reduce_sum(layer.index_table.lookup(ids))

    lookup(batch)
    calls, start = 0, time.perf_counter()
    while calls < 20 or time.perf_counter() - start < 1.0:
        lookup(batch).numpy()
        calls += 1
    return calls * FLAGS.lookup_batch / (time.perf_counter() - start)


def main(argv):
    del argv
    if FLAGS.batch_size % FLAGS.replicas:
        raise app.UsageError("--batch_size must be divisible by --replicas")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from benchmarks import machine

    gpus = machine.find_gpus()
    import dpkeras

    if not gpus and FLAGS.strategy == "dpkeras":
        dpkeras.simulate_cpu_devices(FLAGS.replicas + 1)
    import keras
    import numpy as np
    import tensorflow as tf

    def dataset(seed):
        """One endless generator: each `fit` call continues it (a tf.data dataset restarts)."""
        return batches(np, seed)

    def make(dynamic):
        keras.utils.set_random_seed(FLAGS.seed)
        if FLAGS.strategy == "none":
            return build(keras, dynamic)
        compute = (
            [f"/gpu:{i}" for i in range(FLAGS.replicas)]
            if gpus
            else [f"/cpu:{i + 1}" for i in range(FLAGS.replicas)]
        )
        with dpkeras.get_strategy(compute, "/cpu:0").scope():
            return build(keras, dynamic)

    rss_before = resident_mib()
    dynamic = make(True)
    layers = [layer for layer in dynamic.layers if layer.name.startswith("feature_")]
    memory = []

    def record(step):
        memory.append(
            {
                "step": step,
                "ids_with_rows": sum(layer.size for layer in layers),
                "ids_pending": sum(
                    int(layer.pending_table.size()) for layer in layers if FLAGS.min_count > 1
                ),
                "rss_mib": round(resident_mib(), 1),
                "rss_growth_mib": round(resident_mib() - rss_before, 1),
            }
        )

    dynamic_rate = train(dynamic, dataset(FLAGS.seed), FLAGS.steps, record)
    dynamic_bytes = table_bytes(dynamic)
    lookup_rate = lookups_per_second(tf, layers[0])
    fixed = make(False)
    fixed_rate = train(fixed, dataset(FLAGS.seed), FLAGS.steps)
    result = {
        "run": {
            "strategy": FLAGS.strategy,
            "replicas": FLAGS.replicas if FLAGS.strategy == "dpkeras" else 1,
            "devices": "gpu" if gpus else "simulated cpu",
            "batch_size": FLAGS.batch_size,
            "capacity": FLAGS.capacity,
            "eviction": FLAGS.eviction,
            "min_count": FLAGS.min_count,
            "zipf": FLAGS.zipf,
            "steps": FLAGS.steps,
            "command": "python -m benchmarks.dynamic_embedding " + " ".join(sys.argv[1:]),
        },
        "memory": memory,
        "table_mib": {
            "dynamic": round(dynamic_bytes / 2**20, 1),
            "fixed": round(table_bytes(fixed) / 2**20, 1),
        },
        "steps_per_second": {"dynamic": round(dynamic_rate, 2), "fixed": round(fixed_rate, 2)},
        "index_lookups_per_second": round(lookup_rate),
    }
    os.makedirs(os.path.dirname(FLAGS.out) or ".", exist_ok=True)
    with open(FLAGS.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"{'step':>6} {'ids with rows':>14} {'pending':>8} {'RSS MiB':>8} {'growth':>7}")
    for m in memory:
        print(
            f"{m['step']:>6} {m['ids_with_rows']:>14} {m['ids_pending']:>8} "
            f"{m['rss_mib']:>8} {m['rss_growth_mib']:>7}"
        )
    print(f"tables (rows + Adagrad, MiB): {result['table_mib']}")
    print(f"steps/s: {result['steps_per_second']}")
    print(f"index lookups/s (one feature, {FLAGS.lookup_batch} ids a call): {round(lookup_rate)}")
    print(f"written to {FLAGS.out}")


if __name__ == "__main__":
    app.run(main)
