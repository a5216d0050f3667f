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
SIGTERM or SIGINT. With `--exit-with-client` (the default when the task comes from TF_CONFIG,
as under Kubernetes), it also exits 0 when the client finishes training, and 75 when the client
stops answering before it finishes. `--cpus` and `--exit-with-client` fall back to their
`DPKERAS_*` variables, then their defaults (`dpkeras._config`). A bad cluster, job, task or
setting, or a busy port, is one line on stderr and exit status 2, before the server starts
(TensorFlow would abort on a busy port).
"""

import argparse
import errno
import socket
import sys

from dpkeras import _cli, _config
from dpkeras.cluster import _spec, _task

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


def _task_from_args(args, tf_config_text):
    """Returns `(cluster dict, job, index, from TF_CONFIG)` from the flags, falling back to
    TF_CONFIG (`tf_config_text`, as `dpkeras._config.Config.tf_config` holds it)."""
    tf_config = {}
    if args.cluster is None or args.job is None or args.task is None:
        tf_config = _spec.parse_tf_config(tf_config_text)[0] or {}
    task = tf_config.get("task") if isinstance(tf_config.get("task"), dict) else {}
    cluster = load_cluster(args.cluster) if args.cluster is not None else tf_config.get("cluster")
    job = args.job if args.job is not None else task.get("type")
    index = args.task if args.task is not None else task.get("index", 0 if "type" in task else None)
    if cluster is None:
        raise _UsageError("no cluster: pass --cluster (a JSON file or string) or set TF_CONFIG.")
    if job is None or index is None:
        raise _UsageError(
            f"which task to run is unknown: pass --job and --task (or set "
            f"TF_CONFIG's task). Received: job={job!r}, task={index!r}."
        )
    from_tf_config = args.cluster is None and args.job is None and args.task is None
    return cluster, job, index, from_tf_config


def _client_to_watch(spec, job, index, from_tf_config, exit_with_client):
    """`(task name, address)` of the client to end with, or None; see `--exit-with-client`
    (`exit_with_client`: the flag, else `$DPKERAS_EXIT_WITH_CLIENT`, else None)."""
    if exit_with_client is None:
        exit_with_client = from_tf_config
    leader = _spec.client_job(spec)
    if leader is None and from_tf_config and (job, index) == ("worker", 0):
        raise _UsageError(
            "this cluster has no chief or master, so worker 0 is the client: run the training "
            "script in this task (with this TF_CONFIG), not `dpkeras serve`."
        )
    if not exit_with_client:
        return None
    if leader is None and not from_tf_config:
        raise _UsageError(
            "--exit-with-client needs the client's address: name it as the cluster's 'chief' "
            "(or 'master') job. Without one the client is not a task of the cluster."
        )
    return _task.client_address(spec)


def _check_task(cluster, job, index):
    """Validates the cluster and the task; returns `(ClusterSpec, address)`."""

    try:
        spec = _spec.cluster_spec_of(cluster)
    except ValueError as e:
        raise _UsageError(str(e)) from None
    if job not in ("ps", "worker"):
        raise _UsageError(
            f"--job must be 'ps' or 'worker' (the chief or master is the client, which runs the "
            f"training script, not `dpkeras serve`). Received: {job!r}"
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
        default=None,
        metavar="N",
        help=f"logical CPU devices of this task (default: ${_config.VARIABLES['cpus']}, else "
        "1; more lets one machine run several CPU replicas)",
    )
    parser.add_argument(
        "--exit-with-client",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="end when the client (the cluster's chief or master; under TF_CONFIG without "
        "them, worker 0) finishes training (status 0), or stops answering before it finishes "
        f"(status {_task.CLIENT_GONE}) (default: ${_config.VARIABLES['exit_with_client']}, "
        "else on when the task comes from TF_CONFIG, else off)",
    )
    _cli.add_verbose_argument(parser)
    args = parser.parse_args(argv)
    try:
        if args.cpus is not None and args.cpus < 1:
            raise _UsageError(f"--cpus must be >= 1. Received: {args.cpus}")
        config = _config.config_in_force(cpus=args.cpus, exit_with_client=args.exit_with_client)
        cluster, job, index, from_tf_config = _task_from_args(args, config.tf_config)
        if job == "evaluator":
            print(
                f"{_PREFIX}: an evaluator takes no part in dpkeras's synchronous training: "
                f"nothing to serve, ending with status 0.",
                flush=True,
            )
            return 0
        spec, address = _check_task(cluster, job, index)
        client = _client_to_watch(spec, job, index, from_tf_config, config.exit_with_client)
        _check_port_free(address)
    except (_UsageError, ValueError) as e:
        print(f"{_PREFIX}: error: {e}", file=sys.stderr, flush=True)
        return 2
    _task.serve(spec, job, index, config.cpus, client, config.client_start_timeout, prefix=_PREFIX)
