r"""One training client of the peers comparison (`benchmarks/peers.py` starts it).

    python -m benchmarks.peer_client '{"strategy": "pss", "model": "dlrm", "k": 10, ...}'

Runs one strategy on one model in this process and prints one JSON line (a record). The
strategies, and the Keras each runs under (`FRAMEWORK`):

- `one_process` (Keras 3) and `one_process_tf_keras` (tf-keras): no strategy, the references;
- `dpkeras`, `dpkeras_hybrid` (Keras 3): `dpkeras.get_strategy(cluster=...)`, all-on-ps or
  `placement.hybrid()`, on the cluster's ps and workers;
- `pss` (tf-keras): `tf.distribute.ParameterServerStrategy` from this process (the chief), which
  `model.fit` drives through its `ClusterCoordinator`: asynchronous, each step a batch on one
  worker against the ps's variables;
- `mwms` (Keras 3), `mwms_tf_keras` (tf-keras): `MultiWorkerMirroredStrategy`, one such process
  per worker (TF_CONFIG), synchronous all-reduce; worker 0 reports the training;
- `local_dpkeras`, `local_mirrored` (Keras 3): one machine, `replicas` simulated CPU devices
  (dpkeras's variables on /cpu:0; MirroredStrategy's copied on each).

tf-keras processes run with TF_USE_LEGACY_KERAS=1 and never import dpkeras (Keras 3 and
tf-keras do not mix in one process). The DLRM is built from Keras layers in both Kerases (the
same computation everywhere), unless `"keras_rs": true` (Keras 3 clients only: keras-rs's
`DistributedEmbedding` and `FeatureCross`).

The data is one pass: the warm-up fit takes the first W global batches of the synthetic
training set (`"warm"`, a multiple of K; default 2K), then each repeat a short fit of W and a
long fit of `steps` + W, none repeated, each fit given a dataset of its own examples
(ParameterServerStrategy's workers each read their shard of them from a saved dataset,
repeated in case one worker runs more steps than its shard holds). Each repeat times its short
fit and its long one from start to end (for `pss` the end waits for the scheduled steps): the
steps' cost is the difference, without what a fit costs once (tracing is done by the warm-up
fit); the repeat with the median time is reported. After training: the loss and (one output
unit) AUC on held-out examples (the last `eval_examples` of the same synthetic draw, never
trained on), computed from the trained weights in a model outside any strategy, and the
weights saved for the comparison with one device.
"""

import importlib.util
import json
import os
import resource
import statistics
import sys
import time

if __package__ in (None, ""):  # run as `python benchmarks/peer_client.py`
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np

from benchmarks import models

FRAMEWORK = {
    "one_process": "keras",
    "dpkeras": "keras",
    "dpkeras_hybrid": "keras",
    "dpkeras_baseline": "keras",
    "mwms": "keras",
    "local_dpkeras": "keras",
    "local_mirrored": "keras",
    "one_process_tf_keras": "tf_keras",
    "pss": "tf_keras",
    "mwms_tf_keras": "tf_keras",
}


def _wire_module():
    """`dpkeras/testing/_wire.py` loaded by path: it imports nothing of dpkeras, and importing
    the `dpkeras` package would import Keras 3 into a tf-keras process."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.path.join(root, "dpkeras", "testing", "_wire.py")
    spec = importlib.util.spec_from_file_location("_dpkeras_wire", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cpu_seconds(pid):
    """User + system CPU seconds of process `pid` so far (/proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def own_cpu():
    """This process's user + system CPU seconds so far."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def data_plan(warm, steps, repeats):
    """`[(first batch, batches)]`: the warm-up fit's (`warm`), then each repeat's short fit
    (`warm`) and long fit (`steps` + `warm`), consecutive: one pass over the data."""
    plan, first = [(0, warm)], warm
    for _ in range(repeats):
        plan += [(first, warm), (first + warm, steps + warm)]
        first += steps + 2 * warm
    return plan


def import_keras(framework):
    """The Keras module of `framework` ("keras" or "tf_keras")."""
    if framework == "tf_keras":
        if os.environ.get("TF_USE_LEGACY_KERAS") != "1":
            raise RuntimeError("a tf-keras client needs TF_USE_LEGACY_KERAS=1 in its environment")
        import tf_keras

        return tf_keras
    import keras

    return keras


def make_strategy(config, tf):
    """The strategy of `config["strategy"]` (None for the one-process references)."""
    name = config["strategy"]
    spec = config.get("spec")
    if name.startswith("one_process"):
        return None
    if name in ("dpkeras", "dpkeras_hybrid", "dpkeras_baseline"):
        import dpkeras

        where = dpkeras.placement.hybrid() if name == "dpkeras_hybrid" else None
        return dpkeras.get_strategy(cluster=spec, parameter_device=where)
    if name in ("mwms", "mwms_tf_keras"):
        return tf.distribute.MultiWorkerMirroredStrategy()  # the cluster from TF_CONFIG
    if name == "pss":
        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec(spec), task_type="chief", task_id=0, rpc_layer="grpc"
        )
        return tf.distribute.ParameterServerStrategy(resolver)
    if name in ("local_dpkeras", "local_mirrored"):
        compute = [f"/cpu:{1 + i}" for i in range(config["replicas"])]
        if name == "local_mirrored":
            return tf.distribute.MirroredStrategy(compute)
        import dpkeras

        return dpkeras.ParameterDeviceStrategy(compute, "/cpu:0")
    raise ValueError(f"Unknown peer strategy {name!r}. Valid: {', '.join(FRAMEWORK)}")


def split_cpu(tf, devices):
    """Splits the CPU into `devices` logical devices (before TensorFlow initialises)."""
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(devices)]
    )


class Window:
    """What one fit costs, from its start to its end (`callback(keras)`: a Keras callback of
    the fit level, which ParameterServerStrategy allows; its end comes after the scheduled
    steps finish): seconds, this process's CPU, the tasks' CPU and each process's TCP bytes.
    `minus(other)` is the difference of two fits: the steps one has more than the other,
    without what every fit costs once."""

    def __init__(self, pids, wire):
        self.pids, self.wire = pids, wire

    def start(self):
        self.meter = self.wire.TrafficMeter(self.pids).start()
        self.task_cpu = {t: cpu_seconds(p) for t, p in self.pids.items()}
        self.cpu = own_cpu()
        self.t0 = time.perf_counter()

    def stop(self):
        self.seconds = time.perf_counter() - self.t0
        self.cpu = own_cpu() - self.cpu
        self.task_cpu = {t: cpu_seconds(self.pids[t]) - c for t, c in self.task_cpu.items()}
        self.meter.stop()
        self.traffic = self.meter.traffic

    def minus(self, other):
        """A `Window`-like result: this fit's figures less `other`'s."""
        out = Window(self.pids, self.wire)
        out.seconds = self.seconds - other.seconds
        out.cpu = self.cpu - other.cpu
        out.task_cpu = {t: c - other.task_cpu[t] for t, c in self.task_cpu.items()}
        out.traffic = {t: v - other.traffic[t] for t, v in self.traffic.items()}
        return out

    def callback(self, keras):
        window = self

        class Measure(keras.callbacks.Callback):
            def on_train_begin(self, logs=None):
                window.start()

            def on_train_end(self, logs=None):
                window.stop()

        return Measure()


def rows_of(data, first, count):
    """Examples `[first, first + count)` of `(x, y)` (views, no copy)."""
    return split(split(data, first)[1], count)[0]


def segment_path(config, first):
    """Where a `pss` client saves the examples of the fit that starts at batch `first`."""
    return os.path.join(config["data_dir"], f"from-batch-{first}")


def save_segments(config, tf, data, plan):
    """Saves each fit's examples as a dataset of its own (`pss`: the workers read them; a
    dataset's `skip` would read every skipped element)."""
    batch = config["batch"]
    for first, batches in plan:
        rows = rows_of(data, first * batch, batches * batch)
        tf.data.Dataset.from_tensor_slices(rows).save(segment_path(config, first))


def make_fit_data(config, tf, data):
    """`fit_data(first, batches)`: the kwargs of a fit over those global batches of `data`,
    a dataset of that fit's examples only (made when called, not skipped to)."""
    batch = config["batch"]
    name = config["strategy"]
    if name == "pss":
        dataset_creator = import_keras("tf_keras").utils.experimental.DatasetCreator

        def fit_data(first, batches):
            path = segment_path(config, first)

            def dataset_fn(context):
                rows = tf.data.Dataset.load(path)
                rows = rows.shard(context.num_input_pipelines, context.input_pipeline_id)
                return rows.batch(batch, drop_remainder=True).repeat()

            return dict(x=dataset_creator(dataset_fn), steps_per_epoch=batches)

        return fit_data

    def fit_data(first, batches):
        rows = rows_of(data, first * batch, batches * batch)
        # Whole batches, statically (MirroredStrategy's multi-step loop under Keras 3 fails on
        # a batch dimension of unknown size: "You must feed a value for placeholder").
        dataset = tf.data.Dataset.from_tensor_slices(rows).batch(batch, drop_remainder=True)
        if name.startswith("mwms"):
            options = tf.data.Options()
            policy = tf.data.experimental.AutoShardPolicy.DATA
            options.experimental_distribute.auto_shard_policy = policy
            dataset = dataset.with_options(options)
        return dict(x=dataset, steps_per_epoch=batches)

    return fit_data


def split(data, rows):
    """`(the first `rows` examples, the rest)` of `(x, y)` (x an array or a dict of them)."""

    def cut(part):
        return tuple(
            {k: v[part] for k, v in a.items()} if isinstance(a, dict) else a[part] for a in data
        )

    return cut(slice(None, rows)), cut(slice(rows, None))


def held_out(config, keras, model, x, y):
    """Loss and (one sigmoid output) AUC of `model`'s weights on the held-out `(x, y)`, in a
    model outside any strategy."""
    name, size = config["model"], config["size"]
    plain = models.build(name, size, keras_module=keras, keras_rs=config.get("keras_rs", False))
    plain.set_weights(model.get_weights())
    predictions = plain.predict(x, batch_size=4096, verbose=0)
    loss = keras.losses.get(models.MODELS[name].loss)
    out = {"held_out_loss": float(np.mean(np.asarray(loss(y, predictions))))}
    if predictions.shape[-1] == 1:
        auc = keras.metrics.AUC(num_thresholds=1000)
        auc.update_state(y, predictions)
        out["held_out_auc"] = float(np.asarray(auc.result()))
    return out


def median_run(runs):
    """The run with the median seconds (the middle one; the faster of two)."""
    return sorted(runs, key=lambda r: r.seconds)[(len(runs) - 1) // 2]


def train(config):
    """Builds, trains and measures; returns the record (worker 0's, under MWMS)."""
    framework = FRAMEWORK[config["strategy"]]
    import tensorflow as tf

    if config["strategy"].startswith("local_"):
        split_cpu(tf, config["replicas"] + 1)
    keras = import_keras(framework)
    wire = _wire_module()
    name, k, batch = config["model"], config["k"], config["batch"]
    warm = config.get("warm") or 2 * k
    if warm % k or config["steps"] % k:
        raise ValueError(f"warm={warm} and steps={config['steps']} must be multiples of K={k}")
    plan = data_plan(warm, config["steps"], config["repeats"])
    rows = (plan[-1][0] + plan[-1][1]) * batch
    # One draw: the held-out examples follow the same teacher (and, for the DLRM, the same
    # popular ids) as the training ones.
    data = models.synthetic_data(name, rows + config["eval_examples"], config["size"])
    (x, y), (x_held, y_held) = split(data, rows)
    if config["strategy"] == "pss":  # the workers read it from disk, their shard each
        save_segments(config, tf, (x, y), plan)
    strategy = make_strategy(config, tf)
    keras.utils.set_random_seed(1234)
    spec = models.MODELS[name]

    def build():
        model = models.build(
            name, config["size"], keras_module=keras, keras_rs=config.get("keras_rs", False)
        )
        model.compile(
            optimizer=keras.optimizers.get(spec.optimizer), loss=spec.loss, steps_per_execution=k
        )
        return model

    if strategy is None:
        model = build()
    else:
        with strategy.scope():
            model = build()
    fit_data = make_fit_data(config, tf, (x, y))
    pids = dict(config.get("pids", {}), client=os.getpid())
    first = own_cpu()
    model.fit(**fit_data(*plan[0]), epochs=1, verbose=0)  # traces
    record = {
        "strategy": config["strategy"],
        "framework": framework,
        "model": name,
        "k": k,
        "workers": config.get("workers", 0),
        "batch": batch,
        "replicas": 1 if strategy is None else strategy.num_replicas_in_sync,
        "first_fit_cpu_s": own_cpu() - first,
    }
    if "dpkeras" in sys.modules:  # which dpkeras ran (`dpkeras_baseline`: another checkout's)
        record["dpkeras_from"] = os.path.dirname(os.path.realpath(sys.modules["dpkeras"].__file__))
    runs, losses, seconds = [], [], []
    for short, long in zip(plan[1::2], plan[2::2]):
        windows = []
        for first_batch, batches in (short, long):
            window = Window(pids, wire)
            history = model.fit(
                **fit_data(first_batch, batches),
                epochs=1,
                verbose=0,
                callbacks=[window.callback(keras)],
            )
            windows.append(window)
        runs.append(windows[1].minus(windows[0]))
        seconds.append([round(w.seconds, 3) for w in windows])
        losses.append(float(history.history["loss"][-1]))
    steps = config["steps"]
    best = median_run(runs)
    record.update(
        loss=losses[-1],
        samples=(plan[-1][0] + plan[-1][1]) * batch,
        steps_per_s=steps / best.seconds,
        samples_per_s=steps * batch / best.seconds,
        samples_per_s_runs=[round(steps * batch / r.seconds, 1) for r in runs],
        fit_seconds_runs=seconds,  # [short, long] of each repeat
        whole_fit_samples_per_s=statistics.median(
            (steps + warm) * batch / long_seconds for _, long_seconds in seconds
        ),
        client_cpu_ms_per_step=1000 * best.cpu / steps,
        task_cpu_ms_per_step={t: 1000 * c / steps for t, c in best.task_cpu.items()},
        wire_bytes_per_step={
            t: [round(v.sent / steps), round(v.received / steps)] for t, v in best.traffic.items()
        },
    )
    if config.get("task_index", 0) == 0:
        record.update(held_out(config, keras, model, x_held, y_held))
        if config.get("weights_out"):
            np.savez(config["weights_out"], *model.get_weights())
    return record


def main(argv):
    config = json.loads(argv[1])
    record = train(config)
    print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main(sys.argv)
