r"""Per-fit costs on one machine: many small fits, as Keras's own callback tests run them.

Each fit is `model.fit(x, y, epochs=2, validation_data=..., callbacks=[EarlyStopping])` on
NumPy arrays of 12 rows in batches of 4, the same model fitted again each time (as Keras's
early_stopping_test does, whose batches of 5 MirroredStrategy cannot split: Keras's symbolic
build averages the replicas' uneven shares). What a fit costs is then mostly fixed costs:
iterators, traces, callbacks.
Each strategy runs in a process of its own (the CPU split into `replicas + 1` logical devices);
the first fit (the traces) is not counted. For each strategy it prints the CPU and the wall time
per fit, and where the time goes, as shares of a profile of the counted fits (inclusive, so
they overlap):

- `making iterators`: the epoch's iterators, made by Keras's epoch loop for training and for
  validation (with a strategy, TensorFlow's distributed iterator and its MultiDeviceIterator,
  which traces functions for every device; without one, `iter(dataset)`);
- `tracing`: tracing `tf.function`s, wherever it happens (also inside the iterators).

    python -m benchmarks.fit_costs                     # none, dpkeras, mirrored; 2 replicas
    python -m benchmarks.fit_costs --fits=20 --replicas=3

Writes one JSON line per strategy to `--out`.
"""

import cProfile
import json
import os
import pstats
import resource
import subprocess
import sys
import time

from absl import app, flags

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

FLAGS = flags.FLAGS
flags.DEFINE_integer("fits", 8, "Fits counted per strategy (after one uncounted).")
flags.DEFINE_integer("replicas", 2, "Compute replicas of dpkeras and MirroredStrategy.")
flags.DEFINE_list("strategies", ["none", "dpkeras", "mirrored"], "Strategies compared.")
flags.DEFINE_string("out", "results/fit_costs.jsonl", "JSON lines written here.")
flags.DEFINE_string("child", None, "Internal: run one strategy in this process.")

# Where the CPU goes: inclusive times from a profile of the counted fits (they overlap: the
# traces TensorFlow's distributed iterators make are in both).
_MEASURES = {
    # Keras's epoch loop makes the epoch's iterator here and does nothing else but yield.
    "making iterators": ("keras/src/trainers/epoch_iterator.py", "_enumerate_iterator"),
    "tracing": (
        "tensorflow/python/eager/polymorphic_function/tracing_compilation.py",
        "trace_function",
    ),
}


def _inclusive(stats, file_end, function):
    """Seconds inside `function` of a file ending in `file_end`, outermost calls only."""
    keys = [k for k in stats.stats if k[0].endswith(file_end) and k[2] == function]
    total = 0.0
    for key in keys:
        _, _, _, _, callers = stats.stats[key]
        total += sum(c[3] for caller, c in callers.items() if caller not in keys)
    return total


def _child(name, fits, replicas):
    import dpkeras

    dpkeras.simulate_cpu_devices(replicas + 1)
    import contextlib

    import keras
    import numpy as np
    import tensorflow as tf

    devices = [f"/cpu:{i}" for i in range(1, replicas + 1)]
    strategy = {
        "none": lambda: None,
        "dpkeras": lambda: dpkeras.get_strategy(devices, "/cpu:0"),
        "mirrored": lambda: tf.distribute.MirroredStrategy(devices),
    }[name]()
    rng = np.random.default_rng(0)
    x, y = rng.random((12, 5)), rng.random((12, 1))
    x_val, y_val = rng.random((12, 5)), rng.random((12, 1))
    with strategy.scope() if strategy else contextlib.nullcontext():
        model = keras.Sequential([keras.layers.Dense(1, activation="relu") for _ in range(2)])
        model.compile(loss="mae", optimizer="adam", metrics=["mse"])

    def fit():
        model.fit(
            x,
            y,
            batch_size=4,
            epochs=2,
            validation_data=(x_val, y_val),
            callbacks=[keras.callbacks.EarlyStopping(patience=5, monitor="val_loss")],
            verbose=0,
        )

    fit()  # traces
    before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    for _ in range(fits):
        fit()
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(fits):
        fit()
    profile.disable()
    stats = pstats.Stats(profile)
    profiled = sum(v[2] for v in stats.stats.values())
    shares = {name: _inclusive(stats, *where) for name, where in _MEASURES.items()}
    return {
        "strategy": name,
        "replicas": replicas if strategy else 1,
        "fits": fits,
        "cpu_s_per_fit": cpu / fits,
        "wall_s_per_fit": wall / fits,
        "profile_shares": {k: v / profiled for k, v in shares.items()},
    }


def main(argv):
    del argv
    if FLAGS.child:
        print("RESULT " + json.dumps(_child(FLAGS.child, FLAGS.fits, FLAGS.replicas)))
        return
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    rows = []
    for name in FLAGS.strategies:
        proc = subprocess.run(
            [sys.executable, "-m", "benchmarks.fit_costs", f"--child={name}"]
            + [f"--fits={FLAGS.fits}", f"--replicas={FLAGS.replicas}"],
            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
            capture_output=True,
            text=True,
            env=env,
            timeout=1800,
        )
        if proc.returncode != 0:
            sys.exit(f"{name} failed:\n{proc.stderr[-3000:]}")
        line = next(li for li in proc.stdout.splitlines() if li.startswith("RESULT "))
        rows.append(json.loads(line[len("RESULT ") :]))
    os.makedirs(os.path.dirname(FLAGS.out) or ".", exist_ok=True)
    with open(FLAGS.out, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    base = next((r["cpu_s_per_fit"] for r in rows if r["strategy"] == "none"), None)
    buckets = list(rows[0]["profile_shares"])
    print(
        f"{'strategy':<10} {'replicas':>8} {'CPU/fit':>9} {'x none':>7} {'wall/fit':>9}  "
        + "  ".join(f"{b:>15}" for b in buckets)
    )
    for r in rows:
        ratio = f"{r['cpu_s_per_fit'] / base:.2f}" if base else "-"
        print(
            f"{r['strategy']:<10} {r['replicas']:>8} {r['cpu_s_per_fit']:>8.3f}s {ratio:>7} "
            f"{r['wall_s_per_fit']:>8.3f}s  "
            + "  ".join(f"{100 * r['profile_shares'][b]:>14.0f}%" for b in buckets)
        )


if __name__ == "__main__":
    app.run(main)
