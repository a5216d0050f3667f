r"""A DLRM reported the way recommender papers and MLPerf report one: samples/s after warm-up
and AUC after one pass, with the batch size and the hardware.

    python -m benchmarks.recsys                        # one machine and a 2-worker cluster
    python -m benchmarks.recsys --where=local --replicas=2 --batch=512

The model is `benchmarks/models.py`'s `dlrm` (DLRM-DCNv2 on Criteo Kaggle's shape: 13 dense
features, 26 categorical ones with Zipf ids, tables capped at 200,000 x `--size` rows) on
synthetic data whose labels depend on the features (the dense ones linearly, each id through a
fixed hash), so AUC measures learning: 0.5 is chance. Each strategy trains in a process of its
own (`benchmarks/peer_client.py`) over one pass of the same training set; AUC is
`keras.metrics.AUC` on `--eval_examples` held-out examples (the end of the same draw, never
trained on), from the trained weights in a model outside any strategy.

- one machine (`local`): one device (Keras 3, and tf-keras: the reference of
  ParameterServerStrategy), dpkeras and MirroredStrategy on `--replicas` simulated CPU devices
  (the CPU split in logical devices: they share the cores);
- a loopback cluster (`cluster`) of 1 ps + `--workers` workers: dpkeras all-on-ps and hybrid,
  and TensorFlow's ParameterServerStrategy under tf-keras (asynchronous) when tf-keras is
  installed (`pip install -e '.[peers]'`), else a row saying it was not run.

Writes `<out>/recsys.{jsonl,md}`; published figures, on other hardware, are printed beside.
"""

import json
import os
import sys

from absl import app, flags

if __package__ in (None, ""):  # run as `python benchmarks/recsys.py`
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import machine, peers
from dpkeras.testing import LocalCluster

FLAGS = flags.FLAGS

LOCAL = ("one_process", "one_process_tf_keras", "local_dpkeras", "local_mirrored")
CLUSTER = ("dpkeras", "dpkeras_hybrid", "pss")
# Published training throughput of comparable models, on other hardware: context, not a
# measurement of this machine (as quoted in issue 43; not re-measured here).
PUBLISHED = (
    (
        "NVIDIA DeepLearningExamples, TF2 DLRM, two CPUs (Criteo)",
        "17.7k samples/s",
    ),
    ("Alibaba DeepRec modelzoo, WDL on Criteo, 4 CPU cores", "31.1 steps/s"),
)

flags.DEFINE_list("where", ["local", "cluster"], "Where to run: local, cluster.")
flags.DEFINE_list("local", list(LOCAL), f"One-machine strategies, of: {', '.join(LOCAL)}.")
flags.DEFINE_list("cluster", list(CLUSTER), f"Cluster strategies, of: {', '.join(CLUSTER)}.")
flags.DEFINE_integer("replicas", 2, "Simulated CPU devices of the one-machine runs.", 1)
flags.DEFINE_integer("workers", 2, "Workers of the cluster runs (1 ps).", 1)
flags.DEFINE_integer("batch", 512, "Global batch size.", 1)
flags.DEFINE_integer("k", 10, "steps_per_execution.", 1)
flags.DEFINE_integer(
    "mirrored_k",
    1,
    "MirroredStrategy's steps_per_execution: above 1, Keras 3.15's fit under it fails here "
    "(`You must feed a value for placeholder tensor`, as keras-team/keras#19246).",
    1,
)
flags.DEFINE_integer("steps", 60, "Measured steps of each long fit (a multiple of --k).", 1)
flags.DEFINE_integer("repeats", 3, "Short + long fit pairs (the median reported).", 1)
flags.DEFINE_float("size", 0.25, "Model size (tables capped at 200,000 x size rows).")
flags.DEFINE_integer("eval_examples", 65536, "Held-out examples for AUC.", 1)
flags.DEFINE_integer("client_timeout", 1200, "Seconds before a client is killed.", 1)
flags.DEFINE_string("out", "results", "Directory for recsys.{jsonl,md}.")
flags.DEFINE_string(
    "records", None, "A recsys.jsonl of an earlier run to report (with the run's flags), not run."
)
flags.DEFINE_bool(
    "keras_rs",
    False,
    "The Keras 3 strategies' DLRM from keras-rs (default: from Keras layers, the same "
    "computation as ParameterServerStrategy's under tf-keras).",
)


def settings():
    """The peers' `Settings` from the flags."""
    return peers.settings_from(
        FLAGS,
        replicas=FLAGS.replicas,
        warm=2 * max(FLAGS.k, FLAGS.mirrored_k),  # the same data plan at every K
    )


def run(echo=print):
    """Every chosen strategy on the DLRM; returns the records (with one device's AUC)."""
    records, config = [], settings()

    def keep(record):
        echo(json.dumps(record), flush=True)
        records.append(record)

    if "local" in FLAGS.where:
        for strategy in FLAGS.local:
            k = FLAGS.mirrored_k if strategy == "local_mirrored" else FLAGS.k
            keep(peers.run_peer(strategy, "dlrm", k, 0, config))
    if "cluster" in FLAGS.where:
        ours = [s for s in FLAGS.cluster if s != "pss"]
        if ours:
            with LocalCluster(ps=1, workers=FLAGS.workers, cpus=1) as cluster:
                for strategy in ours:
                    keep(peers.run_peer(strategy, "dlrm", FLAGS.k, FLAGS.workers, config, cluster))
        if "pss" in FLAGS.cluster:
            keep(peers.run_peer("pss", "dlrm", FLAGS.k, FLAGS.workers, config))
    return peers.add_distances(records, by_k=False)  # one data plan at every K


def _where(record):
    if record["strategy"].startswith("one_process"):
        return "one machine", "1 device"
    if record["strategy"].startswith("local_"):
        return "one machine", f"{FLAGS.replicas} simulated devices"
    return "loopback cluster", f"1 ps + {record['workers']} workers"


def markdown(records, info):
    """The table: each strategy's samples/s, AUC and loss; the machine; published figures."""
    lines = [
        f"DLRM-DCNv2 (Criteo Kaggle's shape, tables capped at {int(200_000 * FLAGS.size):,} "
        f"rows), global batch {FLAGS.batch}, one pass over "
        f"{records[0].get('samples', 0):,} synthetic examples; samples/s steady after warm-up "
        f"(the median of {FLAGS.repeats}: a fit of {FLAGS.steps} + W steps less one of W, W = "
        f"{2 * max(FLAGS.k, FLAGS.mirrored_k)}), "
        f"AUC and loss on {FLAGS.eval_examples:,} held-out examples (one device's beside; "
        f"tf-keras's for PSS); weights: relative L2 distance from one device's.",
        "",
        *[line for line in machine.lines(info) if not line.startswith("Devices:")],
        f"Devices: no GPU; one machine: one process, its CPU split into {FLAGS.replicas} + 1 "
        f"logical devices for dpkeras (variables on /cpu:0) and MirroredStrategy; cluster: "
        f"`dpkeras serve` tasks of 1 CPU device each on 127.0.0.1. Every process shares the "
        f"same cores, with other work.",
        "",
        "| where | strategy | devices | K | samples/s | whole fit | AUC (one device) | held-out "
        "loss | weights vs one device | CPU client ms/step |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        where, devices = _where(r)
        head = f"| {where} | {r['strategy']} | {devices} | {r['k']} |"
        if "skipped" in r or "error" in r:
            why = f"not run: {r['skipped']}" if "skipped" in r else f"failed: {r['error']}"
            lines.append(f"{head} {peers.shorten(why).replace('|', '/')} | | | | | |")
            continue
        auc = f"{r['held_out_auc']:.4f}"
        if "reference_auc" in r:
            auc += f" ({r['reference_auc']:.4f})"
        client = r.get("client_cpu_ms_per_step")
        _, weights = peers.distance_cells(r)
        lines.append(
            f"{head} {r['samples_per_s']:,.0f} | {r['whole_fit_samples_per_s']:,.0f} | {auc} | "
            f"{r['held_out_loss']:.4f} | {weights} | {'-' if client is None else f'{client:.1f}'} |"
        )
    lines += ["", "Published, on other hardware (not measured here):", ""]
    lines += [f"- {what}: {figure}" for what, figure in PUBLISHED]
    return "\n".join(lines) + "\n"


def main(argv):
    del argv
    unknown = sorted(
        set(FLAGS.where) - {"local", "cluster"}
        | set(FLAGS.local) - set(LOCAL)
        | set(FLAGS.cluster) - set(CLUSTER)
    )
    if unknown:
        raise app.UsageError(f"Unknown: {unknown}. Local: {LOCAL}; cluster: {CLUSTER}.")
    for k in (FLAGS.k, FLAGS.mirrored_k):
        if FLAGS.steps % k or (2 * max(FLAGS.k, FLAGS.mirrored_k)) % k:
            raise app.UsageError(
                f"--steps={FLAGS.steps} and 2 x the larger K must be multiples of --k="
                f"{FLAGS.k} and --mirrored_k={FLAGS.mirrored_k}."
            )
    os.makedirs(FLAGS.out, exist_ok=True)
    if FLAGS.records:  # the run's machine (its load at the start), when it wrote one
        with open(FLAGS.records) as f:
            records = [json.loads(line) for line in f if line.strip()]
        records = peers.add_distances(records, by_k=False)
        saved = os.path.join(os.path.dirname(FLAGS.records), "recsys-machine.json")
        if os.path.exists(saved):
            with open(saved) as f:
                info = json.load(f)
        else:
            info = dict(machine.describe([], FLAGS.replicas, "/cpu:0"), loadavg_at_start=None)
    else:
        info = machine.describe([], FLAGS.replicas, "/cpu:0")
        with open(os.path.join(FLAGS.out, "recsys-machine.json"), "w") as f:
            json.dump(info, f)
        records = run()
    table = markdown(records, info)
    with open(os.path.join(FLAGS.out, "recsys.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    with open(os.path.join(FLAGS.out, "recsys.md"), "w") as f:
        f.write(table)
    print(table)


if __name__ == "__main__":
    app.run(main)
