r"""What an unseeded pipeline costs per epoch on a cluster, against a seeded one.

On a cluster, a pipeline whose random ops have no seed (Keras's `shuffle=True` on NumPy arrays
without `keras.utils.set_random_seed`) gets the same fresh seeds on every worker each epoch:
its copies on the workers are rebuilt each epoch, so the arrays travel to each worker once per
epoch instead of once per `fit` (`dpkeras._input.seeds`, docs/cluster.md). This measures that
cost: on a loopback cluster of 1 ps + `--workers` one-CPU workers, a small model fitted for
`--epochs` short epochs on arrays of `--rows` x 32 float32, in turns seeded and unseeded (a
client process each), the client's CPU and the wall time per epoch.

    python -m benchmarks.seeds                        # 200000 rows (25.6 MB), 2 workers
    python -m benchmarks.seeds --rows=20000 --turns=3

Prints one line per client and writes them as JSON lines to `--out`.
"""

import json
import os
import sys

from absl import app, flags

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

FLAGS = flags.FLAGS
flags.DEFINE_integer("rows", 200_000, "Rows of the arrays (32 float32 features each).")
flags.DEFINE_integer("workers", 2, "Worker tasks of one CPU each (and one ps).")
flags.DEFINE_integer("epochs", 10, "Epochs counted per client (after one uncounted).")
flags.DEFINE_integer("steps", 5, "Steps per epoch (batches of 256).")
flags.DEFINE_integer("turns", 2, "Seeded and unseeded clients, in turns.")
flags.DEFINE_string("out", "results/seeds.jsonl", "JSON lines written here.")

_CLIENT = """
import json, resource, time
import numpy as np, keras, dpkeras
SPEC, SEEDED, ROWS, EPOCHS, STEPS = {args}
if SEEDED:
    keras.utils.set_random_seed(1)
with dpkeras.scope(cluster=SPEC):
    model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(16), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
rng = np.random.default_rng(0)
x = rng.random((ROWS, 32), dtype="float32")
y = rng.random(ROWS, dtype="float32")
model.fit(x, y, batch_size=256, epochs=1, steps_per_epoch=STEPS, verbose=0)  # traces

def cpu():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime

wall, spent = time.perf_counter(), cpu()
model.fit(x, y, batch_size=256, epochs=EPOCHS, steps_per_epoch=STEPS, verbose=0)
print(json.dumps({{
    "seeded": SEEDED, "rows": ROWS, "workers": len(SPEC["worker"]),
    "client_cpu_ms_per_epoch": (cpu() - spent) * 1000 / EPOCHS,
    "wall_ms_per_epoch": (time.perf_counter() - wall) * 1000 / EPOCHS,
}}))
"""


def main(argv):
    del argv
    from dpkeras.testing import LocalCluster, run_python

    records = []
    with LocalCluster(ps=1, workers=FLAGS.workers, cpus=1) as cluster:
        for _ in range(FLAGS.turns):
            for seeded in (True, False):
                args = (cluster.spec, seeded, FLAGS.rows, FLAGS.epochs, FLAGS.steps)
                out = run_python(_CLIENT.format(args=repr(args)))
                record = json.loads(out.strip().splitlines()[-1])
                print(
                    f"{'seeded' if seeded else 'unseeded':>8}: client CPU "
                    f"{record['client_cpu_ms_per_epoch']:.1f} ms/epoch, wall "
                    f"{record['wall_ms_per_epoch']:.1f} ms/epoch",
                    flush=True,
                )
                records.append(record)
    os.makedirs(os.path.dirname(FLAGS.out) or ".", exist_ok=True)
    with open(FLAGS.out, "a") as f:
        for record in records:
            f.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    app.run(main)
