"""`dpkeras serve`: runs one task (a ps or a worker) of a cluster, until SIGTERM or SIGINT.

```
dpkeras serve --cluster cluster.json --job ps --task 0 [--cpus 2]
dpkeras serve --cluster '{"ps": ["10.0.0.1:2222"], "worker": ["10.0.0.2:2222"]}' \
    --job worker --task 0
TF_CONFIG='{"cluster": {...}, "task": {"type": "worker", "index": 0}}' dpkeras serve
```

The task is a `tf.distribute.Server` (TensorFlow's gRPC server). It listens on its port on
every network interface and has no authentication or encryption: private networks only.
Prints `dpkeras serve: <task> listening on <address> ...` then `ready`, and exits 0 on
SIGTERM or SIGINT. A bad cluster, job or task, or a busy port, is one line on stderr and exit
status 2, before TensorFlow starts (TensorFlow would abort the process on a busy port).
"""

import argparse
import errno
import json
import os
import signal
import socket
import sys
import threading

from dpkeras.cluster import _spec

_PREFIX = "dpkeras serve"


class _UsageError(ValueError):
    """A bad argument: reported as one line on stderr, exit status 2."""


def load_cluster(text):
    """`--cluster`: a JSON object, or the path of a file holding one (`dpkeras serve`, `env`).

    Raises:
        ValueError: naming the file or the text, when it cannot be read or parsed.
    """
    try:
        return _spec.load_cluster(text, what="--cluster")
    except ValueError as e:
        raise _UsageError(str(e)) from None


def _task_from_args(args):
    """Returns `(cluster dict, job, index)` from the flags, falling back to TF_CONFIG."""
    tf_config = {}
    if args.cluster is None or args.job is None or args.task is None:
        raw = os.environ.get("TF_CONFIG", "")
        if raw.strip():
            try:
                tf_config = json.loads(raw)
            except ValueError as e:
                raise _UsageError(
                    f"TF_CONFIG is not valid JSON ({e}). Received: {raw[:200]!r}"
                ) from None
            if not isinstance(tf_config, dict):
                raise _UsageError(f"TF_CONFIG must be a JSON object. Received: {raw[:200]!r}")
    task = tf_config.get("task") if isinstance(tf_config.get("task"), dict) else {}
    cluster = load_cluster(args.cluster) if args.cluster is not None else tf_config.get("cluster")
    job = args.job if args.job is not None else task.get("type")
    index = args.task if args.task is not None else task.get("index")
    if cluster is None:
        raise _UsageError("no cluster: pass --cluster (a JSON file or string) or set TF_CONFIG.")
    if job is None or index is None:
        raise _UsageError(
            f"which task to run is unknown: pass --job and --task (or set "
            f"TF_CONFIG's task). Received: job={job!r}, task={index!r}."
        )
    return cluster, job, index


def _check_task(cluster, job, index):
    """Validates the cluster and the task; returns `(ClusterSpec, address)`."""

    try:
        spec = _spec.resolve_cluster(cluster)
    except ValueError as e:
        raise _UsageError(str(e)) from None
    if job not in ("ps", "worker"):
        raise _UsageError(
            f"--job must be 'ps' or 'worker' (the chief is the client, which "
            f"does not run `dpkeras serve`). Received: {job!r}"
        )
    if job not in spec.jobs:
        raise _UsageError(f"the cluster has no job {job!r}. Received jobs: {spec.jobs}")
    addresses = spec.job_tasks(job)
    if not isinstance(index, int) or not 0 <= index < len(addresses):
        raise _UsageError(
            f"--task must be an index of job {job!r}: 0..{len(addresses) - 1}. Received: {index!r}"
        )
    return spec, addresses[index]


def _check_port_free(address):
    """Binds the port as TensorFlow will (every interface) and releases it; raises if busy."""
    port = int(address.rsplit(":", 1)[1])
    for family, host in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
        try:
            with socket.socket(family, socket.SOCK_STREAM) as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind((host, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise _UsageError(
                    f"port {port} of {address} is already in use; stop what "
                    f"holds it or choose another port."
                ) from None
            # Any other error (no IPv6 on this machine): TensorFlow will say.


def serve(argv=None):
    """`dpkeras serve`: runs one cluster task until SIGTERM/SIGINT; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="dpkeras serve",
        description="Run one task (ps or worker) of a TensorFlow cluster for dpkeras. "
        "No authentication or encryption: private networks only.",
    )
    parser.add_argument(
        "--cluster",
        default=None,
        metavar="JSON_OR_FILE",
        help="the cluster: a JSON file path or a JSON string such as "
        '\'{"ps": ["10.0.0.1:2222"], "worker": ["10.0.0.2:2222"]}\' '
        "(default: TF_CONFIG's cluster)",
    )
    parser.add_argument(
        "--job",
        default=None,
        choices=("ps", "worker"),
        help="this task's job (default: TF_CONFIG's task type)",
    )
    parser.add_argument(
        "--task",
        type=int,
        default=None,
        metavar="INDEX",
        help="this task's index in its job (default: TF_CONFIG's task index)",
    )
    parser.add_argument(
        "--cpus",
        type=int,
        default=1,
        metavar="N",
        help="logical CPU devices of this task (default: 1; more lets one "
        "machine run several CPU replicas)",
    )
    args = parser.parse_args(argv)
    try:
        if args.cpus < 1:
            raise _UsageError(f"--cpus must be >= 1. Received: {args.cpus}")
        cluster, job, index = _task_from_args(args)
        spec, address = _check_task(cluster, job, index)
        _check_port_free(address)
    except _UsageError as e:
        print(f"{_PREFIX}: error: {e}", file=sys.stderr, flush=True)
        return 2

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    from dpkeras.cluster._spec import task_name

    workers = len(spec.job_tasks("worker"))
    # TF's multi-worker tests: fewer inter-op threads than workers + 1 "may hang" the cluster.
    config = tf.compat.v1.ConfigProto(
        device_count={"CPU": args.cpus},
        inter_op_parallelism_threads=max(os.cpu_count() or 1, workers + 1),
    )
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    tf.distribute.Server(spec, job_name=job, task_index=index, config=config, start=True)
    print(
        f"{_PREFIX}: {task_name(job, index)} listening on {address} (port "
        f"{address.rsplit(':', 1)[1]} of every interface; no authentication or encryption: "
        f"private networks only)",
        flush=True,
    )
    print("ready", flush=True)
    while not stop.wait(1.0):
        pass
    print(f"{_PREFIX}: {task_name(job, index)} stopped", flush=True)
    sys.stdout.flush()
    sys.stderr.flush()
    # TF's gRPC server cannot be stopped (Server.stop is unimplemented) and its threads can
    # block interpreter shutdown: leave at once, the status already decided.
    os._exit(0)
