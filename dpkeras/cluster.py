"""The cluster a strategy runs on: which tasks, how to reach them, and how a dead one is named.

A cluster is TensorFlow's: `ps` tasks hold variables, `worker` tasks compute, each a
`tf.distribute.Server` (started with `dpkeras serve`). This process is the client: it connects
to every task, places variables and computations on their devices, and drives every step, as in
TensorFlow's eager remote execution. An optional `chief` job names this process's own address,
which a cluster spanning several machines needs so that tasks can reach the client.

Synchronous training is fail-stop: when a task dies, the step fails and training restarts from a
checkpoint (`keras.callbacks.BackupAndRestore`). What this module adds is that the failure is
reported, naming the task, instead of a hang or a TensorFlow error that names several tasks:

- `connect` probes every task before handing the cluster to TensorFlow, so an address that
  does not answer is an error naming the task within `timeout` seconds, not a hang. It also
  turns off TensorFlow's streaming of remote requests, without which a function first run on a
  task after it died blocks forever instead of raising.
- `failed_tasks` / `name_failures` turn TensorFlow's error about a lost task (which names
  several tasks, the dead one among derived errors) into `TaskFailedError`, naming the task
  that no longer answers.
- `HealthMonitor` probes the tasks from a thread while training runs, because a step blocks
  forever when a task hangs without dying (a frozen process or machine, a network partition:
  measured on TF 2.21, nothing in TensorFlow times it out or cancels it): it reports the task
  and, by default, ends the process with a message naming it (fail-stop), so a job scheduler
  restarts it.

TensorFlow's gRPC servers have no authentication and no encryption: run a cluster on a private
network only.
"""

import json
import os
import re
import socket
import sys
import threading
import time

import tensorflow as tf

__all__ = [
    "CLUSTER_JOBS",
    "DEFAULT_CONNECT_TIMEOUT",
    "HealthMonitor",
    "TaskFailedError",
    "load_cluster",
    "watch",
    "connect",
    "connected_cluster",
    "default_cluster_devices",
    "failed_tasks",
    "name_failures",
    "probe",
    "resolve_cluster",
    "task_addresses",
    "task_devices",
    "task_name",
]

TF_CONFIG_ENV = "TF_CONFIG"
STREAMING_ENQUEUE_ENV = "TF_ENABLE_EAGER_CLIENT_STREAMING_ENQUEUE"
CLUSTER_JOBS = ("ps", "worker", "chief")
DEFAULT_CONNECT_TIMEOUT = 60.0

_ADDRESS = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(\d{1,5})$")
_TASK_IN_TEXT = re.compile(r"/job:(\w+)/replica:0/task:(\d+)")

_lock = threading.Lock()
_connected = None  # the ClusterSpec this process connected to, or None
_monitor = None  # the HealthMonitor `watch` started, or None


def task_name(job, index):
    """`("ps", 1)` -> `"/job:ps/replica:0/task:1"`, TensorFlow's name of a task."""
    return f"/job:{job}/replica:0/task:{index}"


def _normalize_job(job, tasks, source):
    """Returns the job's addresses as a list, in task order; raises for anything else."""
    if isinstance(tasks, dict):
        indices = sorted(tasks)
        if indices != list(range(len(indices))):
            raise ValueError(
                f"The tasks of job {job!r} must be numbered 0..n-1 without gaps. "
                f"Received task indices {indices} from {source}."
            )
        tasks = [tasks[i] for i in indices]
    if isinstance(tasks, str) or not isinstance(tasks, (list, tuple)):
        raise ValueError(
            f"Job {job!r} must be a list of 'host:port' addresses. "
            f"Received: {tasks!r} (of type {type(tasks).__name__}) from {source}."
        )
    if not tasks:
        raise ValueError(f"Job {job!r} has no task. Received: {job}=[] from {source}.")
    for address in tasks:
        match = _ADDRESS.match(address) if isinstance(address, str) else None
        if match is None or not 0 < int(match.group(2)) < 65536:
            raise ValueError(
                f"Every task of job {job!r} must be a 'host:port' address such as "
                f"'10.0.0.2:2222'. Received: {address!r} from {source}."
            )
    return list(tasks)


def _validate(cluster, source):
    """Checks a `{job: addresses}` mapping; returns it as a `tf.train.ClusterSpec`."""
    if not isinstance(cluster, dict) or not cluster:
        raise ValueError(
            f"A cluster must map job names to addresses, such as "
            f"{{'ps': ['10.0.0.1:2222'], 'worker': ['10.0.0.2:2222', '10.0.0.3:2222']}}. "
            f"Received: {cluster!r} from {source}."
        )
    unknown = [job for job in cluster if job not in CLUSTER_JOBS]
    if unknown:
        raise ValueError(
            f"Unknown job(s) {unknown} in the cluster from {source}; valid jobs: "
            f"{', '.join(CLUSTER_JOBS)}. Received jobs: {list(cluster)}."
        )
    if "worker" not in cluster:
        raise ValueError(
            f"A cluster must have a 'worker' job: workers run the replicas. Received jobs "
            f"{list(cluster)} from {source}."
        )
    jobs = {
        job: _normalize_job(job, cluster[job], source) for job in CLUSTER_JOBS if job in cluster
    }
    if len(jobs.get("chief", [])) > 1:
        raise ValueError(
            f"The 'chief' job is this process (the client): it has one task. Received "
            f"chief={jobs['chief']} from {source}."
        )
    seen = {}
    for job, addresses in jobs.items():
        for index, address in enumerate(addresses):
            name = task_name(job, index)
            if address in seen:
                raise ValueError(
                    f"Two tasks share the address {address}: {seen[address]} and {name} "
                    f"(from {source}). Every task needs its own port."
                )
            seen[address] = name
    return tf.train.ClusterSpec(jobs)


def _from_tf_config():
    raw = os.environ.get(TF_CONFIG_ENV)
    if raw is None or not raw.strip():
        return None
    source = f"{TF_CONFIG_ENV}={raw!r}"
    try:
        config = json.loads(raw)
    except ValueError as e:
        raise ValueError(f"{TF_CONFIG_ENV} is not valid JSON ({e}). Received: {source}.") from None
    if not isinstance(config, dict):
        raise ValueError(f"{TF_CONFIG_ENV} must be a JSON object. Received: {source}.")
    cluster = config.get("cluster")
    if not isinstance(cluster, dict) or not ({"ps", "worker"} & set(cluster)):
        return None
    task = config.get("task") or {}
    task_type = task.get("type") if isinstance(task, dict) else None
    if task_type not in (None, "chief"):
        raise ValueError(
            f"{TF_CONFIG_ENV} says this process is task {task_type!r} "
            f"(index {task.get('index')!r}), but a process that builds a model under dpkeras "
            f"is the client, task type 'chief' or no task. Start ps and worker tasks with "
            f"`dpkeras serve`, which reads {TF_CONFIG_ENV}. Received: {source}."
        )
    return _validate(cluster, source)


def load_cluster(text, what="the cluster"):
    """A cluster dict from a JSON object, or from the path of a file holding one.

    Args:
        text: str, JSON text or a file path.
        what: str, how error messages name the text (`dpkeras serve` says "--cluster").

    Raises:
        ValueError: naming the file or the text, when it cannot be read or parsed.
    """
    if text.lstrip().startswith("{"):
        source, raw = what, text
    else:
        source = f"{what} file {text!r}"
        try:
            with open(text, encoding="utf-8") as f:
                raw = f.read()
        except OSError as e:
            raise ValueError(
                f"cannot read {source}: {e.strerror}. Expected a JSON file path "
                f'or a JSON object such as \'{{"ps": ["host:2222"], '
                f'"worker": ["host:2223"]}}\'.'
            ) from None
    try:
        cluster = json.loads(raw)
    except ValueError as e:
        raise ValueError(f"{source} is not valid JSON ({e}). Received: {raw[:200]!r}") from None
    if not isinstance(cluster, dict):
        raise ValueError(
            f"{source} must hold a JSON object {{job: [addresses]}}. Received: {raw[:200]!r}"
        )
    return cluster


def resolve_cluster(cluster=None):
    """Returns the cluster to run on as a validated `tf.train.ClusterSpec`, or None.

    Jobs: `worker` (required: workers run the replicas), `ps` (optional: the tasks that hold
    variables; without it they live on the first worker) and `chief` (optional, one task: this
    process's own address, needed when the tasks run on other machines, since they send results
    back to the client). A cluster with `ps` only is refused: list the machine that computes as
    a worker.

    ```python
    spec = resolve_cluster({"ps": ["10.0.0.1:2222"],
                            "worker": ["10.0.0.2:2222", "10.0.0.3:2222"]})
    ```

    Args:
        cluster: a dict `{job: ["host:port", ...]}`, the same as JSON text or the path of a
            JSON file, a `tf.train.ClusterSpec`, a
            `tf.distribute.cluster_resolver.ClusterResolver`, or None. Defaults to None: the
            cluster of the `TF_CONFIG` environment variable if it names a `ps` or `worker` job
            (this process must then be task type `chief` or have no task), else no cluster.

    Returns:
        A `tf.train.ClusterSpec` with jobs listed as task-ordered address lists, or None when
        there is no cluster.

    Raises:
        ValueError: for an unknown job, a missing `worker` job, an empty job, an address that
            is not `host:port`, two tasks on one address, more than one chief, unparseable
            `TF_CONFIG`, or a `TF_CONFIG` naming this process as a ps or worker task.
    """
    if cluster is None:
        return _from_tf_config()
    source = "the cluster argument"
    if isinstance(cluster, str):
        source = f"the cluster argument {cluster[:100]!r}"
        cluster = load_cluster(cluster)
    if isinstance(cluster, tf.distribute.cluster_resolver.ClusterResolver):
        source = f"the cluster resolver {type(cluster).__name__}"
        cluster = cluster.cluster_spec()
        if not cluster.jobs:
            raise ValueError(f"{source} names no job; a cluster needs a 'worker' job.")
    if isinstance(cluster, tf.train.ClusterSpec):
        cluster = cluster.as_dict()
    elif not isinstance(cluster, dict):
        raise ValueError(
            f"A cluster must be a dict {{job: ['host:port', ...]}}, a tf.train.ClusterSpec or "
            f"a tf.distribute.cluster_resolver.ClusterResolver. Received: {cluster!r} "
            f"(of type {type(cluster).__name__})."
        )
    return _validate(cluster, source)


def task_addresses(cluster_spec):
    """`{task name: "host:port"}` for every task of the cluster, in job order (ps, worker)."""
    return {
        task_name(job, i): address
        for job in cluster_spec.jobs
        for i, address in enumerate(cluster_spec.job_tasks(job))
    }


def _remote_tasks(cluster_spec):
    """The tasks this process connects to (every task but the chief, which it is)."""
    return {
        name: address
        for name, address in task_addresses(cluster_spec).items()
        if not name.startswith("/job:chief/")
    }


# An HTTP/2 client preface and an empty SETTINGS frame: a gRPC server answers with its own
# SETTINGS frame. The kernel accepts TCP connections for a process that is frozen, so a bare
# connect cannot tell a hung task from a live one; this exchange needs the server to run.
_HTTP2_HELLO = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])


def probe(address, timeout=1.0):
    """Returns None if the gRPC server at `address` answers, else why not (a string).

    Opens a TCP connection and exchanges HTTP/2 greetings (gRPC runs on HTTP/2), so a killed
    server (connection refused), an unreachable machine (timeout) and a frozen process (no
    answer: the kernel accepts, the server does not reply) all count as not answering.

    Args:
        address: str, `"host:port"`.
        timeout: float, seconds allowed for the connection and for the answer.
    """
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(_HTTP2_HELLO)
            if not sock.recv(9):
                return "it closed the connection without answering"
            return None
    except TimeoutError:
        return f"no answer within {timeout:g} s"
    except OSError as e:
        return e.strerror or type(e).__name__


def _wait_for(tasks, timeout):
    """Waits until every `{name: address}` answers; raises TimeoutError naming the first not."""
    deadline = time.monotonic() + timeout
    pending = dict(tasks)
    while True:
        why = {}
        for name, address in list(pending.items()):
            reason = probe(address, timeout=max(0.1, min(2.0, deadline - time.monotonic())))
            if reason is None:
                del pending[name]
            else:
                why[name] = reason
        if not pending:
            return
        if time.monotonic() >= deadline:
            name = next(iter(pending))
            others = f" (and {len(pending) - 1} more)" if len(pending) > 1 else ""
            raise TimeoutError(
                f"{name} at {pending[name]} did not answer within {timeout:g} s "
                f"({why[name]}){others}. Start it with `dpkeras serve --cluster ... "
                f"--job {name.split('/')[1][4:]} --task {name.rsplit(':', 1)[1]}`, or check "
                f"the address and the firewall."
            )
        time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))


def connected_cluster():
    """The `tf.train.ClusterSpec` this process connected to with `connect`, or None."""
    return _connected


def connect(cluster_spec, timeout=DEFAULT_CONNECT_TIMEOUT):
    """Connects this process to a cluster as its client; a no-op if already connected to it.

    Every task is probed first (see `probe`), so an address that does not answer is an error naming
    the task after at most `timeout` seconds (TensorFlow's own connection waits longer and
    does not name the task). The client is job `localhost`, or the `chief` task if the cluster
    names one. A process connects to one cluster for its lifetime: TensorFlow invalidates
    every remote variable when the cluster changes.

    Args:
        cluster_spec: `tf.train.ClusterSpec`, as returned by `resolve_cluster`.
        timeout: float, seconds to wait for every task to answer. Defaults to 60.

    Raises:
        TimeoutError: if a task does not answer within `timeout`; names the task and address.
        RuntimeError: if this process is already connected to a different cluster.
        ValueError: for an invalid cluster (see `resolve_cluster`) or a timeout <= 0.
    """
    global _connected
    cluster_spec = resolve_cluster(cluster_spec)
    if cluster_spec is None:
        raise ValueError("connect() needs a cluster. Received: None.")
    if not isinstance(timeout, (int, float)) or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds. Received: {timeout!r}")
    with _lock:
        if _connected is not None:
            if _connected.as_dict() == cluster_spec.as_dict():
                return
            raise RuntimeError(
                f"This process is already connected to the cluster {_connected.as_dict()}; a "
                f"process connects to one cluster for its lifetime (TensorFlow invalidates "
                f"remote variables on a change). Received: {cluster_spec.as_dict()}. Use a "
                f"new process for another cluster."
            )
        _wait_for(_remote_tasks(cluster_spec), timeout)
        # Without this, a function first run on a task after it died blocks forever on TF 2.21
        # (measured: > 120 s); with it, it raises UnavailableError at once (0.01 s). TF's
        # ParameterServerStrategy sets it the same way. Read when TF makes its remote clients,
        # so setting it here works even after TF initialised.
        os.environ.setdefault(STREAMING_ENQUEUE_ENV, "False")
        job = "chief" if "chief" in cluster_spec.jobs else "localhost"
        tf.config.experimental_connect_to_cluster(cluster_spec, job_name=job, task_index=0)
        _connected = cluster_spec


def task_devices(cluster_spec):
    """`{task name: [device names]}` of the remote tasks, as TensorFlow lists them.

    Call after `connect`: `tf.config.list_logical_devices()` then lists every remote device
    with its full name, such as `/job:ps/replica:0/task:0/device:CPU:0`.
    """
    names = [d.name for d in tf.config.list_logical_devices()]
    return {
        task: [n for n in names if n.startswith(task + "/")] for task in _remote_tasks(cluster_spec)
    }


def _device_kind(name):
    return name.rsplit("/device:", 1)[1].split(":")[0]


def default_cluster_devices(cluster_spec):
    """The compute and parameter devices used on a cluster when none are given, and why.

    Compute: every GPU of every worker task; with no GPU on the workers, every CPU device of
    every worker (except the parameter device). Parameters: the CPU:0 of every ps task; with no
    ps job, the CPU:0 of the first worker.

    Args:
        cluster_spec: `tf.train.ClusterSpec` this process is connected to.

    Returns:
        `(compute_devices, parameter_devices, reason)`: lists of full device names and a
        sentence saying why.

    Raises:
        RuntimeError: if a task lists no device (this process is not connected to it).
    """
    devices = task_devices(cluster_spec)
    empty = [task for task, names in devices.items() if not names]
    if empty:
        raise RuntimeError(
            f"No device of {', '.join(empty)} is known to this process; connect to the cluster "
            f"first (dpkeras.cluster.connect). Known devices: "
            f"{[d.name for d in tf.config.list_logical_devices()]}."
        )
    workers = [t for t in devices if t.startswith("/job:worker/")]
    ps = [t for t in devices if t.startswith("/job:ps/")]
    if ps:
        parameter = [f"{t}/device:CPU:0" for t in ps]
        where = f"the CPU:0 of each of the {len(ps)} ps task(s)"
    else:
        parameter = [f"{workers[0]}/device:CPU:0"]
        where = f"no ps job: the CPU:0 of the first worker, {workers[0]}"
    gpus = [d for t in workers for d in devices[t] if _device_kind(d) == "GPU"]
    if gpus:
        return (
            gpus,
            parameter,
            (
                f"compute on all {len(gpus)} GPU(s) of the {len(workers)} "
                f"worker(s); variables on {where}"
            ),
        )
    cpus = [
        d for t in workers for d in devices[t] if _device_kind(d) == "CPU" and d not in parameter
    ]
    if not cpus:  # a single worker with a single CPU and no ps: it does both
        cpus = list(parameter)
    return (
        cpus,
        parameter,
        (
            f"no GPU on the workers: compute on {len(cpus)} CPU device(s) of "
            f"the {len(workers)} worker(s); variables on {where}"
        ),
    )


_RESTARTED = "it was restarted and lost this client's state"
_NAMED = "named by TensorFlow's error"
_NAMED_REASONS = (_RESTARTED, _NAMED)


class TaskFailedError(tf.errors.UnavailableError):
    """A task of the cluster died or stopped answering while training.

    Synchronous training cannot go on without it: restart the task (`dpkeras serve` with the
    same arguments), then restart training from the last checkpoint
    (`keras.callbacks.BackupAndRestore` resumes `fit` where it stopped).

    Attributes:
        task: str, the task's name, such as `"/job:ps/replica:0/task:1"`.
        address: str, its `host:port`.
    """

    def __init__(self, task, address, reason):
        self.task = task
        self.address = address
        state = "failed" if reason in _NAMED_REASONS else "is unreachable"
        super().__init__(
            None,
            None,
            f"{task} at {address} {state} ({reason}); synchronous training cannot continue. "
            f"Restart that task if it is down, then restart training from the last checkpoint "
            f"(keras.callbacks.BackupAndRestore).",
        )


def failed_tasks(cluster_spec, error=None, timeout=1.0):
    """Names the tasks that no longer answer, probing every task (see `probe`).

    Args:
        cluster_spec: `tf.train.ClusterSpec`.
        error: optional exception TensorFlow raised; when no port refuses, the tasks it names as
            a remote target are returned instead, with the reason "named by TensorFlow's
            error", or "it was restarted and lost this client's state" when TensorFlow says
            the task no longer knows this client (a restarted task answers probes).
        timeout: float, seconds allowed per probe.

    Returns:
        `{task name: reason}`, in cluster order; empty if every task answers and the error names
        none.
    """
    tasks = _remote_tasks(cluster_spec)
    dead = {}
    for name, address in tasks.items():
        reason = probe(address, timeout)
        if reason is not None:
            dead[name] = reason
    if dead or error is None:
        return dead
    text = str(error)
    for job, index in _TASK_IN_TEXT.findall(text):
        name = task_name(job, index)
        if name in tasks and name not in dead and f"remote target {name}" in text:
            dead[name] = _RESTARTED if "Unable to find a context_id" in text else _NAMED
    return dead


def name_failures(cluster_spec):
    """A context manager that turns TensorFlow's errors about a lost task into `TaskFailedError`.

    ```python
    with name_failures(spec):
        model.fit(...)   # a killed ps -> TaskFailedError("/job:ps/replica:0/task:1 at ...")
    ```

    TensorFlow's errors (`tf.errors.OpError`, and a `ValueError` carrying a gRPC error) are
    translated when a task no longer answers, or when every task answers but a gRPC error names
    a remote target; anything else passes through. The original is the `__cause__`.
    """
    return _NameFailures(cluster_spec)


def _may_be_task_failure(error):
    """Whether `error` can come from a lost task: any TF op error, or a ValueError carrying a
    gRPC error (with streaming enqueue on, TF 2.21 raises a lost ps inside Keras `fit` as
    ValueError "... Additional GRPC error information from remote target ...")."""
    if isinstance(error, tf.errors.OpError):
        return True
    return isinstance(error, ValueError) and "GRPC" in str(error)


class _NameFailures:
    def __init__(self, cluster_spec):
        self._spec = cluster_spec

    def __enter__(self):
        return self

    def __exit__(self, kind, error, traceback):
        if error is None or isinstance(error, TaskFailedError) or not _may_be_task_failure(error):
            return False
        grpc = isinstance(error, tf.errors.UnavailableError) or "GRPC" in str(error)
        dead = failed_tasks(self._spec, error if grpc else None)
        if not dead:
            return False
        task, reason = next(iter(dead.items()))
        raise TaskFailedError(task, task_addresses(self._spec)[task], reason) from error


def _exit_process(task, address, reason):
    print(
        f"dpkeras: {task} at {address} is unreachable ({reason}); synchronous training cannot "
        f"continue, ending this process (exit code 75) instead of waiting forever. Restart "
        f"that task if it is down, then restart training from the last checkpoint "
        f"(keras.callbacks.BackupAndRestore).",
        file=sys.stderr,
        flush=True,
    )
    os._exit(75)


class HealthMonitor:
    """Probes every task of a cluster from a thread and acts when one stops answering.

    TensorFlow reports a killed task at once (`UnavailableError`, see `name_failures`), but a
    task that hangs without dying (a frozen process or machine, a network partition) blocks the
    step forever, and nothing public cancels a running step. The monitor probes each task every
    `interval` seconds; after `failures` probes in a row fail for one task, it calls
    `on_failure(task, address, reason)` once and stops. The default action prints a line naming
    the task on stderr and ends the process with exit code 75 (`EX_TEMPFAIL`): synchronous
    training is fail-stop, and a job scheduler restarting the client resumes from the last
    checkpoint.

    ```python
    with HealthMonitor(spec):
        model.fit(...)
    ```

    Args:
        cluster_spec: `tf.train.ClusterSpec` of the tasks to watch.
        interval: float, seconds between rounds of probes. Defaults to 2.
        failures: int, consecutive failed probes of a task before it counts as dead.
            Defaults to 3.
        on_failure: callable `(task, address, reason)`, or None for the default (end the
            process). Runs on the monitor's thread.
        probe_timeout: float, seconds allowed per probe. Defaults to 2.

    Attributes:
        failure: `(task, address, reason)` of the first dead task seen, or None.
    """

    def __init__(self, cluster_spec, interval=2.0, failures=3, on_failure=None, probe_timeout=2.0):
        if not isinstance(failures, int) or failures < 1:
            raise ValueError(f"failures must be an int >= 1. Received: {failures!r}")
        for label, value in (("interval", interval), ("probe_timeout", probe_timeout)):
            if not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(
                    f"{label} must be a positive number of seconds. Received: {value!r}"
                )
        self._tasks = _remote_tasks(cluster_spec)
        self._interval = interval
        self._failures = failures
        self._on_failure = on_failure or _exit_process
        self._probe_timeout = probe_timeout
        self._stop = threading.Event()
        self._thread = None
        self.failure = None

    def start(self):
        """Starts probing (a daemon thread); returns self."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="dpkeras-health-monitor", daemon=True
            )
            self._thread.start()
        return self

    def stop(self):
        """Stops probing and waits for the thread (at most one probe round)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False

    def _run(self):
        misses = dict.fromkeys(self._tasks, 0)
        while not self._stop.is_set():
            for name, address in self._tasks.items():
                reason = probe(address, self._probe_timeout)
                misses[name] = 0 if reason is None else misses[name] + 1
                if misses[name] >= self._failures and not self._stop.is_set():
                    self.failure = (name, address, reason)
                    self._on_failure(name, address, reason)
                    return
            self._stop.wait(self._interval)


def watch(cluster_spec):
    """Starts, once per process, a `HealthMonitor` of `cluster_spec` with the default action.

    A dpkeras strategy on a cluster calls it, so that a task that hangs ends the client with a
    message naming it instead of blocking a step forever. Idempotent.
    """
    global _monitor
    with _lock:
        if _monitor is None:
            _monitor = HealthMonitor(cluster_spec).start()
        return _monitor
