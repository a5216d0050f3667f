"""Whether a cluster's tasks answer, and naming the one that does not."""

import contextlib
import os
import re
import socket
import sys
import threading
import time

import tensorflow as tf

from dpkeras.cluster._spec import cluster_of, task_name

_TASK_OF_DEVICE = re.compile(r"/job:(\w+)/replica:0/task:(\d+)/")
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


_RESTARTED = "it was restarted and lost this client's state"


class TaskFailedError(tf.errors.UnavailableError):
    """A task of the cluster died or stopped answering while training.

    Synchronous training cannot go on without it: restart the task (`dpkeras serve` with the
    same arguments), then restart training from the last checkpoint
    (`keras.callbacks.BackupAndRestore` resumes `fit` where it stopped). A ps lost under a
    `fit` with a `BackupAndRestore` backup is waited for instead, and `fit` goes on
    (`dpkeras._patches.lost_tasks`); this is raised when it cannot (`advice` says why).

    Raised without TensorFlow's error chained to it (`raise ... from None`): a traceback ends
    with one line naming the task, not ~30 lines of gRPC details first. That error is kept as
    `tensorflow_error`.

    Attributes:
        task: str, the task's name, such as `"/job:ps/replica:0/task:1"`.
        address: str, its `host:port`.
        reason: str, why it does not serve this client (`failed_tasks`).
        tensorflow_error: the exception TensorFlow raised for the lost task (usually a
            `tf.errors.UnavailableError`, whose message holds the gRPC details), or None.
    """

    __module__ = "dpkeras"  # a traceback names it as users import it: dpkeras.TaskFailedError

    def __init__(self, task, address, reason, tensorflow_error=None, advice=None):
        self.task = task
        self.address = address
        self.reason = reason
        self.tensorflow_error = tensorflow_error
        state = "failed" if reason == _RESTARTED else "is unreachable"
        super().__init__(
            None,
            None,
            f"{task} at {address} {state} ({reason}); synchronous training cannot continue. "
            f"Restart that task if it is down, then restart training from the last checkpoint "
            f"(keras.callbacks.BackupAndRestore)." + (f" {advice}" if advice else ""),
        )


def _connected_tasks():
    """The tasks this process's TensorFlow context has devices of (empty when not connected)."""
    names = set()
    for device in tf.config.list_logical_devices():
        match = _TASK_OF_DEVICE.match(device.name)
        if match:
            names.add(task_name(*match.groups()))
    return names


def serves_this_client(task, timeout=1.0):
    """Returns None if `task` runs an op for this process's context, else why not (a string).

    A restarted task answers `probe` like a live one but no longer holds the context this
    client made at connecting: an op on it fails (TensorFlow's `AbortedError`). This runs one
    tiny op on the task's CPU and waits for its value, from a thread bounded by `timeout`
    (a frozen task would block it). It reads the task's state, never an error's text.
    """
    outcome = []

    def run():
        try:
            with tf.device(f"{task}/device:CPU:0"):
                tf.identity(tf.constant(1)).numpy()  # waits for the task's answer
            outcome.append(None)
        except tf.errors.AbortedError:
            outcome.append(_RESTARTED)
        except tf.errors.OpError as e:
            outcome.append(f"an op on it failed: {type(e).__name__}")

    thread = threading.Thread(target=run, name="dpkeras-context-probe", daemon=True)
    thread.start()
    thread.join(timeout)
    if not outcome:
        return f"no answer to an op within {timeout:g} s"
    return outcome[0]


def failed_tasks(cluster_spec, timeout=1.0):
    """Names the tasks that no longer serve this client, from their state alone.

    Every task is probed (see `probe`: a killed, unreachable or frozen task does not answer).
    When all answer and this process is connected to them, each also runs one op for this
    client (see `serves_this_client`: a restarted task answers probes but lost the client's
    context). No error message is read: an ordinary error on a healthy cluster (an id out of
    range, a shape mismatch) names no task. A task left out (`leave_out`) is not asked.

    Args:
        cluster_spec: `tf.train.ClusterSpec` (a resolved `Cluster` is read as it is).
        timeout: float, seconds allowed per probe and per op.

    Returns:
        `{task name: reason}`, in cluster order; empty if every task answers and serves.
    """
    tasks = {n: a for n, a in cluster_of(cluster_spec).remote.items() if n not in _left_out}
    dead = {}
    for name, address in tasks.items():
        reason = probe(address, timeout)
        if reason is not None:
            dead[name] = reason
    if dead:
        return dead
    connected = _connected_tasks()
    for name in tasks:
        if name in connected:
            reason = serves_this_client(name, timeout)
            if reason is not None:
                dead[name] = reason
    return dead


def name_failures(cluster_spec):
    """A context manager that turns TensorFlow's errors about a lost task into `TaskFailedError`.

    ```python
    with name_failures(spec):
        model.fit(...)   # a killed ps -> TaskFailedError("/job:ps/replica:0/task:1 at ...")
    ```

    TensorFlow's errors (`tf.errors.OpError`, and `ValueError`, which Keras's `fit` may raise
    for a lost ps) become `TaskFailedError` when a task no longer serves this client (see
    `failed_tasks`: decided from the tasks' state, never from the error's text). Anything else
    passes through as itself, such as an id out of an Embedding's range on a healthy cluster.
    The original is the error's `tensorflow_error`, not chained to it (see `TaskFailedError`).
    """
    return _NameFailures(cluster_spec)


class _NameFailures:
    def __init__(self, cluster_spec):
        self._cluster = cluster_of(cluster_spec)

    def __enter__(self):
        return self

    def __exit__(self, kind, error, traceback):
        if not isinstance(error, (tf.errors.OpError, ValueError)):
            return False
        if isinstance(error, TaskFailedError):
            return False
        dead = failed_tasks(self._cluster)
        if not dead:
            return False
        task, reason = next(iter(dead.items()))
        address = self._cluster.tasks[task]
        raise TaskFailedError(task, address, reason, tensorflow_error=error) from None


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
        self.cluster_spec = cluster_spec
        self._tasks = cluster_of(cluster_spec).remote
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
                if name in _left_out:  # training goes on without it (`leave_out`)
                    misses[name] = 0
                    continue
                reason = probe(address, self._probe_timeout)
                misses[name] = 0 if reason is None else misses[name] + 1
                if misses[name] >= self._failures and not self._stop.is_set():
                    self.failure = (name, address, reason)
                    self._on_failure(name, address, reason)
                    return
            self._stop.wait(self._interval)


_lock = threading.Lock()
_monitor = None  # the HealthMonitor `watch` started, or None
_left_out = set()  # tasks training goes on without (`leave_out`): neither watched nor named


def leave_out(task):
    """From now on `task` (a task name) is not expected to answer: training goes on without
    it (a worker lost mid-`fit`, `dpkeras._patches.lost_tasks`). The monitor does not probe it,
    and `failed_tasks` does not name it, until `take_back`."""
    _left_out.add(task)


def take_back(task):
    """`task`, left out (`leave_out`), is expected to answer again: watched and named."""
    _left_out.discard(task)


def left_out():
    """The tasks left out (`leave_out`), sorted."""
    return sorted(_left_out)


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


@contextlib.contextmanager
def paused():
    """In the block, the process's `HealthMonitor` (`watch`) probes nothing: a lost task being
    waited for (`dpkeras._patches.lost_tasks`) does not end the client. Started again after."""
    global _monitor
    with _lock:
        monitor, _monitor = _monitor, None
    if monitor is not None:
        monitor.stop()
    try:
        yield
    finally:
        if monitor is not None:
            watch(monitor.cluster_spec)


def wait_until_it_answers(address, deadline, interval=0.5):
    """Waits until the gRPC server at `address` answers (`probe`), at most until `deadline` (a
    `time.monotonic()` value). Returns None when it answers, else why not (the last probe's
    reason)."""
    while True:
        reason = probe(address, timeout=1.0)
        if reason is None or time.monotonic() >= deadline:
            return reason
        time.sleep(interval)
