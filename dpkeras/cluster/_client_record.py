"""Which client each task serves: the record a client leaves on every task it trains on.

A connecting client writes a small record (who it is, where it answers, since when, whether it
is connecting, training or finished) into a string variable of each ps and worker task, created
with the shared name `dpkeras_client`. Resources of one shared name are one resource on a task,
whoever asks for it (measured on TF 2.21: a second client's eager context, and a graph session,
read what the first client wrote), so this record is what lets

- a second client see that the cluster is in use, and refuse to train beside the first
  (TensorFlow would let it: each client's variables are its own, and both would train on the
  same tasks, or hang in each other's collectives);
- `dpkeras env --cluster` show each task's client without connecting as a client;
- a task end with status 0 when its client finished, by itself, instead of being aborted.

It is read through a graph `tf.compat.v1.Session` on the task, limited to that task's devices
(`device_filters`): no eager context, nothing reset, and no other task contacted. Every read is
bounded. Before connecting, a client reserves each task (`reserve`): a compare-and-swap of the
record, run on the task under a mutex that every client's session shares there
(`tf.CriticalSection` with a shared name), so that of two clients starting at once exactly one
wins and the other is refused before it connects. Once connected, the client writes its record
with one assignment per task, and again at exit, never per step; with each, the task prints
one line (`tf.print` on the task's device prints in the task's process).
"""

import atexit
import json
import os
import socket
import sys
import threading
import time

import tensorflow as tf

from dpkeras import _config
from dpkeras.cluster._health import probe

SHARED_NAME = "dpkeras_client"
_LOCK_NAME = "dpkeras_client_lock"  # the mutex of `reserve`'s compare-and-swap on a task
CONNECTING = "connecting"  # reserved by `reserve`, not yet connected
TRAINING = "training"
FINISHED = "finished"
# How long a `CONNECTING` record of a client on another machine keeps the cluster in use: its
# client probed every task before it reserved them, and connects next (seconds, not minutes);
# past this, a client that died while connecting no longer blocks the next.
_CONNECTING_GRACE = 120.0


def _cpu(task):
    return f"{task}/device:CPU:0"


def _handle():
    return tf.raw_ops.VarHandleOp(dtype=tf.string, shape=[], shared_name=SHARED_NAME)


# The threads of reads under way, each with when it ends at the latest (its session's own
# timeouts end it). A read that timed out goes on after its caller gave up; a process that
# exits while one is inside TensorFlow aborts ("terminate called after throwing an instance
# of ''"), so the exit waits for them.
_reads = {}

# A read makes up to four calls to its task, each allowed the timeout: the session's creation,
# then two runs (`record`) or the listing of its devices (`devices`), and, when the reader was
# closed while the read ran, the session's close. A task answering each call after 0.8
# timeout keeps a read's thread 3.2 timeouts (measured by a review: at 3 timeouts the
# process aborted at exit, 2 times out of 2).
_CALLS_PER_READ = 4
_BACKSTOP = 1.0  # seconds a read's session calls may run past its wait (`RecordReader._deadline`)


@atexit.register
def _wait_for_reads():
    for thread, deadline in list(_reads.items()):
        thread.join(max(0.0, deadline - time.monotonic()))


class RecordReader:
    """Reads one task's record and devices through a graph session on the task.

    Args:
        address: `"host:port"` of the task's server.
        task: the task's name, such as `"/job:ps/replica:0/task:0"`.
        timeout: float, seconds allowed per read (the session's operations and the wait).
    """

    def __init__(self, address, task, timeout=5.0):
        self._target = f"grpc://{address}"
        self._task = task
        self._timeout = timeout
        self._graph = tf.Graph()
        with self._graph.as_default(), tf.device(_cpu(task)):
            handle = _handle()
            self._initialized = tf.raw_ops.VarIsInitializedOp(resource=handle)
            self._value = tf.raw_ops.ReadVariableOp(resource=handle, dtype=tf.string)
        self._swapped = None  # `swap`'s graph, made at its first use (it starts TensorFlow)
        self._session = None
        self._lock = threading.Lock()
        self._busy = False  # a read's thread still runs (it timed out, and may end later)
        self._closed = False

    def _deadline(self):
        """Seconds TensorFlow allows each call of a read: the wait, and `_BACKSTOP` more, so
        that a task that does not answer ends the wait first, in the same words every time
        (the session's own deadline is only a backstop that ends the read's thread)."""
        return self._timeout + _BACKSTOP

    def _run(self, work):
        """`work(session)` on a thread bounded by the timeout; raises TimeoutError.

        A read that times out leaves its thread to end by itself (the session's own timeout
        ends it): the session is closed by that thread, never under it, and a read asked for
        meanwhile times out at once."""
        outcome = []
        with self._lock:
            if self._closed:
                raise RuntimeError(f"The reader of {self._task} is closed.")
            if self._busy:
                raise TimeoutError(f"{self._task} has not answered the previous read yet")
            self._busy = True

        def run():
            try:
                if self._session is None:
                    config = tf.compat.v1.ConfigProto(
                        device_filters=[self._task],
                        operation_timeout_in_ms=int(self._deadline() * 1000),
                    )
                    self._session = tf.compat.v1.Session(
                        self._target, graph=self._graph, config=config
                    )
                outcome.append((True, work(self._session)))
            except Exception as e:  # reported to the caller, as it is
                outcome.append((False, e))
            finally:
                with self._lock:
                    self._busy = False
                    closing = self._closed
                if closing:  # closed while this thread read: its session is closed here
                    self._close_session()
                _reads.pop(threading.current_thread(), None)  # after the close: its 4th call

        thread = threading.Thread(target=run, name="dpkeras-record-read", daemon=True)
        _reads[thread] = time.monotonic() + _CALLS_PER_READ * self._deadline()  # before it ends
        thread.start()
        thread.join(self._timeout)
        if not outcome:
            raise TimeoutError(f"{self._task} did not answer a read within {self._timeout:g} s")
        ok, value = outcome[0]
        if not ok:
            raise value
        return value

    def record(self):
        """The task's record (a dict), or None if no dpkeras client ever connected to it."""
        options = tf.compat.v1.RunOptions(timeout_in_ms=int(self._deadline() * 1000))

        def read(session):
            if not session.run(self._initialized, options=options):
                return None
            return session.run(self._value, options=options)

        raw = self._run(read)
        return None if raw is None else json.loads(raw.decode("utf-8"))

    def swap(self, expected, replacement):
        """Makes the task's record `replacement` (a JSON string) if it is `expected` (the JSON
        string read, "" for none), atomically; returns the JSON string it was ("" for none),
        so the swap happened if and only if that equals `expected`."""
        with self._lock:
            if self._swapped is None:
                with self._graph.as_default(), tf.device(_cpu(self._task)):
                    self._expected = tf.compat.v1.placeholder(tf.string, [])
                    self._replacement = tf.compat.v1.placeholder(tf.string, [])
                    self._swapped = _compare_and_swap(_handle(), self._expected, self._replacement)
        options = tf.compat.v1.RunOptions(timeout_in_ms=int(self._deadline() * 1000))
        feed = {self._expected: expected, self._replacement: replacement}
        raw = self._run(lambda session: session.run(self._swapped, feed, options=options))
        return raw.decode("utf-8")

    def devices(self):
        """The full names of the task's devices."""
        return self._run(lambda session: [d.name for d in session.list_devices()])

    def close(self):
        """Closes the session; never raises, and never waits for a read that timed out (its
        thread closes the session when it ends)."""
        with self._lock:
            self._closed = True
            if self._busy:
                return
        self._close_session()

    def _close_session(self):
        session, self._session = self._session, None
        if session is not None:
            try:
                session.close()
            except tf.errors.OpError:  # the task is gone: its call to close timed out
                pass  # (DeadlineExceededError, after the timeout), and nothing is left to free


def _compare_and_swap(handle, expected, replacement):
    """The graph of `RecordReader.swap`: under the task's one `_LOCK_NAME` mutex, reads the
    record ("" when none was ever written) and writes `replacement` only if it equals
    `expected`; returns what it read."""
    section = tf.CriticalSection(shared_name=_LOCK_NAME)

    def swap():
        current = tf.cond(
            tf.raw_ops.VarIsInitializedOp(resource=handle),
            lambda: tf.raw_ops.ReadVariableOp(resource=handle, dtype=tf.string),
            lambda: tf.constant(""),
        )

        def write():
            with tf.control_dependencies(
                [tf.raw_ops.AssignVariableOp(resource=handle, value=replacement)]
            ):
                return tf.identity(current)

        return tf.cond(tf.equal(current, expected), write, lambda: tf.identity(current))

    return section.execute(swap)


def own_record(cluster, address):
    """The record this client writes: its task name, the address it answers on, and more."""
    name = "/job:localhost/replica:0/task:0"
    if cluster.own is not None:
        name = f"/job:{cluster.own[0]}/replica:0/task:{cluster.own[1]}"
    return {
        "client": name,
        "address": address,
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "since": time.time(),
        "state": TRAINING,
    }


def describe(record):
    """`client X at A (pid P on host H, connected at T)`, for a record (`connecting since T`
    for a client that reserved its tasks and has not connected yet)."""
    since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(record["since"]))
    when = "connecting since" if record["state"] == CONNECTING else "connected at"
    return (
        f"client {record['client']} at {record['address']} (pid {record['pid']} on host "
        f"{record['host']}, {when} {since})"
    )


def client_answers(record):
    """Whether the client of a `TRAINING` record still answers: True, False, or None when it
    cannot be told from here (a client on `localhost` of another machine)."""
    address = record["address"]
    if address.startswith("localhost:") and record["host"] != socket.gethostname():
        return None
    return probe(address, timeout=2.0) is None


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def holding(record):
    """How the client of `record` (a dict, or None) holds its tasks, for a refusal's message,
    or None when it does not: no record, a finished client, or one known to be gone.

    A `TRAINING` client holds them while it answers at its address (or cannot be probed from
    here). A `CONNECTING` client has no server to probe yet: on this machine it holds them
    while its process lives; on another, for `_CONNECTING_GRACE` seconds after it reserved.
    """
    if record is None or record["state"] == FINISHED:
        return None
    on_this_host = record["host"] == socket.gethostname()
    if record["state"] == CONNECTING:
        if on_this_host:
            alive = _pid_alive(record["pid"])
        else:
            alive = time.time() - record["since"] < _CONNECTING_GRACE
        return "is connecting to it" if alive else None
    alive = client_answers(record)
    if alive is False:
        return None
    return "still answers" if alive else "may still run (it cannot be probed from here)"


def _refuse(held, how, task, address):
    verb = "trains on" if held["state"] == TRAINING else "reserved"
    raise RuntimeError(
        f"Cannot connect to the cluster: it is in use by {describe(held)}, which {verb} "
        f"{task} at {address} and {how}. Two clients would train on the same tasks at "
        f"once, each slowing the other. Wait for that client to finish or stop it (kill "
        f"{held['pid']} on {held['host']}), then start this one again; or give this "
        f"one a cluster of its own."
    )


class Reservation:
    """The tasks `reserve` swapped this client's `CONNECTING` record into, each with the record
    it replaced; `release()` puts those back (when connecting fails after reserving)."""

    def __init__(self, mine, timeout):
        self._mine = mine
        self._timeout = timeout
        self.tasks = []  # (task, address, the JSON string replaced)

    def release(self):
        """Puts back each replaced record where this client's is still there; never raises
        (a task that does not answer keeps this client's `CONNECTING` record, which stops
        holding it once this process has ended)."""
        for task, address, before in reversed(self.tasks):
            reader = RecordReader(address, task, self._timeout)
            try:
                reader.swap(self._mine, before)
            except Exception:  # nothing to do about a task that does not answer
                pass
            finally:
                reader.close()
        self.tasks = []


_SWAPS = 10  # compare-and-swap attempts per task before giving up (each lost to a new record)


def reserve(cluster, record, timeout=_config.DEFAULT_CONNECT_TIMEOUT):
    """Reserves each ps and worker task of `cluster` for `record`'s client, before it connects,
    or raises RuntimeError naming the client that holds them.

    Each task's record becomes `record` in state `CONNECTING` by a compare-and-swap on the task
    (`RecordReader.swap`), tasks in name order: of two clients starting at once, the first to
    swap on the first task holds the cluster, and the other reads its record there and is
    refused, having written nothing. A record that holds no task (`holding`) is replaced. A
    task that does not answer is skipped (connecting names it).

    Each task's swap is bounded by `timeout` (the client's connect timeout): a task busy with
    other work, or started on a loaded machine, may take seconds to answer its first session.

    Returns:
        A `Reservation`; release it if connecting fails.

    Raises:
        RuntimeError: naming the client that holds the cluster (nothing is left reserved).
        TimeoutError: naming the task, if one answers its probe but not the swap in time.
    """
    mine = json.dumps(dict(record, state=CONNECTING))
    reservation = Reservation(mine, timeout)
    try:
        for task, address in sorted(cluster.training.items()):
            if task not in cluster.remote or probe(address, timeout=2.0) is not None:
                continue  # connect names a task that does not answer
            reader = RecordReader(address, task, timeout)
            try:
                before = _swap_in(reader, mine, task, address, timeout)
            finally:
                reader.close()
            reservation.tasks.append((task, address, before))
    except BaseException:
        reservation.release()
        raise
    return reservation


def _swap_in(reader, mine, task, address, timeout):
    """Swaps `mine` into the task's record, unless the record there holds it (`_refuse`);
    returns the JSON string replaced."""
    expected = ""  # first guess: no record yet; a swap that fails returns the one there
    for _ in range(_SWAPS):
        try:
            before = reader.swap(expected, mine)
        except (TimeoutError, tf.errors.DeadlineExceededError) as e:
            # The session's own timeout fires as the wait ends: either may come first.
            why = " ".join(str(e).split())  # one line (TensorFlow's message spans lines)
            raise TimeoutError(
                f"Cannot connect to the cluster: {task} at {address} accepts connections but "
                f"did not say which client trains on it within {timeout:g} s ({why}). Its "
                f"server is stuck or overloaded: see its log, or restart it (`dpkeras serve` "
                f"with the same arguments); ${_config.VARIABLES['connect_timeout']} sets "
                f"the wait."
            ) from None
        if before == expected:
            return before
        held = json.loads(before)
        how = holding(held)
        if how is not None:
            _refuse(held, how, task, address)
        expected = before  # a record that holds nothing: replace it
    raise RuntimeError(
        f"Cannot connect to the cluster: the client record on {task} at {address} changed "
        f"{_SWAPS} times while this client read it; other clients keep connecting to this "
        f"cluster. Start one client at a time."
    )


def _write(task, record, line):
    with tf.device(_cpu(task)):
        tf.raw_ops.AssignVariableOp(resource=_handle(), value=tf.constant(json.dumps(record)))
        tf.raw_ops.PrintV2(input=tf.constant(f"dpkeras: {task}: {line}"), output_stream="stderr")


def claim(cluster, record, only=None):
    """Writes `record` (this client, training) on each ps and worker task this process
    connected to (or on task `only`); each task prints that the client connected. Call after
    connecting."""
    where = f"at {record['address']} (pid {record['pid']} on host {record['host']})"
    for task in cluster.training:
        if task in cluster.remote and only in (None, task):
            _write(task, record, f"client {record['client']} {where} connected")


def finish(cluster, record):
    """Marks `record` finished on each task (a task that ends with its client reads it and
    ends with status 0); each task prints that the client finished. Errors are ignored: a task
    that already ended needs no word."""
    record = dict(record, state=FINISHED)
    for task in cluster.training:
        if task in cluster.remote:
            try:
                _write(task, record, f"client {record['client']} finished training")
            except Exception:  # an ended task, or an ended connection: nothing to tell
                pass
    sys.stderr.flush()
