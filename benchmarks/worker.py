"""Runs one strategy/model pair and prints its result as one JSON line.

`compare.py` starts one process of this module per pair (MirroredStrategy misbehaves when two
models share a process), passing the pair as a JSON object:

    python -m benchmarks.worker '{"strategy": "dpkeras", "model": "mlp", "replicas": 3, ...}'

The keys are those of `PairSpec`. The result is the last stdout line starting with
`RESULT_PREFIX`; it is a record with `status` "ok" or "failed" (with the error's first line and
the phase it happened in). Any failure inside the pair is caught and reported that way, so the
process exits 0 whenever it could report; a crash or timeout is reported by the parent.

Device layout: with GPUs, compute replicas are `/gpu:0..`; without, the process first splits the
CPU into `replicas + 1` logical devices, runs replicas on `/cpu:1..` and keeps parameters on
`/cpu:0`. `one_device` runs the whole model on the first compute device (`/gpu:0` or `/cpu:1`)
with `tf.distribute.OneDeviceStrategy`, in the same device configuration.
"""

import copy
import dataclasses
import json
import os
import re
import sys
import time
import traceback

RESULT_PREFIX = "DPKERAS_BENCH_RESULT "

STRATEGIES = (
    "dpkeras",
    "mirrored",
    "central_storage",
    "one_device",
    "dpkeras_sharded",
    "dpkeras_no_dedup",
    "dpkeras_hybrid",
)
# dpkeras_sharded: dpkeras with large weights cut into shards over the parameter devices
# (`PairSpec.partition`); run only when asked for (`compare.py --partition`).
# dpkeras_no_dedup: dpkeras with DPKERAS_DEDUPLICATE=0 (every id of a lookup pulls its row);
# `compare.py --dedup_baseline`, on by default for dlrm. dpkeras itself runs with the
# environment's DPKERAS_DEDUPLICATE, or dpkeras's default (on).
# dpkeras_hybrid: dpkeras with `placement.hybrid()` (dense variables copied on every replica
# and all-reduced, tables on the parameter device); run only when asked for (make gpu-check
# asks for it).
DEDUPLICATION_OFF = {"dpkeras_no_dedup": "0"}
DPKERAS_STRATEGIES = ("dpkeras", "dpkeras_sharded", "dpkeras_no_dedup", "dpkeras_hybrid")


@dataclasses.dataclass(frozen=True)
class PairSpec:
    """What one worker process runs.

    Attributes:
        strategy: one of `STRATEGIES`.
        model: a name in `benchmarks.models.MODELS`.
        replicas: int, compute replicas (ignored by `one_device`, which uses 1).
        size: float, model size multiplier (1.0 = default shapes).
        batch_size: int, global batch, divisible by `replicas`.
        steps: int, timed steps per repeat.
        check_steps: int, steps of the first, untimed `fit` (which traces the step and
            counts its transfers); the loss it reports is the correctness check, taken before
            floating-point differences between strategies have had time to grow.
        warmup_steps: int, further untimed steps before timing starts.
        repeats: int, timed repeats (Keras epochs of `steps` steps).
        seed: int, seed of the weights, the data and Dropout.
        devices: `"simulated"` (logical CPU devices) or `"gpu"`.
        logical_gpus: int, with `"gpu"`: split the first GPU into this many logical GPUs
            (`dpkeras.testing.split_gpu`) before TensorFlow starts; 0: the GPUs as they are.
        parameter_device: str, where dpkeras and central_storage keep variables.
        partition: int, for `dpkeras_sharded`: the most shards a weight is cut into (a
            `MinSizePartitioner` with 256 KiB shards at least); 0 for the other strategies.
        data_examples: int, distinct synthetic examples (at least 2 batches), cycled.
    """

    strategy: str
    model: str
    replicas: int = 3
    size: float = 1.0
    batch_size: int = 240
    steps: int = 20
    check_steps: int = 5
    warmup_steps: int = 3
    repeats: int = 3
    seed: int = 1234
    devices: str = "simulated"
    logical_gpus: int = 0
    parameter_device: str = "/cpu:0"
    partition: int = 0
    data_examples: int = 4096

    @property
    def effective_replicas(self):
        return 1 if self.strategy == "one_device" else self.replicas

    @classmethod
    def from_json(cls, text):
        fields = {f.name for f in dataclasses.fields(cls)}
        data = json.loads(text)
        unknown = sorted(set(data) - fields)
        if unknown:
            raise ValueError(f"Unknown pair fields {unknown}. Valid fields: {sorted(fields)}")
        return cls(**data)


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def first_line(error):
    """`"TypeName: first line of the message"`, the way results report an exception.

    Keras wraps errors raised inside a layer as "Exception encountered when calling X.call()."
    followed by the real message; the real message's first line is appended to that.
    """
    lines = [_ANSI.sub("", line).strip() for line in str(error).strip().splitlines()]
    lines = [line for line in lines if line]
    if not lines:
        return type(error).__name__
    text = lines[0]
    if text.startswith("Exception encountered when calling") and len(lines) > 1:
        text = f"{text.rstrip('.')}: {lines[1]}"
    return f"{type(error).__name__}: {text}"


def base_record(spec):
    """The fields every result has, before anything ran."""
    return {
        "strategy": spec.strategy,
        "model": spec.model,
        "size": spec.size,
        "replicas": spec.effective_replicas,
        "batch_size": spec.batch_size,
        "devices": spec.devices,
        "status": "failed",
        "error": None,
        "phase": None,
    }


def compute_devices(spec):
    """Short names of the devices that run replicas for this pair."""
    kind = "gpu" if spec.devices == "gpu" else "cpu"
    first = 0 if kind == "gpu" else 1
    return [f"/{kind}:{first + i}" for i in range(spec.effective_replicas)]


def parameter_device_list(parameter_device):
    """`"/cpu:0,/cpu:3"` -> `["/cpu:0", "/cpu:3"]` (the `--parameter_device` flag's value)."""
    return [d.strip() for d in parameter_device.split(",") if d.strip()]


def make_strategy(spec):
    """The `tf.distribute` strategy for `spec.strategy` on this pair's devices."""
    import tensorflow as tf

    import dpkeras

    compute = compute_devices(spec)
    parameter_devices = parameter_device_list(spec.parameter_device)
    if spec.strategy in DPKERAS_STRATEGIES:
        # Several devices: variables spread over them by dpkeras.placement.greedy_by_size.
        partitioner = None
        if spec.strategy == "dpkeras_sharded":
            partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(
                min_shard_bytes=256 << 10, max_shards=max(spec.partition, 2)
            )
        where = parameter_devices if len(parameter_devices) > 1 else parameter_devices[0]
        if spec.strategy == "dpkeras_hybrid":  # tables on `where`, dense variables copied
            where = dpkeras.placement.hybrid(where)
        return dpkeras.ParameterDeviceStrategy(compute, where, partitioner=partitioner)
    if spec.strategy == "mirrored":
        return tf.distribute.MirroredStrategy(compute)
    if spec.strategy == "central_storage":  # takes one device: the first
        return tf.distribute.experimental.CentralStorageStrategy(
            compute, parameter_device=parameter_devices[0]
        )
    if spec.strategy == "one_device":
        return tf.distribute.OneDeviceStrategy(compute[0])
    raise ValueError(
        f"Unknown strategy {spec.strategy!r}. Valid strategies: {', '.join(STRATEGIES)}"
    )


def _components(variable):
    """The per-device tf.Variables behind a Keras variable under any strategy."""
    import keras
    import tensorflow as tf

    value = variable.value if isinstance(variable, keras.Variable) else variable
    if isinstance(value, tf.distribute.DistributedValues):
        return list(value.values)
    if hasattr(value, "copies"):  # a dpkeras.ReplicatedVariable: one copy per replica
        return list(value.copies)
    return list(getattr(value, "shards", [value]))  # a sharded dpkeras variable: its shards


def variable_bytes_by_device(variables):
    """`{short device: bytes}` of the persistent variables, each counted once per copy.

    Mirrored variables count once on every replica; a variable kept on a parameter device
    counts once there.
    """
    from dpkeras._device_names import canonical_device, short_device
    from dpkeras._sizes import nbytes

    seen, totals = set(), {}
    for v in variables:
        for c in _components(v):
            key = (id(c), c.device)
            if key in seen:
                continue
            seen.add(key)
            device = short_device(canonical_device(c.device)) if c.device else "?"
            totals[device] = totals.get(device, 0) + nbytes(c.shape, c.dtype)
    return dict(sorted(totals.items()))


def peak_memory_by_device(devices):
    """`{short device: peak bytes}` of GPUs; None for a CPU or a GPU that cannot tell.

    A CPU is never asked: TensorFlow's CPU allocator reports a peak of 0 on some machines and
    raises on others, and neither is a measurement.
    """
    import tensorflow as tf

    peaks = {}
    for d in devices:
        if "gpu" not in d.lower():
            peaks[d] = None
            continue
        try:
            peaks[d] = int(tf.config.experimental.get_memory_info(d.upper().lstrip("/"))["peak"])
        except (ValueError, tf.errors.OpError, KeyError):
            peaks[d] = None
    return peaks


def transfer_fields(report, replica_devices):
    """The per-step transfer numbers of a record, from a `dpkeras._transfers.TransferReport`.

    "Per replica" is the average over the compute devices. Bytes count tensors whose shape is
    known when the step is traced; a sharded lookup's rows (a count known only when the step
    runs) are counted in `runtime_size_tensors_to_replicas_per_step`, not in the bytes.
    `tensors_to_each_replica` splits the
    tensors each replica receives by shape, `{device: [all, arrays, scalars, unknown]}`:
    arrays are variable values (or rows gathered from them); scalars are metric
    state, counters and flags (a Keras `Mean` or `Accuracy` is two scalar variables); unknown
    are sends whose shape TensorFlow did not record (control-only edges carry no data).

    The batch is not counted: other strategies deliver each replica's share in their input
    iterators, outside the step, while dpkeras on CPU replicas cuts it inside the step
    (`Transfer.of_the_batch`); counting it for dpkeras alone would compare unlike things.
    """
    n = len(replica_devices)
    to = [report.to_device(d, batch=False) for d in replica_devices]
    back = [report.from_device(d) for d in replica_devices]
    coll = [report.collectives_on(d) for d in replica_devices]
    split = {}
    for d in replica_devices:
        incoming = [
            t for t in report.transfers if t.destination == _short(d) and not t.of_the_batch
        ]
        unknown = sum(1 for t in incoming if t.shape is None)
        scalars = sum(1 for t in incoming if t.shape == ())
        split[d] = [len(incoming), len(incoming) - unknown - scalars, scalars, unknown]
    return {
        "tensors_to_replicas_per_step": sum(t for t, _ in to) / n,
        "bytes_to_replicas_per_step": sum(b for _, b in to) / n,
        "tensors_from_replicas_per_step": sum(t for t, _ in back) / n,
        "bytes_from_replicas_per_step": sum(b for _, b in back) / n,
        "collectives_per_replica_per_step": sum(c for c, _ in coll) / n,
        "collective_bytes_per_replica_per_step": sum(b for _, b in coll) / n,
        "max_tensors_to_a_replica_per_step": max(t for t, _ in to),
        "scalar_tensors_to_replicas_per_step": sum(v[2] for v in split.values()) / n,
        "unknown_shape_tensors_to_replicas_per_step": sum(v[3] for v in split.values()) / n,
        "runtime_size_tensors_to_replicas_per_step": sum(
            1
            for d in replica_devices
            for t in report.transfers
            if t.destination == _short(d)
            and not t.of_the_batch
            and t.shape is not None
            and None in t.shape
        )
        / n,
        "tensors_to_each_replica": split,
        "transfers": {k: list(v) for k, v in report.summary().items()},
    }


def _short(device):
    from dpkeras._device_names import canonical_device, short_device

    return short_device(canonical_device(device))


def _median(values):
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def timing_fields(seconds_per_repeat, steps, batch_size):
    """Throughput fields from the wall time of each timed repeat of `steps` steps."""
    rates = [steps / s for s in seconds_per_repeat]
    median = _median(rates)
    return {
        "steps_per_sec": median,
        "examples_per_sec": median * batch_size,
        "steps_per_sec_runs": rates,
        "steps_per_sec_best": max(rates),
        "steps_per_sec_spread": (max(rates) - min(rates)) / median if median else None,
    }


class _Progress:
    """The phase a pair is in, so a failure says where it happened."""

    def __init__(self):
        self.phase = "setup"


def run(spec):
    """Runs one pair in this process; returns its record (never raises for pair failures)."""
    record = base_record(spec)
    progress = _Progress()
    start = time.perf_counter()
    try:
        record.update(_run(spec, progress))
        record.update(status="ok", error=None, phase=None)
    except Exception as e:  # noqa: BLE001 - a failing pair is a result, reported as such
        record.update(status="failed", error=first_line(e), phase=progress.phase)
        traceback.print_exc(file=sys.stderr)
    record["wall_seconds"] = time.perf_counter() - start
    if hasattr(os, "getloadavg"):  # how busy the machine was: others' work skews steps/s
        record["loadavg_1min"] = os.getloadavg()[0]
    return record


def _run(spec, progress):
    from benchmarks import models

    if spec.strategy not in STRATEGIES:
        raise ValueError(
            f"Unknown strategy {spec.strategy!r}. Valid strategies: {', '.join(STRATEGIES)}"
        )
    if spec.model not in models.MODELS:
        raise ValueError(f"Unknown model {spec.model!r}. Valid models: {', '.join(models.MODELS)}")
    if spec.batch_size % spec.effective_replicas:
        raise ValueError(
            f"The global batch size {spec.batch_size} does not split evenly over "
            f"{spec.effective_replicas} replicas; Keras fit needs a multiple. "
            f"Received: batch_size={spec.batch_size}, replicas={spec.effective_replicas}"
        )

    if spec.strategy in DEDUPLICATION_OFF:  # read by dpkeras when the strategy is made
        os.environ["DPKERAS_DEDUPLICATE"] = DEDUPLICATION_OFF[spec.strategy]
    progress.phase = "memory check"
    memory = memory_check(spec)

    import dpkeras

    if spec.devices == "simulated":
        highest = max(
            [spec.replicas]
            + [int(d.rsplit(":", 1)[1]) for d in parameter_device_list(spec.parameter_device)]
        )
        dpkeras.simulate_cpu_devices(highest + 1)
    elif spec.logical_gpus:
        dpkeras.testing.split_gpu(spec.logical_gpus)
    import keras
    import numpy as np
    import tensorflow as tf

    from dpkeras._transfers import record_transfers

    tf.get_logger().setLevel("ERROR")
    replica_devices = compute_devices(spec)
    out = {
        "compute_devices": replica_devices,
        "parameter_device": (
            spec.parameter_device
            if spec.strategy in DPKERAS_STRATEGIES + ("central_storage",)
            else None
        ),
        "partition": spec.partition or None,
        "deduplicate": (
            os.environ.get("DPKERAS_DEDUPLICATE", "default")
            if spec.strategy in DPKERAS_STRATEGIES
            else None
        ),
        **memory,
    }

    progress.phase = "build"
    t = time.perf_counter()
    keras.utils.set_random_seed(spec.seed)
    strategy = make_strategy(spec)
    description = models.MODELS[spec.model]
    with strategy.scope():
        model = models.build(spec.model, spec.size)
        model.compile(
            optimizer=keras.optimizers.get(copy.deepcopy(description.optimizer)),
            loss=description.loss,
            metrics=[description.metric],
        )
    cross = getattr(strategy.extended, "_cross_device_ops", None)
    out["cross_device_ops"] = type(cross).__name__ if cross is not None else None
    out["parameters"] = int(model.count_params())
    out["build_seconds"] = time.perf_counter() - t

    batches = max(2, -(-spec.data_examples // spec.batch_size))
    x, y = models.synthetic_data(spec.model, spec.batch_size * batches, spec.size, seed=spec.seed)
    out.update(
        models.lookup_rows(
            spec.model, x, spec.batch_size, spec.effective_replicas, spec.size, steps=batches
        )
    )
    dataset = (
        tf.data.Dataset.from_tensor_slices((x, y))
        .batch(spec.batch_size, drop_remainder=True)
        .cache()
        .repeat()
        .prefetch(2)
    )
    fit = dict(shuffle=False, verbose=0)

    progress.phase = "first steps"
    t = time.perf_counter()
    with record_transfers() as recorder:
        history = model.fit(dataset, epochs=1, steps_per_epoch=spec.check_steps, **fit)
    out["first_steps_seconds"] = time.perf_counter() - t
    out["check_loss"] = float(history.history["loss"][-1])
    t = time.perf_counter()
    out.update(transfer_fields(recorder.report(), replica_devices))
    out["transfer_count_seconds"] = time.perf_counter() - t

    progress.phase = "warm-up"
    t = time.perf_counter()
    if spec.warmup_steps:
        model.fit(dataset, epochs=1, steps_per_epoch=spec.warmup_steps, **fit)
    out["warmup_seconds"] = time.perf_counter() - t

    progress.phase = "timed steps"
    timer = _epoch_timer(keras)
    history = model.fit(
        dataset, epochs=spec.repeats, steps_per_epoch=spec.steps, callbacks=[timer], **fit
    )
    out.update(timing_fields(timer.seconds, spec.steps, spec.batch_size))
    out["cpu_seconds_per_step"] = _median(timer.cpu_seconds) / spec.steps
    out["final_loss"] = float(history.history["loss"][-1])

    progress.phase = "measure"
    t = time.perf_counter()
    first_x = tf.nest.map_structure(lambda a: a[: spec.batch_size], x)
    loss_fn = keras.losses.get(description.loss)
    out["eval_loss"] = float(
        np.mean(
            keras.ops.convert_to_numpy(
                loss_fn(y[: spec.batch_size], model(first_x, training=False))
            )
        )
    )
    out["model_variables"] = len(model.variables)
    out["trainable_variables"] = len(model.trainable_variables)
    out["metric_variables"] = len(model.metrics_variables)
    out["optimizer_variables"] = len(model.optimizer.variables)
    out["variable_bytes_by_device"] = variable_bytes_by_device(
        list(model.variables) + list(model.optimizer.variables) + list(model.metrics_variables)
    )
    devices_used = sorted(set(replica_devices) | set(out["variable_bytes_by_device"]))
    out["peak_memory_bytes_by_device"] = peak_memory_by_device(devices_used)
    out["measure_seconds"] = time.perf_counter() - t
    return out


# Optimizer slots per table row, per optimizer class name: Adagrad one accumulator, Adam two.
_SLOTS = {"SGD": 0, "Adagrad": 1, "Adam": 2, "AdamW": 2}


def copies_of_the_tables(strategy, replicas):
    """How many copies of every embedding table a strategy keeps: MirroredStrategy one per
    replica; the others one (on the parameter device, or the one device)."""
    return replicas if strategy == "mirrored" else 1


def available_memory_bytes():
    """The host's available memory (`MemAvailable` of /proc/meminfo), or None if unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def memory_check(spec, available=None):
    """The memory the pair's embedding tables need; raises `MemoryError` if it cannot fit.

    The tables with their optimizer slots, times the copies the strategy keeps
    (`copies_of_the_tables`). On simulated devices every copy is in host memory, checked
    against `available` (default: `available_memory_bytes()`) with a quarter kept free for
    activations and TensorFlow; on GPUs each replica's copy must fit its GPU, which TensorFlow
    reports as an out-of-memory error in the build. Returns the record's memory fields.
    """
    from benchmarks import models

    one_copy = models.table_bytes(spec.model, spec.size)
    optimizer = (
        models.MODELS[spec.model].optimizer["class_name"] if spec.model in models.MODELS else ""
    )
    one_copy *= 1 + _SLOTS.get(optimizer, 2)
    copies = copies_of_the_tables(spec.strategy, spec.effective_replicas)
    needed = one_copy * copies
    fields = {"table_bytes_with_slots": one_copy, "table_copies": copies}
    if spec.devices != "simulated" or not needed:
        return fields
    available = available_memory_bytes() if available is None else available
    if available is not None and needed > 0.75 * available:
        raise MemoryError(
            f"{spec.strategy} does not fit: it keeps {copies} copies of the embedding tables "
            f"and their optimizer slots ({one_copy / 2**30:.2f} GiB each, "
            f"{needed / 2**30:.2f} GiB in all) and this host has {available / 2**30:.2f} GiB "
            f"available (at most 75% of it used for tables). Run with a smaller --size."
        )
    return fields


def _epoch_timer(keras):
    class EpochTimer(keras.callbacks.Callback):
        """Wall time of each epoch; Keras syncs on the epoch's logs before on_epoch_end."""

        def __init__(self):
            super().__init__()
            self.seconds, self.cpu_seconds = [], []
            self._start = self._cpu_start = None

        def on_epoch_begin(self, epoch, logs=None):
            self._start, self._cpu_start = time.perf_counter(), time.process_time()

        def on_epoch_end(self, epoch, logs=None):
            float((logs or {}).get("loss", 0.0))  # make sure the epoch's work is done
            self.seconds.append(time.perf_counter() - self._start)
            self.cpu_seconds.append(time.process_time() - self._cpu_start)

    return EpochTimer()


def main(argv):
    if len(argv) != 2:
        print(
            f"usage: python -m benchmarks.worker '<PairSpec as JSON>' (got {argv[1:]!r})",
            file=sys.stderr,
        )
        return 2
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        spec = PairSpec.from_json(argv[1])
    except (ValueError, TypeError) as e:
        print(f"Bad pair spec: {first_line(e)}", file=sys.stderr)
        return 2
    record = run(spec)
    sys.stdout.flush()
    print(RESULT_PREFIX + json.dumps(record), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
