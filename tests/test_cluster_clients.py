"""One client at a time: a second client is refused naming the first, `dpkeras env --cluster`
shows who trains without disturbing it, and the tasks say when a client connects and leaves.

One real cluster (1 ps, 1 worker, `dpkeras serve` processes that do not end with the client)
whose spec names a chief address; every client is a fresh process. Every wait is bounded.
"""

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc  # TensorFlow's own dependency
import pytest
import tensorflow as tf

from dpkeras import _config
from dpkeras.cluster import _client_record, _connect, _spec, _task
from dpkeras.testing import LocalCluster, server_env

TIMEOUT = 300

# A client that trains one epoch, says so, waits for a line on stdin, then trains again and
# prints its losses and those of the same model built after connecting without a strategy.
_CLIENT = """
import json, sys
import numpy as np
import dpkeras, keras

def build():
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    return model

x = np.random.RandomState(0).rand(32, 3).astype("float32")
y = x.sum(axis=1, keepdims=True)
with dpkeras.scope(cluster=json.loads(sys.argv[1])):
    model = build()
losses = model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0).history["loss"]
print("TRAINING", flush=True)
sys.stdin.readline()
losses += model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0).history["loss"]
reference = build()
expected = reference.fit(x, y, batch_size=8, epochs=3, shuffle=False, verbose=0)
print("RESULT " + json.dumps({"loss": losses, "expected": expected.history["loss"]}), flush=True)
"""


@pytest.fixture(scope="module")
def local():
    with LocalCluster(ps=1, workers=1, cpus=1, chief=True) as cluster:
        yield cluster


def _without_chief(spec):
    return {job: tasks for job, tasks in spec.items() if job != "chief"}


def _run(argv, timeout=TIMEOUT):
    return subprocess.run(argv, capture_output=True, text=True, env=server_env(), timeout=timeout)


def _connect_script(spec):
    return [
        sys.executable,
        "-c",
        f"import dpkeras\nwith dpkeras.scope(cluster={spec!r}):\n    pass\nprint('CONNECTED')",
    ]


class _FirstClient:
    """The first client, running `_CLIENT` until `finish()`."""

    def __init__(self, spec):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(_CLIENT), json.dumps(spec)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=server_env(),
        )
        line = []
        reader = threading.Thread(target=lambda: line.append(self.proc.stdout.readline()))
        reader.daemon = True
        reader.start()
        reader.join(TIMEOUT)
        if line != ["TRAINING\n"]:
            self.proc.kill()
            pytest.fail(f"the first client did not start training: {line} {self.proc.stderr}")

    def finish(self):
        out, err = self.proc.communicate("\n", timeout=TIMEOUT)
        assert self.proc.returncode == 0, err[-3000:]
        result = json.loads(out.split("RESULT ", 1)[1])
        return result["loss"], result["expected"]

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)


def _live_holder(local):
    """The record of a training client that answers (its address is the worker's server)."""
    return {
        "client": "/job:localhost/replica:0/task:0",
        "address": local.address("worker", 0),
        "pid": 4242,
        "host": socket.gethostname(),
        "since": time.time(),
        "state": _client_record.TRAINING,
    }


def _check_in_use(cluster, timeout=_config.DEFAULT_CONNECT_TIMEOUT):
    """What a client checks before connecting: reserves `cluster`'s tasks (or raises naming
    the client that holds them), then releases them, as a client whose connecting failed."""
    record = _client_record.own_record(cluster, "localhost:1")
    _client_record.reserve(cluster, record, timeout).release()


def _last_line(text):
    return [line for line in text.splitlines() if line.strip()][-1]


def test_a_second_client_is_refused_naming_the_first_and_env_shows_it_undisturbed(local):
    """With a client training: a second one, as the chief (TensorFlow alone: "Could not start
    gRPC server") or as /job:localhost (TensorFlow alone: it connects and trains beside the
    first), is refused in one line naming the first; `dpkeras env --cluster` shows each
    task's state and that client; the first trains on, equal to one process. After it
    finished, a new client connects."""
    chief = local.spec["chief"][0]
    first = _FirstClient(local.spec)
    try:
        refused = re.escape(
            f"RuntimeError: Cannot connect to the cluster: it is in use by client "
            f"/job:chief/replica:0/task:0 at {chief} (pid {first.proc.pid} on host "
            f"{socket.gethostname()}, connected at "
        )
        for spec in (local.spec, _without_chief(local.spec)):
            second = _run(_connect_script(spec))
            assert second.returncode == 1, second.stdout + second.stderr[-3000:]
            assert re.match(
                refused + r"[-0-9: ]+ UTC\), which trains on /job:ps/replica:0/task:0 at "
                r"127\.0\.0\.1:\d+ and still answers\. .*Wait for that client to finish or "
                rf"stop it \(kill {first.proc.pid} on .*\)",
                _last_line(second.stderr),
            ), second.stderr[-3000:]

        env = _run([sys.executable, "-m", "dpkeras", "env", "--cluster", json.dumps(local.spec)])
        assert env.returncode == 0, env.stderr[-3000:]
        lines = env.stdout.splitlines()
        assert (
            f"  /job:chief/replica:0/task:0 at {chief}: the client's task; it answers: a "
            f"client is running" in lines
        ), env.stdout
        for job in ("ps", "worker"):
            address = local.address(job, 0)
            pattern = (
                rf"  /job:{job}/replica:0/task:0 at {re.escape(address)}: answers; cpu:0; "
                rf"training: client /job:chief/replica:0/task:0 at {re.escape(chief)} \(pid "
                rf"{first.proc.pid} on host .*, connected at [-0-9: ]+ UTC\)"
            )
            assert any(re.fullmatch(pattern, line) for line in lines), env.stdout

        losses, expected = first.finish()
        assert losses == pytest.approx(expected, rel=1e-5)  # undisturbed
    finally:
        first.kill()

    after = _run([sys.executable, "-m", "dpkeras", "env", "--cluster", json.dumps(local.spec)])
    assert "no client is running (Connection refused)" in after.stdout, after.stdout
    assert "finished training" in after.stdout, after.stdout
    third = _run(_connect_script(_without_chief(local.spec)))
    assert third.returncode == 0 and third.stdout.strip() == "CONNECTED", third.stderr[-3000:]

    # Each task said when each client connected and left.
    said = [line for line in local.stderr("ps", 0).splitlines() if line.startswith("dpkeras:")]
    task = "/job:ps/replica:0/task:0"
    assert said[:2] == [
        f"dpkeras: {task}: client /job:chief/replica:0/task:0 at {chief} (pid "
        f"{first.proc.pid} on host {socket.gethostname()}) connected",
        f"dpkeras: {task}: client /job:chief/replica:0/task:0 finished training",
    ], said
    assert re.fullmatch(
        rf"dpkeras: {task}: client /job:localhost/replica:0/task:0 at localhost:\d+ \(pid \d+ "
        rf"on host .*\) connected",
        said[2],
    ), said
    assert said[3] == f"dpkeras: {task}: client /job:localhost/replica:0/task:0 finished training"


def _plant(local, **record):
    """Writes a client record (`dpkeras.cluster._client_record`) on the ps and the worker, as a
    client at connecting would, through a graph session on each task: this process connects to
    nothing. Unset fields are those of a client of this machine that trains."""
    record = {
        "client": "/job:chief/replica:0/task:0",
        "address": local.spec["chief"][0],
        "pid": 4242,
        "host": socket.gethostname(),
        "since": time.time(),
        "state": _client_record.TRAINING,
        **record,
    }
    for job in ("ps", "worker"):
        task = f"/job:{job}/replica:0/task:0"
        graph = tf.Graph()
        with graph.as_default(), tf.device(f"{task}/device:CPU:0"):
            write = tf.raw_ops.AssignVariableOp(
                resource=_client_record._handle(), value=tf.constant(json.dumps(record))
            )
        config = tf.compat.v1.ConfigProto(device_filters=[task], operation_timeout_in_ms=60000)
        target = f"grpc://{local.address(job, 0)}"
        with tf.compat.v1.Session(target, graph=graph, config=config) as session:
            session.run(write)


@pytest.fixture
def planted(local):
    """`_plant` on the module's cluster; at the end, the record of a client that finished
    (which blocks nobody), whatever the test planted."""
    yield lambda **record: _plant(local, **record)
    _plant(local, state=_client_record.FINISHED)


def _dead_address():
    with socket.socket() as s:  # a port of this machine that nothing listens on
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def test_a_training_client_that_cannot_be_probed_from_here_refuses_a_second_one(local, planted):
    """A record of a client on `localhost` of another machine: whether it still runs cannot
    be told from here, so the cluster is in use."""
    planted(client="/job:localhost/replica:0/task:0", address="localhost:1", host="elsewhere")
    with pytest.raises(RuntimeError) as refused:
        _check_in_use(_spec.Cluster(_without_chief(local.spec)))
    assert re.match(
        r"Cannot connect to the cluster: it is in use by client /job:localhost/replica:0/task:0 "
        r"at localhost:1 \(pid 4242 on host elsewhere, connected at [-0-9: ]+ UTC\), which trains "
        r"on /job:ps/replica:0/task:0 at 127\.0\.0\.1:\d+ and may still run \(it cannot be "
        r"probed from here\)\. .*\(kill 4242 on elsewhere\)",
        str(refused.value),
    ), str(refused.value)


def test_a_dead_client_s_record_does_not_block_a_new_one(local, planted):
    """The record says training, but its client (on this machine) no longer answers: it died
    without finishing. Planted here, not left by another test."""
    planted(address=_dead_address())
    _check_in_use(_spec.Cluster(_without_chief(local.spec)))  # no error
    planted(address=local.spec["ps"][0])  # the control: a client that answers blocks
    with pytest.raises(RuntimeError, match=r"in use by .* and still answers\."):
        _check_in_use(_spec.Cluster(_without_chief(local.spec)))


def test_a_dead_client_of_this_machine_at_localhost_does_not_block_a_new_one(local, planted):
    """A client that connected as /job:localhost (its address `localhost:port`) on this
    machine and was killed while training: its record says training, and it is probed (only a
    `localhost` address of another machine cannot be), so the next client is not blocked."""
    client = "/job:localhost/replica:0/task:0"
    planted(client=client, address="localhost:" + _dead_address().rsplit(":", 1)[1])
    _check_in_use(_spec.Cluster(_without_chief(local.spec)))  # no error
    live = "localhost:" + local.address("worker", 0).rsplit(":", 1)[1]
    planted(client=client, address=live)  # the control: a client that answers blocks
    with pytest.raises(RuntimeError, match=r"in use by .* and still answers\."):
        _check_in_use(_spec.Cluster(_without_chief(local.spec)))


def test_a_client_refused_on_a_later_task_puts_back_the_records_it_swapped_before(local, planted):
    """Reserving goes through the tasks in name order: a client that reserved the ps and is
    then refused on the worker (another client trains there) leaves the ps as it found it, so
    that once the worker is free, the next attempt (here: this very process, alive) is not
    refused by its own earlier record on the ps."""
    planted(state=_client_record.FINISHED)
    holder = _live_holder(local)
    task = "/job:worker/replica:0/task:0"
    graph = tf.Graph()
    with graph.as_default(), tf.device(f"{task}/device:CPU:0"):
        write = tf.raw_ops.AssignVariableOp(
            resource=_client_record._handle(), value=tf.constant(json.dumps(holder))
        )
    config = tf.compat.v1.ConfigProto(device_filters=[task], operation_timeout_in_ms=60000)
    with tf.compat.v1.Session(
        f"grpc://{local.address('worker', 0)}", graph=graph, config=config
    ) as session:
        session.run(write)  # the worker alone is held
    cluster = _spec.Cluster(_without_chief(local.spec))
    with pytest.raises(RuntimeError, match=r"which trains on /job:worker/replica:0/task:0"):
        _check_in_use(cluster)
    reader = _client_record.RecordReader(
        local.address("ps", 0), "/job:ps/replica:0/task:0", timeout=60
    )
    try:
        assert reader.record()["state"] == _client_record.FINISHED  # as it was
    finally:
        reader.close()
    planted(state=_client_record.FINISHED)  # the worker's client finished
    _check_in_use(cluster)  # no error


def _ended_pid():
    """The process id of a process of this machine that has ended."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=60)
    return proc.pid


@pytest.mark.parametrize(
    "case, holds",
    [
        ("this-host-alive", True),
        ("this-host-ended", False),
        ("other-host-recent", True),
        ("other-host-past-grace", False),
    ],
)
def test_a_connecting_client_s_record_holds_while_its_client_may_still_connect(
    local, planted, case, holds
):
    """A `CONNECTING` record (a client between reserving and connecting) has no server to
    probe: on this machine it holds the tasks while its process lives, so a client killed
    while connecting does not block the next; on another machine, for the grace period after
    it reserved."""
    grace = _client_record._CONNECTING_GRACE
    record = {
        "this-host-alive": dict(pid=os.getpid()),
        "this-host-ended": dict(pid=_ended_pid()),
        "other-host-recent": dict(host="elsewhere", since=time.time() - grace / 2),
        "other-host-past-grace": dict(host="elsewhere", since=time.time() - 2 * grace),
    }[case]
    planted(state=_client_record.CONNECTING, address="localhost:1", **record)
    cluster = _spec.Cluster(_without_chief(local.spec))
    if holds:
        with pytest.raises(RuntimeError, match=r"connecting since .* and is connecting to it\."):
            _check_in_use(cluster)
    else:
        _check_in_use(cluster)  # no error: the record is replaced


def test_a_task_ends_for_its_own_client_s_finished_record_only(local, planted):
    """A task watching the chief ends with status 0 (`_task._client_finished`) when the record
    says the chief finished, not when it says another client did."""
    chief = "/job:chief/replica:0/task:0"
    reader = _client_record.RecordReader(
        local.address("ps", 0), "/job:ps/replica:0/task:0", timeout=60
    )
    try:
        planted(client="/job:localhost/replica:0/task:0", state=_client_record.FINISHED)
        assert not _task._client_finished(reader, chief)
        planted(client=chief, state=_client_record.TRAINING)
        assert not _task._client_finished(reader, chief)
        planted(client=chief, state=_client_record.FINISHED)
        assert _task._client_finished(reader, chief)
    finally:
        reader.close()


def test_a_client_whose_address_is_held_by_another_process_is_one_line():
    """TensorFlow alone says `UnknownError: Could not start gRPC server`."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        address = f"127.0.0.1:{held.getsockname()[1]}"
        cluster = _spec.Cluster({"chief": [address], "worker": ["127.0.0.1:1"]}, own=("chief", 0))
        with pytest.raises(RuntimeError) as raised:
            _connect._refuse_own_address_in_use(cluster)
    assert str(raised.value) == (
        f"Cannot connect as the cluster's client /job:chief/replica:0/task:0 at {address}: its "
        f"port {address.rsplit(':', 1)[1]} is in use on this machine by another process. Wait "
        f"for that client to finish or stop it (`ss -ltnp 'sport = :{address.rsplit(':', 1)[1]}'`"
        f" names it), then start this one again; or give the client another address in the "
        f"cluster."
    )


class _SlowProxy:
    """A TCP proxy to a task's server that answers like a server slow to serve its first
    call: on each connection the server's first bytes (its HTTP/2 greeting, which `probe`
    checks) pass at once, the rest only `delay` seconds after the connection opened
    (`delay=None`: never). A task busy with other work, or starting on a loaded machine.
    `connections()` counts the connections open through it; `close()` cuts them and stops
    listening, as a task whose server is gone."""

    def __init__(self, target, delay):
        self.target, self.delay = target, delay
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.closed = threading.Event()
        self._lock = threading.Lock()
        self._open = {}  # (client, server) -> how many of its two pipes still run
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.closed.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            host, port = self.target.rsplit(":", 1)
            server = socket.create_connection((host, int(port)), timeout=10)
            server.settimeout(None)
            opened = time.monotonic()
            pair = (client, server)
            with self._lock:
                self._open[pair] = 2
            for args in ((client, server, None), (server, client, opened)):
                threading.Thread(target=self._pipe, args=(*args, pair), daemon=True).start()

    def _pipe(self, source, sink, opened, pair):
        first = True
        try:
            while not self.closed.is_set():
                data = source.recv(65536)
                if not data:
                    break
                if opened is not None and not first:
                    if self.delay is None:
                        self.closed.wait()
                        break
                    self.closed.wait(max(0.0, opened + self.delay - time.monotonic()))
                first = False
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for end in (source, sink):
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)
            with self._lock:
                self._open[pair] -= 1
                if not self._open[pair]:
                    del self._open[pair]
                    for end in pair:
                        end.close()

    def connections(self):
        with self._lock:
            return len(self._open)

    def close(self):
        self.closed.set()
        self.listener.close()
        with self._lock:
            pairs = list(self._open)
        for pair in pairs:
            for end in pair:
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)


def _through(local, proxy):
    """The module's cluster spec (no chief) with its ps reached through `proxy`."""
    return dict(_without_chief(local.spec), ps=[proxy.address])


def test_a_task_slow_to_answer_its_first_read_is_waited_for_within_the_connect_timeout(local):
    """The record read waits as long as the client waits for its tasks (60 s by default), not
    a fixed 5 s: a ps whose server answers its probe at once but the read after 6 s (a task
    restarted on a loaded machine) does not fail the client's start."""
    _plant(local, state=_client_record.FINISHED)
    proxy = _SlowProxy(local.address("ps", 0), delay=6.0)
    try:
        started = time.monotonic()
        _check_in_use(_spec.Cluster(_through(local, proxy)))  # no error
        assert time.monotonic() - started >= 5.5  # the read did wait for the slow answer
    finally:
        proxy.close()


def test_a_task_that_answers_its_probe_but_never_a_read_ends_the_start_in_one_clear_error(
    local,
):
    """A client connecting with $DPKERAS_CONNECT_TIMEOUT=3 fails after about 3 s with one
    TimeoutError naming the task. A reader whose read timed out closes without raising and
    without waiting: its session is closed by the read's own thread (closed under it,
    TensorFlow raised DeadlineExceededError from `close`, hiding the timeout)."""
    proxy = _SlowProxy(local.address("ps", 0), delay=None)
    try:
        started = time.monotonic()
        client = subprocess.run(
            _connect_script(_through(local, proxy)),
            capture_output=True,
            text=True,
            env={**server_env(), "DPKERAS_CONNECT_TIMEOUT": "3"},
            timeout=TIMEOUT,
        )
        waited = time.monotonic() - started
        reader = _client_record.RecordReader(proxy.address, "/job:ps/replica:0/task:0", 1.0)
        with pytest.raises(TimeoutError):
            reader.record()
        with pytest.raises(TimeoutError, match="has not answered the previous read yet"):
            reader.record()  # one read at a time: the first one's thread still runs
        closing = time.monotonic()
        reader.close()  # returns at once, and raises nothing
        assert time.monotonic() - closing < 0.5
        assert reader._session is not None  # not closed under the read
        deadline = time.monotonic() + 30  # the read's own timeout ends it, then it closes
        while reader._session is not None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert reader._session is None
    finally:
        proxy.close()
    assert client.returncode != 0 and "CONNECTED" not in client.stdout
    assert waited < 60, waited  # 3 s, the start of a Python process with TensorFlow, its exit
    assert _last_line(client.stderr) == (
        f"TimeoutError: Cannot connect to the cluster: /job:ps/replica:0/task:0 at "
        f"{proxy.address} accepts connections but did not say which client trains on it within "
        f"3 s (/job:ps/replica:0/task:0 did not answer a read within 3 s). Its server is stuck "
        f"or overloaded: see its log, or restart it (`dpkeras serve` with the same arguments); "
        f"$DPKERAS_CONNECT_TIMEOUT sets the wait."
    ), client.stderr[-3000:]


def _wait_for(condition, seconds):
    """Whether `condition()` held within `seconds` (polled every 50 ms)."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_a_reader_whose_task_is_gone_since_its_read_closes_without_raising(local):
    """The task answered a read, then its server went away: closing the session asks the task
    to close it, and that call fails at its own timeout (TensorFlow raises DeadlineExceededError
    from `Session.close`, measured on TF 2.21). `close` swallows it: it ends `reserve`,
    `dpkeras env --cluster` and a task's watch in `finally`, where it would hide their result."""
    _plant(local, state=_client_record.FINISHED)
    proxy = _SlowProxy(local.address("ps", 0), delay=0.0)
    try:
        reader = _client_record.RecordReader(proxy.address, "/job:ps/replica:0/task:0", 1.0)
        assert reader.record()["state"] == _client_record.FINISHED
    finally:
        proxy.close()  # the connection cut, nothing listens: the task is gone
    reader.close()  # raises nothing
    assert reader._session is None
    with pytest.raises(RuntimeError, match="is closed"):
        reader.record()


def test_a_refused_client_leaves_no_connection_to_the_task_it_read(local, planted):
    """`reserve` closes each reader it made, whatever it raises: while a caller still
    holds its error (and so the reader, in the error's traceback), no connection to the task
    stays open, and no session on it."""
    planted(client="/job:localhost/replica:0/task:0", address="localhost:1", host="elsewhere")
    proxy = _SlowProxy(local.address("ps", 0), delay=0.0)
    try:
        with pytest.raises(RuntimeError, match="in use by") as refused:
            _check_in_use(_spec.Cluster(_through(local, proxy)))
        assert refused.value.__traceback__ is not None  # held, with the reader in its frames
        assert _wait_for(lambda: proxy.connections() == 0, 20), proxy.connections()
    finally:
        proxy.close()


class _StandInServer:
    """A gRPC server answering each call with `answer(method, context)`: the response's
    protobuf bytes, or an abort."""

    def __init__(self, answer):
        class Handler(grpc.GenericRpcHandler):
            def service(self, details):
                return grpc.unary_unary_rpc_method_handler(
                    lambda request, context: answer(details.method, context)
                )

        self.server = grpc.server(ThreadPoolExecutor(2), handlers=[Handler()])
        self.address = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"
        self.server.start()

    def close(self):
        self.server.stop(0).wait(10)


def _deadline_server():
    """A task answering every call DEADLINE_EXCEEDED at once: a task whose session times out
    first. With a real server the session's own timeout and the client's wait end together
    (both the timeout after the read starts), so which one the client sees is a race; here
    TensorFlow raises its DeadlineExceededError before the wait ends, every time."""
    return _StandInServer(
        lambda method, context: context.abort(
            grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"
        )
    )


def _gone_after_create_server():
    """A task that creates a session (a `CreateSessionResponse` of handle "h", its protobuf
    bytes) and answers every other call UNAVAILABLE: a task gone after the session was made,
    whose session's close then raises TensorFlow's UnavailableError."""

    def answer(method, context):
        if method.endswith("/CreateSession"):
            return b"\x0a\x01h"  # field 1 (session_handle), 1 byte: "h"
        context.abort(grpc.StatusCode.UNAVAILABLE, "gone")

    return _StandInServer(answer)


def test_a_reader_whose_session_close_is_refused_closes_without_raising():
    """A task gone after the session was made: the read fails with TensorFlow's error, and
    `close()`, whose call to close the session TensorFlow answers with UnavailableError (not
    only DeadlineExceededError: any error of the task), raises nothing."""
    server = _gone_after_create_server()
    try:
        reader = _client_record.RecordReader(server.address, "/job:ps/replica:0/task:0", 5)
        with pytest.raises(tf.errors.UnavailableError):
            reader.record()
        reader.close()
    finally:
        server.close()


def test_a_read_that_ends_in_the_session_s_own_deadline_is_the_same_one_line_error():
    """A read ended by TensorFlow's DeadlineExceededError (the session's timeout fired before
    the client's wait ended) ends the start in the same one-line TimeoutError naming the task
    as a read that was not answered in time; TensorFlow's own message, on several lines, is
    joined into it."""
    task = "/job:ps/replica:0/task:0"
    server = _deadline_server()
    try:
        reader = _client_record.RecordReader(server.address, task, timeout=30)
        try:
            with pytest.raises(tf.errors.DeadlineExceededError) as alone:
                reader.record()  # the read alone: TensorFlow's error, on three lines
        finally:
            reader.close()
        assert str(alone.value) == "Graph execution error:\n\nDeadline Exceeded"
        cluster = _spec.Cluster({"ps": [server.address], "worker": [_dead_address()]})
        with pytest.raises(TimeoutError) as raised:
            _check_in_use(cluster, timeout=30)
    finally:
        server.close()
    assert str(raised.value) == (
        f"Cannot connect to the cluster: {task} at {server.address} accepts connections but did "
        f"not say which client trains on it within 30 s (Graph execution error: Deadline "
        f"Exceeded). Its server is stuck or overloaded: see its log, or restart it (`dpkeras "
        f"serve` with the same arguments); $DPKERAS_CONNECT_TIMEOUT sets the wait."
    )


def test_a_read_answered_late_within_its_timeout_succeeds_and_exit_waits_for_its_calls(
    local,
):
    """A ps whose read is answered after 5 s, with a timeout of 8 s: the start goes on (the
    client waits for the whole timeout, not a part of it). While the read runs, the exit's wait
    registered for it (`_client_record._reads`) covers its four calls to the task (creating
    the session, two runs, and the close its thread makes when the reader was closed under
    it), each allowed the timeout and the session's backstop: 36 s from its start."""
    _plant(local, state=_client_record.FINISHED)
    proxy = _SlowProxy(local.address("ps", 0), delay=5.0)
    before = set(_client_record._reads)
    left = []  # seconds left of the first read's registered wait, when first seen
    stop = threading.Event()

    def watch():
        while not left and not stop.wait(0.05):
            for thread, deadline in list(_client_record._reads.items()):
                if thread not in before:
                    left.append(deadline - time.monotonic())

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        _check_in_use(_spec.Cluster(_through(local, proxy)), timeout=8)
    finally:
        stop.set()
        watcher.join(10)
        proxy.close()
    calls = 4 * (8 + _client_record._BACKSTOP)  # each call allowed the wait and the backstop
    assert left and calls - 4 <= left[0] <= calls, left  # seen within 4 s of its start


# A client that imports everything, says READY, and on a line from stdin connects and trains
# (40 steps): two of them released by one write each start connecting within milliseconds.
_RACER = """
import json, sys
import numpy as np
import dpkeras, keras

x = np.random.RandomState(0).rand(320, 3).astype("float32")
y = x.sum(axis=1, keepdims=True)
print("READY", flush=True)
sys.stdin.readline()
with dpkeras.scope(cluster=json.loads(sys.argv[1])):
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
losses = model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0).history["loss"]
keras.utils.set_random_seed(1)
reference = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2), keras.layers.Dense(1)])
reference.compile(optimizer="sgd", loss="mse")
expected = reference.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
print("RESULT " + json.dumps({"loss": losses, "expected": expected.history["loss"]}), flush=True)
"""


def _racers(spec, n):
    """`n` `_RACER` processes, each READY (imported), not yet released."""
    racers = []
    for _ in range(n):
        racers.append(
            subprocess.Popen(
                [sys.executable, "-c", textwrap.dedent(_RACER), json.dumps(spec)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=server_env(),
            )
        )
    for racer in racers:
        line = []
        reader = threading.Thread(
            target=lambda r=racer, said=line: said.append(r.stdout.readline())
        )
        reader.daemon = True
        reader.start()
        reader.join(TIMEOUT)
        assert line == ["READY\n"], line
    return racers


@pytest.mark.parametrize("round_", range(3))
def test_two_clients_started_at_once_one_trains_and_the_other_is_refused_in_one_line(local, round_):
    """Two clients of one cluster (as /job:localhost, as scripts that every worker runs would
    be), released to connect within a millisecond of each other: exactly one trains, equal to
    one process; the other is refused before it connects, its last line naming the first. No
    interleaved steps, no hang (TensorFlow alone lets both train, or both hang)."""
    racers = _racers(_without_chief(local.spec), 2)
    try:
        for racer in racers:  # released together
            racer.stdin.write("\n")
        for racer in racers:
            racer.stdin.flush()
        outcomes = [racer.communicate(timeout=TIMEOUT) for racer in racers]
    finally:
        for racer in racers:
            if racer.poll() is None:
                racer.kill()
    codes = sorted(racer.returncode for racer in racers)
    assert codes == [0, 1], [(r.returncode, err[-2000:]) for r, (_, err) in zip(racers, outcomes)]
    (won_out, _), (_, lost_err) = sorted(outcomes, key=lambda o: 0 if "RESULT " in o[0] else 1)
    winner = racers[0] if racers[0].returncode == 0 else racers[1]
    result = json.loads(won_out.split("RESULT ", 1)[1])
    assert result["loss"] == pytest.approx(result["expected"], rel=1e-5)  # undisturbed
    assert re.fullmatch(
        r"RuntimeError: Cannot connect to the cluster: it is in use by client "
        r"/job:localhost/replica:0/task:0 at localhost:\d+ \(pid "
        rf"{winner.pid} on host .*, (connecting since|connected at) [-0-9: ]+ UTC\), which "
        r"(reserved|trains on) /job:ps/replica:0/task:0 at 127\.0\.0\.1:\d+ and (is connecting "
        r"to it|still answers)\. Two clients would train .*",
        _last_line(lost_err),
    ), lost_err[-3000:]
    assert "Traceback" in lost_err and lost_err.count("RuntimeError:") == 1


def test_of_clients_reserving_at_once_exactly_one_holds_the_cluster(local):
    """Three clients of this process reserve the cluster at the same instant, 20 times: each
    time exactly one holds it and the others are refused naming it; released, the next round
    finds it free (the compare-and-swap on each task, `_client_record.reserve`)."""
    cluster = _spec.Cluster(_without_chief(local.spec))
    for _ in range(20):
        outcomes = {}
        barrier = threading.Barrier(3)

        def race(i, barrier=barrier, outcomes=outcomes):
            record = _client_record.own_record(cluster, f"localhost:{i + 1}")
            barrier.wait()
            try:
                outcomes[i] = _client_record.reserve(cluster, record, 60)
            except RuntimeError as e:
                outcomes[i] = e

        threads = [threading.Thread(target=race, args=(i,)) for i in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(TIMEOUT)
        held = [o for o in outcomes.values() if isinstance(o, _client_record.Reservation)]
        refused = [str(o) for o in outcomes.values() if isinstance(o, RuntimeError)]
        assert len(held) == 1 and len(refused) == 2, outcomes
        assert all("is connecting to it" in why for why in refused), refused
        held[0].release()


def test_a_swap_waits_for_the_lock_another_session_holds_on_the_task(local, planted):
    """The compare-and-swap runs under one mutex per task, which every client's session shares
    (`tf.CriticalSection` with a shared name): a swap asked for while another session holds it
    waits, then sees what that session wrote. Here the other session holds it until this test
    says, then writes the record of a training client that answers: the waiting reservation is
    refused naming it (without the shared lock it would have swapped at once)."""
    planted(state=_client_record.FINISHED)
    task = "/job:ps/replica:0/task:0"
    holder = json.dumps(_live_holder(local))
    graph = tf.Graph()
    with graph.as_default(), tf.device(f"{task}/device:CPU:0"):
        entered = tf.queue.FIFOQueue(1, tf.int32, shared_name="dpkeras_test_entered")
        go = tf.queue.FIFOQueue(1, tf.int32, shared_name="dpkeras_test_go")

        def hold():
            with tf.control_dependencies([entered.enqueue(1)]):
                wait = go.dequeue()
            with tf.control_dependencies([wait]):
                write = tf.raw_ops.AssignVariableOp(
                    resource=_client_record._handle(), value=tf.constant(holder)
                )
            with tf.control_dependencies([write]):
                return tf.constant(0)

        held = tf.CriticalSection(shared_name=_client_record._LOCK_NAME).execute(hold)
        wait_entered = entered.dequeue()
        release = go.enqueue(1)
    config = tf.compat.v1.ConfigProto(device_filters=[task], operation_timeout_in_ms=120000)
    session = tf.compat.v1.Session(f"grpc://{local.address('ps', 0)}", graph=graph, config=config)
    holding = threading.Thread(target=session.run, args=(held,), daemon=True)
    holding.start()
    refused = []
    try:
        session.run(wait_entered)  # the other session holds the lock
        cluster = _spec.Cluster(_without_chief(local.spec))
        reserving = threading.Thread(
            target=lambda: refused.append(pytest.raises(RuntimeError, _check_in_use, cluster)),
            daemon=True,
        )
        reserving.start()
        reserving.join(3.0)
        assert reserving.is_alive(), "the swap did not wait for the lock"
    finally:
        session.run(release)
        holding.join(60)
        session.close()
    reserving.join(60)
    assert refused and "which trains on /job:ps/replica:0/task:0" in str(refused[0].value)


def test_a_client_whose_connecting_failed_after_reserving_leaves_the_cluster_free(local):
    """Connecting refused after the tasks were reserved (here: variables made before it) puts
    their records back: the same process, its variables deleted, then connects (without the
    release its own reservation would refuse it, as long as it lives)."""
    program = textwrap.dedent(
        f"""
        import gc
        import tensorflow as tf
        import dpkeras
        spec = {_without_chief(local.spec)!r}
        v = tf.Variable(1.0)
        try:
            dpkeras.cluster.connect(spec)
        except RuntimeError as e:
            print("REFUSED", "holds 1 TensorFlow variable" in str(e), flush=True)
        del v
        gc.collect()
        dpkeras.cluster.connect(spec)
        print("CONNECTED", flush=True)
        """
    )
    run = _run([sys.executable, "-c", program])
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split() == ["REFUSED", "True", "CONNECTED"], run.stdout
