r"""What one Adagrad update of an embedding table costs: Keras 3's own, and dpkeras's.

Keras 3's `Adagrad.update_step` computes `sqrt(accumulator + epsilon)` and checks it for zeros
and NaNs over the whole table on every step; an Adagrad made in a dpkeras scope does the same
arithmetic on the gradient's rows only, with the same bits (`dpkeras/_extended/sparse_rows.py`).
For each table size: the milliseconds of one update of a `--batch`-row sparse gradient (Zipf
ids, repeated), in a `tf.function`, the median of `--repeats` rounds of `--steps` updates, on
one CPU device; and whether the two tables end bit-identical.

    python -m benchmarks.sparse_update
    python -m benchmarks.sparse_update --rows=25000,1000000 --dim=64
"""

import contextlib
import os
import sys
import time

import numpy as np
from absl import app, flags

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

FLAGS = flags.FLAGS
flags.DEFINE_list("rows", ["25000", "100000", "1000000"], "Table sizes (rows).")
flags.DEFINE_integer("dim", 32, "Row width.", lower_bound=1)
flags.DEFINE_integer("batch", 256, "Gradient rows per update.", lower_bound=1)
flags.DEFINE_integer("steps", 100, "Updates per round.", lower_bound=1)
flags.DEFINE_integer("repeats", 3, "Rounds; the median is reported.", lower_bound=1)


def _measure(rows, strategy):
    import keras
    import tensorflow as tf

    rng = np.random.RandomState(0)
    initial = rng.rand(rows, FLAGS.dim).astype("float32")
    with strategy.scope() if strategy is not None else contextlib.nullcontext():
        table = keras.Variable(initial, name="table")
        optimizer = keras.optimizers.Adagrad(0.05)
        optimizer.build([table])
    ids = [tf.constant(rng.zipf(1.1, FLAGS.batch) % rows, tf.int64) for _ in range(8)]
    values = [tf.constant(rng.randn(FLAGS.batch, FLAGS.dim).astype("float32")) for _ in ids]
    shape = tf.constant([rows, FLAGS.dim], tf.int64)

    @tf.function
    def update(v, i):
        optimizer.apply([tf.IndexedSlices(v, i, shape)], [table])

    update(values[0], ids[0])
    seconds = []
    for _ in range(FLAGS.repeats):
        start = time.perf_counter()
        for step in range(FLAGS.steps):
            update(values[step % 8], ids[step % 8])
        seconds.append((time.perf_counter() - start) / FLAGS.steps)
    return float(np.median(seconds)) * 1e3, table.numpy()


def main(argv):
    del argv
    import dpkeras

    dpkeras.simulate_cpu_devices(2)
    strategy = dpkeras.get_strategy(["/cpu:1"], "/cpu:0")
    print(f"Adagrad update of {FLAGS.batch} sparse rows of width {FLAGS.dim}, ms (median)")
    print("| table rows | Keras 3 | dpkeras | bit-identical |")
    print("|---|---|---|---|")
    for rows in (int(r) for r in FLAGS.rows):
        ours, ours_table = _measure(rows, strategy)
        keras_ms, keras_table = _measure(rows, None)
        same = np.array_equal(ours_table, keras_table)
        print(f"| {rows:,} | {keras_ms:.3f} | {ours:.3f} | {same} |", flush=True)


if __name__ == "__main__":
    app.run(main)
