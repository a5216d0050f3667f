r"""dpkeras on a local cluster, beside one process and CentralStorageStrategy on the same cluster.

Starts real `dpkeras serve` processes on loopback (PS parameter servers and WORKERS workers,
`--cpus` logical CPU devices each), then runs each strategy in its own client process:

- `one_process`: no cluster, one device (the baseline of the ratios and of the loss check);
- `dpkeras`: `dpkeras.scope(cluster=...)`: every worker CPU computes, variables on the ps tasks;
- `central_storage`: TF's CentralStorageStrategy given the same worker devices and ps:0.

Per strategy: steps/s (median over repeats), the client's CPU seconds per step, the bytes per
step crossing between processes (client, each ps, each worker; counted from the partitioned
step graph, `dpkeras.train_step_transfers`) and the loss after the check steps.

    python -m benchmarks.cluster                       # --cluster=2,2 --cpus=2, recommender
    python -m benchmarks.cluster --cluster=1,2 --models=mlp,recommender

Writes `<out>/cluster.{jsonl,md}`. On one machine the "network" is loopback and every process
shares the cores: the numbers show traffic and client overhead, not a distributed speed-up.
"""

import json
import os
import subprocess
import sys
import textwrap

from absl import app, flags

if __package__ in (None, ""):  # run as `python benchmarks/cluster.py`
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.models import MODELS
from dpkeras.testing import LocalCluster, server_env

FLAGS = flags.FLAGS

flags.DEFINE_list("cluster", ["2", "2"], "PS,WORKERS: parameter servers and workers to start.")
flags.DEFINE_integer(
    "cpus", 2, "Logical CPU devices per server (a worker's replicas).", lower_bound=1
)
flags.DEFINE_list("models", ["recommender", "mlp"], f"Models, of: {', '.join(MODELS)}.")
flags.DEFINE_list(
    "strategies",
    ["one_process", "dpkeras", "central_storage"],
    "Strategies to run, of: one_process, dpkeras, central_storage.",
)
flags.DEFINE_integer("steps", 20, "Timed steps per repeat.", lower_bound=1)
flags.DEFINE_integer("repeats", 3, "Timed repeats; steps/s is their median.", lower_bound=1)
flags.DEFINE_integer("check_steps", 3, "Untimed steps first (tracing, loss check).", lower_bound=1)
flags.DEFINE_float("size", 0.25, "Model size multiplier (see benchmarks/models.py).")
flags.DEFINE_integer(
    "pair_timeout", 600, "Seconds before a client is killed as failed.", lower_bound=1
)
flags.DEFINE_string("out", "results", "Directory for cluster.{jsonl,md}.")

STRATEGIES = ("one_process", "dpkeras", "central_storage")

# The client: builds the model under the strategy, counts one step's transfers between
# processes, then times fits. Prints one JSON line.
_CLIENT = """
import json, os, statistics, sys, time
import numpy as np
sys.path.insert(0, {root!r})
import dpkeras, keras, tensorflow as tf
from benchmarks import models

spec, name, model_name = json.loads({spec!r}), {strategy!r}, {model!r}
size, steps, repeats, check = {size!r}, {steps!r}, {repeats!r}, {check!r}
model_spec = models.MODELS[model_name]
workers = [f"/job:worker/replica:0/task:{{t}}/device:CPU:{{i}}"
           for t in range(len(spec["worker"])) for i in range({cpus!r})]
if name == "one_process":
    strategy = None
elif name == "dpkeras":
    strategy = dpkeras.get_strategy(cluster=spec)
else:
    dpkeras.cluster.connect(dpkeras.cluster.resolve_cluster(spec))
    strategy = tf.distribute.experimental.CentralStorageStrategy(
        workers, parameter_device="/job:ps/replica:0/task:0/device:CPU:0")
replicas = 1 if strategy is None else strategy.num_replicas_in_sync
batch = model_spec.batch_size // 24 * 24 or 24  # divisible by 1, 2, 3, 4, 6 and 8
keras.utils.set_random_seed(1234)


def build():
    model = models.build(model_name, size)
    model.compile(optimizer=keras.optimizers.get(model_spec.optimizer), loss=model_spec.loss,
                  metrics=[model_spec.metric])
    return model


if strategy is None:
    model = build()
else:
    with strategy.scope():
        model = build()
x, y = models.synthetic_data(model_name, batch * (steps + check), size)
first = tf.nest.map_structure(lambda a: a[:batch], x), y[:batch]
crossing = {{}}
try:
    if strategy is None:  # nothing crosses between processes: train the same one step
        model.fit(first[0], first[1], batch_size=batch, epochs=1, shuffle=False, verbose=0)
        raise StopIteration
    report = dpkeras.train_step_transfers(model, first[0], first[1], batch_size=batch)
    for t in report.transfers:
        a, b = (d.rsplit("/", 1)[0] if d.startswith("/job:") else "client"
                for d in (t.source, t.destination))
        if a != b:
            crossing[f"{{a}} -> {{b}}"] = crossing.get(f"{{a}} -> {{b}}", 0) + t.bytes
except StopIteration:
    pass
except Exception as e:  # counting is best effort; the timing still runs
    crossing = {{"error": f"{{type(e).__name__}}: {{str(e)[:200]}}"}}
head = tf.nest.map_structure(lambda a: a[:batch * check], x)
loss = model.fit(head, y[:batch * check], batch_size=batch, epochs=1, shuffle=False,
                 verbose=0).history["loss"][-1]
seconds, cpu = [], []
for _ in range(repeats):
    c0, t0 = time.process_time(), time.perf_counter()
    model.fit(x, y, batch_size=batch, epochs=1, steps_per_epoch=steps, shuffle=False,
              verbose=0)
    seconds.append(time.perf_counter() - t0)
    cpu.append(time.process_time() - c0)
median = statistics.median(seconds)
print(json.dumps({{"strategy": name, "model": model_name, "replicas": replicas,
                  "batch_size": batch, "steps_per_s": steps / median,
                  "spread": (max(seconds) - min(seconds)) / median,
                  "client_cpu_s_per_step": statistics.median(cpu) / steps,
                  "loss": float(loss), "crossing_bytes_per_step": crossing}}))
"""


def run_client(spec, strategy, model, root):
    """Runs one strategy/model pair in a fresh client process; returns its record."""
    code = _CLIENT.format(
        root=root,
        spec=json.dumps(spec),
        strategy=strategy,
        model=model,
        size=FLAGS.size,
        steps=FLAGS.steps,
        repeats=FLAGS.repeats,
        check=FLAGS.check_steps,
        cpus=FLAGS.cpus,
    )
    try:
        proc = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code)],
            capture_output=True,
            text=True,
            env=server_env(),
            timeout=FLAGS.pair_timeout,
        )
    except subprocess.TimeoutExpired:
        return {"strategy": strategy, "model": model, "error": "timed out"}
    if proc.returncode != 0:
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        return {
            "strategy": strategy,
            "model": model,
            "error": (lines[-1] if lines else f"exit {proc.returncode}")[:300],
        }
    return json.loads(proc.stdout.strip().splitlines()[-1])


def markdown(records, ps, workers):
    """The table of BENCHMARKS.md's cluster section."""
    lines = [
        f"Local cluster: {ps} ps + {workers} workers x {FLAGS.cpus} CPU devices, size "
        f"{FLAGS.size:g}, {FLAGS.steps} steps x {FLAGS.repeats} repeats.",
        "",
        "| model | strategy | replicas | steps/s | vs one process | client CPU s/step "
        "| bytes/step between processes | loss |",
        "|---|---|---|---|---|---|---|---|",
    ]
    base = {
        r["model"]: r for r in records if r.get("strategy") == "one_process" and "error" not in r
    }
    for r in records:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['strategy']} | | failed: {r['error']} | | | | |")
            continue
        crossing = r["crossing_bytes_per_step"]
        total = (
            "n/a (not countable)"
            if "error" in crossing
            else f"{sum(v for v in crossing.values()):,}"
        )
        ratio = (
            f"{r['steps_per_s'] / base[r['model']]['steps_per_s']:.2f}x"
            if r["model"] in base
            else ""
        )
        lines.append(
            f"| {r['model']} | {r['strategy']} | {r['replicas']} | "
            f"{r['steps_per_s']:.2f} | {ratio} | {r['client_cpu_s_per_step']:.4f} | "
            f"{total} | {r['loss']:.4f} |"
        )
    lines += ["", "Bytes per step by direction (from the partitioned step graph):", ""]
    for r in records:
        if "error" not in r and r["strategy"] != "one_process":
            lines.append(
                f"- {r['model']} / {r['strategy']}: "
                + ", ".join(
                    f"{k}: {v:,}" if isinstance(v, int) else f"{k}: {v}"
                    for k, v in sorted(r["crossing_bytes_per_step"].items())
                )
            )
    return "\n".join(lines) + "\n"


def main(argv):
    del argv
    if len(FLAGS.cluster) != 2 or not all(n.isdigit() for n in FLAGS.cluster):
        raise app.UsageError(
            f"--cluster must be PS,WORKERS (two counts). Received: {','.join(FLAGS.cluster)}"
        )
    ps, workers = (int(n) for n in FLAGS.cluster)
    if workers < 1:
        raise app.UsageError("--cluster needs at least one worker.")
    unknown = sorted(set(FLAGS.strategies) - set(STRATEGIES))
    if unknown or sorted(set(FLAGS.models) - set(MODELS)):
        raise app.UsageError(
            f"Unknown strategies or models: {unknown or FLAGS.models}. "
            f"Strategies: {', '.join(STRATEGIES)}; models: {', '.join(MODELS)}"
        )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    os.makedirs(FLAGS.out, exist_ok=True)
    records = []
    with LocalCluster(ps=ps, workers=workers, cpus=FLAGS.cpus) as local:
        for model in FLAGS.models:
            for strategy in FLAGS.strategies:
                record = run_client(local.spec, strategy, model, root)
                print(json.dumps(record), flush=True)
                records.append(record)
    with open(os.path.join(FLAGS.out, "cluster.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    table = markdown(records, ps, workers)
    with open(os.path.join(FLAGS.out, "cluster.md"), "w") as f:
        f.write(table)
    print(table)


if __name__ == "__main__":
    app.run(main)
