r"""dpkeras on a local cluster as workers are added, beside CentralStorageStrategy.

For each worker count W, starts real `dpkeras serve` processes on loopback (PS parameter
servers and W workers, `--cpus` logical CPU devices each) and runs each strategy and each
`steps_per_execution` K in its own client process:

- `dpkeras`: `dpkeras.scope(cluster=...)`: every worker CPU computes, variables on the ps;
- `dpkeras_hybrid`: `dpkeras.scope(cluster=..., parameter_device=placement.hybrid())`: the
  tables on the ps, every other variable replicated on the workers' CPUs, its gradients
  all-reduced worker to worker;
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
as the slower epoch lasts: polling and health probes, not input work). With `--epoch_steps` >
0, the client's CPU per step, per epoch, per epoch of validation and per fit, from fits of
long and short epochs (`--input=numpy` gives fit NumPy arrays, as most scripts do; `dataset`
a finite tf.data dataset), and their projection to 64 workers.

    python -m benchmarks.cluster                              # --workers=1,2,4,8
    python -m benchmarks.cluster --workers=2 --k=1,10 --strategies=dpkeras
    python -m benchmarks.cluster --strategies=dpkeras --input=numpy --input_rounds=0
    python -m benchmarks.cluster --strategies=dpkeras,dpkeras_hybrid --models=mlp,dlrm \
        --k=10 --input_rounds=0 --epoch_steps=0
    python -m benchmarks.cluster --merge=a/cluster.jsonl,b/cluster.jsonl --out=both
    python -m benchmarks.cluster --peers=dpkeras,dpkeras_hybrid,pss,mwms,mwms_tf_keras \
        --workers=1,2 --models=mlp,recommender,dlrm --k=10 --batch=256 --steps=200 --repeats=3

With `--peers`, runs instead TensorFlow's cluster strategies beside dpkeras's two placements
on the same loopback cluster (`benchmarks/peers.py`: ParameterServerStrategy and
MultiWorkerMirroredStrategy under tf-keras, MultiWorkerMirroredStrategy under Keras 3), and
writes `<out>/peers.{jsonl,md}`; a peer that cannot run or fails is a row saying why.

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

from benchmarks import peers
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
    "Strategies, of: dpkeras, dpkeras_hybrid, central_storage, one_process.",
)
flags.DEFINE_list("k", ["1", "10"], "steps_per_execution values.")
flags.DEFINE_integer("steps", 60, "Measured steps (a multiple of every K).", lower_bound=1)
flags.DEFINE_float("size", 0.25, "Model size multiplier (see benchmarks/models.py).")
flags.DEFINE_integer("batch", 96, "Global batch size.", lower_bound=1)
flags.DEFINE_integer(
    "input_rounds", 20, "Work per element of the input-CPU dataset (0: do not measure).", 0
)
flags.DEFINE_enum(
    "input",
    "dataset",
    ["dataset", "numpy"],
    "What fit is given: a tf.data dataset of global batches, or NumPy arrays (fit(x, y), as "
    "most scripts call it).",
)
flags.DEFINE_integer(
    "epoch_steps",
    200,
    "Steps of the long epochs of the per-epoch measurement (the short ones have a tenth; both "
    "multiples of every K); 0: do not measure per epoch and per fit.",
    lower_bound=0,
)
flags.DEFINE_integer("epoch_repeats", 3, "Repeats of the per-epoch measurement.", lower_bound=1)
flags.DEFINE_integer("client_timeout", 900, "Seconds before a client is killed.", lower_bound=1)
flags.DEFINE_string("out", "results", "Directory for cluster.{jsonl,md,png}.")
flags.DEFINE_list(
    "peers",
    [],
    f"Instead of --strategies: the peers comparison (benchmarks/peers.py), of: "
    f"{', '.join(peers.PEERS)}; each model's one-device references are added.",
)
flags.DEFINE_integer("repeats", 3, "With --peers: measured fits, the median reported.", 1)
flags.DEFINE_integer(
    "eval_examples", 16384, "With --peers: held-out examples for the loss and AUC.", 1
)
flags.DEFINE_bool(
    "keras_rs",
    False,
    "With --peers: the Keras 3 peers' DLRM from keras-rs (default: from Keras layers, the same "
    "computation as tf-keras's).",
)
flags.DEFINE_string(
    "baseline",
    "",
    "With --peers=...,dpkeras_baseline: a checkout of another dpkeras commit (`git worktree add "
    "DIR COMMIT`), trained all-on-ps beside this one in the same run (a before/after).",
)
flags.DEFINE_list(
    "merge",
    [],
    "cluster.jsonl files of earlier runs (e.g. one per W) to report together in <out>, "
    "instead of running.",
)

STRATEGIES = ("dpkeras", "dpkeras_hybrid", "central_storage", "one_process")
DPKERAS = ("dpkeras", "dpkeras_hybrid")  # the strategies whose bytes and ring are reported
LINK_BYTES_PER_S = 3.1e9  # 25 Gb/s, each way

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
input_kind, epoch_steps, epoch_repeats = {input_kind!r}, {epoch_steps!r}, {epoch_repeats!r}
model_spec = models.MODELS[model_name]
workers = [f"/job:worker/replica:0/task:{{t}}/device:CPU:{{i}}"
           for t in range(len(spec["worker"])) for i in range(cpus)]
if name == "one_process":
    strategy = None
elif name == "dpkeras":
    strategy = dpkeras.get_strategy(cluster=spec)
elif name == "dpkeras_hybrid":
    strategy = dpkeras.get_strategy(cluster=spec, parameter_device=dpkeras.placement.hybrid())
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
x, y = models.synthetic_data(model_name, batch * max(steps + 2 * k, epoch_steps), size)
dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch).repeat()


def rows(n):
    return tf.nest.map_structure(lambda a: a[: batch * n], x), y[: batch * n]


def fit_data(n):
    # n steps: NumPy arrays given to fit, or a finite dataset (a new iterator each epoch)
    xs, ys = rows(n)
    if input_kind == "numpy":
        return dict(x=xs, y=ys, batch_size=batch)
    return dict(x=tf.data.Dataset.from_tensor_slices((xs, ys)).batch(batch))


def client_cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
record = {{"strategy": name, "model": model_name, "k": k, "workers": len(spec["worker"]),
          "replicas": 1 if strategy is None else strategy.num_replicas_in_sync,
          "input": input_kind}}


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


main = dict(x=dataset) if input_kind == "dataset" else dict(x=x, y=y, batch_size=batch)
first = client_cpu()
model.fit(**main, steps_per_epoch=2 * k, epochs=1, verbose=0)  # traces
record["first_fit_cpu_s"] = client_cpu() - first
measure = Measure()
history = model.fit(**main, steps_per_epoch=steps + 2 * k, epochs=1, verbose=0,
                    callbacks=[measure])
if epoch_steps and strategy is not None:
    # The client's CPU per step, per epoch and per fit. A callback reads the client's CPU at
    # each epoch's start and at the end of training: an epoch's cost is the CPU from its start
    # to the next, a fit's fixed cost what the fit spent outside its epochs (distributing the
    # data, per input host; making the datasets). Per step and per epoch come from long and
    # short epochs: a short epoch's cost less its steps' is the fixed cost of an epoch (each
    # input host's iterators, callbacks, logs).
    short = epoch_steps // 10
    validation = fit_data(short)
    validation = (validation["x"] if input_kind == "dataset"
                  else (validation["x"], validation["y"]))

    class Epochs(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.marks = []

        def on_epoch_begin(self, epoch, logs=None):
            self.marks.append(client_cpu())

        def on_train_end(self, logs=None):
            self.marks.append(client_cpu())

    def spent(epochs, n, **kwargs):
        # (the mean CPU of an epoch after the first, the CPU of the fit beyond that many
        # epochs): the first epoch also makes what a fit makes once, on first use (the
        # validation data's distributed dataset, at the first validation).
        epochs_seen = Epochs()
        start = client_cpu()
        model.fit(**fit_data(n), epochs=epochs, verbose=0, callbacks=[epochs_seen], **kwargs)
        total = client_cpu() - start
        marks = epochs_seen.marks
        steady = (marks[-1] - marks[1]) / (epochs - 1)
        return steady, total - epochs * steady

    spent(2, short, validation_data=validation)  # traces evaluation, and for NumPy input
    runs = []
    for _ in range(epoch_repeats):
        long_epoch, _ = spent(3, epoch_steps)
        short_epoch, one_fit = spent(10, short)
        with_validation, validation_fit = spent(10, short, validation_data=validation)
        step = (long_epoch - short_epoch) / (epoch_steps - short)
        runs.append(dict(
            step_ms=1000 * step,
            epoch_ms=1000 * (short_epoch - short * step),
            fit_ms=1000 * one_fit,
            validation_ms=1000 * (with_validation - short_epoch),
            validation_fit_ms=1000 * (validation_fit - one_fit),
        ))
    for key in runs[0]:
        values = sorted(r[key] for r in runs)
        record[f"client_{{key}}"] = values[len(values) // 2]
        record[f"client_{{key}}_runs"] = [round(r[key], 3) for r in runs]
record.update(
    loss=float(history.history["loss"][-1]),
    steps_per_s=steps / measure.seconds,
    client_cpu_ms_per_step=1000 * measure.client / steps,
    task_cpu_ms_per_step={{t: 1000 * c / steps for t, c in measure.cpu.items()}},
    wire_bytes_per_step={{t: [round(v.sent / steps), round(v.received / steps)]
                          for t, v in measure.meter.traffic.items()}},
)
if name in ("dpkeras", "dpkeras_hybrid"):
    # Dense bytes: the trainable variables that are not tables. Under hybrid placement, the
    # replicated ones; all-on-ps, all of them less the model's tables (the same figure).
    def nbytes(v):
        return int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize
    record["dense_bytes"] = sum(
        nbytes(v) for v in model.trainable_variables
        if isinstance(v.value, dpkeras.ReplicatedVariable))
    record["dense_bytes_by_tables"] = (
        sum(nbytes(v) for v in model.trainable_variables) - models.table_bytes(model_name, size))
    if name == "dpkeras":
        record["dense_bytes"] = record["dense_bytes_by_tables"]
    w = len(spec["worker"])
    record["ring_bytes_each_way"] = 2 * (w - 1) / w * record["dense_bytes"]
if name in ("dpkeras", "dpkeras_hybrid"):
    first = tf.nest.map_structure(lambda a: a[:batch], x), y[:batch]
    try:
        report = dpkeras.train_step_transfers(model, first[0], first[1], batch_size=batch)
    except Exception as e:  # noqa: BLE001 - a record, not a failed run
        report = None
        record["static_error"] = f"{{type(e).__name__}}: {{e}}"[:300]
if name in ("dpkeras", "dpkeras_hybrid") and report is not None:
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
    # Each process's CPU for the fit with the trivial map and for the one with the expensive
    # map: the workers' totals of the second are issue 31's input measurement.
    record["input_fit_cpu_s"] = spent
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
        input_kind=FLAGS.input,
        epoch_steps=FLAGS.epoch_steps,
        epoch_repeats=FLAGS.epoch_repeats,
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
                f"- {r['model']}, {r['strategy']}, W={r['workers']}, K={r['k']}: static "
                f"{total / 1e3:,.1f} KB, wire (all processes' sends) {wire / 1e3:,.1f} KB; "
                f"tensors of run-time size the static count cannot size: {unknown}"
            )
    lines += epoch_table(records)
    lines += modes_table(records)
    return "\n".join(lines) + "\n"


def _line(points):
    """Least-squares `(intercept, slope)` of `(x, y)` points (slope 0 for a single x)."""
    xs, ys = zip(*points)
    mx, my = statistics.mean(xs), statistics.mean(ys)
    spread = sum((x - mx) ** 2 for x in xs)
    slope = 0.0 if spread == 0 else sum((x - mx) * (y - my) for x, y in points) / spread
    return my - slope * mx, slope


def projection(records, workers=64, epoch_steps=None):
    """The client's CPU at `workers` workers, per (model, strategy, K, input), from straight
    lines through the measured W: per step, per epoch, and an epoch of `epoch_steps` steps
    (default: the run's `--epoch_steps`) with its fixed cost, as ms and as the steps/s that
    the client alone allows. Rows need `client_step_ms` and `client_epoch_ms`."""
    epoch_steps = epoch_steps or FLAGS.epoch_steps
    groups = {}
    for r in records:
        if "client_epoch_ms" in r:
            key = (r["model"], r["strategy"], r["k"], r.get("input", "dataset"))
            groups.setdefault(key, []).append(r)
    out = []
    for key, rows in sorted(groups.items()):
        step = _line([(r["workers"], r["client_step_ms"]) for r in rows])
        epoch = _line([(r["workers"], r["client_epoch_ms"]) for r in rows])
        step_ms = max(step[0] + step[1] * workers, 0.0)
        epoch_ms = max(epoch[0] + epoch[1] * workers, 0.0)
        total = epoch_ms + epoch_steps * step_ms
        out.append(
            dict(
                zip(("model", "strategy", "k", "input"), key),
                workers=workers,
                step_ms=step_ms,
                epoch_ms=epoch_ms,
                epoch_steps=epoch_steps,
                epoch_total_ms=total,
                steps_per_s=epoch_steps * 1000 / total if total else float("inf"),
            )
        )
    return out


def epoch_table(records):
    """The per-step, per-epoch and per-fit columns (the client's CPU), and their projection."""
    rows = [r for r in records if "client_epoch_ms" in r]
    if not rows:
        return []
    lines = [
        "",
        f"The client's CPU per step, per epoch and per fit (medians of "
        f"{FLAGS.epoch_repeats} repeats; epochs of {FLAGS.epoch_steps} and "
        f"{FLAGS.epoch_steps // 10} steps; the first fit traces):",
        "",
        "| model | strategy | input | W | K | ms/step | ms/epoch (fixed) | ms/epoch of "
        "validation | ms/fit (fixed, after the first) | ms/fit of validation | first fit (s) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['strategy']} | {r.get('input', 'dataset')} | {r['workers']} "
            f"| {r['k']} | {r['client_step_ms']:.2f} | {r['client_epoch_ms']:.1f} | "
            f"{r['client_validation_ms']:.1f} | {r['client_fit_ms']:.1f} | "
            f"{r.get('client_validation_fit_ms', float('nan')):.1f} | "
            f"{r['first_fit_cpu_s']:.2f} |"
        )
    lines += [
        "",
        "Projected to 64 workers (straight lines through the measured W), the client's CPU "
        f"for an epoch of {FLAGS.epoch_steps} steps and the steps/s the client allows:",
        "",
    ]
    for p in projection(records):
        lines.append(
            f"- {p['model']}, {p['strategy']}, {p['input']}, K={p['k']}: {p['step_ms']:.2f} "
            f"ms/step + {p['epoch_ms']:.0f} ms/epoch = {p['epoch_total_ms']:.0f} ms per epoch, "
            f"{p['steps_per_s']:,.0f} steps/s"
        )
    return lines


def _kb(n):
    return f"{n / 1e3:,.1f}"


def _both(record, task):
    """`(sent, received)` bytes per step of `task` (0, 0 when not measured)."""
    return tuple(record["wire_bytes_per_step"].get(task, [0, 0]))


def _tasks(record, job):
    return sorted(t for t in record["wire_bytes_per_step"] if t.startswith(f"{job}:"))


def link_bytes(record):
    """What one record's links carry per step (bytes): for each ps task `(sent, received)`;
    the busiest ps task's larger direction; the workers' mean and max of sent + received and
    of the larger direction; the client's sent + received."""
    ps = {t: _both(record, t) for t in _tasks(record, "ps")}
    workers = [_both(record, t) for t in _tasks(record, "worker")]
    return dict(
        ps=ps,
        ps_each_way=max((max(v) for v in ps.values()), default=0),
        worker_mean=statistics.mean(sum(v) for v in workers) if workers else 0,
        worker_max=max((sum(v) for v in workers), default=0),
        worker_each_way=max((max(v) for v in workers), default=0),
        client=sum(_both(record, "client")),
    )


def ps_ratio(records):
    """`{(model, W, K): hybrid ps bytes / all-on-ps ps bytes}` (sent + received over every ps
    task), where both modes were measured."""
    total = {
        (r["model"], r["workers"], r["k"], r["strategy"]): sum(
            sum(v) for v in link_bytes(r)["ps"].values()
        )
        for r in records
        if r["strategy"] in DPKERAS and "error" not in r
    }
    return {
        key[:3]: total[key] / total[key[:3] + ("dpkeras",)]
        for key in total
        if key[3] == "dpkeras_hybrid" and total.get(key[:3] + ("dpkeras",))
    }


def modes_projection(records, workers=64, link=LINK_BYTES_PER_S):
    """Each resource's ceiling in steps/s at `workers` workers, per (model, mode, K), from the
    measured W: the client (1 / its CPU per step, a straight line through the measured W); the
    busiest ps task's link (`link` bytes/s each way over its larger direction per step, a
    straight line through the measured W: all-on-ps grows with W, hybrid carries rows only);
    a worker's link (its share of the ps's larger direction at the largest measured W: all its
    ps traffic all-on-ps, its rows with hybrid placement, plus, for hybrid, a ring's 2(W-1)/W x
    the dense bytes each way at `workers`; a worker's 8 GPUs do not multiply the dense bytes,
    since a worker presums its replicas). `first` names the lowest."""
    groups = {}
    for r in records:
        if r["strategy"] in DPKERAS and "error" not in r and "dense_bytes" in r:
            groups.setdefault((r["model"], r["strategy"], r["k"]), []).append(r)
    out = []
    for (model, strategy, k), rows in sorted(groups.items()):
        rows.sort(key=lambda r: r["workers"])
        last = rows[-1]
        client = _line([(r["workers"], r["client_cpu_ms_per_step"]) for r in rows])
        client_ms = max(client[0] + client[1] * workers, 1e-9)
        ps = _line([(r["workers"], link_bytes(r)["ps_each_way"]) for r in rows])
        ps_bytes = max(ps[0] + ps[1] * workers, 1.0)
        dense = last["dense_bytes"]
        ring = 2 * (workers - 1) / workers * dense
        # A worker's share of the ps's traffic: all of its ps traffic all-on-ps, its rows with
        # hybrid placement (worker:0 also carries per-step traffic of its own, in both modes).
        to_ps = link_bytes(last)["ps_each_way"] / last["workers"]
        worker_bytes = ring + to_ps if strategy == "dpkeras_hybrid" else to_ps
        ceilings = {
            "client": 1000 / client_ms,
            "ps link": link / ps_bytes,
            "worker link": link / max(worker_bytes, 1.0),
        }
        out.append(
            dict(
                model=model,
                strategy=strategy,
                k=k,
                workers=workers,
                measured_workers=[r["workers"] for r in rows],
                client_ms=client_ms,
                ps_bytes=ps_bytes,
                worker_bytes=worker_bytes,
                dense_bytes=dense,
                ring_bytes=ring,
                ceilings=ceilings,
                first=min(ceilings, key=ceilings.get),
            )
        )
    return out


def modes_table(records):
    """The dpkeras modes side by side: all-on-ps and hybrid, per model, W and K; their ps-bytes
    ratio; the ring reference; and their projection to 64 workers."""
    rows = [r for r in records if r["strategy"] in DPKERAS]
    if not rows:
        return []
    lines = [
        "",
        "All-on-ps (`dpkeras`) and hybrid (`dpkeras_hybrid`: tables on the ps, the rest "
        "all-reduced among the workers), per step. CPU: ms per step of the client, each ps "
        "task, the workers' mean / max. Bytes (KB per step, the kernel's TCP counters): each ps "
        "task sent + received (sent / received); a worker's link sent + received (mean / max "
        "over the workers); the client's sent + received. Dense: the bytes of the trainable "
        "variables that are not tables; ring: 2(W-1)/W x dense, what a ring all-reduce sends "
        "and receives per worker each way.",
        "",
        "| model | mode | W | K | steps/s | CPU client | CPU ps | CPU workers mean / max | "
        "ps KB (sent / recv) | worker KB mean / max | client KB | dense KB | ring KB each way | "
        "ps hybrid / all-on-ps |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    ratios = ps_ratio(records)
    for r in rows:
        mode = "hybrid" if r["strategy"] == "dpkeras_hybrid" else "all-on-ps"
        head = f"| {r['model']} | {mode} | {r['workers']} | {r['k']} |"
        if "error" in r:
            lines.append(f"{head} failed: {r['error'][:200]} |" + " |" * 9)
            continue
        cpu = r["task_cpu_ms_per_step"]
        ps_cpu = ", ".join(f"{cpu[t]:.1f}" for t in sorted(cpu) if t.startswith("ps"))
        worker_cpu = [v for t, v in cpu.items() if t.startswith("worker")]
        b = link_bytes(r)
        ps_bytes = ", ".join(f"{_kb(sum(v))} ({_kb(v[0])} / {_kb(v[1])})" for v in b["ps"].values())
        ratio = ratios.get((r["model"], r["workers"], r["k"]))
        dense, ring = r.get("dense_bytes"), r.get("ring_bytes_each_way")
        lines.append(
            f"{head} {r['steps_per_s']:.1f} | {r['client_cpu_ms_per_step']:.2f} | {ps_cpu} | "
            f"{statistics.mean(worker_cpu):.1f} / {max(worker_cpu):.1f} | {ps_bytes} | "
            f"{_kb(b['worker_mean'])} / {_kb(b['worker_max'])} | {_kb(b['client'])} | "
            f"{'' if dense is None else _kb(dense)} | {'' if ring is None else _kb(ring)} | "
            f"{'' if ratio is None or mode != 'hybrid' else f'{ratio:.3f}x'} |"
        )
    projected = modes_projection(records)
    if projected:
        lines += [
            "",
            "Projected to 64 workers x 8 GPUs on a 25 Gb/s network (3.1 GB/s each way), each "
            "resource's ceiling in steps/s (client: 1 / its CPU per step, a line through the "
            "measured W; ps link: 3.1 GB/s over the busiest ps task's larger direction per "
            "step, a line through the measured W; worker link: all-on-ps its ps traffic, "
            "hybrid 2(W-1)/W x dense + its rows, per worker, not per GPU, since a worker "
            "presums its 8 replicas):",
            "",
            "| model | mode | K | measured W | client ms/step | ps KB/step | worker KB/step "
            "each way | client | ps link | worker link | first limit |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for p in projected:
            mode = "hybrid" if p["strategy"] == "dpkeras_hybrid" else "all-on-ps"
            c = p["ceilings"]
            lines.append(
                f"| {p['model']} | {mode} | {p['k']} | "
                f"{','.join(map(str, p['measured_workers']))} | {p['client_ms']:.2f} | "
                f"{_kb(p['ps_bytes'])} | {_kb(p['worker_bytes'])} | {c['client']:,.0f} | "
                f"{c['ps link']:,.0f} | {c['worker link']:,.0f} | {p['first']} |"
            )
    return lines


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


def write(records):
    """Writes `<out>/cluster.{jsonl,md,png}` and prints the tables."""
    os.makedirs(FLAGS.out, exist_ok=True)
    with open(os.path.join(FLAGS.out, "cluster.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    table = markdown(records)
    with open(os.path.join(FLAGS.out, "cluster.md"), "w") as f:
        f.write(table)
    chart(records, os.path.join(FLAGS.out, "cluster.png"))
    print(table)


def peer_settings():
    """The peers' `Settings` from the flags."""
    return peers.settings_from(FLAGS, baseline=FLAGS.baseline)


def write_peers(records, settings):
    """Writes `<out>/peers.{jsonl,md}` and prints the table."""
    os.makedirs(FLAGS.out, exist_ok=True)
    with open(os.path.join(FLAGS.out, "peers.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    table = peers.markdown(records, settings)
    with open(os.path.join(FLAGS.out, "peers.md"), "w") as f:
        f.write(table)
    print(table)


def merge_peers(paths):
    """The peers table of earlier runs' peers.jsonl (a later file's record of the same model,
    peer, W and K replaces an earlier one's), their distances recomputed from the weights
    files they name; the flags describe the runs."""
    found = {}
    for path in paths:
        with open(path) as f:
            for line in f:
                if line.strip():
                    r = json.loads(line)
                    found[(r["model"], r["strategy"], r["workers"], r["k"])] = r
    records = peers.add_distances(list(found.values()))
    write_peers(records, peer_settings())


def run_peers(counts, ks):
    """The peers comparison: every peer at every W; writes `<out>/peers.{jsonl,md}`."""
    unknown = sorted(set(FLAGS.peers) - set(peers.PEERS)) + sorted(set(FLAGS.models) - set(MODELS))
    if unknown:
        raise app.UsageError(
            f"Unknown peers or models: {unknown}. Peers: {', '.join(peers.PEERS)}; models: "
            f"{', '.join(MODELS)}"
        )
    settings = peer_settings()
    os.makedirs(FLAGS.out, exist_ok=True)
    for peer in FLAGS.peers:
        reason = peers.unavailable(peer, settings)
        if reason:
            print(f"{peer}: not run: {reason}", flush=True)
    records = peers.run_all(counts, FLAGS.models, ks, FLAGS.peers, settings)
    write_peers(records, settings)


def main(argv):
    del argv
    if FLAGS.peers and FLAGS["input"].present:
        raise app.UsageError(
            f"--input={FLAGS.input} applies to --strategies runs. Received it with --peers, "
            "where every peer (dpkeras too) fits the same tf.data dataset of global batches "
            "(benchmarks/peer_client.py): ParameterServerStrategy cannot take NumPy arrays."
        )
    if FLAGS.merge and all(os.path.basename(p) == "peers.jsonl" for p in FLAGS.merge):
        merge_peers(FLAGS.merge)
        return
    if FLAGS.merge:
        records = []
        for path in FLAGS.merge:
            with open(path) as f:
                records += [json.loads(line) for line in f if line.strip()]
        records.sort(key=lambda r: (r["workers"], r["model"], r["strategy"], r["k"]))
        write(records)
        return
    counts = sorted({int(n) for n in FLAGS.workers if n.isdigit()})
    if not counts or len(counts) != len(FLAGS.workers) or counts[0] < 1:
        raise app.UsageError(
            f"--workers must be positive counts. Received: {','.join(FLAGS.workers)}"
        )
    ks = [int(k) for k in FLAGS.k]
    if any(FLAGS.steps % k for k in ks):
        raise app.UsageError(f"--steps={FLAGS.steps} must be a multiple of every --k {ks}.")
    if FLAGS.peers:
        run_peers(counts, ks)
        return
    if any(FLAGS.epoch_steps % (10 * k) for k in ks):
        raise app.UsageError(
            f"--epoch_steps={FLAGS.epoch_steps} must be a multiple of 10 x every --k {ks} (its "
            f"tenth, the short epochs, a multiple of every K)."
        )
    unknown = sorted(set(FLAGS.strategies) - set(STRATEGIES))
    if unknown or sorted(set(FLAGS.models) - set(MODELS)):
        raise app.UsageError(
            f"Unknown strategies or models: {unknown or FLAGS.models}. "
            f"Strategies: {', '.join(STRATEGIES)}; models: {', '.join(MODELS)}"
        )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    os.makedirs(FLAGS.out, exist_ok=True)
    records = []

    def run(local, strategy, model, k):
        record = run_client(local, strategy, model, k, root)
        print(json.dumps(record), flush=True)
        records.append(record)

    for workers in counts:
        with LocalCluster(ps=FLAGS.ps, workers=workers, cpus=FLAGS.cpus) as local:
            for model in FLAGS.models:
                for strategy in FLAGS.strategies:
                    for k in ks if strategy != "one_process" else ks[:1]:
                        run(local, strategy, model, k)
    write(records)


if __name__ == "__main__":
    app.run(main)
