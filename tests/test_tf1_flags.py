"""TF1's between-graph layout: the same script in every task, its task given by flags
(`--job_name --task_index --ps_hosts --worker_hosts`, TensorFlow's `mnist_replica.py`) and
passed to `dpkeras.cluster.join`, which decides as under `TF_CONFIG`.

The end-to-end test starts real processes on free 127.0.0.1 ports; every wait is bounded.
"""

import json
import re
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from dpkeras._cli import launch
from dpkeras.cluster import _spec
from dpkeras.cluster._local import child_options
from dpkeras.testing import assert_weights_close, free_ports, server_env

HOSTS = {"ps_hosts": "10.0.0.1:2222", "worker_hosts": "10.0.0.2:2222,10.0.0.3:2222"}
SPEC = {"ps": ["10.0.0.1:2222"], "worker": ["10.0.0.2:2222", "10.0.0.3:2222"]}


@pytest.fixture(autouse=True)
def no_task_given(monkeypatch):
    """Each test starts as a process given no task, without TF_CONFIG."""
    monkeypatch.setattr(_spec, "_given", None)
    monkeypatch.delenv("TF_CONFIG", raising=False)


def _take(**flags):
    _spec.take_task(*_spec.task_given(**flags))
    return _spec.cluster_of()


def test_no_flags_is_no_task():
    assert _spec.task_given() is None
    assert _spec.task_given(cluster=SPEC) is None


@pytest.mark.parametrize(
    "hosts",
    [HOSTS, {"ps_hosts": ["10.0.0.1:2222"], "worker_hosts": ["10.0.0.2:2222", " 10.0.0.3:2222"]}],
    ids=["strings", "lists"],
)
def test_the_flags_give_the_cluster_and_task_tf_config_would(hosts):
    config, source = _spec.task_given(job_name="worker", task_index="1", **hosts)
    assert config == {"cluster": SPEC, "task": {"type": "worker", "index": 1}}
    assert source.startswith("join(job_name='worker', task_index='1', ps_hosts=")


@pytest.mark.parametrize(
    "job, index, serves_as, own",
    [("ps", 0, ("ps", 0), None), ("worker", 1, ("worker", 1), None), ("worker", 0, None, 0)],
)
def test_worker_0_is_the_client_and_every_other_task_serves(job, index, serves_as, own):
    joined = _take(job_name=job, task_index=index, **HOSTS)
    assert joined.as_dict() == SPEC
    assert joined.serves_as == serves_as
    assert joined.client == ("/job:worker/replica:0/task:0", "10.0.0.2:2222")
    assert joined.own == (None if own is None else ("worker", 0))
    assert joined.ends_tasks == (own is not None)  # worker 0 ends the tasks at its exit
    assert _spec.task_origin() == "given to dpkeras.cluster.join()"


def test_a_cluster_with_job_name_and_task_index_is_tf_distribute_server_s_form():
    spec = {"chief": ["10.0.0.9:2222"], **SPEC}
    joined = _take(cluster=spec, job_name="ps", task_index=0)
    assert joined.serves_as == ("ps", 0)
    assert joined.client == ("/job:chief/replica:0/task:0", "10.0.0.9:2222")


def test_a_tf_config_that_agrees_is_no_conflict_and_a_second_join_the_same_is_a_no_op(
    monkeypatch,
):
    tf_config = {"cluster": SPEC, "task": {"type": "ps", "index": 0}}
    monkeypatch.setenv("TF_CONFIG", json.dumps(tf_config))
    assert _take(job_name="ps", task_index=0, **HOSTS).serves_as == ("ps", 0)
    assert _take(job_name="ps", task_index=0, **HOSTS).serves_as == ("ps", 0)


@pytest.mark.parametrize(
    "tf_config, theirs",
    [
        ({"cluster": SPEC, "task": {"type": "worker", "index": 1}}, "/job:worker/replica:0/task:1"),
        ({"cluster": {"worker": ["h:1"]}, "task": {"type": "worker", "index": 0}}, "task:0 of"),
        ({"cluster": SPEC}, "no task"),
    ],
    ids=["other-task", "other-cluster", "no-task"],
)
def test_flags_and_a_tf_config_that_differ_are_one_error(monkeypatch, tf_config, theirs):
    monkeypatch.setenv("TF_CONFIG", json.dumps(tf_config))
    with pytest.raises(
        ValueError,
        match=r"^This process is given its task twice, and the two differ: join\(job_name='ps', "
        r"task_index=0, .*\) makes it /job:ps/replica:0/task:0 of \{.*\}; TF_CONFIG makes it "
        rf".*{re.escape(theirs)}.* Give one: unset TF_CONFIG, or call join\(\) without "
        r"job_name and task_index\. Received: TF_CONFIG='.*'\.$",
    ):
        _take(job_name="ps", task_index=0, **HOSTS)
    assert _spec._given is None  # nothing taken


def test_a_process_is_one_task_for_its_lifetime():
    _take(job_name="ps", task_index=0, **HOSTS)
    with pytest.raises(
        ValueError,
        match=r"^This process already joined as /job:ps/replica:0/task:0 of \{.*\} "
        r"\(join\(job_name='ps', .*\)\); a process is one task for its lifetime\. Received: "
        r"join\(job_name='worker', task_index=1, .*\)\.$",
    ):
        _take(job_name="worker", task_index=1, **HOSTS)


@pytest.mark.parametrize(
    "flags, pattern",
    [
        (
            dict(HOSTS, job_name="chief", task_index=0),
            r"^job_name must be 'ps' or 'worker', a job of the cluster given\. "
            r"Received: job_name='chief'\.$",
        ),
        (
            dict(worker_hosts="h:1", job_name="ps", task_index=0),
            r"^job_name must be 'worker', a job of the cluster given\. Received: job_name='ps'\.$",
        ),
        (
            dict(HOSTS, job_name="worker", task_index=2),
            r"^task_index 2 is out of range: job 'worker' has 2 task\(s\), indices 0\.\.1\. "
            r"Received: job_name='worker', task_index=2, ps_hosts='10\.0\.0\.1:2222', "
            r"worker_hosts='10\.0\.0\.2:2222,10\.0\.0\.3:2222'\.$",
        ),
        (
            dict(HOSTS, job_name="worker", task_index="one"),
            r"^task_index must be an integer >= 0\. Received: task_index='one' \(of type str\)\.$",
        ),
        (
            dict(HOSTS, job_name="worker", task_index=True),
            r"^task_index must be an integer >= 0\. Received: task_index=True \(of type bool\)\.$",
        ),
        (
            dict(job_name="worker", task_index=0, ps_hosts="", worker_hosts="h:1"),
            r"^ps_hosts is empty: give every task's 'host:port', comma-separated, such as "
            r"'10\.0\.0\.1:2222,10\.0\.0\.2:2222'\. Received: ps_hosts=''\.$",
        ),
        (
            dict(job_name="worker", task_index=0, worker_hosts="h:1,,h:2"),
            r"^worker_hosts has an empty address: give every task's 'host:port', .* "
            r"Received: worker_hosts='h:1,,h:2'\.$",
        ),
        (
            dict(job_name="worker", task_index=0, worker_hosts=2222),
            r"^worker_hosts must be 'host:port' addresses, comma-separated in a string or in a "
            r"list\. Received: worker_hosts=2222 \(of type int\)\.$",
        ),
        (
            dict(job_name="worker", task_index=0, worker_hosts="h"),
            r"^Every task of job 'worker' must be a 'host:port' address such as "
            r"'10\.0\.0\.2:2222'\. Received: 'h' from join\(job_name='worker', task_index=0, "
            r"worker_hosts='h'\)\.$",
        ),
        (
            dict(job_name="ps", task_index=0, ps_hosts="h:1"),
            r"^worker_hosts is missing: with job_name and task_index, join\(\) needs the "
            r"workers' addresses \(and ps_hosts, the ps tasks'\), or a cluster\. Received: "
            r"job_name='ps', task_index=0, ps_hosts='h:1'\.$",
        ),
        (
            dict(HOSTS, task_index=0),
            r"^job_name missing: join\(\) needs job_name and task_index, this process's task, "
            r"with the cluster's addresses\. Received: task_index=0, ps_hosts=.*\.$",
        ),
        (
            dict(HOSTS, job_name="ps"),
            r"^task_index missing: join\(\) needs .* Received: job_name='ps', ps_hosts=.*\.$",
        ),
        (
            dict(cluster=SPEC, job_name="ps", task_index=0, worker_hosts="h:1"),
            r"^join\(\) takes the cluster or ps_hosts and worker_hosts, not both\. Received: "
            r"cluster=\{.*\}, job_name='ps', task_index=0, worker_hosts='h:1'\.$",
        ),
        (
            dict(cluster=SPEC, job_name="chief", task_index=0),
            r"^job_name must be 'ps' or 'worker', a job of the cluster given\. "
            r"Received: job_name='chief'\.$",
        ),
    ],
)
def test_bad_flags_are_one_line_errors(flags, pattern):
    with pytest.raises(ValueError, match=pattern) as raised:
        _spec.task_given(**flags)
    assert "\n" not in str(raised.value)


def test_launch_gives_each_task_tf1_s_flags():
    spec = {"ps": ["127.0.0.1:1"], "worker": ["127.0.0.1:2", "127.0.0.1:3"]}
    assert launch.task_flags(spec, "worker", 1) == [
        "--job_name=worker",
        "--task_index=1",
        "--ps_hosts=127.0.0.1:1",
        "--worker_hosts=127.0.0.1:2,127.0.0.1:3",
    ]
    assert launch.task_flags({"worker": ["127.0.0.1:2"]}, "worker", 0) == [
        "--job_name=worker",
        "--task_index=0",
        "--worker_hosts=127.0.0.1:2",
    ]


def test_launch_flags_start_each_task_with_its_flags_and_no_tf_config(tmp_path):
    """`dpkeras launch --flags`: each task's command ends with its four flags, `TF_CONFIG`
    (even one in the launcher's environment) is not passed on, and worker 0 is the client."""
    path = tmp_path / "args.py"
    path.write_text("import os, sys\nprint('ARGS', sys.argv[1:], os.environ.get('TF_CONFIG'))\n")
    proc = subprocess.run(
        [sys.executable, "-m", "dpkeras", "launch", "--flags", "--ps", "1", "--workers", "2"]
        + ["--", sys.executable, str(path), "--out=x"],
        capture_output=True,
        text=True,
        env=dict(server_env(), TF_CONFIG=json.dumps({"cluster": SPEC})),
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(
        r"^dpkeras launch: ps:0, worker:0, worker:1 on 127\.0\.0\.1; the client is "
        r"worker:0$",
        proc.stdout,
        re.M,
    ), proc.stdout
    said = sorted(line for line in proc.stdout.splitlines() if " ARGS " in line)
    hosts = (
        r"'--ps_hosts=127\.0\.0\.1:(\d+)', '--worker_hosts=127\.0\.0\.1:(\d+),127\.0\.0\.1:(\d+)'"
    )
    tasks = [("ps", 0), ("worker", 0), ("worker", 1)]
    assert len(said) == 3, proc.stdout
    ports = set()
    for line, (job, index) in zip(said, tasks):
        match = re.fullmatch(
            rf"\[{job}:{index}\] ARGS \['--out=x', '--job_name={job}', '--task_index={index}', "
            rf"{hosts}\] None",
            line,
        )
        assert match, line
        ports.add(match.groups())
    assert len(ports) == 1  # every task was given the same cluster


def test_launch_flags_with_a_chief_is_a_usage_error():
    proc = subprocess.run(
        [sys.executable, "-m", "dpkeras", "launch", "--flags", "--client", "chief", "--"]
        + [sys.executable, "-c", "pass"],
        capture_output=True,
        text=True,
        env=server_env(),
        timeout=120,
    )
    assert proc.returncode == 2
    assert re.search(
        r"^dpkeras launch: error: --flags makes worker 0 the client \(TF1's flags name ps and "
        r"worker tasks only\)\. Received: --client chief$",
        proc.stderr,
        re.M,
    ), proc.stderr


# TF1's between-graph script, ported: absl flags, the same file in every task. Without flags
# it trains in one process: the reference.
_SCRIPT = """
import numpy as np
from absl import app, flags
import dpkeras, keras

flags.DEFINE_string("job_name", None, "ps or worker")
flags.DEFINE_integer("task_index", None, "index of the task in its job")
flags.DEFINE_string("ps_hosts", None, "comma-separated host:port of the ps tasks")
flags.DEFINE_list("worker_hosts", None, "host:port of the workers")
flags.DEFINE_string("out", None, "where the trained weights go")
FLAGS = flags.FLAGS


def main(_):
    dpkeras.cluster.join(job_name=FLAGS.job_name, task_index=FLAGS.task_index,
                         ps_hosts=FLAGS.ps_hosts, worker_hosts=FLAGS.worker_hosts)
    keras.utils.set_random_seed(1)
    rng = np.random.RandomState(0)
    x = rng.rand(64, 8).astype("float32")
    y = rng.rand(64, 2).astype("float32")
    with dpkeras.scope() as strategy:
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4, activation="relu"),
                                  keras.layers.Dense(2)])
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    np.savez(FLAGS.out, replicas=strategy.num_replicas_in_sync, *model.get_weights())
    print("TRAINED", flush=True)


if __name__ == "__main__":
    app.run(main)
"""
E2E_TIMEOUT = 240  # seconds for the whole cluster to end, on a loaded machine


def _weights(path):
    with np.load(path) as saved:
        arrays = [saved[f"arr_{i}"] for i in range(len(saved.files) - 1)]
        return int(saved["replicas"]), arrays


def test_a_flags_script_under_absl_trains_on_worker_0_and_every_task_ends_with_status_0(
    tmp_path,
):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(_SCRIPT))
    ps, w0, w1 = (f"127.0.0.1:{port}" for port in free_ports(3))
    hosts = [f"--ps_hosts={ps}", f"--worker_hosts={w0},{w1}"]
    env = server_env()
    env.pop("TF_CONFIG", None)
    procs = {}
    try:
        for job, index in (("ps", 0), ("worker", 1), ("worker", 0)):
            argv = [sys.executable, str(script), f"--job_name={job}", f"--task_index={index}"]
            procs[f"{job}:{index}"] = subprocess.Popen(
                [*argv, *hosts, f"--out={tmp_path / f'{job}{index}.npz'}"],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
                **child_options(),
            )
        reference = subprocess.run(  # meanwhile: the same script, no flags, one process
            [sys.executable, str(script), f"--out={tmp_path / 'reference.npz'}"],
            capture_output=True,
            text=True,
            env=env,
            timeout=E2E_TIMEOUT,
        )
        assert reference.returncode == 0, reference.stderr[-3000:]
        deadline = time.monotonic() + E2E_TIMEOUT
        outputs = {
            task: proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            for task, proc in procs.items()
        }
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
    statuses = {task: proc.returncode for task, proc in procs.items()}
    shown = {task: err[-2000:] for task, (_, err) in outputs.items()}
    assert statuses == {"ps:0": 0, "worker:0": 0, "worker:1": 0}, shown
    assert "TRAINED" in outputs["worker:0"][0]
    for task in ("ps:0", "worker:1"):  # they served and never reached the training
        job, index = task.split(":")
        out = outputs[task][0]
        assert "TRAINED" not in out
        assert re.search(
            rf"^dpkeras: this process is /job:{job}/replica:0/task:{index} of the cluster given "
            r"to dpkeras\.cluster\.join\(\), not its client \(/job:worker/replica:0/task:0\)",
            out,
            re.M,
        ), out
        assert re.search(
            rf"^dpkeras: /job:{job}/replica:0/task:{index}: the client "
            r"/job:worker/replica:0/task:0 finished training; ending with status 0$",
            out,
            re.M,
        ), out
    replicas, trained = _weights(tmp_path / "worker0.npz")
    one, expected = _weights(tmp_path / "reference.npz")
    assert (replicas, one) == (2, 1)  # worker 0's and worker 1's devices; one CPU
    assert_weights_close(expected, trained, rtol=1e-5, atol=1e-6)


def test_spaces_around_the_addresses_of_a_flag_string_are_ignored():
    """`--worker_hosts="h:1, h:2"` (a space after each comma) names the same tasks as without
    the spaces, as in a list."""
    config, _ = _spec.task_given(
        job_name="worker",
        task_index=1,
        ps_hosts=" 10.0.0.1:2222 ",
        worker_hosts="10.0.0.2:2222, 10.0.0.3:2222",
    )
    assert config == {"cluster": SPEC, "task": {"type": "worker", "index": 1}}


def test_a_second_join_as_the_same_task_of_another_cluster_is_refused():
    _take(job_name="ps", task_index=0, **HOSTS)
    with pytest.raises(ValueError, match=r"^This process already joined as /job:ps/replica:0/"):
        _take(job_name="ps", task_index=0, ps_hosts="10.0.0.9:2222", worker_hosts="10.0.0.2:2222")
    assert _spec.cluster_of().as_dict() == SPEC  # still the first
