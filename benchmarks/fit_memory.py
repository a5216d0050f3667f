r"""Memory per fit in a long-lived client: many fresh small models, each fitted and dropped.

A hyper-parameter search runs many fits in one process. Each fit here builds a fresh model (an
Embedding, a Dense, a BatchNormalization, an AUC metric), compiles it, fits it for 2 short
epochs with validation data and EarlyStopping, evaluates it, predicts with it and drops it.
Resident memory (VmRSS) is read after every fit, in the client and, on a cluster, in every task;
the growth per fit is the slope between fit `--first` and the last one (the first fits trace
and warm caches).

Modes, each in a process of its own:

- `none`: Keras alone, no strategy (the baseline);
- `machine`: dpkeras on one machine, the CPU split into `replicas + 1` logical devices;
- `cluster`: dpkeras on a local cluster of `dpkeras serve` tasks (`--ps` ps and `--workers`
  workers of `--cpus` CPUs each), the client in a process of its own;
- `tf`: TensorFlow alone on such a cluster, no strategy: per fit a fresh multi-device
  `tf.function` shaped as a step, called and dropped (what TensorFlow itself leaves on the
  tasks per fresh function).

`--vocabulary` sets the Embedding's rows: growth on the ps that does not follow it is not the
variables.

    python -m benchmarks.fit_memory                                # none, machine, cluster
    python -m benchmarks.fit_memory --fits=30 --first=5 --modes=none,machine,cluster,tf

Each row also counts what a fit could leave behind in the client: the functions registered in
its TensorFlow context and live Python objects (after `gc.collect()`). Writes one JSON line per
mode to `--out`.
"""

import gc
import json
import os
import subprocess
import sys

from absl import app, flags

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

FLAGS = flags.FLAGS
flags.DEFINE_integer("fits", 12, "Fits in all, per mode.")
flags.DEFINE_integer("first", 4, "Growth is measured from after this fit to after the last.")
flags.DEFINE_integer("replicas", 2, "Compute replicas of the one-machine mode.")
flags.DEFINE_integer("ps", 1, "ps tasks of the cluster mode.")
flags.DEFINE_integer("workers", 2, "Worker tasks of the cluster mode.")
flags.DEFINE_integer("cpus", 1, "CPUs of each task of the cluster mode.")
flags.DEFINE_list("modes", ["none", "machine", "cluster"], "Modes measured.")
flags.DEFINE_string("out", "results/fit_memory.jsonl", "JSON lines written here.")
flags.DEFINE_string("child", None, "Internal: run one mode in this process.")
flags.DEFINE_string("spec", None, "Internal: the cluster spec (JSON) of the cluster mode.")
flags.DEFINE_string("pids", None, "Internal: the tasks' pids (JSON) of the cluster mode.")
flags.DEFINE_integer(
    "vocabulary", 100, "Rows of the Embedding (a larger one tells whether variables are freed)."
)
flags.DEFINE_bool("trace", False, "Also print the top Python allocations that grew (slow).")


def resident_mib(pid="self"):
    """A process's resident memory (VmRSS) in MiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS in /proc/{pid}/status")


def one_fit(keras, np, strategy, data, vocabulary=100):
    """Builds, compiles, fits, evaluates and predicts with a fresh model; drops it."""
    import contextlib

    x, y, x_val, y_val = data
    with strategy.scope() if strategy else contextlib.nullcontext():
        model = keras.Sequential(
            [
                keras.Input((8,), dtype="int32"),
                keras.layers.Embedding(vocabulary, 8),
                keras.layers.GlobalAveragePooling1D(),
                keras.layers.Dense(16, activation="relu"),
                keras.layers.BatchNormalization(),
                keras.layers.Dense(1, activation="sigmoid"),
            ]
        )
        model.compile(optimizer="adam", loss="binary_crossentropy", metrics=[keras.metrics.AUC()])
    model.fit(
        x,
        y,
        batch_size=16,
        epochs=2,
        validation_data=(x_val, y_val),
        callbacks=[keras.callbacks.EarlyStopping(patience=1, monitor="val_loss")],
        verbose=0,
    )
    model.evaluate(x_val, y_val, batch_size=16, verbose=0)
    model.predict(x_val, batch_size=16, verbose=0)
    del model
    gc.collect()


def tf_fit(tf, workers):
    """TensorFlow alone: a fresh function with a step's shape (a variable on the ps read by
    each worker, each worker's result summed on the ps), called 5 times and dropped."""
    with tf.device("/job:ps/task:0/device:CPU:0"):
        v = tf.Variable(tf.ones((8, 8)) * 0.01)

    @tf.function
    def step(x):
        parts = []
        for w in range(workers):
            with tf.device(f"/job:worker/task:{w}/device:CPU:0"):
                y = x
                for _ in range(100):
                    y = tf.tanh(tf.matmul(y, v))
                parts.append(tf.reduce_sum(y, axis=0))
        with tf.device("/job:ps/task:0/device:CPU:0"):
            v.assign_add(tf.linalg.diag(tf.add_n(parts)) * 1e-6)

    for _ in range(5):
        step(tf.ones((4, 8)))


def _child(mode, fits, first, replicas, spec, pids, trace, vocabulary):
    import dpkeras

    if mode == "machine":
        dpkeras.simulate_cpu_devices(replicas + 1)
    import keras
    import numpy as np
    import tensorflow as tf

    from dpkeras import _tf_internals

    strategy = {
        "none": lambda: None,
        "machine": lambda: dpkeras.get_strategy(
            [f"/cpu:{i}" for i in range(1, replicas + 1)], "/cpu:0"
        ),
        "cluster": lambda: dpkeras.get_strategy(cluster=spec),
        "tf": lambda: tf.config.experimental_connect_to_cluster(tf.train.ClusterSpec(spec)),
    }[mode]()
    rng = np.random.default_rng(0)
    data = (
        rng.integers(0, 100, (64, 8)).astype("int32"),
        rng.integers(0, 2, (64, 1)).astype("float32"),
        rng.integers(0, 100, (32, 8)).astype("int32"),
        rng.integers(0, 2, (32, 1)).astype("float32"),
    )
    tasks = dict(pids or {})
    records = []
    snapshot = None
    for fit in range(1, fits + 1):
        if mode == "tf":
            tf_fit(tf, len(spec["worker"]))
        else:
            one_fit(keras, np, strategy, data, vocabulary)
        gc.collect()
        record = {
            "fit": fit,
            "client_mib": resident_mib(),
            **{f"{task}_mib": resident_mib(pid) for task, pid in tasks.items()},
            "functions": len(_tf_internals.function_names()),
            "objects": len(gc.get_objects()),
        }
        records.append(record)
        print("FIT " + json.dumps(record), file=sys.stderr, flush=True)
        if trace and fit == first:
            import tracemalloc

            tracemalloc.start(12)
            snapshot = tracemalloc.take_snapshot()
            types_before = _type_counts()
    if trace and snapshot is not None:
        _print_growth(snapshot, types_before, fits - first)
    return {"mode": mode, "fits": fits, "first": first, "records": records}


def _type_counts():
    counts = {}
    for obj in gc.get_objects():
        kind = type(obj)
        name = f"{getattr(kind, '__module__', '?')}.{getattr(kind, '__qualname__', kind)}"
        counts[name] = counts.get(name, 0) + 1
    return counts


def _print_growth(snapshot, types_before, fits):
    import tracemalloc

    after = tracemalloc.take_snapshot()
    print(f"--- Python allocations grown over {fits} fits (top 25, by traceback)", file=sys.stderr)
    for stat in after.compare_to(snapshot, "traceback")[:25]:
        print(f"{stat.size_diff / 1024:9.1f} KiB {stat.count_diff:+7d}", file=sys.stderr)
        for line in stat.traceback.format()[-12:]:
            print("      " + line, file=sys.stderr)
    types_after = _type_counts()
    grown = sorted(
        ((types_after.get(k, 0) - types_before.get(k, 0), k) for k in types_after), reverse=True
    )
    print(f"--- live objects grown over {fits} fits, by type (top 40)", file=sys.stderr)
    for diff, name in grown[:40]:
        print(f"{diff:+8d} {name}", file=sys.stderr)


def per_fit(records, first, key):
    """Growth of `key` per fit from after fit `first` to after the last."""
    start = next(r for r in records if r["fit"] == first)
    last = records[-1]
    return (last[key] - start[key]) / (last["fit"] - first)


def _run_child(mode, env, extra=()):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.fit_memory", f"--child={mode}"]
        + [f"--fits={FLAGS.fits}", f"--first={FLAGS.first}", f"--replicas={FLAGS.replicas}"]
        + [f"--vocabulary={FLAGS.vocabulary}"]
        + (["--trace"] if FLAGS.trace else [])
        + list(extra),
        cwd=root,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        timeout=3600,
    )
    if proc.returncode != 0:
        sys.exit(f"{mode} failed (exit status {proc.returncode})")
    line = next(li for li in proc.stdout.splitlines() if li.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])


def main(argv):
    del argv
    if FLAGS.child:
        spec = json.loads(FLAGS.spec) if FLAGS.spec else None
        pids = json.loads(FLAGS.pids) if FLAGS.pids else None
        result = _child(
            FLAGS.child,
            FLAGS.fits,
            FLAGS.first,
            FLAGS.replicas,
            spec,
            pids,
            FLAGS.trace,
            FLAGS.vocabulary,
        )
        print("RESULT " + json.dumps(result))
        return
    if not 1 <= FLAGS.first < FLAGS.fits:
        raise app.UsageError("--first must be at least 1 and less than --fits.")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    rows = []
    for mode in FLAGS.modes:
        if mode not in ("cluster", "tf"):
            rows.append(_run_child(mode, env))
            continue
        from dpkeras.testing import LocalCluster, server_env

        cluster = LocalCluster(ps=FLAGS.ps, workers=FLAGS.workers, cpus=FLAGS.cpus)
        cluster.start()
        try:
            extra = [f"--spec={json.dumps(cluster.spec)}", f"--pids={json.dumps(cluster.pids())}"]
            rows.append(_run_child(mode, server_env(), extra))
        finally:
            cluster.stop()
    os.makedirs(os.path.dirname(FLAGS.out) or ".", exist_ok=True)
    with open(FLAGS.out, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    print(f"MiB per fit, from after fit {FLAGS.first} to after fit {FLAGS.fits}:")
    print(f"{'mode':<8} {'process':<10} {'MiB/fit':>8} {'after first':>12} {'after last':>11}")
    for row in rows:
        records = row["records"]
        keys = [k for k in records[0] if k.endswith("_mib")]
        for key in keys:
            start = next(r for r in records if r["fit"] == row["first"])[key]
            print(
                f"{row['mode']:<8} {key[: -len('_mib')]:<10} "
                f"{per_fit(records, row['first'], key):>8.2f} {start:>12.1f} "
                f"{records[-1][key]:>11.1f}"
            )
        print(
            f"{row['mode']:<8} {'(counts)':<10} functions/fit "
            f"{per_fit(records, row['first'], 'functions'):.1f}, objects/fit "
            f"{per_fit(records, row['first'], 'objects'):.0f}"
        )


if __name__ == "__main__":
    app.run(main)
