"""Connecting this process to a cluster as its client: the mechanics under `join`."""

import atexit
import gc
import os
import sys
import threading
import time
import weakref

import tensorflow as tf

from dpkeras import _config, _quiet, _tf_internals
from dpkeras.cluster import _health, _loop
from dpkeras.cluster._client_record import claim, finish, own_record, reserve
from dpkeras.cluster._health import probe
from dpkeras.cluster._local import free_port, port_in_use
from dpkeras.cluster._spec import task_name

STREAMING_ENQUEUE_ENV = "TF_ENABLE_EAGER_CLIENT_STREAMING_ENQUEUE"
DEFAULT_CONNECT_TIMEOUT = _config.DEFAULT_CONNECT_TIMEOUT
_FIRST_WORD = 2.0  # seconds of silence before the client names the tasks it waits for
_FINISH_WAIT = 5.0  # seconds the tasks get, at the client's exit, to hear it and to end
_lock = threading.Lock()
_connected = None  # the ClusterSpec this process connected to, or None
_record = None  # this client's record on each task (`_client_record`), once connected
_whole = None  # the server definition of connecting, with every task (`leave_out`)
# The tf.data datasets alive when this process connected as a task of the cluster (the chief,
# or worker 0): each sits on a device that connecting renamed (/job:localhost/... became the
# task's), and fails where it is used ("unknown device [Op:DatasetToGraphV2]"). A client that
# connects as /job:localhost keeps its devices' names, and its datasets work.
_made_before = weakref.WeakSet()


def _say(text):
    print(f"dpkeras: {text}", file=sys.stderr, flush=True)


def _wait_for(tasks, timeout):
    """Waits until every `{name: address}` answers; raises TimeoutError naming each that did
    not. After a moment of silence it names each task it waits for, and each that answers."""
    start = time.monotonic()
    deadline = start + timeout
    pending = dict(tasks)
    named = set()
    while True:
        why = {}
        for name, address in list(pending.items()):
            reason = probe(address, timeout=max(0.1, min(2.0, deadline - time.monotonic())))
            if reason is None:
                del pending[name]
            else:
                why[name] = reason
        for name in sorted(named - set(pending)):
            _say(f"{name} at {tasks[name]} answered")
            named.discard(name)
        if not pending:
            return
        now = time.monotonic()
        if now >= deadline:
            missing = "; ".join(
                f"{name} at {address} ({why[name]}): start it with `dpkeras serve --cluster ... "
                f"--job {name.split('/')[1][4:]} --task {name.rsplit(':', 1)[1]}`"
                for name, address in pending.items()
            )
            raise TimeoutError(
                f"{len(pending)} of the cluster's {len(tasks)} tasks did not answer within "
                f"{timeout:g} s: {missing}. Or check the addresses and the firewall; "
                f"${_config.VARIABLES['connect_timeout']} sets the wait."
            )
        if now - start >= _FIRST_WORD:
            for name in [n for n in pending if n not in named]:
                _say(
                    f"waiting for {name} at {pending[name]} ({why[name]}); up to "
                    f"{deadline - now:.0f} s more (${_config.VARIABLES['connect_timeout']})"
                )
                named.add(name)
        time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))


def _variables_alive():
    """Names of the TensorFlow variables alive in this process (Keras paths where known)."""
    import keras  # only to name variables by their Keras path

    gc.collect()
    objects = gc.get_objects()
    paths = {
        id(v.value): v.path
        for v in objects
        if isinstance(v, keras.Variable) and isinstance(getattr(v, "value", None), tf.Variable)
    }
    return [paths.get(id(v), v.name) for v in objects if isinstance(v, tf.Variable)]


def _refuse_variables_made_before(cluster_spec):
    alive = _variables_alive()
    if alive:
        shown = ", ".join(repr(name) for name in alive[:5])
        more = f" and {len(alive) - 5} more" if len(alive) > 5 else ""
        raise RuntimeError(
            f"Cannot connect to the cluster {cluster_spec.as_dict()}: this process already "
            f"holds {len(alive)} TensorFlow variable(s) ({shown}{more}). Connecting resets "
            f"TensorFlow's eager context: a model built before it keeps running afterwards "
            f"but reads stale values (its next fit repeats its losses, evaluate is off). "
            f"Connect first: enter dpkeras.scope(cluster=...) (or call "
            f"dpkeras.cluster.connect) before building any model, or delete those models "
            f"(del model) before connecting."
        )


def _remember_datasets_made_before():
    _made_before.update(o for o in gc.get_objects() if isinstance(o, tf.data.Dataset))


def refuse_datasets_made_before(dataset, what="The dataset"):
    """Raises ValueError, naming `dataset` and the fix, when it (or a dataset it reads) was
    made before this process connected to its cluster as one of its tasks.

    A tf.data pipeline sits on the device it was made on, and connecting as the chief (or
    worker 0) renames this process's devices: used afterwards it fails with TensorFlow's
    "/job:localhost/... unknown device [Op:DatasetToGraphV2]". Checked where a strategy
    distributes a dataset.
    """
    if not _made_before:
        return
    for current in _tf_internals.pipeline(dataset):
        if current in _made_before:
            shown = "" if current is dataset else f", which reads {type(current).__name__}"
            raise ValueError(
                f"{what} {type(dataset).__name__} (element_spec {dataset.element_spec}"
                f"{shown}) was made before this process joined its cluster as its "
                f"{_connected.own[0]} task. Joining renamed this process's devices, and a "
                f"tf.data pipeline stays on the device it was made on. Make the "
                f"dataset after joining: call dpkeras.cluster.join() first in the script "
                f"(before any tf.data code; under TF_CONFIG every task runs the top of the "
                f"script, and join() is where the ps and workers stop), or build it after "
                f"entering dpkeras.scope(cluster=...)."
            )


def connected_cluster():
    """The `tf.train.ClusterSpec` this process connected to with `connect`, or None."""
    return _connected


def connect_to(cluster, timeout=None):
    """Connects this process to `cluster` (a `dpkeras.cluster._spec.Cluster`) as its client; a
    no-op if already connected to it. Called by `dpkeras.cluster.join` alone, the one step
    (see `dpkeras.cluster.connect` for what connecting does and raises)."""
    global _connected, _record
    if timeout is None:
        timeout = _config.setting("connect_timeout").value
    if not isinstance(timeout, (int, float)) or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds. Received: {timeout!r}")
    with _lock:
        if _connected is not None:
            if _connected.as_dict() == cluster.as_dict():
                return
            raise RuntimeError(
                f"This process is already connected to the cluster {_connected.as_dict()}; a "
                f"process connects to one cluster for its lifetime (TensorFlow invalidates "
                f"remote variables on a change). Received: {cluster.as_dict()}. Use a "
                f"new process for another cluster."
            )
        _wait_for(cluster.remote, timeout)
        own = cluster.own
        if own is None:  # the client's own server (TensorFlow would pick a port the same way)
            address = f"localhost:{free_port()}"
        else:
            address = cluster.tasks[task_name(*own)]
        record = own_record(cluster, address)
        if own is not None and own[0] == "worker":  # worker 0 leads: its devices compute
            _split_local_cpu()  # before TensorFlow starts (reserving builds a graph: it does)
        # Before anything reaches the tasks: of two clients starting at once, one holds them.
        reservation = reserve(cluster, record, timeout)
        try:
            _refuse_own_address_in_use(cluster)
            _refuse_variables_made_before(cluster)
            if own is not None:  # this process's devices are renamed /job:localhost -> own task
                _remember_datasets_made_before()
            # Without this, a function first run on a task after it died blocks forever on TF
            # 2.21 (measured: > 120 s); with it, it raises UnavailableError at once (0.01 s).
            # TF's ParameterServerStrategy sets it the same way. Read when TF makes its remote
            # clients, so setting it here works even after TF initialised.
            os.environ.setdefault(STREAMING_ENQUEUE_ENV, "False")
            # A task that dies mid-step makes TensorFlow log its error again, with gRPC details,
            # as warnings before TaskFailedError names the task: hidden unless $DPKERAS_VERBOSE.
            _quiet.filter_client_stderr()
            # TensorFlow logs its default session config at INFO: ~20 lines under absl's app.run.
            with _quiet.tensorflow_info_dropped():
                if own is None:
                    spec = tf.train.ClusterSpec({**cluster.as_dict(), "localhost": [address]})
                    tf.config.experimental_connect_to_cluster(spec, job_name="localhost")
                else:
                    tf.config.experimental_connect_to_cluster(
                        cluster, job_name=own[0], task_index=own[1]
                    )
        except BaseException:
            reservation.release()
            raise
        _connected = cluster
        atexit.register(_quiet_teardown)  # registered first, so it runs last
        _record = record
        claim(cluster, record)
        atexit.register(_at_exit, cluster, record)


def reconnect_to_restarted(task):
    """After `task` of the connected cluster restarted: connects this client to it again (its
    state on every other task kept: `_tf_internals.reconnect_restarted_tasks`) and writes this
    client's record on it again (`_client_record.claim`), so that it is known to serve this
    client, as at connecting."""
    with _lock:
        if _connected is None:
            raise RuntimeError("This process is not connected to a cluster.")
        _tf_internals.reconnect_restarted_tasks()
        claim(_connected, _record, only=task)
    _wait_until_reached(task)


def leave_out(task):
    """Drops `task` (a task of the connected cluster, lost) from this client's connection,
    keeping its state on every other task: functions made afterwards are not sent to it, and
    nothing waits for it. Its devices are no longer listed. `take_back` adds it again."""
    global _whole
    with _lock:
        if _connected is None:
            raise RuntimeError("This process is not connected to a cluster.")
        if _whole is None:
            _whole = _tf_internals.server_def()
        _tf_internals.connect_with(_without(_whole, _health.left_out() + [task]))
        _health.leave_out(task)


def take_back(task):
    """Connects this client again to `task`, left out (`leave_out`) and answering again at its
    address (restarted), and writes this client's record on it (`_client_record.claim`)."""
    with _lock:
        if _connected is None or _whole is None:
            raise RuntimeError(f"{task} was not left out of this client's cluster.")
        rest = [name for name in _health.left_out() if name != task]
        _tf_internals.connect_with(_without(_whole, rest))
        _health.take_back(task)
        claim(_connected, _record, only=task)
    _wait_until_reached(task)


def _wait_until_reached(task):
    """Waits until every other task this client runs functions on reaches `task`, connected
    again after its restart, both ways, as a step does: worker 0, which coordinates each step,
    sends it a function; each task receives a tensor from it and it one from each.

    Its address answering this client does not mean the others reach it: a task that tried to
    reach it while it was down backs off (gRPC waits up to two minutes between attempts,
    growing with each failure) and, until its next attempt, fails every call to it at once
    ("failed to connect to all addresses; ... Connection refused"). Bounded by
    `$DPKERAS_TASK_RESTART_TIMEOUT`.

    Raises:
        tf.errors.UnavailableError: if a task still cannot reach `task` when the time is up.
    """
    others = [
        name for name in _connected.training if name != task and name not in _health.left_out()
    ]
    if not others:
        return
    coordinator = _loop.loop_device(None)

    @tf.function
    def round_trip(x):
        with tf.device(f"{task}/device:CPU:0"):
            there = x + 1.0
        sums = []
        for name in others:
            with tf.device(f"{name}/device:CPU:0"):
                here = there + 1.0
            with tf.device(f"{task}/device:CPU:0"):
                sums.append(here + 1.0)
        return tf.add_n(sums)

    deadline = time.monotonic() + _config.setting("task_restart_timeout").value
    while True:
        try:
            with tf.device(coordinator):
                round_trip(tf.constant(0.0)).numpy()
            return
        except tf.errors.UnavailableError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.5)


def _without(definition, tasks):
    """A copy of server definition `definition` whose cluster lacks `tasks` (task names)."""
    left = type(definition)()
    left.CopyFrom(definition)
    for name in tasks:
        task = tf.DeviceSpec.from_string(name)
        for job in left.cluster.job:
            if job.name == task.job and task.task in job.tasks:
                del job.tasks[task.task]
    return left


def _refuse_own_address_in_use(cluster):
    """A client that is a task of the cluster (the chief) listens on its address: refuses, in
    one line, when something on this machine holds its port (TensorFlow would fail with "Could
    not start gRPC server"), naming another client of the cluster when a gRPC server answers."""
    if cluster.own is None:
        return
    name = task_name(*cluster.own)
    address = cluster.tasks[name]
    port = int(address.rsplit(":", 1)[1])
    if not port_in_use(port):
        return
    host = address.rsplit(":", 1)[0]
    what = "another process"
    if probe(f"{host}:{port}" if host not in ("", "0.0.0.0") else f"localhost:{port}") is None:
        what = "a gRPC server, likely another client of this cluster already running as " + name
    raise RuntimeError(
        f"Cannot connect as the cluster's client {name} at {address}: its port {port} is in "
        f"use on this machine by {what}. Wait for that client to finish or stop it (`ss -ltnp "
        f"'sport = :{port}'` names it), then start this one again; or give the client another "
        f"address in the cluster."
    )


def _split_local_cpu():
    """Splits this process's CPU into `$DPKERAS_CPUS` logical devices, when set, before
    TensorFlow initialises (a worker 0 that leads computes on its own devices)."""
    cpus = _config.setting("cpus")
    if cpus.source == "default" or _tf_internals.context_initialized():
        return
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(cpus.value)]
    )


def _at_exit(cluster, record):
    """At the exit of a connected client that did not die of an uncaught exception: tells every
    task that it finished (`_client_record.finish`: each prints it), and ends the tasks when it is
    their task of `TF_CONFIG`. Bounded: a task that does not answer is not waited for."""
    if getattr(sys, "last_value", None) is not None:  # an uncaught exception ends the client
        return  # the tasks see it gone, and end with a status of their own (`_task`)
    worker = threading.Thread(target=finish, args=(cluster, record), daemon=True)
    worker.start()
    worker.join(_FINISH_WAIT)
    if cluster.ends_tasks:
        _release_tasks(cluster)


def _release_tasks(cluster):
    """At the exit of a client started as a task of `TF_CONFIG` (one program in every task):
    ends every other task with status 0, so that no ps or worker outlives the job.

    A task that watches this client ends by itself once it reads that the client finished
    (`dpkeras.cluster._task`), saying so; the others that still answer after `_FINISH_WAIT`
    seconds are ended by a request (TensorFlow's `Abort` with `exit_without_error`, which logs
    a warning on the task), whose error is expected and ignored.
    """
    deadline = time.monotonic() + _FINISH_WAIT
    pending = training_tasks_but_own(cluster)
    while pending and time.monotonic() < deadline:
        time.sleep(0.1)
        pending = [n for n in pending if probe(cluster.tasks[n], timeout=0.5) is None]
    for name in pending:
        try:
            with tf.device(f"{name}/device:CPU:0"):
                tf.raw_ops.Abort(error_msg="dpkeras: training finished", exit_without_error=True)
        except Exception:  # the task ended before answering, as asked
            pass


def _quiet_teardown():
    """At the exit of a connected client, after its last words (Python prints an uncaught
    exception's traceback before exit handlers run): silences standard error for the rest.

    What is left of the process is TensorFlow's teardown, in which it asks every task to forget
    each of the client's functions, and logs a failure per function and task that has ended
    (~160 lines of "Failed to remove function remotely" after a `TaskFailedError`, or after
    `_release_tasks` ended them).
    """
    sys.stdout.flush()
    sys.stderr.flush()
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)


def training_tasks_but_own(cluster):
    """The ps and worker tasks other than this client's own (of a `Cluster`)."""
    return [name for name in cluster.training if name in cluster.remote]
