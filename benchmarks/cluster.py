r"""dpkeras on a local cluster as workers are added, beside CentralStorageStrategy.

For each worker count W, starts real `dpkeras serve` processes on loopback (PS parameter
servers and W workers, `--cpus` logical CPU devices each) and runs each strategy and each
`steps_per_execution` K in its own client process:

- `dpkeras`: `dpkeras.scope(cluster=...)`: every worker CPU computes, variables on the ps;
- `central_storage`: TensorFlow's CentralStorageStrategy given the same devices and ps:0;
- `one_process`: no cluster, one device (the loss check).

Measured per step, after a warm-up (tracing) and over `--steps` steps of one `fit`:
steps/s; the client's CPU (getrusage); each task's CPU (/proc); the bytes each process sends
and receives (the kernel's TCP counters, `dpkeras.testing.TrafficMeter`: rows, gRPC and RPC
overhead included); for dpkeras, the step graph's static count beside it
(`dpkeras.train_step_transfers`, which names the tensors of run-time size it cannot count).
With `--input_rounds` > 0, the input's CPU: the CPU of each process (client and tasks) for an
epoch over a dataset with an expensive per-element map, less the same with a trivial map,
shown as the workers' total and every process's (the client and ps also spend CPU for as long
as the slower epoch lasts: polling and health probes, not input work).

    python -m benchmarks.cluster                              # --workers=1,2,4,8
    python -m benchmarks.cluster --workers=2 --k=1,10 --strategies=dpkeras

Writes `<out>/cluster.{jsonl,md,png}`. On one machine the "network" is loopback and every
process shares the cores: the numbers show costs and how they grow, not a speed-up.
"""

import json
import os
import statistics
import subprocess
import sys
import textwrap

from absl import app, flags

if __package__ in (None, ""):  # run as `python benchmarks/cluster.py`
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.models import MODELS
from dpkeras.testing import LocalCluster, server_env

FLAGS = flags.FLAGS

flags.DEFINE_list("workers", ["1", "2", "4", "8"], "Worker counts to run, one cluster each.")
flags.DEFINE_integer("ps", 1, "Parameter servers.", lower_bound=1)
flags.DEFINE_integer(
    "cpus", 1, "Logical CPU devices per task (a worker's replicas).", lower_bound=1
)
flags.DEFINE_list("models", ["recommender"], f"Models, of: {', '.join(MODELS)}.")
flags.DEFINE_list(
    "strategies",
    ["dpkeras", "central_storage"],
    "Strategies, of: dpkeras, central_storage, one_process.",
)
flags.DEFINE_list("k", ["1", "10"], "steps_per_execution values.")
flags.DEFINE_integer("steps", 60, "Measured steps (a multiple of every K).", lower_bound=1)
flags.DEFINE_float("size", 0.25, "Model size multiplier (see benchmarks/models.py).")
flags.DEFINE_integer("batch", 96, "Global batch size.", lower_bound=1)
flags.DEFINE_integer(
    "input_rounds", 20, "Work per element of the input-CPU dataset (0: do not measure).", 0
)
flags.DEFINE_integer("client_timeout", 900, "Seconds before a client is killed.", lower_bound=1)
flags.DEFINE_string("out", "results", "Directory for cluster.{jsonl,md,png}.")

STRATEGIES = ("dpkeras", "central_storage", "one_process")

# The client: one strategy, one K. Prints one JSON line.
_CLIENT = r"""
import json, os, resource, sys, time
import numpy as np
sys.path.insert(0, {root!r})
import dpkeras, keras, tensorflow as tf
from benchmarks import models
from dpkeras.testing import TrafficMeter

spec, pids = json.loads({spec!r}), json.loads({pids!r})
name, model_name, k = {strategy!r}, {model!r}, {k!r}
size, steps, batch, rounds, cpus = {size!r}, {steps!r}, {batch!r}, {rounds!r}, {cpus!r}
model_spec = models.MODELS[model_name]
workers = [f"/job:worker/replica:0/task:{{t}}/device:CPU:{{i}}"
           for t in range(len(spec["worker"])) for i in range(cpus)]
if name == "one_process":
    strategy = None
elif name == "dpkeras":
    strategy = dpkeras.get_strategy(cluster=spec)
else:
    dpkeras.cluster.connect(spec)
    strategy = tf.distribute.experimental.CentralStorageStrategy(
        workers, parameter_device="/job:ps/replica:0/task:0/device:CPU:0")
keras.utils.set_random_seed(1234)


def cpu_seconds(pid):
    with open(f"/proc/{{pid}}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def build():
    model = models.build(model_name, size)
    model.compile(optimizer=keras.optimizers.get(model_spec.optimizer), loss=model_spec.loss,
                  steps_per_execution=k)
    return model


def under(strategy, fn):
    if strategy is None:
        return fn()
    with strategy.scope():
        return fn()


model = under(strategy, build)
x, y = models.synthetic_data(model_name, batch * (steps + 2 * k), size)
dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch).repeat()
record = {{"strategy": name, "model": model_name, "k": k, "workers": len(spec["worker"]),
          "replicas": 1 if strategy is None else strategy.num_replicas_in_sync}}


class Measure(keras.callbacks.Callback):
    # From the end of the warm-up executions to the end of the fit.
    def on_train_batch_end(self, batch, logs=None):
        if batch == 2 * k - 1:
            self.meter = TrafficMeter(dict(pids, client=os.getpid())).start()
            self.cpu = {{t: cpu_seconds(p) for t, p in pids.items()}}
            self.client = resource.getrusage(resource.RUSAGE_SELF)
            self.t0 = time.perf_counter()

    def on_train_end(self, logs=None):
        self.seconds = time.perf_counter() - self.t0
        end = resource.getrusage(resource.RUSAGE_SELF)
        self.client = (end.ru_utime + end.ru_stime
                       - self.client.ru_utime - self.client.ru_stime)
        self.cpu = {{t: cpu_seconds(p) - c for t, p, c in
                    ((t, pids[t], c) for t, c in self.cpu.items())}}
        self.meter.stop()


model.fit(dataset, steps_per_epoch=2 * k, epochs=1, verbose=0)  # traces
measure = Measure()
history = model.fit(dataset, steps_per_epoch=steps + 2 * k, epochs=1, verbose=0,
                    callbacks=[measure])
record.update(
    loss=float(history.history["loss"][-1]),
    steps_per_s=steps / measure.seconds,
    client_cpu_ms_per_step=1000 * measure.client / steps,
    task_cpu_ms_per_step={{t: 1000 * c / steps for t, c in measure.cpu.items()}},
    wire_bytes_per_step={{t: [round(v.sent / steps), round(v.received / steps)]
                          for t, v in measure.meter.traffic.items()}},
)
if name == "dpkeras":
    first = tf.nest.map_structure(lambda a: a[:batch], x), y[:batch]
    report = dpkeras.train_step_transfers(model, first[0], first[1], batch_size=batch)
    static = {{}}
    for t in report.transfers:
        a, b = (d.rsplit("/", 1)[0] if d.startswith("/job:") else "client"
                for d in (t.source, t.destination))
        if a != b:
            static[f"{{a}} -> {{b}}"] = static.get(f"{{a}} -> {{b}}", 0) + t.bytes
    record["static_bytes_per_step"] = static
    record["static_unknown_size"] = sorted({{f"{{t.source}} -> {{t.destination}}: {{t.tensor}}"
                                            for t in report.sized_at_run_time}})[:10]
if rounds and strategy is not None:
    def items(work):
        def element(i):
            v = tf.random.stateless_normal([64, 64], seed=tf.stack([i, i]))
            for _ in range(work):
                v = tf.tanh(tf.matmul(v, v) / 64.0)
            return v[0, :8], v[1, 0]
        return tf.data.Dataset.range(batch * 20).map(element, num_parallel_calls=2).batch(batch)

    def tiny():
        return keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])

    probe = under(strategy, lambda: tiny())
    under(strategy, lambda: probe.compile(optimizer="sgd", loss="mse", steps_per_execution=k))
    every = dict(pids, client=os.getpid())  # wherever the strategy runs the input
    spent = []
    for work in (0, rounds):
        probe.fit(items(work), epochs=1, verbose=0)  # traces
        before = {{t: cpu_seconds(p) for t, p in every.items()}}
        probe.fit(items(work), epochs=1, verbose=0)
        spent.append({{t: cpu_seconds(p) - before[t] for t, p in every.items()}})
    extra = {{t: spent[1][t] - spent[0][t] for t in every}}
    record["input_cpu_s_total"] = sum(extra.values())
    record["input_cpu_s_workers"] = sum(v for t, v in extra.items() if t.startswith("worker"))
    record["input_cpu_s_by_process"] = extra
print(json.dumps(record))
"""


def run_client(local, strategy, model, k, root):
    """Runs one strategy/K in a fresh client process; returns its record."""
    code = _CLIENT.format(
        root=root,
        spec=json.dumps(local.spec),
        pids=json.dumps(local.pids()),
        strategy=strategy,
        model=model,
        k=k,
        size=FLAGS.size,
        steps=FLAGS.steps,
        batch=FLAGS.batch,
        rounds=FLAGS.input_rounds,
        cpus=FLAGS.cpus,
    )
    base = {"strategy": strategy, "model": model, "k": k, "workers": len(local.spec["worker"])}
    try:
        proc = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code)],
            capture_output=True,
            text=True,
            env=server_env(),
            timeout=FLAGS.client_timeout,
        )
    except subprocess.TimeoutExpired:
        return {**base, "error": "timed out"}
    if proc.returncode != 0:
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        if os.environ.get("DPKERAS_BENCH_DEBUG"):
            print(proc.stderr[-5000:], file=sys.stderr)
        return {**base, "error": (lines[-1] if lines else f"exit {proc.returncode}")[:300]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _wire(record, task):
    sent, received = record["wire_bytes_per_step"].get(task, [0, 0])
    return f"{sent / 1e3:,.1f} / {received / 1e3:,.1f}"


def markdown(records):
    """The tables of BENCHMARKS.md's cluster section."""
    lines = [
        f"Local cluster: {FLAGS.ps} ps + W workers x {FLAGS.cpus} CPU device(s), model size "
        f"{FLAGS.size:g}, global batch {FLAGS.batch}, {FLAGS.steps} measured steps after a "
        f"warm-up. Bytes: the kernel's TCP counters (sent / received, KB per step).",
        "",
        "| model | strategy | W | K | steps/s | client CPU ms/step | worker CPU ms/step "
        "(mean) | client KB/step | ps:0 KB/step | worker:0 KB/step | input CPU s, workers / all | "
        "loss |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        head = f"| {r['model']} | {r['strategy']} | {r['workers']} | {r['k']} |"
        if "error" in r:
            lines.append(f"{head} failed: {r['error']} | | | | | | | |")
            continue
        workers = [v for t, v in r["task_cpu_ms_per_step"].items() if t.startswith("worker")]
        input_cpu = (
            f"{r['input_cpu_s_workers']:.2f} / {r['input_cpu_s_total']:.2f}"
            if "input_cpu_s_workers" in r
            else ""
        )
        lines.append(
            f"{head} {r['steps_per_s']:.1f} | {r['client_cpu_ms_per_step']:.2f} | "
            f"{statistics.mean(workers):.1f} | {_wire(r, 'client')} | {_wire(r, 'ps:0')} | "
            f"{_wire(r, 'worker:0')} | "
            f"{input_cpu} | {r['loss']:.4f} |"
        )
    static = [r for r in records if "static_bytes_per_step" in r]
    if static:
        lines += [
            "",
            "Bytes per step the step graph's static shapes account for (dpkeras, between "
            "processes), beside what the wire carries:",
            "",
        ]
        for r in static:
            total = sum(r["static_bytes_per_step"].values())
            wire = sum(v[0] for t, v in r["wire_bytes_per_step"].items())
            unknown = len(r["static_unknown_size"])
            lines.append(
                f"- W={r['workers']}, K={r['k']}: static {total / 1e3:,.1f} KB, wire (all "
                f"processes' sends) {wire / 1e3:,.1f} KB; tensors of run-time size the static "
                f"count cannot size: {unknown}"
            )
    return "\n".join(lines) + "\n"


def chart(records, path):
    """Steps/s and client CPU per step against workers, a line per strategy and K."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in records if "error" not in r]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    panels = (
        ("steps/s", lambda r: r["steps_per_s"]),
        ("client CPU ms per step", lambda r: r["client_cpu_ms_per_step"]),
        ("input CPU s of the workers (an epoch)", lambda r: r.get("input_cpu_s_workers")),
    )
    for ax, (title, value) in zip(axes, panels):
        for key in sorted({(r["model"], r["strategy"], r["k"]) for r in ok}):
            rows = sorted(
                (r for r in ok if (r["model"], r["strategy"], r["k"]) == key),
                key=lambda r: r["workers"],
            )
            points = [(r["workers"], value(r)) for r in rows if value(r) is not None]
            if points:
                ax.plot(*zip(*points), marker="o", label=f"{key[1]} K={key[2]}")
        ax.set_xlabel("workers")
        ax.set_title(title)
        ax.set_xscale("log", base=2)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv):
    del argv
    counts = sorted({int(n) for n in FLAGS.workers if n.isdigit()})
    if not counts or len(counts) != len(FLAGS.workers) or counts[0] < 1:
        raise app.UsageError(
            f"--workers must be positive counts. Received: {','.join(FLAGS.workers)}"
        )
    ks = [int(k) for k in FLAGS.k]
    if any(FLAGS.steps % k for k in ks):
        raise app.UsageError(f"--steps={FLAGS.steps} must be a multiple of every --k {ks}.")
    unknown = sorted(set(FLAGS.strategies) - set(STRATEGIES))
    if unknown or sorted(set(FLAGS.models) - set(MODELS)):
        raise app.UsageError(
            f"Unknown strategies or models: {unknown or FLAGS.models}. "
            f"Strategies: {', '.join(STRATEGIES)}; models: {', '.join(MODELS)}"
        )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    os.makedirs(FLAGS.out, exist_ok=True)
    records = []
    for workers in counts:
        with LocalCluster(ps=FLAGS.ps, workers=workers, cpus=FLAGS.cpus) as local:
            for model in FLAGS.models:
                for strategy in FLAGS.strategies:
                    for k in ks if strategy != "one_process" else ks[:1]:
                        record = run_client(local, strategy, model, k, root)
                        print(json.dumps(record), flush=True)
                        records.append(record)
    with open(os.path.join(FLAGS.out, "cluster.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    table = markdown(records)
    with open(os.path.join(FLAGS.out, "cluster.md"), "w") as f:
        f.write(table)
    chart(records, os.path.join(FLAGS.out, "cluster.png"))
    print(table)


if __name__ == "__main__":
    app.run(main)
