r"""dpkeras beside TensorFlow's own cluster strategies, on one loopback cluster.

`benchmarks/cluster.py --peers=...` runs this. For each worker count W and model, each peer
trains in client processes of its own (`benchmarks/peer_client.py`) on the same one-pass data:

- `dpkeras`, `dpkeras_hybrid`: one client; 1 ps + W workers (`dpkeras serve`), shared by both;
- `pss`: TensorFlow's ParameterServerStrategy under tf-keras (`model.fit` through its
  `ClusterCoordinator`, asynchronous); 1 ps + W workers + this client as the chief, a cluster
  per client;
- `mwms`, `mwms_tf_keras`: MultiWorkerMirroredStrategy under Keras 3 and under tf-keras; W
  client processes (TF_CONFIG), no ps;
- the references, once per model and K: `one_process` (Keras 3), `one_process_tf_keras`.

A peer that cannot run (tf-keras not installed) or that fails is a record with `skipped` or
`error` and its reason, never an exception. Each record carries samples/s, CPU per step, bytes
per step per process, the held-out loss (and AUC) and, for the synchronous peers, how far its
weights are from its framework's one device's after the same samples.
"""

import dataclasses
import importlib.util
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from benchmarks.peer_client import FRAMEWORK
from dpkeras.cluster._local import child_options, free_ports
from dpkeras.testing import LocalCluster, server_env

PEERS = ("dpkeras", "dpkeras_hybrid", "dpkeras_baseline", "pss", "mwms", "mwms_tf_keras")
OURS = ("dpkeras", "dpkeras_hybrid", "dpkeras_baseline")  # one client on the shared cluster
REFERENCE = {"keras": "one_process", "tf_keras": "one_process_tf_keras"}
ASYNCHRONOUS = ("pss",)
TF_KERAS_MISSING = "tf-keras is not installed (pip install -e '.[peers]')"
GRACE_SECONDS = 20  # after one process of a peer fails, how long the others get to exit


@dataclasses.dataclass(frozen=True)
class Settings:
    """What every client of a run shares (the `--flags` of `benchmarks/cluster.py`)."""

    size: float = 0.25
    steps: int = 200
    repeats: int = 3
    batch: int = 256
    eval_examples: int = 16384
    timeout: float = 900.0
    out: str = "results"
    replicas: int = 2  # simulated CPU devices of `local_*` clients
    keras_rs: bool = False  # Keras 3 clients' DLRM from keras-rs (tf-keras's never is)
    warm: int = 0  # steps of the warm-up and short fits (0: 2K)
    baseline: str = ""  # `dpkeras_baseline`'s checkout (another commit's), whose dpkeras it runs


def settings_from(flags, **more):
    """`Settings` from the flags both `benchmarks/cluster.py` and `benchmarks/recsys.py` define
    (`--size`, `--steps`, `--repeats`, `--batch`, `--eval_examples`, `--client_timeout`, `--out`,
    `--keras_rs`), with `more` on top."""
    return Settings(
        size=flags.size,
        steps=flags.steps,
        repeats=flags.repeats,
        batch=flags.batch,
        eval_examples=flags.eval_examples,
        timeout=flags.client_timeout,
        out=flags.out,
        keras_rs=flags.keras_rs,
        **more,
    )


def unavailable(strategy, settings=None):
    """Why `strategy` cannot run in this environment, or None."""
    if FRAMEWORK[strategy] == "tf_keras" and importlib.util.find_spec("tf_keras") is None:
        return TF_KERAS_MISSING
    if strategy == "dpkeras_baseline":
        checkout = "" if settings is None else settings.baseline
        if not checkout or not os.path.isfile(os.path.join(checkout, "dpkeras", "__init__.py")):
            return (
                f"--baseline={checkout!r} is not a dpkeras checkout (a directory holding "
                f"dpkeras/__init__.py: `git worktree add DIR COMMIT`)"
            )
    return None


def baseline_path(checkout, directory):
    """A directory in `directory` holding only `checkout`'s `dpkeras` package (a link)."""
    path = os.path.join(directory, "baseline")
    os.makedirs(path, exist_ok=True)
    link = os.path.join(path, "dpkeras")
    if not os.path.islink(link):
        os.symlink(os.path.abspath(os.path.join(checkout, "dpkeras")), link)
    return path


def client_command(config, baseline=None):
    """The argv of one peer client; with `baseline` (a directory holding another checkout's
    `dpkeras`, `baseline_path`), put first on its path: `python -m` would put the working
    directory, perhaps this checkout, before it."""
    if baseline is None:
        return [sys.executable, "-m", "benchmarks.peer_client", json.dumps(config)]
    program = (
        "import runpy, sys; sys.path.insert(0, sys.argv.pop(1)); "
        "runpy.run_module('benchmarks.peer_client', run_name='__main__', alter_sys=True)"
    )
    return [sys.executable, "-c", program, baseline, json.dumps(config)]


def client_env(strategy, tf_config=None):
    """The environment of one peer client: tf-keras peers get TF_USE_LEGACY_KERAS=1, MWMS
    clients their TF_CONFIG."""
    env = server_env()
    env.pop("TF_CONFIG", None)
    if FRAMEWORK[strategy] == "tf_keras":
        env["TF_USE_LEGACY_KERAS"] = "1"
    else:
        env.pop("TF_USE_LEGACY_KERAS", None)
    if tf_config is not None:
        env["TF_CONFIG"] = json.dumps(tf_config)
    return env


_EXCEPTION = re.compile(r"^([A-Za-z_][\w.]*(Error|Exception|Exit)|Traceback)\b")


def error_line(stderr, limit=400):
    """The last exception a process printed (its line and what follows it, on one line; the
    middle of a long one elided), else its last non-empty line."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    starts = [i for i, line in enumerate(lines) if _EXCEPTION.match(line) and ":" in line]
    text = " ".join(lines[starts[-1] :]) if starts else (lines[-1] if lines else "")
    if len(text) > limit:
        text = f"{text[: limit // 2]} ... {text[-limit // 2 :]}"
    return text


_FRAME = re.compile(r'^\s*File "([^"]+)", line \d+, in (\S+)')


def error_frames(stderr, count=4):
    """`module.py:function` of the last `count` frames of the last traceback in `stderr`."""
    frames = [m.groups() for m in map(_FRAME.match, stderr.splitlines()) if m]
    return [f"{os.path.basename(path)}:{name}" for path, name in frames[-count:]]


def run_processes(commands, envs, timeout, grace=None):
    """Runs `commands` together; returns `[(returncode or None if killed, stdout, stderr)]`.

    When one exits with an error the others get `grace` seconds, then are killed (an MWMS
    worker waits for its peers forever; default `GRACE_SECONDS`); all are killed after
    `timeout` seconds.
    """
    grace = GRACE_SECONDS if grace is None else grace
    files = [(tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")) for _ in commands]
    procs = [
        subprocess.Popen(c, stdout=o, stderr=e, env=env, text=True, **child_options())
        for c, env, (o, e) in zip(commands, envs, files)
    ]
    deadline = time.monotonic() + timeout
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        if any(p.poll() not in (None, 0) for p in procs):
            deadline = min(deadline, time.monotonic() + grace)
        time.sleep(0.2)
    killed = set()
    for i, p in enumerate(procs):
        if p.poll() is None:
            p.kill()
            killed.add(i)
        p.wait()
    out = []
    for i, (p, (o, e)) in enumerate(zip(procs, files)):
        o.seek(0)
        e.seek(0)
        out.append((None if i in killed else p.returncode, o.read(), e.read()))
        o.close()
        e.close()
    return out


def _last_json(stdout):
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else None


def outcome(base, results):
    """The records of a peer's processes from their `(returncode, stdout, stderr)` (worker 0
    first), or one record with the first failure's message as `error`: a process that exited
    with an error before one that was killed (the others of a failed MWMS peer)."""
    failures = [(i, r) for i, r in enumerate(results) if r[0] != 0]
    if failures:
        exited = [(i, r) for i, r in failures if r[0] is not None]
        i, (code, _, stderr) = (exited or failures)[0]
        what = f"exit {code}" if code is not None else "killed (timed out, or a peer failed)"
        where = f"process {i} of {len(results)}: " if len(results) > 1 else ""
        return {
            **base,
            "error": f"{where}{error_line(stderr) or what}",
            "error_frames": error_frames(stderr),
        }
    records = [_last_json(stdout) for _, stdout, _ in results]
    missing = [i for i, r in enumerate(records) if r is None]
    if missing:
        return {**base, "error": f"process {missing[0]} printed no record"}
    return records


def merge_workers(records):
    """One MWMS record from its workers' records: worker 0's, with each worker's own CPU and
    bytes as task figures (there is no separate client)."""
    record = dict(records[0])
    record["task_cpu_ms_per_step"] = {
        f"worker:{i}": r["client_cpu_ms_per_step"] for i, r in enumerate(records)
    }
    record["wire_bytes_per_step"] = {
        f"worker:{i}": r["wire_bytes_per_step"]["client"] for i, r in enumerate(records)
    }
    record["client_cpu_ms_per_step"] = None
    return record


def base_config(strategy, model, k, workers, settings):
    """The client config every peer shares."""
    return dict(
        strategy=strategy,
        model=model,
        k=k,
        workers=workers,
        size=settings.size,
        steps=settings.steps,
        repeats=settings.repeats,
        batch=settings.batch,
        eval_examples=settings.eval_examples,
        replicas=settings.replicas,
        warm=settings.warm,
        keras_rs=settings.keras_rs and FRAMEWORK[strategy] == "keras",
        weights_out=weights_path(settings, strategy, model, k, workers),
    )


def weights_path(settings, strategy, model, k, workers):
    return os.path.join(settings.out, "peers-weights", f"{model}-{strategy}-k{k}-w{workers}.npz")


def run_peer(strategy, model, k, workers, settings, cluster=None):
    """Runs one peer (or reference: `workers` 0) and returns its record.

    `cluster`: the running `LocalCluster` of dpkeras's peers; `pss` starts its own, MWMS none.
    """
    base = dict(strategy=strategy, framework=FRAMEWORK[strategy], model=model, k=k)
    base["workers"] = workers
    reason = unavailable(strategy, settings)
    if reason:
        return {**base, "skipped": reason}
    config = base_config(strategy, model, k, workers, settings)
    os.makedirs(os.path.dirname(config["weights_out"]), exist_ok=True)
    try:
        if strategy in OURS:
            config.update(spec=cluster.spec, pids=cluster.pids())
            with tempfile.TemporaryDirectory() as directory:
                baseline = None
                if strategy == "dpkeras_baseline":
                    baseline = baseline_path(settings.baseline, directory)
                results = run_processes(
                    [client_command(config, baseline)], [client_env(strategy)], settings.timeout
                )
        elif strategy == "pss":
            with LocalCluster(ps=1, workers=workers, cpus=1, chief=True) as own, \
                    tempfile.TemporaryDirectory() as data_dir:  # fmt: skip
                config.update(spec=own.spec, pids=own.pids(), data_dir=data_dir)
                results = run_processes(
                    [client_command(config)], [client_env(strategy)], settings.timeout
                )
        elif strategy.startswith("mwms"):
            spec = {"worker": [f"127.0.0.1:{p}" for p in free_ports(workers)]}
            commands, envs = [], []
            for i in range(workers):
                mine = dict(config, task_index=i)
                if i:
                    mine["weights_out"] = None
                commands.append(client_command(mine))
                tf_config = {"cluster": spec, "task": {"type": "worker", "index": i}}
                envs.append(client_env(strategy, tf_config))
            results = run_processes(commands, envs, settings.timeout)
        else:
            results = run_processes(
                [client_command(config)], [client_env(strategy)], settings.timeout
            )
    except Exception as e:  # noqa: BLE001 - a cluster that did not start is a row, not a crash
        return {**base, "error": f"{type(e).__name__}: {e}"[:400]}
    if os.environ.get("DPKERAS_BENCH_DEBUG"):
        for _, _, stderr in results:
            print(stderr[-5000:], file=sys.stderr)
    records = outcome(base, results)
    if isinstance(records, dict):
        return records
    record = merge_workers(records) if strategy.startswith("mwms") else records[0]
    record["workers"] = workers
    record["weights_path"] = config["weights_out"]
    return record


def weight_distance(path, reference):
    """`(relative L2 distance, max absolute difference)` of two weights files, or None when
    their arrays do not match in number or shape."""
    with np.load(path) as a, np.load(reference) as b:
        xs = [a[f"arr_{i}"] for i in range(len(a.files))]
        ys = [b[f"arr_{i}"] for i in range(len(b.files))]
    if len(xs) != len(ys) or any(x.shape != y.shape for x, y in zip(xs, ys)):
        return None
    diff = np.sqrt(sum(float(np.sum((x - y) ** 2.0)) for x, y in zip(xs, ys)))
    norm = np.sqrt(sum(float(np.sum(y**2.0)) for y in ys))
    return diff / norm, max(float(np.max(np.abs(x - y))) for x, y in zip(xs, ys))


def add_distances(records, by_k=True):
    """Adds each record's `reference_loss`, `reference_auc` and (synchronous peers)
    `weights_vs_reference` from its framework's one-device record of the same model and K (any
    K with `by_k=False`: when every K was given the same data plan, `Settings.warm`)."""

    def key(r):
        return (r["model"], r["k"] if by_k else None, r["framework"])

    refs = {
        key(r): r for r in records if r["strategy"] in REFERENCE.values() and "held_out_loss" in r
    }
    for r in records:
        ref = refs.get(key(r))
        if ref is None or r is ref or "held_out_loss" not in r:
            continue
        r["reference_loss"] = ref["held_out_loss"]
        if "held_out_auc" in ref:
            r["reference_auc"] = ref["held_out_auc"]
        if r["strategy"] not in ASYNCHRONOUS and r.get("weights_path") and ref.get("weights_path"):
            try:
                r["weights_vs_reference"] = weight_distance(r["weights_path"], ref["weights_path"])
            except OSError as e:
                r["weights_vs_reference_error"] = str(e)
    return records


def run_all(workers, models, ks, peers, settings, echo=print):
    """Every reference, then every peer at every W; returns the records (with distances)."""
    records = []

    def keep(record):
        echo(json.dumps(record))
        records.append(record)

    frameworks = sorted({FRAMEWORK[p] for p in peers})
    for model in models:
        for k in ks:
            for framework in frameworks:
                keep(run_peer(REFERENCE[framework], model, k, 0, settings))
    for w in workers:
        ours = [p for p in peers if p in OURS]
        if ours:
            with LocalCluster(ps=1, workers=w, cpus=1) as cluster:
                for model in models:
                    for k in ks:
                        for peer in ours:
                            keep(run_peer(peer, model, k, w, settings, cluster))
        for model in models:
            for k in ks:
                for peer in peers:
                    if peer not in ours:
                        keep(run_peer(peer, model, k, w, settings))
    return add_distances(records)


def _kb(n):
    return f"{n / 1e3:,.1f}"


def _cpu(record):
    """`(client, ps, workers mean)` CPU ms per step, as text ("" where not measured)."""
    cpu = record["task_cpu_ms_per_step"]
    client = record.get("client_cpu_ms_per_step")
    ps = [v for t, v in cpu.items() if t.startswith("ps")]
    workers = [v for t, v in cpu.items() if t.startswith("worker")]
    return (
        "-" if client is None else f"{client:.2f}",
        "-" if not ps else ", ".join(f"{v:.1f}" for v in ps),
        "-" if not workers else f"{statistics.mean(workers):.1f}",
    )


def _bytes(record):
    """`(ps sent / received, worker mean sent + received, client sent + received)` in KB."""
    wire = record["wire_bytes_per_step"]
    ps = [v for t, v in wire.items() if t.startswith("ps")]
    workers = [sum(v) for t, v in wire.items() if t.startswith("worker")]
    client = wire.get("client")
    return (
        "-" if not ps else ", ".join(f"{_kb(v[0])} / {_kb(v[1])}" for v in ps),
        "-" if not workers else _kb(statistics.mean(workers)),
        "-" if client is None else _kb(sum(client)),
    )


def distance_cells(record):
    """How far from one device: the held-out loss beside one device's; the weights' relative
    L2 distance for synchronous peers ("async" for PSS)."""
    if "held_out_loss" not in record:
        return "", ""
    loss = f"{record['held_out_loss']:.4f}"
    if "reference_loss" in record:
        loss += f" ({record['reference_loss']:.4f})"
    if record["strategy"] in REFERENCE.values():
        return loss, "reference"
    if record["strategy"] in ASYNCHRONOUS:
        return loss, "asynchronous: n/a"
    distance = record.get("weights_vs_reference")
    return loss, "" if distance is None else f"{distance[0]:.1e}"


def shorten(text, limit=240):
    """`text`, its middle elided beyond `limit` characters (a tensor's values in a message)."""
    if len(text) <= limit:
        return text
    return f"{text[: limit * 2 // 3]} ... {text[-limit // 3 :]}"


def markdown(records, settings):
    """The peers table: one row per record, failures and skips with their reason."""
    lines = [
        f"Peers on a loopback cluster: global batch {settings.batch} (PSS: {settings.batch} a "
        f"step on one worker), model size {settings.size:g}, one pass over the data; the "
        f"DLRM from {'keras-rs (Keras 3 peers)' if settings.keras_rs else 'Keras layers'}. "
        f"samples/s: steady, from the difference of a fit of {settings.steps} + 2K steps and "
        f"one of 2K (the median of {settings.repeats} repeats); whole fit: the longer fit "
        f"from start to end, what a fit of that length gets. Held-out loss (one device's, "
        f"same framework, beside it) and AUC on {settings.eval_examples:,} held-out examples; "
        f"weights: relative L2 distance from one device's after the same samples. CPU: ms per "
        f"step (MWMS has no separate client: each worker drives itself). Bytes: the kernel's "
        f"TCP counters, KB per step.",
        "",
        "| model | peer | W | K | samples/s | whole fit | CPU client | CPU ps | CPU workers "
        "(mean) | ps KB sent / recv | worker KB (mean, sent + recv) | client KB | held-out loss "
        "(one device) | AUC | weights vs one device |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        head = f"| {r['model']} | {r['strategy']} | {r['workers']} | {r['k']} |"
        if "skipped" in r or "error" in r:
            why = f"not run: {r['skipped']}" if "skipped" in r else f"failed: {r['error']}"
            lines.append(f"{head} {shorten(why).replace('|', '/')} |" + " |" * 10)
            continue
        client, ps, workers = _cpu(r)
        ps_kb, worker_kb, client_kb = _bytes(r)
        loss, weights = distance_cells(r)
        auc = f"{r['held_out_auc']:.4f}" if "held_out_auc" in r else ""
        lines.append(
            f"{head} {r['samples_per_s']:,.0f} | {r.get('whole_fit_samples_per_s', 0):,.0f} | "
            f"{client} | {ps} | {workers} | {ps_kb} | {worker_kb} | {client_kb} | {loss} | "
            f"{auc} | {weights} |"
        )
    return "\n".join(lines) + "\n"
