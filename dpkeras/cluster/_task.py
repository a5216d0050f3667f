"""Joining a cluster: the one step (`join`) and its doors, this process's role under
`TF_CONFIG`, and serving it.

One program in every task, as TensorFlow's parameter-server guide and Kubeflow's TFJob run it:
the same script starts in every task with its `TF_CONFIG`, and `join` (called first by the
script, or by `dpkeras.scope()` / `get_strategy()`) decides:

- the client (task `chief` or `master`; with neither, worker 0) goes on and trains;
- a `ps` or other `worker` task serves (a `tf.distribute.Server`) and never returns: the
  process ends with status 0 when the client finishes, or with status 75 when the client
  stops answering (or never starts) before it finishes;
- an `evaluator` takes no part in synchronous training: it ends at once with status 0.
"""

import os
import signal
import sys
import threading
import time

import tensorflow as tf

from dpkeras import _config, _quiet
from dpkeras.cluster._client_record import FINISHED, RecordReader
from dpkeras.cluster._connect import connect_to
from dpkeras.cluster._health import probe
from dpkeras.cluster._local import port_in_use
from dpkeras.cluster._spec import Cluster, cluster_of, take_task, task_given, task_name, task_origin

CLIENT_GONE = 75  # EX_TEMPFAIL: the client went away before training finished
_PROBE_INTERVAL = 2.0
_RECORD_INTERVAL = 0.5  # seconds between reads of whether the client finished
_FIRST_PROBE_INTERVAL = 0.25
_PROBE_FAILURES = 3


def client_address(cluster_spec):
    """`(task name, "host:port")` of the client as a task of `cluster_spec` (its chief or
    master; with neither, worker 0, which leads in that layout)."""
    return Cluster(cluster_spec).client


def join(
    cluster=None, timeout=None, *, job_name=None, task_index=None, ps_hosts=None, worker_hosts=None
):
    """Joins this process to a cluster: the named step, as `keras.distribution.initialize()`.

    One program runs in every task (TensorFlow's parameter-server guide, Kubeflow's TFJob, TF1's
    between-graph scripts), and this call is where the tasks part ways:

    - the client (`chief` or `master`; with neither, worker 0; or any process given `cluster`
      explicitly without `job_name`) connects to every task, once for its lifetime, and gets
      the cluster back;
    - a `ps` or other `worker` task (under `TF_CONFIG`, or named by `job_name` and
      `task_index`) prints that it stops being a client here, serves (a
      `tf.distribute.Server`) and never returns: the process ends with status 0 when the
      client finishes, 75 when the client stops answering or never comes;
    - an `evaluator` ends at once with status 0 (dpkeras trains synchronously).

    This process's task comes from the arguments `job_name` and `task_index` (with
    `ps_hosts` and `worker_hosts`, TF1's flags, or with `cluster`, as
    `tf.distribute.Server(cluster, job_name, task_index)` takes them), else from `TF_CONFIG`.
    Given as arguments, they stand for `TF_CONFIG` in this process from then on:
    `dpkeras.scope()` and a later `join()` find them; a `TF_CONFIG` that names another
    cluster or task is an error, not overridden.

    Call it first, before anything that touches TensorFlow's devices (a `tf.data` dataset made
    before connecting cannot be used after it); calling it again is a no-op. It is the one
    step behind every door into a cluster: `dpkeras.scope()` and `dpkeras.get_strategy()` take
    it as it is (a `ps` or `worker` task serves there too); `dpkeras.cluster.connect` and a
    `dpkeras.ParameterDeviceStrategy(cluster=...)` take it as the client only, and refuse a
    task that would serve.

    ```python
    import dpkeras
    dpkeras.cluster.join()          # under TF_CONFIG: ps and workers serve from here
    with dpkeras.scope():
        ...
    ```

    TF1's flags (`--job_name=ps --task_index=0 --ps_hosts=h1:2222 --worker_hosts=h2:2222,h3:2222`,
    TensorFlow's `mnist_replica.py`), the same script in every task; worker 0 trains:

    ```python
    dpkeras.cluster.join(job_name=FLAGS.job_name, task_index=FLAGS.task_index,
                         ps_hosts=FLAGS.ps_hosts, worker_hosts=FLAGS.worker_hosts)
    with dpkeras.scope():           # worker 0 only: the others serve in join() and end
        ...
    ```

    Args:
        cluster: a dict of jobs, a JSON string or file, a `tf.train.ClusterSpec` or a cluster
            resolver; None reads `TF_CONFIG` (or `ps_hosts` and `worker_hosts`).
        timeout: float, seconds to wait for every task to answer; None: 60, or
            `$DPKERAS_CONNECT_TIMEOUT`.
        job_name: str, this process's job: "ps" or "worker" (with `cluster`, any job of it).
            None: `TF_CONFIG` says, or this process is the client.
        task_index: int (or a string of digits), this process's index in its job.
        ps_hosts: the ps tasks' "host:port" addresses, comma-separated in a string or in a
            list; None: no ps (variables on worker 0). Not with `cluster`.
        worker_hosts: the workers' addresses, likewise; needed with `job_name` unless
            `cluster` is given.

    Returns:
        The `tf.train.ClusterSpec` this process is the client of (a `Cluster`, which carries
        what dpkeras reads about it), or None when there is no cluster (no argument, no
        `TF_CONFIG` naming a `ps` or `worker` job).

    Raises:
        ValueError: for an invalid cluster; a `job_name` that is not a job of the cluster, a
            `task_index` out of range, empty hosts, `job_name`, `task_index` or `worker_hosts`
            missing; a `TF_CONFIG` or an earlier `join` naming another task. TimeoutError: a
            task that does not answer (named).
    """
    given = task_given(cluster, job_name, task_index, ps_hosts, worker_hosts)
    if given is not None:
        take_task(*given)
        cluster = None  # read as TF_CONFIG is, from here on
    joined = cluster_of(cluster)
    if joined is None:
        return None
    if joined.serves_as is not None:
        _serve_from_here(joined)
    connect_to(joined, timeout)
    return joined


def connect(cluster_spec, timeout=None):
    """Connects this process to a cluster as its client: `join`, for the client only.

    Every task is probed first, so an address that does not answer is an error naming the task
    after at most `timeout` seconds (TensorFlow's own connection waits longer and does not name
    the task). The client is job `localhost`, or its own task of the cluster (the `chief` or
    `master`; without one, worker 0 when `TF_CONFIG` says this process is worker 0). A process
    connects to one cluster for its lifetime: TensorFlow invalidates every remote variable when
    the cluster changes; connecting again to the same cluster is a no-op.

    Unlike `join`, it never serves: a process that `TF_CONFIG` makes a `ps` or other `worker`
    task (with `cluster_spec` None) is refused, naming `join`, where such a task serves.

    ```python
    dpkeras.cluster.connect({"ps": ["10.0.0.1:2222"], "worker": ["10.0.0.2:2222"]})
    ```

    Args:
        cluster_spec: the cluster, as `cluster_spec_of` takes it (a dict of jobs, a JSON string
            or file, a `tf.train.ClusterSpec` or a cluster resolver); None reads `TF_CONFIG`.
        timeout: float, seconds to wait for every task to answer. None: 60, or
            `$DPKERAS_CONNECT_TIMEOUT`.

    Raises:
        TimeoutError: if a task does not answer within `timeout`; names the task and address.
        RuntimeError: if this process is already connected to a different cluster, or holds
            TensorFlow variables made before connecting (they would read stale values after
            it); names them.
        ValueError: for an invalid cluster (see `cluster_spec_of`), no cluster at all, a
            timeout <= 0, or a process that `TF_CONFIG` makes a task other than the client.
    """
    if client_of(cluster_spec, timeout, "connect as its client") is None:
        raise ValueError("connect() needs a cluster. Received: None.")


def client_of(cluster, timeout=None, what="build a strategy"):
    """`join`, for a process that must be the cluster's client (a strategy's constructor,
    `connect`): a `ps` or `worker` task under `TF_CONFIG` is refused, naming its role and the
    step where it serves (`join`), before anything connects.

    Args:
        cluster, timeout: as `join` takes them.
        what: str, what the refused process cannot do, for the message.

    Returns:
        A `tf.train.ClusterSpec` (this process connected to it), or None.
    """
    joined = cluster_of(cluster)
    if joined is None:
        return None
    if joined.serves_as is not None:
        raise ValueError(
            f"This process is {task_name(*joined.serves_as)} of the cluster {task_origin()}, not "
            f"its client ({joined.client[0]}): it cannot {what}. Call "
            f"dpkeras.cluster.join() (or enter dpkeras.scope()) first in the script: a task "
            f"that is not the client serves from there and never returns."
        )
    return join(joined, timeout)


def _serve_from_here(cluster):
    job, index = cluster.serves_as
    name = task_name(job, index)
    if job == "evaluator":
        print(
            f"dpkeras: this task is {name}; dpkeras trains synchronously and uses no evaluator "
            f"(evaluate in the client, with validation data or callbacks): nothing to do, "
            f"ending with status 0.",
            flush=True,
        )
        _end(0)
    client = cluster.client
    print(
        f"dpkeras: this process is {name} of the cluster {task_origin()}, not its client "
        f"({client[0]}): it stops being a client here, serves, and ends with the client.",
        flush=True,
    )
    config = _config.config_in_force()
    serve(
        cluster,
        job,
        index,
        cpus=config.cpus,
        client=client,
        client_start_timeout=config.client_start_timeout,
    )


def serve(spec, job, index, cpus=1, client=None, client_start_timeout=None, prefix="dpkeras"):
    """Runs task `job`:`index` of `spec` as a `tf.distribute.Server`; ends the process.

    Ends with status 0 on SIGTERM or SIGINT, or when the client finishes training. With
    `client`, `(task name, address)`, the client is watched: the process ends with status 0
    once the client writes that it finished (`dpkeras.cluster._client_record`), with status 75
    if the client does not answer within `client_start_timeout` seconds, or stops answering
    afterwards before it finishes; each with a line saying why. (A client under `TF_CONFIG`
    ends the tasks that do not end by themselves with TensorFlow's `Abort`, status 0.)

    Args:
        spec: the `tf.train.ClusterSpec`.
        job, index: this task.
        cpus: int, logical CPU devices of the task.
        client: `(task name, "host:port")` of the client to watch, or None.
        client_start_timeout: float, seconds allowed for the client to appear.
        prefix: str, what the printed lines start with.
    """
    _quiet.filter_stderr()  # the server logs a SessionOptions dump per client (see _quiet)
    address = spec.job_tasks(job)[index]
    workers = len(spec.job_tasks("worker"))
    # TF's multi-worker tests: fewer inter-op threads than workers + 1 "may hang" the cluster.
    config = tf.compat.v1.ConfigProto(
        device_count={"CPU": cpus},
        inter_op_parallelism_threads=max(os.cpu_count() or 1, workers + 1),
    )
    stop = threading.Event()
    stopped_by = []  # the signal that stopped the task

    def on_signal(signum, _frame):
        stopped_by.append(signal.Signals(signum).name)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    name = task_name(job, index)
    try:
        tf.distribute.Server(spec, job_name=job, task_index=index, config=config, start=True)
    except tf.errors.UnknownError as e:  # TensorFlow says only "Could not start gRPC server"
        port = address.rsplit(":", 1)[1]
        why = "its port is in use by another process" if port_in_use(int(port)) else str(e).strip()
        print(
            f"{prefix}: {name} cannot listen on {address}: {why}. Stop what listens on port "
            f"{port} (`ss -ltnp 'sport = :{port}'` names it), or give this task another address "
            f"in the cluster.",
            file=sys.stderr,
            flush=True,
        )
        _end(1)
    print(
        f"{prefix}: {name} listening on {address} (port {address.rsplit(':', 1)[1]} of every "
        f"interface; no authentication or encryption: private networks only)",
        flush=True,
    )
    print("ready", flush=True)
    status = 0
    if client is not None:
        status = _watch(client, client_start_timeout, stop, prefix, name, address)
    else:
        while not stop.wait(1.0):
            pass
    if status == 0:
        print(f"{prefix}: {name} stopped by {stopped_by[0]}; ending with status 0", flush=True)
    _end(status)


def _watch(client, start_timeout, stop, prefix, name, own_address):
    """0 when stopped by a signal; `CLIENT_GONE` when the client never answers within
    `start_timeout` or stops answering. Ends the process with status 0 when the client writes
    that it finished training (its record, `dpkeras.cluster._client_record`, read from this
    task's own server)."""
    client_name, address = client
    deadline = time.monotonic() + (start_timeout or _config.DEFAULT_CLIENT_START_TIMEOUT)
    while probe(address, timeout=2.0) is not None:
        if stop.wait(_FIRST_PROBE_INTERVAL):  # often: a client that fails at once is seen
            return 0
        if time.monotonic() > deadline:
            print(
                f"{prefix}: the client {client_name} at {address} did not answer within "
                f"{start_timeout:g} s; ending {name} with status {CLIENT_GONE}.",
                file=sys.stderr,
                flush=True,
            )
            return CLIENT_GONE
    print(f"{prefix}: {name}: the client {client_name} at {address} is up", flush=True)
    reader = RecordReader(f"localhost:{own_address.rsplit(':', 1)[1]}", name)
    misses = 0
    rounds = 0
    while not stop.wait(_RECORD_INTERVAL):
        if _client_finished(reader, client_name):
            print(
                f"{prefix}: {name}: the client {client_name} finished training; ending with "
                f"status 0",
                flush=True,
            )
            _end(0)
        rounds += 1
        if rounds % round(_PROBE_INTERVAL / _RECORD_INTERVAL):
            continue
        reason = probe(address, timeout=2.0)
        misses = 0 if reason is None else misses + 1
        if misses >= _PROBE_FAILURES:
            print(
                f"{prefix}: the client {client_name} at {address} stopped answering ({reason}) "
                f"before training finished; ending {name} with status {CLIENT_GONE}.",
                file=sys.stderr,
                flush=True,
            )
            return CLIENT_GONE
    return 0


def _client_finished(reader, client_name):
    """Whether this task's record says that `client_name` finished training (a read that
    fails, or times out, says no: the probes then decide)."""
    try:
        record = reader.record()
    except Exception:  # this task's own server did not answer in time: probe as before
        return False
    return record is not None and record["client"] == client_name and record["state"] == FINISHED


def _end(status):
    sys.stdout.flush()
    _quiet.close()  # passes on what is left, flushing standard error
    sys.stderr.flush()
    # TF's gRPC server cannot be stopped (Server.stop is unimplemented) and its threads can
    # block interpreter shutdown: leave at once, the status already decided.
    os._exit(status)
