"""The pieces of going on without a lost worker that need no cluster: a task left out is
neither watched nor named, the server definition without it (and, after a take-back, without
the workers still out), and the strategy's refusal to leave out the devices its variables live
on. The whole path, on a real cluster whose worker is killed and restarted, is
tests/test_cluster_training.py's
`test_a_worker_lost_mid_fit_is_left_out_and_taken_back_within_float_tolerance`."""

import socket
import threading
import time

import keras
import pytest
import tensorflow as tf
from tensorflow.core.protobuf import tensorflow_server_pb2

import dpkeras
from dpkeras.cluster import _connect, _health
from dpkeras.cluster._local import free_port

DEAD = "/job:worker/replica:0/task:1"


@pytest.fixture
def dead_worker():
    """A cluster spec whose worker 1 listens nowhere; worker 1 left out for the test."""
    spec = tf.train.ClusterSpec(
        {"worker": [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]}
    )
    yield spec
    _health.take_back(DEAD)


def test_a_task_left_out_is_not_named_until_taken_back(dead_worker):
    _health.leave_out(DEAD)
    assert _health.left_out() == [DEAD]
    dead = _health.failed_tasks(dead_worker, timeout=0.5)
    assert DEAD not in dead and len(dead) == 1, dead  # worker 0 listens nowhere either
    _health.take_back(DEAD)
    assert _health.left_out() == []
    assert DEAD in _health.failed_tasks(dead_worker, timeout=0.5)


def test_the_monitor_does_not_end_the_client_for_a_task_left_out():
    """Probed every 0.05 s, ended after 1 miss: nothing while the dead task is left out, the
    task named once taken back."""
    listener = socket.create_server(("127.0.0.1", 0))  # worker 0: answers as gRPC does
    stop = threading.Event()

    def answer():
        while not stop.is_set():
            connection, _ = listener.accept()
            with connection:
                connection.recv(64)
                connection.sendall(bytes(9))  # an HTTP/2 frame header: the probe's answer

    threading.Thread(target=answer, daemon=True).start()
    alive = f"127.0.0.1:{listener.getsockname()[1]}"
    spec = tf.train.ClusterSpec({"worker": [alive, f"127.0.0.1:{free_port()}"]})
    assert _health.probe(alive) is None
    _health.leave_out(DEAD)
    failures = []
    monitor = _health.HealthMonitor(
        spec, interval=0.05, failures=1, on_failure=lambda *a: failures.append(a)
    )
    with monitor:
        time.sleep(0.5)
        assert failures == []
        _health.take_back(DEAD)
        deadline = time.monotonic() + 10
        while not failures and time.monotonic() < deadline:
            time.sleep(0.05)
    stop.set()
    _health.take_back(DEAD)
    assert [f[0] for f in failures] == [DEAD]


def test_the_server_definition_without_a_task_keeps_every_other():
    definition = tensorflow_server_pb2.ServerDef(job_name="localhost", task_index=0)
    for name, addresses in {"ps": ["a:1", "b:2"], "worker": ["c:3", "d:4", "e:5"]}.items():
        job = definition.cluster.job.add(name=name)
        for i, address in enumerate(addresses):
            job.tasks[i] = address
    left = _connect._without(definition, [DEAD, "/job:ps/replica:0/task:0"])
    jobs = {job.name: dict(job.tasks) for job in left.cluster.job}
    assert jobs == {"ps": {1: "b:2"}, "worker": {0: "c:3", 2: "e:5"}}
    assert (left.job_name, left.task_index) == ("localhost", 0)
    assert len(definition.cluster.job[1].tasks) == 3  # the original is unchanged


def test_replicas_are_not_left_out_where_a_variable_lives():
    """On one machine the compute devices and the variables share a task: leaving it out is
    refused, naming the variable, and changes nothing; without variables, no device would be
    left."""
    strategy = dpkeras.ParameterDeviceStrategy(compute_devices=["/cpu:0"])
    extended = strategy.extended
    task = extended.worker_devices[0].rsplit("/device:", 1)[0]
    assert task == "/job:localhost/replica:0/task:0"
    with pytest.raises(ValueError, match=r"No compute device is left without \["):
        extended.compute_without([task])
    with strategy.scope():
        keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, name="d")])
    before = list(extended.worker_devices)
    with pytest.raises(ValueError, match=r"Variable '.*' lives on \['/job:localhost"):
        extended.compute_without([task])
    assert list(extended.worker_devices) == before
    assert extended.compute_without([]) is False  # nothing changed: the steps are kept
    assert list(extended.worker_devices) == before


def test_worker_0_runs_the_step_loop_and_is_waited_for_not_left_out():
    """Every step is run from worker 0's CPU (`_loop.loop_device`): lost, it cannot be left out
    (the next step would have nowhere to run, "unknown device"), so `fit` waits for it as for
    a ps. Decided before anything changes: the strategy is not touched."""
    from dpkeras._patches import lost_tasks

    error = _health.TaskFailedError("/job:worker/replica:0/task:0", "127.0.0.1:1", "gone")

    class Untouched:
        cluster_spec = None

        def compute_without(self, tasks):
            raise AssertionError("the strategy's devices were changed")

    assert lost_tasks._went_on_without(None, Untouched(), error, backup=None) is False


def test_a_worker_taken_back_leaves_the_others_still_out_out_of_the_connection(monkeypatch):
    """Workers 1 and 2 left out, worker 1 taken back: this client connects again with worker
    1 and still without worker 2 (a function sent to worker 2, still down, would fail), and
    claims worker 1 alone. Faked: the connection, the claim and the wait for the others."""
    definition = tensorflow_server_pb2.ServerDef(job_name="localhost", task_index=0)
    for name, addresses in {"ps": ["a:1"], "worker": ["c:3", "d:4", "e:5"]}.items():
        job = definition.cluster.job.add(name=name)
        for i, address in enumerate(addresses):
            job.tasks[i] = address
    connected, claimed = [], []
    monkeypatch.setattr(_connect, "_connected", object())
    monkeypatch.setattr(_connect, "_whole", definition)
    monkeypatch.setattr(_connect._tf_internals, "connect_with", connected.append)
    monkeypatch.setattr(_connect, "claim", lambda cluster, record, only: claimed.append(only))
    monkeypatch.setattr(_connect, "_wait_until_reached", lambda task: None)
    other = "/job:worker/replica:0/task:2"
    monkeypatch.setattr(_health, "_left_out", {DEAD, other})
    _connect.take_back(DEAD)
    assert [{job.name: dict(job.tasks) for job in d.cluster.job} for d in connected] == [
        {"ps": {0: "a:1"}, "worker": {0: "c:3", 1: "d:4"}}
    ]
    assert claimed == [DEAD] and _health.left_out() == [other]
