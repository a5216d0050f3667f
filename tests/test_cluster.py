"""dpkeras.cluster: resolving a cluster, connecting to real servers, and naming a dead task.

Anything that connects runs in a fresh subprocess: a process connects to one cluster, and the
pytest process must stay unconnected.
"""

import json
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading

import pytest
import tensorflow as tf

from dpkeras import cluster
from dpkeras.cluster import _connect, _health
from dpkeras.cluster._local import free_port
from dpkeras.testing import server_env

SPEC = {"ps": ["10.0.0.1:2222"], "worker": ["10.0.0.2:2222", "10.0.0.3:2222"]}


# --- cluster_spec_of ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "given",
    [
        SPEC,
        tf.train.ClusterSpec(SPEC),
        tf.distribute.cluster_resolver.SimpleClusterResolver(tf.train.ClusterSpec(SPEC)),
        {"ps": {0: "10.0.0.1:2222"}, "worker": {1: "10.0.0.3:2222", 0: "10.0.0.2:2222"}},
    ],
)
def test_resolve_cluster_accepts_dict_spec_and_resolver(given):
    assert cluster.cluster_spec_of(given).as_dict() == SPEC


def test_resolve_cluster_is_cluster_spec_of_with_a_deprecation_warning():
    with pytest.warns(
        DeprecationWarning,
        match=r"resolve_cluster is deprecated .* 0\.5\.0; it is "
        r"dpkeras\.cluster\.cluster_spec_of",
    ):
        assert cluster.resolve_cluster(SPEC).as_dict() == SPEC
    assert "resolve_cluster" not in cluster.__all__


def test_resolve_cluster_keeps_chief_and_worker_only_clusters():
    spec = {"chief": ["10.0.0.9:2222"], "worker": ["[::1]:2222"]}
    assert cluster.cluster_spec_of(spec).as_dict() == spec


def test_no_cluster_without_tf_config():
    assert cluster.cluster_spec_of() is None


@pytest.mark.parametrize(
    "tf_config",
    [
        {"cluster": SPEC},
        {"cluster": SPEC, "task": {"type": "chief", "index": 0}},
        {"cluster": {**SPEC, "chief": ["10.0.0.9:2222"]}, "task": {"type": "chief", "index": 0}},
    ],
)
def test_resolve_cluster_from_tf_config(monkeypatch, tf_config):
    monkeypatch.setenv("TF_CONFIG", json.dumps(tf_config))
    assert cluster.cluster_spec_of().as_dict() == tf_config["cluster"]


def test_tf_config_without_ps_or_worker_is_no_cluster(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"chief": ["h:1"]}}))
    assert cluster.cluster_spec_of() is None


@pytest.mark.parametrize(
    "tf_config, pattern",
    [
        (
            json.dumps({"cluster": {"ps": ["h:1"], "worker": {"1": "h:2"}}}),
            r"The tasks of job 'worker' must be numbered 0\.\.n-1 without gaps\. Received task "
            r"indices \['1'\] from TF_CONFIG=.*A sparse TF_CONFIG \(Kubeflow TFJob's "
            r"enableDynamicWorker.*turn enableDynamicWorker off\.",
        ),
        ("{bad json", r"TF_CONFIG is not valid JSON \(.*\)\. Received: TF_CONFIG='\{bad json'\."),
        ("[1, 2]", r"TF_CONFIG must be a JSON object\. Received: TF_CONFIG='\[1, 2\]'\."),
        (
            json.dumps({"cluster": {"ps": ["h:1"]}}),
            r"A cluster must have a 'worker' job.*Received jobs \['ps'\] from TF_CONFIG=.*",
        ),
    ],
)
def test_tf_config_errors(monkeypatch, tf_config, pattern):
    monkeypatch.setenv("TF_CONFIG", tf_config)
    with pytest.raises(ValueError, match=pattern):
        cluster.cluster_spec_of()


@pytest.mark.parametrize(
    "given, pattern",
    [
        (3, r"A cluster must be a dict .*Received: 3 \(of type int\)\."),
        (
            {},
            r"A cluster must map job names to addresses.*Received: \{\} from the cluster "
            r"argument\.",
        ),
        (
            {"ps": ["h:1"]},
            r"A cluster must have a 'worker' job: workers run the replicas\. "
            r"Received jobs \['ps'\] from the cluster argument\.",
        ),
        (
            {"worker": ["h:1"], "trainer": ["h:2"]},
            r"Unknown job\(s\) \['trainer'\] .*valid jobs: ps, worker, chief, master, evaluator\. "
            r"Received jobs: \['worker', 'trainer'\]\.",
        ),
        (
            {"worker": ["h:1"], "chief": ["h:2"], "master": ["h:3"]},
            r"A cluster names its client 'chief' or 'master' \(the older name\), not both\.",
        ),
        (
            {"worker": []},
            r"Job 'worker' has no task\. Received: worker=\[\] from the cluster "
            r"argument\.",
        ),
        (
            {"worker": "h:1"},
            r"Job 'worker' must be a list of 'host:port' addresses\. Received: "
            r"'h:1' \(of type str\)",
        ),
        (
            {"worker": ["h"]},
            r"Every task of job 'worker' must be a 'host:port' address.*"
            r"Received: 'h' from the cluster argument\.",
        ),
        ({"worker": ["h:0"]}, r"Every task of job 'worker' must be .*Received: 'h:0'"),
        ({"worker": ["h:99999"]}, r"Every task of job 'worker' must be .*Received: 'h:99999'"),
        ({"worker": [2222]}, r"Every task of job 'worker' must be .*Received: 2222"),
        (
            {"worker": {0: "h:1", 2: "h:2"}},
            r"The tasks of job 'worker' must be numbered 0\.\.n-1 without gaps\. Received task "
            r"indices \[0, 2\]",
        ),
        (
            {"ps": ["h:1"], "worker": ["h:2", "h:1"]},
            r"Two tasks share the address h:1: /job:ps/replica:0/task:0 and "
            r"/job:worker/replica:0/task:1 \(from the cluster argument\)\.",
        ),
        (
            {"chief": ["a:1", "b:1"], "worker": ["h:1"]},
            r"The 'chief' job is the client: it has one task\. Received "
            r"chief=\['a:1', 'b:1'\]",
        ),
    ],
)
def test_resolve_cluster_errors(given, pattern):
    with pytest.raises(ValueError, match=pattern):
        cluster.cluster_spec_of(given)


def test_empty_resolver_is_refused():
    empty = tf.distribute.cluster_resolver.SimpleClusterResolver(tf.train.ClusterSpec({}))
    with pytest.raises(
        ValueError,
        match=r"the cluster resolver SimpleClusterResolver names no "
        r"job; a cluster needs a 'worker' job\.",
    ):
        cluster.cluster_spec_of(empty)


# --- probing and connecting, without TensorFlow connecting -------------------------------


def _bounded(fn, limit):
    """Runs fn in a thread; returns (result or exception); fails the test if it blocks."""
    box = {}

    def run():
        try:
            box["value"] = fn()
        except Exception as e:  # noqa: BLE001 (returned to the test)
            box["value"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(limit)
    assert "value" in box, f"still blocked after {limit} s"
    return box["value"]


def test_probe_tells_refused_and_silent_ports():
    with socket.socket() as silent:  # accepts connections (the kernel does), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        assert _health.probe(address, timeout=0.5) == "no answer within 0.5 s"
    assert _health.probe(address, timeout=0.5) == "Connection refused"


def test_connect_names_each_task_it_waits_for_and_every_one_that_did_not_answer(monkeypatch, capfd):
    """Two tasks never answer (one silent, one refusing): the client names each as it waits,
    then fails naming both, after the wait `$DPKERAS_CONNECT_TIMEOUT` sets."""
    monkeypatch.setenv("DPKERAS_CONNECT_TIMEOUT", "3")
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        port = silent.getsockname()[1]
        refused = free_port()
        spec = {"ps": [f"127.0.0.1:{refused}"], "worker": [f"127.0.0.1:{port}"]}
        error = _bounded(lambda: cluster.connect(spec), limit=30)
    assert isinstance(error, TimeoutError)
    assert re.fullmatch(
        rf"2 of the cluster's 2 tasks did not answer within 3 s: "
        rf"/job:ps/replica:0/task:0 at 127\.0\.0\.1:{refused} \(Connection refused\): start it "
        rf"with `dpkeras serve --cluster \.\.\. --job ps --task 0`; "
        rf"/job:worker/replica:0/task:0 at 127\.0\.0\.1:{port} \(no answer within .* s\): start "
        rf"it with `dpkeras serve --cluster \.\.\. --job worker --task 0`\. Or check the "
        rf"addresses and the firewall; \$DPKERAS_CONNECT_TIMEOUT sets the wait\.",
        str(error),
    ), str(error)
    waiting = [line for line in capfd.readouterr().err.splitlines() if "waiting for" in line]
    assert len(waiting) == 2, waiting  # each named once, while it waits
    assert waiting[0].startswith("dpkeras: waiting for /job:ps/replica:0/task:0 at 127.0.0.1:")
    assert re.search(
        r"\(Connection refused\); up to \d+ s more \(\$DPKERAS_CONNECT_TIMEOUT\)$", waiting[0]
    )
    assert _connect.connected_cluster() is None  # TensorFlow was never asked to connect


def test_connect_argument_errors():
    with pytest.raises(
        ValueError,
        match=r"timeout must be a positive number of seconds\. "
        r"Received: 0",
    ):
        cluster.connect({"worker": ["127.0.0.1:1"]}, timeout=0)
    with pytest.raises(ValueError, match=r"connect\(\) needs a cluster\. Received: None\."):
        cluster.connect(None)


def test_health_monitor_argument_errors():
    with pytest.raises(ValueError, match=r"failures must be an int >= 1\. Received: 0"):
        cluster.HealthMonitor(tf.train.ClusterSpec(SPEC), failures=0)
    with pytest.raises(
        ValueError,
        match=r"interval must be a positive number of seconds\. "
        r"Received: -1",
    ):
        cluster.HealthMonitor(tf.train.ClusterSpec(SPEC), interval=-1)


def test_health_monitor_reports_a_silent_task_once():
    seen = []
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        spec = cluster.cluster_spec_of({"worker": [address]})
        monitor = cluster.HealthMonitor(
            spec,
            interval=0.1,
            failures=2,
            probe_timeout=0.2,
            on_failure=lambda *failure: seen.append(failure),
        )
        with monitor:
            _bounded(lambda: monitor._thread.join(), limit=30)
    assert seen == [("/job:worker/replica:0/task:0", address, "no answer within 0.2 s")]
    assert monitor.failure == seen[0]


class _Answering:
    """A loopback port that answers like a gRPC server: 9 bytes after any greeting."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.sock.settimeout(0.2)
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self):
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            with conn:
                conn.sendall(bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]))

    def close(self):
        self._stop.set()
        self._thread.join(10)
        self.sock.close()


def test_probe_accepts_an_answering_server():
    server = _Answering()
    try:
        assert _health.probe(server.address, timeout=2.0) is None
    finally:
        server.close()


def _grpc_error(target):
    return tf.errors.UnavailableError(
        None,
        None,
        f"recvmsg:Connection reset by peer\nAdditional GRPC error information from "
        f"remote target {target} while calling /tensorflow.WorkerService/RecvTensor",
    )


def test_name_failures_names_the_refusing_task():
    alive, dead_port = _Answering(), socket.socket()
    try:
        dead_port.bind(("127.0.0.1", 0))  # bound, not listening: refuses
        dead = f"127.0.0.1:{dead_port.getsockname()[1]}"
        spec = cluster.cluster_spec_of({"ps": [dead], "worker": [alive.address]})
        cause = _grpc_error("/job:worker/replica:0/task:0")  # derived: names the live task
        with pytest.raises(cluster.TaskFailedError) as info:
            with cluster.name_failures(spec):
                raise cause
        assert info.value.task == "/job:ps/replica:0/task:0"
        assert info.value.address == dead
        assert info.value.tensorflow_error is cause
        assert info.value.__cause__ is None and info.value.__suppress_context__  # not chained
        assert isinstance(info.value, tf.errors.UnavailableError)
        assert re.fullmatch(
            rf"/job:ps/replica:0/task:0 at {dead} is unreachable \(Connection "
            rf"refused\); synchronous training cannot continue\..*",
            info.value.message,
        )
    finally:
        alive.close()
        dead_port.close()


@pytest.mark.parametrize(
    "error",
    [
        tf.errors.InvalidArgumentError(
            None,
            None,
            "indices[1] = 57 is not in [0, 10)\nAdditional GRPC error information from remote "
            "target /job:worker/replica:0/task:0 while calling /tensorflow.WorkerService/Recv",
        ),
        _grpc_error("/job:worker/replica:0/task:0/device:CPU:0"),
    ],
    ids=["op-error", "unavailable"],
)
def test_an_error_naming_a_task_that_answers_passes_through(error):
    """A gRPC error's text names a remote target, but the task answers: an ordinary error (a
    failed op on a healthy task), not a dead task. Decided by probing, never by the text."""
    alive = _Answering()
    try:
        spec = cluster.cluster_spec_of({"worker": [alive.address]})
        with pytest.raises(type(error)) as info:
            with cluster.name_failures(spec):
                raise error
        assert info.value is error
    finally:
        alive.close()


@pytest.mark.parametrize(
    "error",
    [
        ValueError("a shape error, nothing to do with the cluster"),
        tf.errors.InvalidArgumentError(None, None, "Incompatible shapes: [2] vs. [3]"),
        KeyError("x"),
    ],
)
def test_name_failures_passes_other_errors_through_when_every_task_answers(error):
    alive = _Answering()
    try:
        spec = cluster.cluster_spec_of({"worker": [alive.address]})
        with pytest.raises(type(error)) as info:
            with cluster.name_failures(spec):
                raise error
        assert info.value is error
    finally:
        alive.close()


# --- a real cluster ----------------------------------------------------------------------


def _client(code, spec, timeout=300):
    """Runs client code (spec in SPEC) in a fresh process with 2 CPU devices; returns it."""
    prefix = (
        "import dpkeras\ndpkeras.simulate_cpu_devices(2)\nimport json, os\n"
        f"SPEC = json.loads({json.dumps(json.dumps(spec))})\n"
    )
    try:
        return subprocess.run(
            [sys.executable, "-c", prefix + textwrap.dedent(code)],
            capture_output=True,
            text=True,
            env=server_env(),
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"the client hung: no exit within {timeout} s")


def test_connect_task_devices_and_defaults_on_a_real_cluster(local):
    proc = _client(
        """
        import tensorflow as tf
        from dpkeras import cluster
        from dpkeras.cluster import _connect, _devices, _health
        spec = cluster.cluster_spec_of(SPEC)
        cluster.connect(spec, timeout=60)
        cluster.connect(SPEC, timeout=60)  # the same cluster again: a no-op
        try:
            cluster.connect({"worker": SPEC["worker"][:1]})
        except RuntimeError as e:
            error = str(e)
        joined = _connect.connected_cluster()
        compute, parameter, reason = _devices.default_cluster_devices(joined)
        print(json.dumps({
            "logical": [d.name for d in tf.config.list_logical_devices()],
            "tasks": _devices.task_devices(joined), "compute": compute,
            "parameter": parameter, "reason": reason, "error": error,
            "streaming": os.environ["TF_ENABLE_EAGER_CLIENT_STREAMING_ENQUEUE"]}))
        """,
        local.spec,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout)
    names = {
        f"/job:{j}/replica:0/task:{t}": [
            f"/job:{j}/replica:0/task:{t}/device:CPU:{c}" for c in range(2)
        ]
        for j in ("ps", "worker")
        for t in range(2)
    }
    assert got["tasks"] == names
    # The client's own (simulated) devices are listed without a job, after connecting.
    assert got["logical"] == ["/device:CPU:0", "/device:CPU:1"] + sum(names.values(), [])
    assert got["parameter"] == [
        "/job:ps/replica:0/task:0/device:CPU:0",
        "/job:ps/replica:0/task:1/device:CPU:0",
    ]
    assert (
        got["compute"]
        == names["/job:worker/replica:0/task:0"] + names["/job:worker/replica:0/task:1"]
    )
    assert got["reason"] == (
        "no GPU on the workers: compute on 4 CPU device(s) of the 2 "
        "worker(s); variables on the CPU:0 of each of the 2 ps task(s)"
    )
    assert re.match(
        r"This process is already connected to the cluster \{'ps': .*; a process "
        r"connects to one cluster for its lifetime .*Received: \{'worker': \[",
        got["error"],
    )
    assert got["streaming"] == "False"


_TRAIN = """
    import signal, sys
    import tensorflow as tf
    from dpkeras import cluster
    from dpkeras.cluster import _connect, _devices, _health
    spec = cluster.cluster_spec_of(SPEC)
    cluster.connect(spec, timeout=60)
    with tf.device("/job:ps/replica:0/task:0/device:CPU:0"):
        kernel = tf.Variable(tf.zeros([64, 64]))
    with tf.device("/job:ps/replica:0/task:1/device:CPU:0"):
        bias = tf.Variable(tf.zeros([64]))

    @tf.function
    def step(x):
        total = []
        for w in range(2):
            with tf.device(f"/job:worker/replica:0/task:{w}/device:CPU:1"):
                total.append(tf.reduce_sum(tf.matmul(x, kernel) + bias))
        with tf.device("/job:ps/replica:0/task:0/device:CPU:0"):
            kernel.assign_add(tf.ones([64, 64]) * 1e-3)
        with tf.device("/job:ps/replica:0/task:1/device:CPU:0"):
            bias.assign_add(tf.ones([64]) * 1e-3)
        return tf.add_n(total)

    x = tf.ones([8, 64])
    for _ in range(5):
        step(x)
    print("trained", flush=True)
    """


def test_a_killed_ps_is_an_error_naming_it(local):
    victim = local.procs[("ps", 1)].pid
    proc = _client(
        _TRAIN
        + f"""
    try:
        with cluster.name_failures(spec):
            for i in range(10000):
                if i == 3:
                    os.kill({victim}, signal.SIGKILL)
                step(x)
    except cluster.TaskFailedError as e:
        print("step:", e.task, e.address, "|", e, flush=True)
    # A function first run after the death, on the dead task: with TF's default streaming
    # enqueue it blocks forever (TF 2.21); connect() turns streaming off, so it raises.
    try:
        with cluster.name_failures(spec):
            with tf.device("/job:ps/replica:0/task:1/device:CPU:0"):
                float(tf.function(lambda: kernel[0, 0] + bias[0])())
    except cluster.TaskFailedError as e:
        print("new function:", e.task, flush=True)
    """,
        local.spec,
        timeout=300,
    )
    local.restart("ps", 1)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    address = local.address("ps", 1)
    assert lines[0] == "trained"
    assert re.fullmatch(
        rf"step: /job:ps/replica:0/task:1 {address} \| /job:ps/replica:0/task:1 at {address} "
        # refused, or reset when the probe races the kill: the kernel's word, either is right
        rf"is unreachable \(Connection (refused|reset by peer)\); synchronous training cannot "
        rf"continue\. "
        rf"Restart that task if it is down, then restart training from the last checkpoint "
        rf"\(keras\.callbacks\.BackupAndRestore\)\.",
        lines[1],
    ), lines[1]
    assert lines[2:] == ["new function: /job:ps/replica:0/task:1"]


def test_health_monitor_ends_a_client_blocked_by_a_frozen_ps(local):
    """A frozen ps blocks the step forever in TF 2.21; the monitor ends the process instead."""
    victim = local.procs[("ps", 1)].pid
    proc = _client(
        _TRAIN
        + f"""
    with cluster.HealthMonitor(spec, interval=0.5, failures=2, probe_timeout=1.0):
        for i in range(10000):
            if i == 3:
                os.kill({victim}, signal.SIGSTOP)
                print("frozen", flush=True)
            step(x)
    print("not reached", flush=True)
    """,
        local.spec,
        timeout=300,
    )
    local.kill("ps", 1, signal.SIGCONT)
    local.restart("ps", 1)
    assert proc.stdout.splitlines() == ["trained", "frozen"], proc.stderr[-3000:]
    assert proc.returncode == 75, proc.stderr[-3000:]
    address = local.address("ps", 1)
    assert proc.stderr.splitlines()[-1] == (
        f"dpkeras: /job:ps/replica:0/task:1 at {address} is unreachable (no answer within 1 s); "
        f"synchronous training cannot continue, ending this process (exit code 75) instead of "
        f"waiting forever. Restart that task if it is down, then restart training from the last "
        f"checkpoint "
        f"(keras.callbacks.BackupAndRestore)."
    )


def test_keras_fit_with_a_killed_ps_raises_task_failed_error(local):
    """Keras `fit`, variables on ps:1, compute on worker:0; ps:1 killed at batch 5."""
    victim = local.procs[("ps", 1)].pid
    proc = _client(
        f"""
        import signal
        import keras, numpy as np, tensorflow as tf
        from dpkeras import cluster
        from dpkeras.cluster import _connect, _devices, _health
        spec = cluster.cluster_spec_of(SPEC)
        cluster.connect(spec, timeout=60)
        with tf.device("/job:ps/replica:0/task:1/device:CPU:0"):
            model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16),
                                      keras.layers.Dense(1)])
            model.compile(optimizer="adam", loss="mse")

        class Kill(keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                if batch == 5:
                    os.kill({victim}, signal.SIGKILL)

        x, y = np.ones((640, 8), "float32"), np.ones((640, 1), "float32")
        try:
            with cluster.name_failures(spec):
                with tf.device("/job:worker/replica:0/task:0/device:CPU:0"):
                    model.fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=[Kill()])
        except cluster.TaskFailedError as e:
            print(e.task, type(e.tensorflow_error).__name__)
        """,
        local.spec,
    )
    local.restart("ps", 1)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["/job:ps/replica:0/task:1", "UnavailableError"]


def test_a_restarted_task_is_named_from_its_state(local):
    """A restarted ps answers probes, but no longer holds the client's context: the next op on
    it becomes TaskFailedError naming it as restarted, found by running an op on each task (its
    state), not by reading TensorFlow's message; the healthy tasks are not named."""
    prefix = (
        "import dpkeras\ndpkeras.simulate_cpu_devices(2)\nimport json, os, sys\n"
        f"SPEC = json.loads({json.dumps(json.dumps(local.spec))})\n"
    )
    code = prefix + textwrap.dedent(
        """
        import tensorflow as tf
        from dpkeras import cluster
        from dpkeras.cluster import _health
        spec = cluster.cluster_spec_of(SPEC)
        cluster.connect(spec, timeout=60)
        with tf.device("/job:ps/replica:0/task:1/device:CPU:0"):
            v = tf.Variable(1.0)
        print("before:", _health.failed_tasks(spec), flush=True)
        sys.stdin.readline()  # the test restarts ps:1 meanwhile
        print("after:", _health.failed_tasks(spec), flush=True)
        try:
            with cluster.name_failures(spec):
                v.assign_add(1.0)
        except cluster.TaskFailedError as e:
            print("error:", e.task, "|", e, flush=True)
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=server_env(),
    )
    try:
        first = _read_line(proc, timeout=120)
        local.restart("ps", 1)
        out, err = proc.communicate("\n", timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert first == "before: {}", first
    assert proc.returncode == 0, err[-3000:]
    address = local.address("ps", 1)
    assert out.splitlines() == [
        "after: {'/job:ps/replica:0/task:1': \"it was restarted and lost this client's state\"}",
        f"error: /job:ps/replica:0/task:1 | /job:ps/replica:0/task:1 at {address} failed (it "
        f"was restarted and lost this client's state); synchronous training cannot continue. "
        f"Restart that task if it is down, then restart training from the last checkpoint "
        f"(keras.callbacks.BackupAndRestore).",
    ]


def _read_line(proc, timeout):
    """The next line of `proc`'s stdout, waiting at most `timeout` seconds."""
    lines = []
    reader = threading.Thread(target=lambda: lines.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    if not lines:
        pytest.fail(f"no line from the client within {timeout} s")
    return lines[0].rstrip("\n")


def test_resolve_cluster_reads_json_text_and_files(tmp_path):
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps(SPEC))
    assert cluster.cluster_spec_of(str(path)).as_dict() == cluster.cluster_spec_of(SPEC).as_dict()
    assert cluster.cluster_spec_of(json.dumps(SPEC)).as_dict() == SPEC
    with pytest.raises(ValueError, match=r"cannot read the cluster file '.*missing.json': No such"):
        cluster.cluster_spec_of(str(tmp_path / "missing.json"))
    with pytest.raises(ValueError, match=r"the cluster is not valid JSON .*Received: '\{ps'"):
        cluster.cluster_spec_of("{ps")


@pytest.mark.parametrize("job, index, have", [("worker", 2, "tasks 0..1"), ("chief", 0, "no task")])
def test_a_tf_config_task_the_cluster_does_not_list_is_one_clear_error(
    monkeypatch, job, index, have
):
    """Not an IndexError from deep inside: the task, the job's tasks, and the fix."""
    spec = {"ps": ["127.0.0.1:1"], "worker": ["127.0.0.1:2", "127.0.0.1:3"]}
    monkeypatch.setenv(
        "TF_CONFIG", json.dumps({"cluster": spec, "task": {"type": job, "index": index}})
    )
    with pytest.raises(ValueError) as raised:
        cluster.join()
    assert str(raised.value).startswith(
        f"TF_CONFIG's task is {job} {index}, but its cluster's {job!r} job has {have}: list "
        f"this task's address in the cluster, or fix the index. Received: task="
    )
    assert _connect.connected_cluster() is None
