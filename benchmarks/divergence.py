r"""Where a data-parallel run parts from one device's: the step, and the ReLU that did it.

N replicas on a global batch give one device's weights within float tolerance: each replica
sums its share of the batch's gradient and the shares are summed, in another order than one
device's single sum, so the two runs differ in the last bits (~1e-8 of float32). A ReLU's
derivative jumps at 0: when an example's pre-activation lies within that difference of 0, it
is on one side in one run and on the other in the other, its gradient through that unit
counts in one run only, and the runs jump apart by one example's contribution; later steps
carry that on. This benchmark finds such a step in the benchmark recommender
(`benchmarks/models.py`: two tables, `Dense(64, relu)`, `Dense(32, relu)`, a sigmoid; Adagrad),
trained as `benchmarks/cluster.py --peers` trains it (the same data, fits and seeds; K=1):

1. one device, recording after every step a summary of every weight (each table row's sum, the
   dense weights whole);
2. dpkeras on a loopback cluster (1 ps + `--workers` workers of one CPU each, every variable on
   the ps), comparing after every step with 1's summary; at the first step whose largest
   difference exceeds `--threshold` it saves its weights from the step before and stops;
3. one device again, up to the step before, saving its weights;

then the first dense layer's pre-activations of that step's batch under both weights: the
examples and units whose sign differs, and how close to 0 they were.

    python -m benchmarks.divergence                 # W=4, ~10 minutes here
    python -m benchmarks.divergence --workers=2 --steps=100
"""

import json
import os
import subprocess
import sys
import tempfile

import numpy as np
from absl import app, flags

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

FLAGS = flags.FLAGS
EVAL_EXAMPLES = 16384  # drawn with the training examples, as benchmarks/peer_client.py draws
flags.DEFINE_integer("workers", 4, "Workers of the loopback cluster (one CPU each).", lower_bound=1)
flags.DEFINE_integer("steps", 200, "Steps of each repeat's long fit, as benchmarks/cluster.py.")
flags.DEFINE_integer("repeats", 3, "Repeats (a short and a long fit each).", lower_bound=1)
flags.DEFINE_integer("batch", 256, "Global batch size.", lower_bound=1)
flags.DEFINE_float("size", 0.25, "Model size multiplier (see benchmarks/models.py).")
flags.DEFINE_float("threshold", 1e-6, "A step parts the runs when a weight differs by more.")
flags.DEFINE_string("out", "results/divergence.json", "Results written here (directory created).")

# One client program for the three runs: argv = mode, cluster spec (or ""), directory, stop.
_CLIENT = """
import contextlib, json, sys
import numpy as np
import keras, tensorflow as tf
from benchmarks import models, peer_client

MODE, SPEC, DIR, STOP = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
BATCH, STEPS, REPEATS, SIZE, THRESHOLD = {batch}, {steps}, {repeats}, {size}, {threshold}
plan = peer_client.data_plan(2, STEPS, REPEATS)
rows = (plan[-1][0] + plan[-1][1]) * BATCH
data = models.synthetic_data("recommender", rows + {eval_examples}, SIZE)  # as peer_client
strategy = None
if MODE == "cluster":
    import dpkeras
    strategy = dpkeras.get_strategy(cluster=json.loads(SPEC))
keras.utils.set_random_seed(1234)
spec = models.MODELS["recommender"]
with strategy.scope() if strategy else contextlib.nullcontext():
    model = models.build("recommender", SIZE)
    model.compile(optimizer=keras.optimizers.get(spec.optimizer), loss=spec.loss)
fit_data = peer_client.make_fit_data(dict(batch=BATCH, strategy="dpkeras"), tf, data)
summaries = np.load(DIR + "/one.npy") if MODE == "cluster" else None
trace, state = [], dict(before=None, parted=None, largest=[])


class Parted(Exception):
    pass


def summary(weights):
    return np.concatenate(
        [weights[0].sum(1), weights[1].sum(1)] + [w.ravel() for w in weights[2:]]
    )


class Trace(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        if state["before"] is None:  # the weights before the first step
            state["before"] = [np.asarray(w) for w in self.model.get_weights()]
            if MODE == "again" and STOP == 0:
                np.savez(DIR + "/one-before.npz", *state["before"])
                raise Parted

    def on_train_batch_end(self, batch, logs=None):
        step = len(trace) + len(state["largest"])
        weights = [np.asarray(w) for w in self.model.get_weights()]
        if MODE == "one":
            trace.append(summary(weights))
        elif MODE == "cluster":
            largest = float(np.abs(summary(weights) - summaries[step]).max())
            state["largest"].append(largest)
            if largest > THRESHOLD:
                state["parted"] = step
                np.savez(DIR + "/cluster-before.npz", *state["before"])
                raise Parted
            state["before"] = weights
        if MODE == "again" and step + 1 == STOP:
            np.savez(DIR + "/one-before.npz", *weights)
            raise Parted
        if MODE == "again":
            state["largest"].append(0.0)


try:
    for first, batches in plan:
        model.fit(**fit_data(first, batches), epochs=1, verbose=0, callbacks=[Trace()])
except Parted:
    pass
if MODE == "one":
    np.save(DIR + "/one.npy", np.stack(trace))
print(json.dumps(dict(parted=state["parted"], largest=state["largest"])))
"""


def _run(mode, spec, directory, stop=0, env=None):
    code = _CLIENT.format(
        batch=FLAGS.batch,
        steps=FLAGS.steps,
        repeats=FLAGS.repeats,
        size=FLAGS.size,
        threshold=FLAGS.threshold,
        eval_examples=EVAL_EXAMPLES,
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(env or os.environ, PYTHONPATH=root, TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run(
        [sys.executable, "-c", code, mode, json.dumps(spec) if spec else "", directory, str(stop)],
        capture_output=True,
        text=True,
        env=env,
        timeout=3600,
    )
    if done.returncode:
        raise RuntimeError(f"the {mode} run failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def batch_ids(step):
    """`(items, users)`: the ids of global batch `step` of the run's data."""
    from benchmarks import models, peer_client

    plan = peer_client.data_plan(2, FLAGS.steps, FLAGS.repeats)
    rows = (plan[-1][0] + plan[-1][1]) * FLAGS.batch
    x, _ = models.synthetic_data("recommender", rows + EVAL_EXAMPLES, FLAGS.size)
    part = slice(step * FLAGS.batch, (step + 1) * FLAGS.batch)
    return x["item"][part].ravel(), x["user"][part].ravel()


def flips(items, users, one, cluster):
    """The first dense layer's pre-activations of the examples `(items, users)` (id arrays)
    under the weights `one` and `cluster` (lists of arrays in the recommender's order: item
    table, user table, first Dense kernel and bias, ...): `[(example, unit, one's, cluster's)]`
    for each whose sign differs."""

    def pre_activations(w):
        return np.concatenate([w[0][items], w[1][users]], 1) @ w[2] + w[3]

    a, b = pre_activations(one), pre_activations(cluster)
    return [
        (int(e), int(u), float(a[e, u]), float(b[e, u]))
        for e, u in np.argwhere(np.sign(a) != np.sign(b))
    ]


def _arrays(path):
    with np.load(path) as f:
        return [f[f"arr_{i}"] for i in range(len(f.files))]


def measure():
    from dpkeras.testing import LocalCluster, server_env

    with tempfile.TemporaryDirectory(prefix="dpkeras-divergence-") as directory:
        _run("one", None, directory)
        with LocalCluster(ps=1, workers=FLAGS.workers, cpus=1) as local:
            cluster = _run("cluster", local.spec, directory, env=server_env())
        step = cluster["parted"]
        record = dict(
            workers=FLAGS.workers,
            batch=FLAGS.batch,
            steps=len(cluster["largest"]),
            threshold=FLAGS.threshold,
            parted_at=step,
            largest_before=max(cluster["largest"][:-1] or [0.0]),
            largest_at=cluster["largest"][-1] if step is not None else None,
            flips=[],
        )
        if step is not None:
            _run("again", None, directory, stop=step)
            record["flips"] = flips(
                *batch_ids(step),
                _arrays(directory + "/one-before.npz"),
                _arrays(directory + "/cluster-before.npz"),
            )
    return record


def report(record):
    """The record as lines a reader can check."""
    lines = [
        f"1 ps + {record['workers']} workers against one device, global batch "
        f"{record['batch']}, K=1:"
    ]
    if record["parted_at"] is None:
        lines.append(
            f"  no step parted them by more than {record['threshold']:g} in "
            f"{record['steps']} steps (largest {record['largest_before']:.2g})"
        )
        return lines
    lines.append(
        f"  steps before {record['parted_at']} within {record['largest_before']:.2g}; step "
        f"{record['parted_at']} parts them by {record['largest_at']:.2g}"
    )
    for example, unit, one, cluster in record["flips"]:
        lines.append(
            f"  example {example} of that batch, first Dense unit {unit}: pre-activation "
            f"{one:.3g} on one device, {cluster:.3g} under dpkeras (ReLU on one side, off on "
            f"the other)"
        )
    if not record["flips"]:
        lines.append("  no pre-activation of the first Dense layer changed sign")
    return lines


def main(argv):
    del argv
    record = measure()
    print("\n".join(report(record)))
    os.makedirs(os.path.dirname(FLAGS.out) or ".", exist_ok=True)
    with open(FLAGS.out, "w") as f:
        json.dump(record, f, indent=1)


if __name__ == "__main__":
    app.run(main)
