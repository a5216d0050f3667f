r"""What deduplicating lookups costs and saves on one machine, A/B in one process.

Trains the same embedding model under two dpkeras strategies that differ only in
`deduplicate` (True and False), on the same devices and batches, alternating timed `fit`s so
that drift in the machine's speed hits both alike; reports the median steps/s of each and their
ratio, for ids that never repeat within a batch (where deduplication only costs: a `tf.unique`
and a local gather per lookup) and for Zipf-distributed ids (where it saves rows).

    python -m benchmarks.dedup                         # 2 replicas on simulated CPU devices
    python -m benchmarks.dedup --rows=100000 --dim=32 --batch=960 --rounds=7

On simulated CPU devices rows cross no link, so this measures the cost side; the bytes saved
are counted by tests/test_cluster_loop.py and the DLRM benchmark.
"""

import os
import statistics
import sys
import time

from absl import app, flags

if __package__ in (None, ""):  # run as `python benchmarks/dedup.py`
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

FLAGS = flags.FLAGS
flags.DEFINE_integer("replicas", 2, "Replicas (simulated CPU devices).", lower_bound=1)
flags.DEFINE_integer("rows", 100_000, "Table rows.", lower_bound=1)
flags.DEFINE_integer("dim", 32, "Embedding width.", lower_bound=1)
flags.DEFINE_integer("ids", 8, "Ids per example.", lower_bound=1)
flags.DEFINE_integer("batch", 960, "Global batch size.", lower_bound=1)
flags.DEFINE_integer("steps", 40, "Steps per timed fit.", lower_bound=1)
flags.DEFINE_integer("rounds", 5, "Timed fits per mode and id distribution.", lower_bound=1)


def _ids(distribution, rng, steps, batch, per_example, rows):
    import numpy as np

    if distribution == "distinct":  # no id repeats within a global batch
        return np.stack(
            [rng.permutation(rows)[: batch * per_example] for _ in range(steps)]
        ).reshape(steps * batch, per_example)
    zipf = np.minimum(rng.zipf(1.1, (steps * batch, per_example)) - 1, rows - 1)
    return rng.permutation(rows)[zipf]  # popular ids scattered over the table


def _model(keras, rows, dim, per_example):
    keras.utils.set_random_seed(1)
    inputs = keras.Input((per_example,), dtype="int32")
    x = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(rows, dim)(inputs))
    x = keras.layers.Dense(64, activation="relu")(x)
    model = keras.Model(inputs, keras.layers.Dense(1)(x))
    model.compile(optimizer=keras.optimizers.Adagrad(0.05), loss="mse")
    return model


def _steps_per_second(model, dataset, steps):
    start = time.perf_counter()
    model.fit(dataset, steps_per_epoch=steps, epochs=1, verbose=0)
    return steps / (time.perf_counter() - start)


def main(argv):
    del argv
    import dpkeras

    dpkeras.simulate_cpu_devices(FLAGS.replicas + 1)
    import keras
    import numpy as np
    import tensorflow as tf

    if FLAGS.rows < FLAGS.batch * FLAGS.ids:
        raise app.UsageError(
            f"--rows must be at least --batch x --ids ({FLAGS.batch * FLAGS.ids}) for a batch of "
            f"distinct ids. Received: --rows={FLAGS.rows}"
        )
    devices = [f"/cpu:{i}" for i in range(1, FLAGS.replicas + 1)]
    rng = np.random.default_rng(0)
    print(
        f"dpkeras {dpkeras.__version__}: {FLAGS.replicas} replicas (simulated CPU devices), "
        f"a {FLAGS.rows} x {FLAGS.dim} table, {FLAGS.batch} x {FLAGS.ids} ids a step, "
        f"{FLAGS.steps} steps x {FLAGS.rounds} rounds per mode, Adagrad.\n"
    )
    print("| ids | distinct ids per step | steps/s deduplicate=True | steps/s False | ratio |")
    print("|---|---|---|---|---|")
    for distribution in ("distinct", "zipf"):
        x = _ids(distribution, rng, FLAGS.steps, FLAGS.batch, FLAGS.ids, FLAGS.rows)
        x = x.astype("int32")
        y = rng.normal(size=(len(x), 1)).astype("float32")
        dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(FLAGS.batch).repeat()
        models = {}
        for mode in (True, False):
            with dpkeras.get_strategy(devices, "/cpu:0", None, None, mode).scope():
                models[mode] = _model(keras, FLAGS.rows, FLAGS.dim, FLAGS.ids)
            models[mode].fit(dataset, steps_per_epoch=3, epochs=1, verbose=0)  # traced
        rates = {True: [], False: []}
        for _ in range(FLAGS.rounds):
            for mode in (True, False):
                rates[mode].append(_steps_per_second(models[mode], dataset, FLAGS.steps))
        on, off = statistics.median(rates[True]), statistics.median(rates[False])
        distinct = np.mean([len(np.unique(b)) for b in x.reshape(FLAGS.steps, -1)])
        print(f"| {distribution} | {distinct:.0f} | {on:.1f} | {off:.1f} | {on / off:.3f} |")


if __name__ == "__main__":
    app.run(main)
