r"""dpkeras against MirroredStrategy, CentralStorageStrategy and one device, side by side.

Trains each chosen model under each chosen strategy with unchanged `model.fit` on synthetic
data, one process per strategy/model pair, and reports steps/s, transfers per step, variable
memory and the final loss next to one device's.

    python -m benchmarks.compare                      # the default run, under 10 minutes
    python -m benchmarks.compare --models=mlp --strategies=dpkeras,mirrored --repeats=9
    python -m benchmarks.compare --scaling            # mlp: replicas 1, 2, 4, 8 x sizes 0.5, 2
    dpkeras bench [same flags]                        # the same, from a source checkout

Writes `<out>/bench.{jsonl,md,png}` (`scaling.*` with --scaling), `<out>/machine.json` and one
log per pair under `<out>/logs/`. On a machine without GPUs every pair's process splits the
CPU into replicas + 1 logical devices; the numbers then measure overhead, not speed-up.
"""

import dataclasses
import json
import os
import subprocess
import sys
import time

from absl import app, flags

if __package__ in (None, ""):  # run as `python benchmarks/compare.py`
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import chart, machine, results
from benchmarks.models import MODELS
from benchmarks.worker import RESULT_PREFIX, STRATEGIES, PairSpec, base_record

FLAGS = flags.FLAGS

flags.DEFINE_list(
    "models",
    list(MODELS),
    f"Comma-separated models to run, of: {', '.join(MODELS)}. With --scaling "
    f"and no --models, only mlp.",
)
flags.DEFINE_list(
    "strategies",
    [s for s in STRATEGIES if s not in ("dpkeras_sharded", "dpkeras_no_dedup", "dpkeras_hybrid")],
    f"Comma-separated strategies to run, of: {', '.join(STRATEGIES)}. "
    f"dpkeras_sharded (added by --partition) is dpkeras with large weights in shards; "
    f"dpkeras_hybrid is dpkeras with placement.hybrid() (dense variables copied per replica). "
    f"one_device is the baseline of the ratios and of the loss check.",
)
flags.DEFINE_integer(
    "replicas",
    None,
    "Compute replicas (devices that each run a copy of the step). Default: "
    "every GPU found; on a CPU-only machine, 3 simulated logical CPU devices "
    "(plus /cpu:0 for parameters and input).",
    lower_bound=1,
)
flags.DEFINE_integer(
    "steps",
    None,
    "Timed training steps per repeat (one Keras epoch each). Default: per "
    "model, " + ", ".join(f"{m.name} {m.steps}" for m in MODELS.values()) + ".",
    lower_bound=1,
)
flags.DEFINE_integer(
    "check_steps",
    5,
    "Steps of the first, untimed fit, which traces the step, counts its "
    "transfers and gives the loss of the correctness check.",
    lower_bound=1,
)
flags.DEFINE_integer(
    "warmup_steps", 3, "Further untimed steps before timing starts.", lower_bound=0
)
flags.DEFINE_integer(
    "repeats",
    5,
    "Timed repeats per pair; steps/s is their median, spread their (max - min) / median.",
    lower_bound=1,
)
flags.DEFINE_integer(
    "batch_size",
    None,
    "Global batch size in examples, split evenly over the replicas (must be "
    "divisible by every replica count run). Default: per model, "
    + ", ".join(f"{m.name} {m.batch_size}" for m in MODELS.values())
    + ".",
    lower_bound=1,
)
flags.DEFINE_float(
    "size",
    1.0,
    "Model size multiplier (layer widths, table rows; 1.0 = the shapes in benchmarks/models.py).",
    lower_bound=0.0,
)
flags.DEFINE_bool(
    "scaling",
    False,
    "Sweep replica counts (--scaling_replicas) and model sizes (--scaling_sizes) "
    "instead of one run at --replicas and --size; writes scaling.* files.",
)
flags.DEFINE_list(
    "scaling_replicas",
    ["1", "2", "4", "8"],
    "With --scaling: comma-separated replica counts (on GPUs, those above the "
    "number of GPUs are skipped).",
)
flags.DEFINE_list(
    "scaling_sizes", ["0.5", "2"], "With --scaling: comma-separated model size multipliers."
)
flags.DEFINE_string("out", "results", "Directory for the result files (created if absent).")
flags.DEFINE_integer(
    "pair_timeout",
    600,
    "Seconds after which a pair's process is killed and reported as failed.",
    lower_bound=1,
)
flags.DEFINE_integer("seed", 1234, "Seed of the initial weights, the data and Dropout.")
flags.DEFINE_string(
    "parameter_device",
    "/cpu:0",
    "Where dpkeras and central_storage keep the variables. A comma-separated "
    "list spreads dpkeras's variables over those devices (greedy by bytes); "
    "central_storage takes the first. On simulated devices, an index beyond "
    "the replicas adds a device that only holds variables.",
)
flags.DEFINE_integer(
    "partition",
    0,
    "Also run dpkeras_sharded: dpkeras with every weight of 256 KiB or more cut into at most "
    "this many shards (tf.distribute.experimental.partitioners.MinSizePartitioner), spread "
    "over the --parameter_device list, such as --parameter_device=/cpu:0,/cpu:4 on simulated "
    "devices. 0: off.",
    lower_bound=0,
)
flags.DEFINE_bool(
    "dedup_baseline",
    None,
    "Also run dpkeras_no_dedup: dpkeras with DPKERAS_DEDUPLICATE=0, every id of a lookup "
    "pulling its own row, beside dpkeras (deduplicating, or as DPKERAS_DEDUPLICATE says). "
    "Default: on when --models includes dlrm.",
)
flags.DEFINE_bool("chart", True, "Draw the PNG chart (needs matplotlib).")
flags.DEFINE_integer(
    "logical_gpus",
    0,
    "Split the first GPU into this many logical GPUs (dpkeras.testing.split_gpu), so that "
    "several replicas run on one GPU; the other GPUs are not used. 0: the GPUs as they are.",
    lower_bound=0,
)

DEFAULT_CPU_REPLICAS = 3


@dataclasses.dataclass
class Config:
    """The run, as decided from the flags and the machine."""

    models: list
    strategies: list
    replica_counts: list
    sizes: list
    steps: int | None
    check_steps: int
    warmup_steps: int
    repeats: int
    batch_size: int | None
    scaling: bool
    out: str
    pair_timeout: int
    seed: int
    parameter_device: str
    devices: str  # "gpu" or "simulated"
    chart: bool = True
    partition: int = 0
    logical_gpus: int = 0


def _choices(values, valid, flag):
    values = [v.strip() for v in values if v.strip()]
    bad = [v for v in values if v not in valid]
    if bad or not values:
        raise app.UsageError(
            f"--{flag} must be a comma-separated list of {', '.join(valid)}. "
            f"Received: --{flag}={','.join(values)}"
        )
    return list(dict.fromkeys(values))


def _numbers(values, kind, flag):
    try:
        numbers = [kind(v) for v in values]
    except ValueError:
        raise app.UsageError(
            f"--{flag} must be a comma-separated list of {kind.__name__}s. "
            f"Received: --{flag}={','.join(values)}"
        ) from None
    if not numbers or any(n <= 0 for n in numbers):
        raise app.UsageError(
            f"--{flag} must list positive numbers. Received: --{flag}={','.join(values)}"
        )
    return numbers


def config_from_flags(f, gpus):
    """Validates the flags against the machine (`gpus`: names of physical GPUs)."""
    logical_gpus = f.logical_gpus
    if logical_gpus:
        if not gpus:
            raise app.UsageError(
                f"--logical_gpus={logical_gpus} splits a GPU, but no GPU was found. Without "
                f"GPUs the benchmark splits the CPU (simulated devices): drop --logical_gpus."
            )
        gpus = [f"{gpus[0]} (logical {i})" for i in range(logical_gpus)]
    models = _choices(f.models, list(MODELS), "models")
    if f.scaling and not f["models"].present:
        models = ["mlp"]
    strategies = _choices(f.strategies, list(STRATEGIES), "strategies")
    if f.partition and "dpkeras_sharded" not in strategies:
        strategies.insert(
            strategies.index("dpkeras") + 1 if "dpkeras" in strategies else 0, "dpkeras_sharded"
        )
    dedup_baseline = "dlrm" in models if f.dedup_baseline is None else f.dedup_baseline
    if dedup_baseline and "dpkeras_no_dedup" not in strategies:
        strategies.insert(
            strategies.index("dpkeras") + 1 if "dpkeras" in strategies else 0, "dpkeras_no_dedup"
        )
    if "dpkeras_sharded" in strategies and f.partition < 2:
        raise app.UsageError(
            f"dpkeras_sharded needs --partition=N with N >= 2 (the most shards per weight). "
            f"Received: --partition={f.partition}"
        )
    if gpus and f.replicas is not None and f.replicas > len(gpus):
        raise app.UsageError(
            f"--replicas={f.replicas} but only {len(gpus)} GPU(s) were found: {', '.join(gpus)}."
        )
    replicas = f.replicas or (len(gpus) if gpus else DEFAULT_CPU_REPLICAS)
    if f.scaling:
        counts = sorted(set(_numbers(f.scaling_replicas, int, "scaling_replicas")))
        if gpus:
            counts = [n for n in counts if n <= len(gpus)]
        sizes = _numbers(f.scaling_sizes, float, "scaling_sizes")
    else:
        counts, sizes = [replicas], [f.size]
    config = Config(
        models=models,
        strategies=strategies,
        replica_counts=counts,
        sizes=sizes,
        steps=f.steps,
        check_steps=f.check_steps,
        warmup_steps=f.warmup_steps,
        repeats=f.repeats,
        batch_size=f.batch_size,
        scaling=f.scaling,
        out=f.out,
        pair_timeout=f.pair_timeout,
        seed=f.seed,
        parameter_device=f.parameter_device,
        devices="gpu" if gpus else "simulated",
        chart=f.chart,
        partition=f.partition,
        logical_gpus=logical_gpus,
    )
    _check_batches(config)
    return config


def _check_batches(config):
    bad = []
    for m in config.models:
        batch = config.batch_size or MODELS[m].batch_size
        for n in config.replica_counts:
            if batch % n:
                bad.append(f"{m}: batch {batch} over {n} replicas")
    if bad:
        raise app.UsageError(
            f"Keras fit needs the global batch to split evenly over the replicas; "
            f"{'; '.join(bad)}. Pass --batch_size with a multiple of "
            f"{', '.join(map(str, config.replica_counts))}."
        )


def plan(config):
    """The pairs to run, in order: per size and model, one_device first (once: it does not
    depend on the replica count), then the other strategies for each replica count."""
    pairs = []
    for size in config.sizes:
        for m in config.models:
            common = dict(
                model=m,
                size=size,
                batch_size=config.batch_size or MODELS[m].batch_size,
                steps=config.steps or MODELS[m].steps,
                check_steps=config.check_steps,
                warmup_steps=config.warmup_steps,
                repeats=config.repeats,
                seed=config.seed,
                devices=config.devices,
                logical_gpus=config.logical_gpus,
                parameter_device=config.parameter_device,
            )
            if "one_device" in config.strategies:
                base = 1 if config.scaling else config.replica_counts[0]
                pairs.append(PairSpec(strategy="one_device", replicas=base, **common))
            for n in config.replica_counts:
                for s in config.strategies:
                    if s != "one_device":
                        partition = config.partition if s == "dpkeras_sharded" else 0
                        pairs.append(
                            PairSpec(strategy=s, replicas=n, partition=partition, **common)
                        )
    return pairs


def worker_command(spec):
    """The command that runs one pair (`python -m benchmarks.worker <spec as JSON>`)."""
    return [sys.executable, "-m", "benchmarks.worker", json.dumps(dataclasses.asdict(spec))]


def _worker_env():
    env = dict(os.environ)
    root = machine.repo_root()
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env


def _last_line(text):
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1] if lines else ""


def parse_worker_output(spec, returncode, stdout, stderr):
    """The pair's record from a finished worker: its result line, or a failure record."""
    for line in reversed((stdout or "").splitlines()):
        if line.startswith(RESULT_PREFIX):
            try:
                return json.loads(line[len(RESULT_PREFIX) :])
            except json.JSONDecodeError as e:
                record = base_record(spec)
                record.update(error=f"Unreadable result line: {e}", phase="report")
                return record
    record = base_record(spec)
    last = _last_line(stderr) or "no output"
    record.update(
        error=f"worker exited with code {returncode} without a result: {last}", phase="process"
    )
    return record


def run_pair(spec, timeout, log_path=None, command=None):
    """Runs one pair in its own process and returns its record; never raises for the pair.

    Args:
        spec: `PairSpec`.
        timeout: seconds before the process is killed (then reported as failed).
        log_path: where to write the worker's stdout and stderr, or None.
        command: the command to run instead of `worker_command(spec)` (for tests).
    """
    command = command or worker_command(spec)
    start = time.perf_counter()
    try:
        proc = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=_worker_env(),
            cwd=machine.repo_root(),
        )
        record = parse_worker_output(spec, proc.returncode, proc.stdout, proc.stderr)
        stdout, stderr = proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as e:
        record = base_record(spec)
        record.update(
            error=f"TimeoutError: the pair did not finish within {timeout} s", phase="process"
        )
        stdout, stderr = _text(e.stdout), _text(e.stderr)
    record["process_seconds"] = time.perf_counter() - start
    if log_path:
        os.makedirs(os.path.dirname(log_path), exist_ok=True)
        with open(log_path, "w") as f:
            f.write(
                f"$ {' '.join(command)}\n\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}\n"
            )
    return record


def _text(data):
    if data is None:
        return ""
    return data.decode(errors="replace") if isinstance(data, bytes) else data


def progress_line(index, total, spec):
    n = spec.effective_replicas
    return (
        f"[{index:>2}/{total}] {spec.model:<11} size {spec.size:<4g} "
        f"{spec.strategy:<15} {n} replica{'s' if n != 1 else ' '}  "
    )


def progress_result(record):
    seconds = record.get("process_seconds", 0.0)
    if record["status"] != "ok":
        return (
            f"FAILED in {record.get('phase') or 'run'}: "
            f"{results.short_error(record.get('error'), 90)}  [{seconds:.0f} s]"
        )
    return (
        f"ok  {record['steps_per_sec']:7.2f} steps/s "
        f"(spread {100 * record['steps_per_sec_spread']:.0f}%)  "
        f"{record['tensors_to_replicas_per_step']:.4g} tensors, "
        f"{record['bytes_to_replicas_per_step'] / 1e6:.2f} MB to each replica/step  "
        f"loss {record['final_loss']:.5f}  [{seconds:.0f} s]"
    )


def run_all(config, pairs, log_dir, echo=print):
    """Runs `pairs` one after another, printing a progress line for each; returns records."""
    records = []
    for i, spec in enumerate(pairs, 1):
        echo(progress_line(i, len(pairs), spec), end="", flush=True)
        log = os.path.join(
            log_dir, f"{spec.model}-{spec.size:g}-{spec.strategy}-{spec.effective_replicas}.log"
        )
        record = run_pair(spec, config.pair_timeout, log)
        echo(progress_result(record), flush=True)
        records.append(record)
    return records


def command_line(argv):
    """The command that repeats this run, for the report: `python -m benchmarks.compare ...`
    (`dpkeras bench` runs this script in a process of its own, with its flags)."""
    return " ".join(["python -m benchmarks.compare"] + list(argv[1:]))


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(
            f"Unexpected arguments: {' '.join(argv[1:])}. All options are --flags; see --helpfull."
        )
    started = time.perf_counter()
    config = config_from_flags(FLAGS, machine.find_gpus())
    gpus = machine.find_gpus()
    if config.logical_gpus:
        gpus = [f"{gpus[0]} (logical {i})" for i in range(config.logical_gpus)]
    replicas = max(config.replica_counts)
    info = machine.describe(
        gpus, replicas, config.parameter_device, config.replica_counts if config.scaling else None
    )
    machine_lines = machine.lines(info)
    pairs = plan(config)
    print("\n".join(machine_lines))
    print(
        f"Running {len(pairs)} pairs ({', '.join(config.models)} x "
        f"{', '.join(config.strategies)}"
        + (
            f"; replicas {config.replica_counts}, sizes {config.sizes}"
            if config.scaling
            else f"; {replicas} replicas"
        )
        + "), one process each.\n",
        flush=True,
    )

    os.makedirs(config.out, exist_ok=True)
    records = run_all(config, pairs, os.path.join(config.out, "logs"))
    info["elapsed_seconds"] = time.perf_counter() - started
    info["command"] = command_line(sys.argv)
    report(records, config, info)
    return 0


def report(records, config, info):
    """Derives the comparisons, prints the table and targets, writes the files.

    Args:
        records: the workers' records, in run order.
        config: the run's `Config`.
        info: `machine.describe`'s dict, with `elapsed_seconds` and `command` added.

    Returns:
        The paths written.
    """
    records = results.derive(records, {m: MODELS[m].loss_tolerance for m in MODELS})
    replicas = max(config.replica_counts)
    stem = "scaling" if config.scaling else "bench"
    elapsed = info.get("elapsed_seconds", 0.0)
    targets = [] if config.scaling else results.check_targets(records)
    extra = results.scaling_tables(records) if config.scaling else []
    extra += results.lookup_tables(records)
    extra += [
        f"Loss check tolerances (relative, on the loss over the first {config.check_steps} steps):",
        "",
    ] + [
        f"- {m}: {MODELS[m].loss_tolerance:g}, {MODELS[m].tolerance_reason}" for m in config.models
    ]
    title = "dpkeras scaling run" if config.scaling else "dpkeras benchmark"
    run_line = f"Command: {info.get('command')}  ({elapsed / 60:.1f} min, {len(records)} pairs)"
    print("\n" + results.format_table(records))
    runtime = [r for r in records if r.get("runtime_size_tensors_to_replicas_per_step")]
    if runtime:
        print(
            "\n->repl MB counts tensors of a size known when the step is traced; "
            + ", ".join(
                f"{r['strategy']} ({r['model']}) also sends each replica "
                f"{r['runtime_size_tensors_to_replicas_per_step']:g} tensor(s) per step of "
                f"run-time size (a sharded lookup's rows), not counted"
                for r in runtime
            )
            + "."
        )
    lookups = results.lookup_tables(records)
    if lookups:
        print("\n" + "\n".join(lookups))
    if targets:
        print("\nTargets (dpkeras on the MLP):")
        print("\n".join(results.format_targets(targets)))
    if config.scaling:
        print("\n" + "\n".join(results.scaling_tables(records)))
    paths = list(
        results.write_results(
            records, config.out, stem, title, machine.lines(info) + [run_line], targets, extra
        )
    )
    with open(os.path.join(config.out, "machine.json"), "w") as f:
        json.dump(info, f, indent=2)
    paths.append(os.path.join(config.out, "machine.json"))
    if config.chart:
        counts = (
            f"{config.replica_counts[0]}-{replicas}"
            if len(config.replica_counts) > 1
            else str(replicas)
        )
        subtitle = f"{info['devices']} devices, {counts} replicas"
        try:
            draw = chart.scaling_chart if config.scaling else chart.comparison_chart
            paths.append(draw(records, os.path.join(config.out, f"{stem}.png"), subtitle))
        except ImportError as e:
            print(f"No chart: {e} (pip install matplotlib, or '.[bench]' in the checkout).")
    note = (
        "Simulated devices: these numbers measure overhead, not speed-up. "
        if info["devices"] == "simulated"
        else ""
    )
    print(f"\n{note}Finished in {elapsed / 60:.1f} min. Files:")
    for p in paths + [os.path.join(config.out, "logs", "")]:
        print(f"  {os.path.abspath(p)}")
    return paths


def run():
    """Entry point for `python -m benchmarks.compare` (and `dpkeras bench`, which runs it)."""
    app.run(main)


if __name__ == "__main__":
    run()
