"""`dpkeras serve`: a real task starts, is reachable, stops on SIGTERM; bad input is exit 2."""

import concurrent.futures
import json
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

from dpkeras import _cli as cli
from dpkeras import _config
from dpkeras._cli.serve import serve
from dpkeras.cluster import _task
from dpkeras.cluster._health import probe
from dpkeras.testing import LocalCluster, free_ports, run_python, serve_command, server_env


def test_serves_a_reachable_task_and_exits_0_on_sigterm():
    with LocalCluster(ps=0, workers=1, cpus=2) as cluster:
        proc = cluster.procs[("worker", 0)]
        for _ in range(20):  # the health probe's greeting is answered and harms nothing
            assert probe(cluster.address("worker", 0), timeout=10) is None
        out = run_python(
            f"""
            import tensorflow as tf
            from dpkeras import cluster
            spec = cluster.cluster_spec_of({cluster.spec!r})
            cluster.connect(spec, timeout=60)
            with tf.device("/job:worker/replica:0/task:0/device:CPU:1"):
                x = tf.constant(20.0) + 22.0
            print(x.device, float(x))
            """,
            timeout=300,
        )
        assert out.split() == ["/job:worker/replica:0/task:0/device:CPU:1", "42.0"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        assert proc.stdout.read().strip() == (
            "dpkeras serve: /job:worker/replica:0/task:0 stopped by SIGTERM; ending with status 0"
        )
        print(cluster.stderr("worker", 0))  # shown by pytest -s, for what TF logs


def test_a_task_starts_without_importing_keras_and_serves(tmp_path):
    """`dpkeras serve` refuses Keras's import before TensorFlow's (TensorFlow would import Keras,
    and Keras matplotlib: about half of a task's start): the task's imports, as `python -X
    importtime` lists them, hold TensorFlow and no Keras, matplotlib or tf-keras module, and
    the task serves a client. In a process that has TensorFlow already (this one), nothing is
    refused."""
    from dpkeras.cluster._without_keras import refuse_keras

    assert refuse_keras() is False  # this process imported TensorFlow and Keras
    (port,) = free_ports(1)
    spec = {"worker": [f"127.0.0.1:{port}"]}
    argv = serve_command(spec, "worker", 0, cpus=2)
    log = tmp_path / "stderr"
    with open(log, "w") as stderr:
        proc = subprocess.Popen(
            [argv[0], "-X", "importtime", *argv[1:]],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env={**server_env(), _config.VARIABLES["verbose"]: "1"},
        )
        try:
            lines = []
            deadline = time.monotonic() + 120
            while "ready" not in lines and time.monotonic() < deadline:
                line = proc.stdout.readline()
                if not line:
                    break
                lines.append(line.strip())
            assert "ready" in lines, (lines, log.read_text()[-3000:])
            out = run_python(
                f"""
                import tensorflow as tf
                from dpkeras import cluster
                cluster.connect(cluster.cluster_spec_of({spec!r}), timeout=60)
                with tf.device("/job:worker/replica:0/task:0/device:CPU:0"):
                    print(float(tf.constant(20.0) + 22.0))
                """,
                timeout=300,
            )
            assert out.split() == ["42.0"]
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
    imported = re.findall(r"^import time:\s+\d+ \|\s+\d+ \|\s*(\S+)$", log.read_text(), re.M)
    assert "tensorflow" in imported, log.read_text()[-3000:]
    refused = [m for m in imported if m.split(".")[0] in ("keras", "tf_keras", "matplotlib")]
    assert not refused, refused


def test_only_keras_and_tf_keras_are_refused_and_only_before_tensorflow(tmp_path):
    """What `refuse_keras` promises, in a fresh Python: nothing in a process that has TensorFlow
    already (though not Keras); else Keras and tf-keras, their submodules too, cannot be
    imported, while `find_spec` still finds them where Python would (TensorFlow reads Keras's
    directory); a module that only starts with their names (`keras_extra`) imports; a second
    call adds no second finder."""
    (tmp_path / "keras_extra.py").write_text("NAME = 'keras_extra'\n")
    (tmp_path / "tf_keras_extra.py").write_text("NAME = 'tf_keras_extra'\n")
    out = run_python(
        f"""
        import importlib, importlib.util, sys, types
        sys.path.insert(0, {str(tmp_path)!r})
        from dpkeras.cluster import _without_keras

        def finders():
            return sum(isinstance(f, _without_keras._Finder) for f in sys.meta_path)

        refused = ["keras", "keras.src.optimizers"]
        if importlib.util.find_spec("tf_keras") is not None:  # the peers extra
            refused += ["tf_keras", "tf_keras.optimizers"]
        found = {{m: importlib.util.find_spec(m).origin for m in refused if "." not in m}}
        sys.modules["tensorflow"] = types.ModuleType("tensorflow")  # TensorFlow, no Keras
        print("with tensorflow", _without_keras.refuse_keras(), finders())
        del sys.modules["tensorflow"]
        print("fresh", _without_keras.refuse_keras(), _without_keras.refuse_keras(), finders())
        for name, origin in found.items():
            spec = importlib.util.find_spec(name)
            print("found", name, spec.origin == origin, bool(spec.submodule_search_locations))
        for name in refused:
            try:
                importlib.import_module(name)
                print("imported", name)
            except ImportError as e:
                print("refused", name, "is not imported in a dpkeras serve task" in str(e))
        import keras_extra, tf_keras_extra
        print("imported", keras_extra.NAME, tf_keras_extra.NAME)
        print("modules", sorted(m for m in sys.modules if m.split(".")[0] in ("keras", "tf_keras")))
        """,
        timeout=120,
    )
    lines = out.splitlines()
    assert lines[:2] == ["with tensorflow False 0", "fresh True True 1"], out
    refused = [line for line in lines if line.startswith("refused")]
    assert refused[:2] == ["refused keras True", "refused keras.src.optimizers True"], out
    assert all(line.endswith(" True") for line in refused) and len(refused) in (2, 4), out
    found = [line for line in lines if line.startswith("found")]
    assert found and all(line.endswith(" True True") for line in found), out
    assert lines[-2:] == ["imported keras_extra tf_keras_extra", "modules []"], out
    assert not [line for line in lines if line.startswith("imported ") and "extra" not in line]


def test_ready_lines_name_task_address_and_warning_and_sigint_exits_0():
    with LocalCluster(ps=1, workers=1, cpus=1) as cluster:
        address = cluster.address("ps", 0)
        assert cluster.startup_lines[("ps", 0)] == [
            f"dpkeras serve: /job:ps/replica:0/task:0 listening on {address} (port "
            f"{address.rsplit(':', 1)[1]} of every interface; no authentication or encryption: "
            f"private networks only)",
            "ready",
        ]
        proc = cluster.procs[("ps", 0)]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0


def _one_error_line(capsys, argv, pattern):
    assert serve(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1, lines
    assert re.fullmatch(r"dpkeras serve: error: " + pattern, lines[0]), lines[0]


SPEC = json.dumps({"ps": ["127.0.0.1:1"], "worker": ["127.0.0.1:2", "127.0.0.1:3"]})


@pytest.mark.parametrize(
    "argv, pattern",
    [
        (
            ["--cluster", "{not json", "--job", "ps", "--task", "0"],
            r"--cluster is not valid JSON \(.*\)\. Received: '\{not json'",
        ),
        (
            ["--cluster", "/nonexistent/cluster.json", "--job", "ps", "--task", "0"],
            r"cannot read --cluster file '/nonexistent/cluster.json': "
            r"No such file or directory\..*",
        ),
        (
            ["--cluster", json.dumps({"ps": ["127.0.0.1:1"]}), "--job", "ps", "--task", "0"],
            r"A cluster must have a 'worker' job.*Received jobs \['ps'\].*",
        ),
        (
            ["--cluster", json.dumps({"worker": ["127.0.0.1:2"]}), "--job", "ps", "--task", "0"],
            r"the cluster has no job 'ps'\. Received jobs: \['worker'\]",
        ),
        (
            ["--cluster", SPEC, "--job", "worker", "--task", "2"],
            r"--task must be an index of job 'worker': 0\.\.1\. Received: 2",
        ),
        (
            ["--cluster", SPEC, "--job", "ps", "--task", "-1"],
            r"--task must be an index of job 'ps': 0\.\.0\. Received: -1",
        ),
        (
            ["--cluster", json.dumps({"worker": ["nohostport"]}), "--job", "worker", "--task", "0"],
            r"Every task of job 'worker' must be a 'host:port' address.*Received: 'nohostport'.*",
        ),
        (
            ["--cluster", SPEC, "--job", "ps", "--task", "0", "--cpus", "0"],
            r"--cpus must be >= 1\. Received: 0",
        ),
        (
            ["--job", "ps", "--task", "0"],
            r"no cluster: pass --cluster \(a JSON file or string\) or set TF_CONFIG\.",
        ),
        (
            ["--cluster", SPEC],
            r"which task to run is unknown: pass --job and --task.*Received: job=None, task=None\.",
        ),
        (
            ["--cluster", SPEC, "--job", "ps", "--task", "0", "--exit-with-client"],
            r"--exit-with-client needs the client's address: name it as the cluster's 'chief' "
            r"\(or 'master'\) job\. Without one the client is not a task of the cluster\.",
        ),
    ],
)
def test_bad_arguments_give_one_line_and_exit_2(capsys, monkeypatch, argv, pattern):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    _one_error_line(capsys, argv, pattern)


def test_cluster_from_a_file(capsys, tmp_path):
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps({"worker": ["127.0.0.1:2"]}))
    _one_error_line(
        capsys,
        ["--cluster", str(path), "--job", "worker", "--task", "3"],
        r"--task must be an index of job 'worker': 0\.\.0\. Received: 3",
    )


def test_task_from_tf_config(capsys, monkeypatch):
    monkeypatch.setenv(
        "TF_CONFIG",
        json.dumps(
            {"cluster": {"worker": ["127.0.0.1:2"]}, "task": {"type": "worker", "index": 5}}
        ),
    )
    _one_error_line(capsys, [], r"--task must be an index of job 'worker': 0\.\.0\. Received: 5")
    monkeypatch.setenv("TF_CONFIG", "{oops")
    _one_error_line(
        capsys, [], r"TF_CONFIG is not valid JSON \(.*\)\. Received: TF_CONFIG='\{oops'\."
    )
    cluster = {"ps": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"]}
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": "worker"}}))
    _one_error_line(
        capsys,
        [],
        r"this cluster has no chief or master, so worker 0 is the client: run the training "
        r"script in this task \(with this TF_CONFIG\), not `dpkeras serve`\.",
    )
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": "evaluator"}}))
    assert serve([]) == 0
    assert "takes no part" in capsys.readouterr().out


def test_under_tf_config_without_a_chief_serve_watches_worker_0(monkeypatch):
    """TFJob without a chief: worker 0 runs the training script and is the client, so the ps
    and the other workers, run as `dpkeras serve` under TF_CONFIG, watch worker 0 (not ps 0,
    which would keep them up after the client is gone)."""
    from dpkeras._cli.serve import _client_to_watch
    from dpkeras.cluster import _spec

    monkeypatch.delenv(_config.VARIABLES["exit_with_client"], raising=False)
    cluster = {"ps": ["127.0.0.1:1"], "worker": ["127.0.0.1:2", "127.0.0.1:3"]}
    for job, index in (("ps", 0), ("worker", 1)):
        monkeypatch.setenv(
            "TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": job, "index": index}})
        )
        spec = _spec.cluster_spec_of()
        assert _client_to_watch(spec, job, index, True, None) == (
            "/job:worker/replica:0/task:0",
            "127.0.0.1:2",
        )


def test_under_tf_config_a_task_ends_with_status_0_when_the_client_finishes():
    """Kubernetes runs `dpkeras serve` with TF_CONFIG: the ps pod must not outlive the job."""
    chief, ps, worker = (f"127.0.0.1:{port}" for port in free_ports(3))
    cluster = {"chief": [chief], "ps": [ps], "worker": [worker]}

    def tf_config(job):
        return json.dumps({"cluster": cluster, "task": {"type": job, "index": 0}})

    tasks = [
        subprocess.Popen(
            [sys.executable, "-m", "dpkeras", "serve"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=dict(server_env(), TF_CONFIG=tf_config(job)),
        )
        for job in ("ps", "worker")
    ]
    try:
        run_python(
            """
            import numpy as np, dpkeras, keras
            with dpkeras.scope():
                model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
                model.compile("sgd", "mse")
            model.fit(np.ones((8, 3)), np.ones((8, 1)), batch_size=4, verbose=0)
            """,
            env={"TF_CONFIG": tf_config("chief")},
            timeout=300,
        )
        assert [t.wait(timeout=60) for t in tasks] == [0, 0]
    finally:
        for t in tasks:
            if t.poll() is None:
                t.kill()


def test_a_task_whose_client_never_starts_ends_with_status_75_after_the_start_timeout():
    """A ps/worker pod whose client never comes must not wait forever nor end "successfully":
    after `$DPKERAS_CLIENT_START_TIMEOUT` seconds it ends with status 75 (EX_TEMPFAIL, so a
    scheduler retries the job) and says why. Every way a task is run watches the client: the
    one program under TF_CONFIG (at `dpkeras.cluster.join()`, or at `dpkeras.scope()`, which
    joins: neither returns in such a task), `dpkeras serve` under TF_CONFIG, and
    `dpkeras serve --cluster ... --exit-with-client`. They run at once, in one cluster whose
    chief (a free port nothing listens on) never starts; each must end 3 s after its `ready`,
    not at once and not after the 1800 s default."""
    from dpkeras.testing._cluster import READY_TIMEOUT, wait_for_line

    timeout = 3
    chief, ps, *workers = (f"127.0.0.1:{port}" for port in free_ports(5))
    cluster = {"chief": [chief], "ps": [ps], "worker": workers}

    def tf_config(job, index):
        return json.dumps({"cluster": cluster, "task": {"type": job, "index": index}})

    script = "import dpkeras\ndpkeras.cluster.join()\nprint('NOT REACHED')\n"
    in_scope = "import dpkeras\nwith dpkeras.scope():\n    print('NOT REACHED')\n"
    entries = {  # name -> (argv, TF_CONFIG or None, task, what its lines start with)
        "serve under TF_CONFIG": (
            [sys.executable, "-m", "dpkeras", "serve"],
            tf_config("ps", 0),
            "/job:ps/replica:0/task:0",
            "dpkeras serve",
        ),
        "serve --exit-with-client": (
            serve_command(cluster, "worker", 0) + ["--exit-with-client"],
            None,
            "/job:worker/replica:0/task:0",
            "dpkeras serve",
        ),
        "one program under TF_CONFIG, join()": (
            [sys.executable, "-c", script],
            tf_config("worker", 1),
            "/job:worker/replica:0/task:1",
            "dpkeras",
        ),
        "one program under TF_CONFIG, dpkeras.scope()": (
            [sys.executable, "-c", in_scope],
            tf_config("worker", 2),
            "/job:worker/replica:0/task:2",
            "dpkeras",
        ),
    }

    def run(entry):
        argv, config, _, _ = entries[entry]
        env = dict(server_env(), **{_config.VARIABLES["client_start_timeout"]: str(timeout)})
        env.pop("TF_CONFIG", None)
        env.pop(_config.VARIABLES["exit_with_client"], None)
        if config is not None:
            env["TF_CONFIG"] = config
        with tempfile.TemporaryFile(mode="w+") as err:
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, text=True, env=env)
            try:
                said = wait_for_line(proc, "ready", READY_TIMEOUT)
                ready = time.monotonic()
                status = proc.wait(timeout=60)  # bounded: far below the 1800 s default
                waited = time.monotonic() - ready
                said += proc.stdout.read().splitlines()  # what it printed after `ready`
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(timeout=30)
                proc.stdout.close()
            err.seek(0)
            lines = [line for line in err.read().splitlines() if line.startswith("dpkeras")]
        return status, waited, lines, said

    with concurrent.futures.ThreadPoolExecutor(len(entries)) as pool:
        results = dict(zip(entries, pool.map(run, entries)))
    chief = cluster["chief"][0]
    for entry, (status, waited, lines, _) in results.items():
        _, _, task, prefix = entries[entry]
        assert status == _task.CLIENT_GONE == 75, (entry, status, lines)
        assert lines == [
            f"{prefix}: the client /job:chief/replica:0/task:0 at {chief} did not answer "
            f"within {timeout} s; ending {task} with status 75."
        ], entry
        # `ready` is read a moment after it is printed: a little slack, never a whole timeout.
        assert timeout - 1 < waited < 60, (entry, waited)
    # The one program says where it stops being a client, and goes no further.
    for entry in (
        "one program under TF_CONFIG, join()",
        "one program under TF_CONFIG, dpkeras.scope()",
    ):
        _, _, task, _ = entries[entry]
        assert results[entry][3][0] == (
            f"dpkeras: this process is {task} of the cluster in TF_CONFIG, not its client "
            f"(/job:chief/replica:0/task:0): it stops being a client here, serves, and ends "
            f"with the client."
        )
        assert "NOT REACHED" not in results[entry][3]


def test_a_strategy_built_in_a_task_that_is_not_the_client_is_refused_naming_join(monkeypatch):
    """The constructor never serves: in a ps task under TF_CONFIG it refuses, naming the role
    and `dpkeras.cluster.join()`, before connecting or creating anything."""
    import dpkeras

    cluster = {"chief": ["127.0.0.1:1"], "ps": ["127.0.0.1:2"], "worker": ["127.0.0.1:3"]}
    monkeypatch.setenv(
        "TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": "ps", "index": 0}})
    )
    with pytest.raises(ValueError) as info:
        dpkeras.ParameterDeviceStrategy()
    assert str(info.value) == (
        "This process is /job:ps/replica:0/task:0 of the cluster in TF_CONFIG, not its client "
        "(/job:chief/replica:0/task:0): it cannot build a strategy. Call "
        "dpkeras.cluster.join() (or enter dpkeras.scope()) first in the script: a task that is "
        "not the client serves from there and never returns."
    )


def test_connect_in_a_task_that_is_not_the_client_is_refused_naming_join():
    """`dpkeras.cluster.connect` is the client's door: in a ps task under TF_CONFIG it neither
    serves (as `join` and `dpkeras.scope()` do there) nor connects as a client of its own
    cluster; it refuses, naming the role and `join`. Run in a child, bounded: a connect that
    served would end 3 s later with status 75, not with this error."""
    chief, ps, worker = (f"127.0.0.1:{port}" for port in free_ports(3))
    cluster = {"chief": [chief], "ps": [ps], "worker": [worker]}
    env = dict(
        server_env(),
        TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "ps", "index": 0}}),
        **{_config.VARIABLES["client_start_timeout"]: "3"},
    )
    proc = subprocess.run(
        [sys.executable, "-c", "import dpkeras\ndpkeras.cluster.connect(None)\nprint('CONNECTED')"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-2000:])
    assert proc.stdout == ""
    assert proc.stderr.rstrip().splitlines()[-1] == (
        "ValueError: This process is /job:ps/replica:0/task:0 of the cluster in TF_CONFIG, not "
        "its client (/job:chief/replica:0/task:0): it cannot connect as its client. Call "
        "dpkeras.cluster.join() (or enter dpkeras.scope()) first in the script: a task that is "
        "not the client serves from there and never returns."
    )


def test_port_in_use_exits_2_with_one_line_before_starting_tensorflow():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        address = f"127.0.0.1:{busy.getsockname()[1]}"
        proc = subprocess.run(
            serve_command({"worker": [address]}, "worker", 0),
            capture_output=True,
            text=True,
            env=server_env(),
            timeout=300,
        )
    assert proc.returncode == 2
    assert proc.stdout == ""
    ours = [line for line in proc.stderr.splitlines() if line.startswith("dpkeras")]
    assert ours == [
        f"dpkeras serve: error: port {address.rsplit(':', 1)[1]} of {address} is "
        f"already in use; stop what holds it or choose another port."
    ]
    assert proc.stderr.splitlines()[-1] == ours[0]  # nothing after it: TF never started


def test_cli_dispatches_serve(capsys):
    assert cli.main(["serve", "--cluster", SPEC, "--job", "ps", "--task", "9"]) == 2
    assert "--task must be an index of job 'ps'" in capsys.readouterr().err
    assert re.search(r"^  serve +run one task \(ps or worker\)", cli._USAGE, re.M)


def test_a_port_in_use_under_tf_config_is_one_line_naming_the_task_and_the_port():
    """The training script in a ps task (TF_CONFIG): `join()` serves, and a taken port is one
    line, not TensorFlow's "UnknownError: Could not start gRPC server". (`dpkeras serve`
    checks the port before it starts TensorFlow; see test_serve_argument_errors.)"""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cluster = {"chief": ["127.0.0.1:1"], "ps": [f"127.0.0.1:{port}"], "worker": ["127.0.0.1:2"]}
        tf_config = json.dumps({"cluster": cluster, "task": {"type": "ps", "index": 0}})
        proc = subprocess.run(
            [sys.executable, "-c", "import dpkeras; dpkeras.cluster.join()"],
            capture_output=True,
            text=True,
            env=dict(server_env(), TF_CONFIG=tf_config),
            timeout=120,
        )
    assert proc.returncode == 1, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last == (
        f"dpkeras: /job:ps/replica:0/task:0 cannot listen on 127.0.0.1:{port}: its port is in "
        f"use by another process. Stop what listens on port {port} (`ss -ltnp 'sport = "
        f":{port}'` names it), or give this task another address in the cluster."
    ), proc.stderr[-2000:]
