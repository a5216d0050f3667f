r"""Soak run: trains for thousands of steps and records memory and step time as it goes.

A long job must not leak: resident memory should level off after the first steps and the step
time should stay where it started. This trains a small MLP (Dense, BatchNormalization, Dropout,
Adam, an accuracy metric: every kind of dpkeras variable) with unchanged `model.fit` for
`--steps` steps, in windows of `--every` steps (one Keras epoch each, so the per-epoch
machinery runs too), and records after each window: resident memory (VmRSS), the step time
(mean, median and 95th percentile over the window), live Python objects and the variables the
strategy holds.

    python -m benchmarks.soak                                  # 5000 steps, dpkeras
    python -m benchmarks.soak --steps=20000 --every=1000 --replicas=2
    python -m benchmarks.soak --strategy=none                  # the baseline: plain Keras

Writes one JSON line per window (after a first line describing the run) to `--out`, and prints
a table and a summary. Without GPUs the CPU is split into `replicas + 1` logical devices
(replicas on /cpu:1.., variables on /cpu:0), as in `benchmarks.compare`.
"""

import gc
import json
import os
import statistics
import sys
import time

from absl import app, flags

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.machine import resident_mib  # noqa: E402

FLAGS = flags.FLAGS

flags.DEFINE_integer("steps", 5000, "Training steps in all.")
flags.DEFINE_integer("every", 250, "Steps per window: one record (and one Keras epoch) each.")
flags.DEFINE_integer("replicas", 3, "Compute replicas (dpkeras).")
flags.DEFINE_integer("batch_size", 96, "Global batch size.")
flags.DEFINE_enum(
    "strategy",
    "dpkeras",
    ["dpkeras", "none"],
    "dpkeras, or none: plain Keras on one device, the baseline.",
)
flags.DEFINE_string("out", "results/soak.jsonl", "JSON lines written here (directory created).")
flags.DEFINE_integer("seed", 1234, "Seed of the weights, the data and Dropout.")


def percentile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def slope_per_1000_steps(points):
    """Least-squares slope of `(step, value)` points, per 1000 steps."""
    n = len(points)
    if n < 2:
        return 0.0
    mx = sum(p[0] for p in points) / n
    my = sum(p[1] for p in points) / n
    var = sum((p[0] - mx) ** 2 for p in points)
    return 1000 * sum((p[0] - mx) * (p[1] - my) for p in points) / var if var else 0.0


def build_model(keras):
    layers = keras.layers
    model = keras.Sequential(
        [
            keras.Input((784,)),
            layers.Dense(256, activation="relu"),
            layers.BatchNormalization(),
            layers.Dropout(0.2),
            layers.Dense(256, activation="relu"),
            layers.Dense(10),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        metrics=["accuracy"],
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


def summarize(records):
    """The summary: memory and step-time trends after the first window (tracing, warm-up)."""
    steady = records[1:] or records
    rss = [(r["step"], r["rss_mib"]) for r in steady]
    step_ms = [(r["step"], r["step_ms_median"]) for r in steady]
    return {
        "rss_first_mib": records[0]["rss_mib"],
        "rss_steady_start_mib": steady[0]["rss_mib"],
        "rss_last_mib": records[-1]["rss_mib"],
        "rss_max_mib": max(r["rss_mib"] for r in records),
        "rss_slope_mib_per_1000_steps": slope_per_1000_steps(rss),
        "step_ms_median_first_steady": steady[0]["step_ms_median"],
        "step_ms_median_last": records[-1]["step_ms_median"],
        "step_ms_slope_per_1000_steps": slope_per_1000_steps(step_ms),
        "python_objects_growth": records[-1]["python_objects"] - steady[0]["python_objects"],
        "variables_constant": len({r["variables"] for r in records}) == 1,
    }


def format_table(records):
    header = (
        f"{'window':>6} {'step':>7} {'RSS MiB':>8} {'dRSS':>6} {'ms/step':>8} "
        f"{'median':>7} {'p95':>7} {'wall':>7} {'objects':>8} {'vars':>5}"
    )
    lines = [header, "-" * len(header)]
    previous = None
    for r in records:
        delta = "" if previous is None else f"{r['rss_mib'] - previous:+.1f}"
        lines.append(
            f"{r['window']:>6} {r['step']:>7} {r['rss_mib']:>8.1f} {delta:>6} "
            f"{r['step_ms_mean']:>8.2f} {r['step_ms_median']:>7.2f} "
            f"{r['step_ms_p95']:>7.2f} {r['wall_ms_per_step']:>7.2f} "
            f"{r['python_objects']:>8} {r['variables']:>5}"
        )
        previous = r["rss_mib"]
    return "\n".join(lines)


def main(argv):
    del argv
    if FLAGS.steps < FLAGS.every or FLAGS.every < 2:
        raise app.UsageError(
            f"--steps must be at least --every (at least 2). Received: "
            f"--steps={FLAGS.steps} --every={FLAGS.every}"
        )
    if FLAGS.batch_size % FLAGS.replicas:
        raise app.UsageError(
            f"--batch_size must be divisible by --replicas. Received: "
            f"--batch_size={FLAGS.batch_size} --replicas={FLAGS.replicas}"
        )
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from benchmarks import machine

    gpus = machine.find_gpus()
    import dpkeras

    if not gpus:
        dpkeras.simulate_cpu_devices(FLAGS.replicas + 1)
    import keras
    import numpy as np
    import tensorflow as tf

    keras.utils.set_random_seed(FLAGS.seed)
    rng = np.random.RandomState(FLAGS.seed)
    x = rng.rand(FLAGS.batch_size * 16, 784).astype("float32")
    y = (x[:, :10].argmax(axis=1)).astype("int32")
    data = (
        tf.data.Dataset.from_tensor_slices((x, y))
        .repeat()
        .batch(FLAGS.batch_size, drop_remainder=True)
        .prefetch(2)
    )

    if FLAGS.strategy == "dpkeras":
        compute = (
            [f"/gpu:{i}" for i in range(FLAGS.replicas)]
            if gpus
            else [f"/cpu:{i + 1}" for i in range(FLAGS.replicas)]
        )
        strategy = dpkeras.get_strategy(compute, "/cpu:0")
        with strategy.scope():
            model = build_model(keras)

        def count_variables():
            return len(strategy.extended.variables())
    else:
        model = build_model(keras)

        def count_variables():
            return len(model.variables) + len(model.optimizer.variables)

    records = []
    window_times = []

    class Recorder(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.window_started = time.perf_counter()
            ended = getattr(self, "window_ended", None)
            self.gap = None if ended is None else self.window_started - ended

        def on_train_batch_begin(self, batch, logs=None):
            self.started = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            window_times.append(time.perf_counter() - self.started)

        def on_epoch_end(self, epoch, logs=None):
            wall = time.perf_counter() - self.window_started
            measured = time.perf_counter()
            gc.collect()
            ms = [1000 * t for t in window_times]
            records.append(
                {
                    "window": epoch,
                    "step": (epoch + 1) * FLAGS.every,
                    "rss_mib": resident_mib(),
                    "step_ms_mean": statistics.fmean(ms),
                    "step_ms_median": statistics.median(ms),
                    "step_ms_p95": percentile(ms, 0.95),
                    "wall_ms_per_step": 1000 * wall / len(ms),
                    "python_objects": len(gc.get_objects()),
                    "variables": count_variables(),
                    "loss": float(logs["loss"]),
                }
            )
            records[-1]["record_seconds"] = time.perf_counter() - measured
            records[-1]["seconds_since_previous_window"] = self.gap
            window_times.clear()
            self.window_ended = time.perf_counter()
            print(format_table(records).splitlines()[-1], flush=True)

    info = machine.describe(gpus, FLAGS.replicas, "/cpu:0")
    info.update(
        strategy=FLAGS.strategy,
        steps=FLAGS.steps,
        every=FLAGS.every,
        replicas=FLAGS.replicas if FLAGS.strategy == "dpkeras" else 1,
        batch_size=FLAGS.batch_size,
        rss_before_training_mib=resident_mib(),
        command=" ".join(["python -m benchmarks.soak"] + sys.argv[1:]),
    )
    print(format_table([]).splitlines()[0], flush=True)
    started = time.time()
    model.fit(
        data,
        steps_per_epoch=FLAGS.every,
        epochs=FLAGS.steps // FLAGS.every,
        verbose=0,
        shuffle=False,
        callbacks=[Recorder()],
    )
    info["wall_seconds"] = time.time() - started
    summary = summarize(records)
    os.makedirs(os.path.dirname(FLAGS.out) or ".", exist_ok=True)
    with open(FLAGS.out, "w") as f:
        f.write(json.dumps({"run": info, "summary": summary}) + "\n")
        for r in records:
            f.write(json.dumps(r) + "\n")
    print()
    print(format_table(records))
    print()
    print(
        f"{FLAGS.strategy}, {info['replicas']} replica(s), {FLAGS.steps} steps of "
        f"{FLAGS.batch_size} in {info['wall_seconds']:.0f} s. RSS: "
        f"{summary['rss_first_mib']:.1f} MiB after the first window, "
        f"{summary['rss_last_mib']:.1f} MiB at the end (slope after the first window: "
        f"{summary['rss_slope_mib_per_1000_steps']:+.2f} MiB per 1000 steps). Median step: "
        f"{summary['step_ms_median_first_steady']:.2f} ms -> "
        f"{summary['step_ms_median_last']:.2f} ms (slope "
        f"{summary['step_ms_slope_per_1000_steps']:+.3f} ms per 1000 steps). Variables "
        f"{'constant' if summary['variables_constant'] else 'CHANGED'}. Written to "
        f"{FLAGS.out}."
    )


def run():
    app.run(main)


if __name__ == "__main__":
    run()
