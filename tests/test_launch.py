"""One program in every task (TF_CONFIG, as Kubeflow's TFJob runs TensorFlow), the local
launcher, and how tasks end.

Every cluster here is real: `dpkeras launch` starts each task as a process on free loopback
ports with its TF_CONFIG, and every wait is bounded.
"""

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from dpkeras import _quiet
from dpkeras.cluster import _local, _spec, _task
from dpkeras.testing import server_env

LAUNCH_TIMEOUT = 300

_TRAIN = """
import json
import numpy as np
import dpkeras, keras

def build():
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((4,), dtype="int32"), keras.layers.Embedding(50, 4),
                              keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(2)])
    model.compile(optimizer="adam",
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model

rng = np.random.RandomState(0)
x, y = rng.randint(0, 50, (64, 4)).astype("int32"), rng.randint(0, 2, 64)
with dpkeras.scope() as strategy:  # a ps or worker task serves from here, then ends
    model = build()
history = model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
reference = build()  # after connecting: this process's own variables, no strategy
expected = reference.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
print("RESULT " + json.dumps({
    "replicas": strategy.num_replicas_in_sync,
    "max_diff": max(float(np.abs(a - b).max())
                    for a, b in zip(reference.get_weights(), model.get_weights())),
    "loss": history.history["loss"], "expected": expected.history["loss"]}))
"""


def _launch(tmp_path, script, *flags, timeout=LAUNCH_TIMEOUT):
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(script))
    proc = subprocess.run(
        [sys.executable, "-m", "dpkeras", "launch", *flags, "--", sys.executable, str(path)],
        capture_output=True,
        text=True,
        env=server_env(),
        timeout=timeout,
    )
    statuses = {}
    for line in proc.stdout.splitlines():
        if line.startswith("dpkeras launch: ") and " exited with status " in line:
            task, status = line[len("dpkeras launch: ") :].split(" exited with status ")
            statuses[task] = status if "stopped by" in status else int(status)
    return proc, statuses


@pytest.mark.parametrize("client", ["chief", "master", "worker"])
def test_one_program_in_every_task_trains_and_every_task_ends_with_status_0(tmp_path, client):
    proc, statuses = _launch(tmp_path, _TRAIN, "--ps=1", "--workers=2", f"--client={client}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    leader = "worker:0" if client == "worker" else f"{client}:0"
    expected_tasks = {"ps:0", "worker:0", "worker:1"} | {leader}
    assert statuses == dict.fromkeys(expected_tasks, 0)
    line = next(li for li in proc.stdout.splitlines() if li.startswith(f"[{leader}] RESULT "))
    out = json.loads(line.split("RESULT ", 1)[1])
    # Without a chief, worker 0 leads and its own device computes too.
    assert out["replicas"] == 2
    assert out["max_diff"] < 1e-5
    assert out["loss"] == pytest.approx(out["expected"], rel=1e-5)
    # TensorFlow's noise is hidden, and counted (dpkeras._quiet).
    lines = [re.sub(r"^\[\w+:\d+\] ", "", li) for li in (proc.stdout + proc.stderr).splitlines()]
    assert [li for li in lines if _quiet.is_noise(li)] == []
    assert re.search(
        r"^dpkeras launch: \d+ lines of TensorFlow's logs hidden \(--verbose", proc.stdout, re.M
    )
    for task in expected_tasks - {leader}:  # each serving task says when the client came
        job, index = task.split(":")
        assert re.search(
            rf"^\[{task}\] dpkeras: /job:{job}/replica:0/task:{index}: the client "
            rf"/job:{leader.split(':')[0]}/replica:0/task:0 at 127\.0\.0\.1:\d+ is up$",
            proc.stdout,
            re.M,
        ), proc.stdout[-3000:]
        # It says when the client connected and finished, and why it ends: not as a warning.
        client = rf"/job:{leader.split(':')[0]}/replica:0/task:0"
        name = rf"/job:{job}/replica:0/task:{index}"
        for pattern, stream in (
            (
                rf"{name}: client {client} at 127\.0\.0\.1:\d+ \(pid \d+ on host .*\) connected",
                proc.stderr,
            ),
            (rf"{name}: client {client} finished training", proc.stderr),
            (rf"{name}: the client {client} finished training; ending with status 0", proc.stdout),
        ):
            assert re.search(rf"^\[{task}\] dpkeras: {pattern}$", stream, re.M), stream[-3000:]
    assert "Exiting the process" not in proc.stderr, proc.stderr[-3000:]


@pytest.mark.parametrize("client", ["chief", "worker"])
def test_a_client_that_fails_ends_every_task_with_status_75(tmp_path, client):
    """The tasks watch the client and end with status 75 when it dies mid-job, each naming it.
    Without a chief (TFJob's layout with only ps and workers) the client is worker 0: the ps
    and worker 1 must watch worker 0, not ps 0 (which stays up, so watching it would leave
    them running until the launcher's grace ran out and it stopped them)."""
    script = """
    import dpkeras, keras
    with dpkeras.scope():
        keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    raise RuntimeError("the training script failed")
    """
    start = time.monotonic()
    workers = 1 if client == "chief" else 2
    proc, statuses = _launch(
        tmp_path, script, "--ps=1", f"--workers={workers}", f"--client={client}"
    )
    assert proc.returncode == 1
    serving = ["ps:0", "worker:0"] if client == "chief" else ["ps:0", "worker:1"]
    assert statuses == {f"{client}:0": 1, **dict.fromkeys(serving, 75)}
    for task in serving:
        job, index = task.split(":")
        assert re.search(
            rf"^\[{task}\] dpkeras: the client /job:{client}/replica:0/task:0 at 127\.0\.0\.1:\d+ "
            rf"stopped answering \(Connection refused\) before training finished; ending "
            rf"/job:{job}/replica:0/task:{index} with status 75\.$",
            proc.stderr,
            re.M,
        ), proc.stderr[-3000:]
    assert time.monotonic() - start < LAUNCH_TIMEOUT  # ended by themselves, bounded


def test_the_launcher_stops_every_task_on_ctrl_c(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(
        "import time, dpkeras\nwith dpkeras.scope():\n    pass\nprint('STARTED', flush=True)\n"
        "time.sleep(600)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "dpkeras", "launch", "--ps=1", "--workers=1", "--"]
        + [sys.executable, str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=server_env(),
    )
    try:
        deadline = time.monotonic() + LAUNCH_TIMEOUT
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if "STARTED" in line or time.monotonic() > deadline:
                break
        assert any("STARTED" in line for line in lines), lines
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGINT
    assert rest.count(" exited with status ") == 3  # chief, ps and worker: all stopped
    assert rest.count("(stopped by dpkeras launch)") == 3


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--workers=0"], r"--workers must be >= 1\. Received: 0"),
        ([], r"no program: give it after --"),
    ],
)
def test_launcher_usage_errors(flags, message):
    proc = subprocess.run(
        [sys.executable, "-m", "dpkeras", "launch", *flags],
        capture_output=True,
        text=True,
        env=server_env(),
        timeout=120,
    )
    assert proc.returncode == 2
    assert re.search(message, proc.stderr), proc.stderr


def test_flags_after_the_double_dash_are_the_program_s_verbose_included(tmp_path):
    """`dpkeras launch -- prog --verbose --ps 3`: every task's program receives `--verbose
    --ps 3`, and the launcher stays quiet (its own --verbose comes before the `--`)."""
    path = tmp_path / "args.py"
    path.write_text(
        "import os, sys\nprint('ARGS', sys.argv[1:], os.environ.get('DPKERAS_VERBOSE'))\n"
    )
    env = server_env()
    env.pop("DPKERAS_VERBOSE", None)
    proc = subprocess.run(
        [sys.executable, "-m", "dpkeras", "launch", "--ps", "0", "--workers", "1", "--"]
        + [sys.executable, str(path), "--verbose", "--ps", "3"],
        capture_output=True,
        text=True,
        env=env,
        timeout=LAUNCH_TIMEOUT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    said = sorted(line for line in proc.stdout.splitlines() if " ARGS " in line)
    assert said == [
        "[chief:0] ARGS ['--verbose', '--ps', '3'] None",
        "[worker:0] ARGS ['--verbose', '--ps', '3'] None",
    ], proc.stdout


def _tf_config(cluster, job, index):
    return json.dumps({"cluster": cluster, "task": {"type": job, "index": index}})


def test_an_evaluator_takes_no_part_and_ends_with_status_0():
    cluster = {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"], "evaluator": ["127.0.0.1:3"]}
    proc = subprocess.run(
        [sys.executable, "-c", "import dpkeras\nwith dpkeras.scope():\n    print('NOT REACHED')"],
        capture_output=True,
        text=True,
        env=dict(server_env(), TF_CONFIG=_tf_config(cluster, "evaluator", 0)),
        timeout=120,
    )
    assert proc.returncode == 0
    assert "uses no evaluator" in proc.stdout and "NOT REACHED" not in proc.stdout


def test_the_roles_read_from_tf_config(monkeypatch):
    """Kubeflow's layouts: chief, master (its older name), or neither (worker 0 leads)."""
    for leader in ("chief", "master"):
        cluster = {leader: ["h:1"], "ps": ["h:2"], "worker": ["h:3", "h:4"], "evaluator": ["h:5"]}
        monkeypatch.setenv("TF_CONFIG", _tf_config(cluster, "worker", 0))
        spec = _spec.cluster_spec_of()
        assert sorted(spec.jobs) == sorted([leader, "ps", "worker"])  # no evaluator
        assert _spec.client_task(spec) == (leader, 0)
        assert _task.client_address(spec) == (f"/job:{leader}/replica:0/task:0", "h:1")
    cluster = {"ps": ["h:2"], "worker": ["h:3", "h:4"]}
    monkeypatch.setenv("TF_CONFIG", _tf_config(cluster, "worker", 0))
    spec = _spec.cluster_spec_of()
    assert _spec.client_task(spec) == ("worker", 0)
    # The tasks that serve watch worker 0 (the client), not ps 0, whatever their own task.
    for job, index in (("ps", 0), ("worker", 1)):
        monkeypatch.setenv("TF_CONFIG", _tf_config(cluster, job, index))
        assert _task.client_address(_spec.cluster_spec_of()) == (
            "/job:worker/replica:0/task:0",
            "h:3",
        )
    monkeypatch.setenv("TF_CONFIG", _tf_config(cluster, "worker", 0))
    assert set(_spec.cluster_of(spec).remote) == {
        "/job:ps/replica:0/task:0",
        "/job:worker/replica:0/task:1",
    }
    monkeypatch.setenv("TF_CONFIG", _tf_config(cluster, "worker", 1))
    assert _spec.client_task(_spec.cluster_spec_of()) is None  # worker 1 serves


def test_the_tfjob_manifest_names_the_roles_dpkeras_reads():
    path = os.path.join(os.path.dirname(os.path.dirname(__file__)), "docs", "tfjob.json")
    with open(path, encoding="utf-8") as f:
        manifest = json.load(f)
    assert manifest["kind"] == "TFJob"
    specs = manifest["spec"]["tfReplicaSpecs"]
    assert set(specs) == {"Chief", "PS", "Worker"}
    commands = {
        role: spec["template"]["spec"]["containers"][0]["command"] for role, spec in specs.items()
    }
    assert len({json.dumps(c) for c in commands.values()}) == 1  # one program in every task
    assert specs["Chief"]["replicas"] == 1
    assert not manifest["spec"].get("enableDynamicWorker", False)
    # The TF_CONFIG TFJob writes for each role (lower-cased replica types) is one dpkeras reads.
    cluster = {
        role.lower(): [f"job-{role.lower()}-{i}.ns.svc:2222" for i in range(spec["replicas"])]
        for role, spec in specs.items()
    }
    for role in specs:
        os.environ["TF_CONFIG"] = _tf_config(cluster, role.lower(), 0)
        try:
            assert _spec.tf_config_task() == (role.lower(), 0)
            assert _spec.client_task(_spec.cluster_spec_of()) == ("chief", 0)
        finally:
            del os.environ["TF_CONFIG"]


def test_the_network_policy_admits_only_the_job_s_own_pods_on_its_port():
    docs = os.path.join(os.path.dirname(os.path.dirname(__file__)), "docs")
    with open(os.path.join(docs, "tfjob.json"), encoding="utf-8") as f:
        job = json.load(f)
    with open(os.path.join(docs, "tfjob-networkpolicy.json"), encoding="utf-8") as f:
        policy = json.load(f)
    assert policy["kind"] == "NetworkPolicy"
    own = {"training.kubeflow.org/job-name": job["metadata"]["name"]}
    assert policy["spec"]["podSelector"] == {"matchLabels": own}
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    assert rule["from"] == [{"podSelector": {"matchLabels": own}}]  # no namespace, no IP block
    ports = {
        port["containerPort"]
        for spec in job["spec"]["tfReplicaSpecs"].values()
        for container in spec["template"]["spec"]["containers"]
        for port in container["ports"]
    }
    assert [(p["protocol"], p["port"]) for p in rule["ports"]] == [("TCP", port) for port in ports]


def test_an_uncaught_task_failure_is_the_client_s_last_line(tmp_path):
    """A ps that ends mid-job: the client's output ends with one line naming it, printed as
    users import the class; TensorFlow's teardown noise ("Failed to remove function remotely",
    a line per function and task) is not printed after it. (TensorFlow's own lines from the
    failing step itself, a few, come before the traceback.)"""
    script = """
    import numpy as np
    import dpkeras, keras, tensorflow as tf
    with dpkeras.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        model.compile("sgd", "mse")
    x, y = np.ones((32, 3), "float32"), np.ones((32, 1), "float32")
    model.fit(x, y, epochs=1, verbose=0)  # the client's functions now live on every task
    try:
        with tf.device("/job:ps/replica:0/task:0/device:CPU:0"):
            tf.raw_ops.Abort(error_msg="ended by the test", exit_without_error=True)
    except Exception:
        pass
    model.fit(x, y, epochs=1, verbose=0)
    """
    proc, statuses = _launch(tmp_path, script, "--ps=1", "--workers=1")
    assert statuses.get("chief:0") == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    client = [
        line[len("[chief:0] ") :]
        for line in (proc.stdout + proc.stderr).splitlines()
        if line.startswith("[chief:0] ") and line.strip() != "[chief:0]"
    ]
    assert re.match(
        r"dpkeras\.TaskFailedError: /job:ps/replica:0/task:0 at 127\.0\.0\.1:\d+ is unreachable",
        client[-1],
    ), client[-20:]


def test_the_ports_of_a_cluster_are_distinct():
    """`dpkeras launch` and LocalCluster take their ports together: asked for one at a time,
    the kernel may hand a port just released out again (CI once got two workers on one port)."""
    ports = _local.free_ports(500)
    assert len(set(ports)) == 500
