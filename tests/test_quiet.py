"""dpkeras's commands print what their user needs: TensorFlow's log noise is hidden unless asked
for (`--verbose`, `$DPKERAS_VERBOSE`), and `dpkeras --help` imports no TensorFlow
(`dpkeras._quiet`, `dpkeras._lazy`). Checked against what TensorFlow prints here, in processes
started without `TF_CPP_MIN_LOG_LEVEL` (which the suite's conftest sets)."""

import json
import logging
import os
import re
import select
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from dpkeras import _quiet
from dpkeras.cluster import _local
from dpkeras.testing import LocalCluster, run_python, serve_command, server_env
from dpkeras.testing._cluster import wait_for_line


def _env(**extra):
    env = {k: v for k, v in server_env().items() if k not in ("TF_CPP_MIN_LOG_LEVEL",)}
    env.pop("DPKERAS_VERBOSE", None)
    return dict(env, **extra)


def _python(code, **extra):
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=_env(**extra),
        timeout=300,
    )


def _dpkeras(*argv, **extra):
    return subprocess.run(
        [sys.executable, "-m", "dpkeras", *argv],
        capture_output=True,
        text=True,
        env=_env(**extra),
        timeout=300,
    )


@pytest.fixture(scope="module")
def tensorflow_start_up():
    """What TensorFlow writes to standard error when it starts and makes a tensor, here."""
    proc = _python("import tensorflow as tf; tf.constant(1.0).numpy()")
    assert proc.returncode == 0, proc.stderr
    if not proc.stderr.strip():
        pytest.skip("TensorFlow prints nothing at start-up on this machine")
    return proc.stderr


def test_what_tensorflow_prints_at_start_up_is_all_noise(tensorflow_start_up):
    lines = LineFilterOf(tensorflow_start_up)
    assert lines.kept == [], lines.kept
    assert lines.dropped == len(tensorflow_start_up.splitlines())


class LineFilterOf:
    def __init__(self, text):
        f = _quiet.LineFilter()
        self.kept = [line for line in text.splitlines() if f.keep(line)]
        self.dropped = f.dropped


def test_the_filter_keeps_everything_that_is_not_tensorflow_s_logging():
    text = "\n".join(
        [
            "I0000 00:00:1795637894.419766   32108 port.cc:153] oneDNN custom operations are on.",
            "/home/me/train.py:12: UserWarning: a warning of the program",
            "W1125 20:14:59.123456   32108 dataset.cc:997] Input will not be optimized",
            "E1125 20:14:59.123456   32108 cuda_platform.cc:52] failed call to cuInit: INTERNAL",
            "E1125 20:14:59.123456   32108 master.cc:12] a real error",
            "I1125 20:14:59.2   32498 eager_service_impl.cc:355] SessionOptions: goo.gle/debugstr ",
            "device_count {",
            '  key: "CPU"',
            "}",
            "",
            "",
            "Traceback (most recent call last):",
            "",
            "epoch 1",
        ]
    )
    lines = LineFilterOf(text)
    assert lines.kept == [
        "/home/me/train.py:12: UserWarning: a warning of the program",
        "E1125 20:14:59.123456   32108 master.cc:12] a real error",
        "Traceback (most recent call last):",
        "",
        "epoch 1",
    ]
    assert lines.dropped == 9


_FATAL = [
    "F1125 20:14:59.123456   32108 op_kernel.cc:12] Check failed: a == b (1 vs. 2)",
    "*** Check failure stack trace: ***",
    "    @     0x7f2b1c2d3e4f  absl::log_internal::LogMessageFatal::~LogMessageFatal()",
]


def test_a_fatal_record_is_never_hidden_not_even_in_a_dump():
    """A crashed task must show why: FATAL records and what follows them are kept, also when
    one comes while a dump is being dropped (a record ends the dump)."""
    assert LineFilterOf("\n".join(_FATAL)).kept == _FATAL
    dump = [
        "I1125 20:14:59.2   32498 eager_service_impl.cc:355] SessionOptions: goo.gle/debugstr ",
        "device_count {",
    ]
    lines = LineFilterOf("\n".join(dump + _FATAL + ["}", "epoch 1"]))
    assert lines.kept == _FATAL + ["}", "epoch 1"]


def test_a_process_that_crashes_shows_its_fatal_record():
    """The record is written and the process aborts at once, holding Python's lock throughout
    (as TensorFlow's C++ does): a filter running in the process itself never passed it on."""
    proc = _python(
        f"""
        import ctypes
        from dpkeras import _quiet
        _quiet.filter_stderr()
        libc = ctypes.PyDLL(None)  # calls that keep Python's lock
        text = {chr(10).join(_FATAL + [""]).encode()!r}
        libc.write(2, text, len(text))
        libc.abort()
        """
    )
    assert proc.returncode == -signal.SIGABRT, proc.stderr
    assert proc.stderr.splitlines() == _FATAL, proc.stderr


def test_dpkeras_help_and_launch_help_import_no_tensorflow():
    proc = _python(
        """
        import contextlib, io, sys
        from dpkeras._cli import main
        with contextlib.redirect_stdout(io.StringIO()):
            assert main(["--help"]) == 0
            try:
                main(["launch", "--help"])
            except SystemExit:
                pass
        print(sorted(m for m in ("tensorflow", "keras") if m in sys.modules))
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
    assert proc.stderr == ""


def test_every_public_name_and_module_is_there_after_import_dpkeras_alone():
    proc = _python(
        """
        import dpkeras
        for name in dpkeras.__all__ + ["cluster", "tf1", "testing"]:
            getattr(dpkeras, name)
        assert callable(dpkeras.cluster.join) and callable(dpkeras.tf1.variable_scope)
        assert set(dpkeras.__all__) <= set(dir(dpkeras))
        print("ok")
        """
    )
    assert proc.returncode == 0 and proc.stdout.split() == ["ok"], proc.stderr[-3000:]


def test_dpkeras_env_prints_no_tensorflow_noise_unless_verbose(tensorflow_start_up):
    quiet = _dpkeras("env")
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stderr == ""
    assert "verbose" in quiet.stdout  # the setting, with where it came from
    for verbose in (_dpkeras("env", "--verbose"), _dpkeras("env", DPKERAS_VERBOSE="1")):
        assert verbose.returncode == 0, verbose.stderr
        assert LineFilterOf(verbose.stderr).dropped >= len(tensorflow_start_up.splitlines())


def test_a_bad_dpkeras_verbose_is_one_line():
    proc = _dpkeras("env", DPKERAS_VERBOSE="loud")
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "dpkeras env: error: DPKERAS_VERBOSE must be one of 1, 0, true or false. "
        "Received: DPKERAS_VERBOSE='loud'"
    )


def test_the_filter_passes_on_a_process_s_and_its_children_s_lines_in_order():
    proc = _python(
        """
        import os, subprocess, sys
        from dpkeras import _quiet
        _quiet.filter_stderr()
        os.write(2, b"I0000 00:00:1795637894.419766   32108 port.cc:153] noise\\n")
        print("one", file=sys.stderr, flush=True)
        subprocess.run([sys.executable, "-c",
            "import os; os.write(2, b'W1125 20:14:59.1 7 x.cc:1] noise\\\\ntwo\\\\n')"])
        os.write(2, b"three, without an end")
        _quiet.close()
        print("four", file=sys.stderr)
        """
    )
    assert proc.returncode == 0
    assert proc.stderr == "one\ntwo\nthree, without an end" + "four\n"


# What a client connected to a cluster printed when worker 1 was killed mid-fit (TensorFlow
# 2.21, log level unset), before dpkeras's traceback; shortened where marked.
_LOST_TASK_WARNING = [
    "W0000 00:00:1795771870.201310   17169 remote_tensor_handle_data.cc:81] Unable to destroy "
    "remote tensor handles. If you are running a tf.function, it usually indicates some op in "
    "the graph gets an error: 2 root error(s) found.",
    "  (0) UNAVAILABLE: {{function_node __inference_multi_step_on_iterator_1093}} "
    "recvmsg:Connection reset by peer",
    "Additional GRPC error information from remote target /job:worker/replica:0/task:1/device:"
    "CPU:1 while calling /tensorflow.eager.EagerService/RunComponentFunction:",
    ':UNKNOWN:Error received from peer  {grpc_message:"recvmsg:Connection reset by peer", '
    "grpc_status:14}",
    "  (1) UNAVAILABLE: {{function_node __inference_multi_step_on_iterator_1093}} "
    "recvmsg:Connection reset by peer",
    "\t [[{{node StatefulPartitionedCall/replica_2/div_no_nan/_98}}]]",
    # A status's payloads follow its last line (seen when a ps is lost: a derived status).
    "\t [[{{node StatefulPartitionedCall/replica_2/Cast/ReadVariableOp/_6}}]] "
    "[type.googleapis.com/tensorflow.DerivedStatus='']",
    # A remote status held in it, cut at 3,072 characters mid-line (seen twice in 40 runs).
    "Additional GRPC ... [truncated]",
    "\t [[{{node StatefulPartitionedCall/replic ... [truncated]",
    "0 successful operations.",
    "4 derived errors ignored.",
    "Additional GRPC error information from remote target /job:worker/replica:0/task:0 while "
    "calling /tensorflow.eager.EagerService/Enqueue:",
    ':UNKNOWN:Error received from peer  {grpc_message:"2 root error(s) found.\\n  (0) '
    'UNAVAILABLE: (shortened)", grpc_status:14}',
]


# What a client printed when fit left a lost worker out (TensorFlow 2.21, log level unset).
_LEFT_OUT_ERROR = [
    "E0000 00:00:1795807542.605894    4620 context.cc:566] Unable to close remote context with "
    "ID 14200391545627463603 for worker: /job:worker/replica:0/task:1 due to failed to connect "
    "to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:56339: Failed to connect to remote "
    "host: Connection refused",
    "Additional GRPC error information from remote target /job:worker/replica:0/task:1 while "
    "calling /tensorflow.eager.EagerService/CloseContext:",
    ':UNKNOWN:Error received from peer  {grpc_status:14, grpc_message:"failed to connect to all '
    "addresses; last error: UNKNOWN: ipv4:127.0.0.1:56339: Failed to connect to remote host: "
    'Connection refused"}',
]


def test_a_client_drops_tensorflow_s_error_for_a_worker_left_out():
    """The ERROR of closing the client's context on a worker `fit` left out goes, with its
    status lines; another ERROR of that file is kept."""
    other = "E1125 20:14:59.123456   32108 context.cc:566] Something else went wrong"
    text = [*_LEFT_OUT_ERROR, "WARNING:dpkeras:dpkeras: ... was lost; fit goes on", other]
    f = _quiet.LineFilter(_quiet.is_client_noise)
    assert [line for line in text if f.keep(line)] == text[-2:]


def test_a_client_drops_tensorflow_s_warnings_of_a_lost_task_and_keeps_the_rest():
    """The warning of a step failing for a lost task goes, with the lines of the error status
    it holds; what follows (a traceback, the program's lines) and every other record stay."""
    other = "W1125 20:14:59.123456   32108 dataset.cc:997] Input will not be optimized"
    text = [*_LOST_TASK_WARNING, *_LOST_TASK_WARNING, "Traceback (most recent call last):"]
    error = (  # an ERROR of that file is not the warning: it is kept
        "E1125 20:14:59.123456   32108 remote_tensor_handle_data.cc:81] Unable to destroy "
        "remote tensor handles: an error"
    )
    text += ["4 derived errors ignored.", other, error, "  (0) UNAVAILABLE: of the program"]
    f = _quiet.LineFilter(_quiet.is_client_noise)
    assert [line for line in text if f.keep(line)] == text[-5:]
    assert f.dropped == 2 * len(_LOST_TASK_WARNING)
    # The commands' filter drops the record with its status lines too.
    lines = LineFilterOf("\n".join([*_LOST_TASK_WARNING, "epoch 1"]))
    assert lines.kept == ["epoch 1"]


def test_a_client_s_filter_is_a_process_that_passes_on_its_last_lines():
    """`filter_client_stderr` in a process that ends with `os._exit` (no exit handler runs),
    with a child writing through it: the lost task's warnings are dropped, every other line
    passed on, in order. With DPKERAS_VERBOSE=1 nothing is dropped."""
    warning = "\n".join(_LOST_TASK_WARNING).encode()
    code = f"""
        import os, subprocess, sys
        from dpkeras import _quiet
        pump = _quiet.filter_client_stderr()
        print("pump:", pump is not None, flush=True)
        os.write(2, {warning!r} + b"\\n")
        print("one", file=sys.stderr, flush=True)
        subprocess.run([sys.executable, "-c", "import os; os.write(2, b'two\\\\n')"])
        os.write(2, b"three, without an end")
        os._exit(3)
        """
    quiet = _python(code)
    assert (quiet.returncode, quiet.stdout) == (3, "pump: True\n")
    assert quiet.stderr == "one\ntwo\nthree, without an end"
    verbose = _python(code, DPKERAS_VERBOSE="1")
    assert (verbose.returncode, verbose.stdout) == (3, "pump: False\n")
    assert verbose.stderr == "\n".join([*_LOST_TASK_WARNING, "one", "two", "three, without an end"])


def _read_until(stream, end, timeout):
    """Bytes read from `stream` (a pipe) up to and including `end`; fails after `timeout` s."""
    seen, deadline = b"", time.monotonic() + timeout
    while not seen.endswith(end):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([stream], [], [], left)[0]:
            pytest.fail(f"no {end!r} within {timeout} s; read {seen!r}")
        chunk = os.read(stream.fileno(), 1)
        if not chunk:
            pytest.fail(f"the stream ended before {end!r}; read {seen!r}")
        seen += chunk
    return seen


def test_a_client_s_filter_passes_a_line_s_start_on_at_once():
    """A progress bar redrawn with "\r" on standard error (tqdm's) shows as it is drawn: the
    start of a line that cannot be TensorFlow's is passed on before the line ends. The client
    waits for the test to have read it."""
    code = """
        import os, sys
        from dpkeras import _quiet
        _quiet.filter_client_stderr()
        os.write(2, b" 50%|#####     |\\r")
        sys.stdin.readline()
        os.write(2, b"100%|##########|\\n")
        """
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=_env(),
    )
    try:
        drawn = _read_until(proc.stderr, b"\r", timeout=120)
        proc.stdin.write(b"\n")
        proc.stdin.close()
        rest = proc.stderr.read()
        assert proc.wait(timeout=120) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert (drawn, rest) == (b" 50%|#####     |\r", b"100%|##########|\n")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_client_s_filter_outlives_a_signal_to_the_group_and_passes_on_the_last_lines(sig):
    """Ctrl-C in a terminal (or a scheduler's SIGTERM) reaches every process of the group, the
    client's filter among them: the filter lives on to pass on what the client writes as it
    ends (its traceback). The client says on its standard output when it has the signal.

    The client sets its SIGINT handler too, as Python does when started from a terminal: a
    process started in the background by a shell without job control (`.ci/run &`) inherits
    SIGINT ignored, and Python then keeps it ignored (the test waited 120 s for nothing)."""
    code = """
        import os, signal, sys
        from dpkeras import _quiet
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        _quiet.filter_client_stderr()
        try:  # before "ready": the signal may come at once (a race seen under load)
            os.write(2, b"ready\\n")  # passed on: the filter has set its signals
            sys.stdin.readline()
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            sys.stdin.readline()
            os.write(2, b"last line\\n")
        """
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_env(),
        start_new_session=True,  # a group of its own: the client and its filter
    )
    try:
        _read_until(proc.stderr, b"ready\n", timeout=120)
        os.killpg(proc.pid, sig)
        assert _read_until(proc.stdout, b"interrupted\n", timeout=120) == b"interrupted\n"
        proc.stdin.write(b"\n")
        proc.stdin.close()
        rest = proc.stderr.read()
        assert proc.wait(timeout=120) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert rest == b"last line\n"


def _started(argv, **extra):
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(**extra),
        **_local.child_options(),
    )
    wait_for_line(proc, "ready", timeout=120)
    return proc


def test_a_served_task_hides_the_dump_tensorflow_logs_for_each_client():
    """Tasks started without TF_CPP_MIN_LOG_LEVEL: TensorFlow logs a SessionOptions dump on
    each when a client connects. `dpkeras serve --verbose` shows it; a task serving from
    `join()` under TF_CONFIG, in a script that imported TensorFlow first, hides it."""
    spec = {"worker": [f"127.0.0.1:{port}" for port in _local.free_ports(2)]}
    joined = """
        import tensorflow as tf
        import dpkeras
        dpkeras.cluster.join()
        """
    tf_config = json.dumps({"cluster": spec, "task": {"type": "worker", "index": 1}})
    procs = [
        _started([*serve_command(spec, "worker", 0), "--verbose"]),
        _started([sys.executable, "-c", textwrap.dedent(joined)], TF_CONFIG=tf_config),
    ]
    try:
        out = run_python(
            f"""
            import tensorflow as tf
            from dpkeras import cluster
            cluster.connect({json.dumps(spec)}, timeout=60)
            with tf.device("/job:worker/replica:0/task:1/device:CPU:0"):
                print(float(tf.constant(20.0) + 22.0))
            """,
            env={"TF_CPP_MIN_LOG_LEVEL": "0"},
            timeout=300,
        )
        assert out.split() == ["42.0"]
    finally:
        for proc in reversed(procs):  # the joined task first: it watches worker 0
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
    verbose, quiet = (proc.communicate(timeout=60)[1] for proc in procs)
    assert [proc.returncode for proc in procs] == [0, 0]
    assert "SessionOptions" in verbose and "device_count {" in verbose
    assert "SessionOptions" not in quiet and "device_count" not in quiet, quiet


def test_dpkeras_env_reports_the_environment_as_the_user_gave_it():
    """`dpkeras env` sets `TF_CPP_MIN_LOG_LEVEL=2` to quiet itself; its report (for bug
    reports) shows the variable only when the user set it, with the user's value."""
    unset = _dpkeras("env")
    assert unset.returncode == 0, unset.stderr
    assert "TF_CPP_MIN_LOG_LEVEL" not in unset.stdout, unset.stdout
    for level in ("1", "2"):  # 2, dpkeras's own level, is reported when the user set it
        given = _dpkeras("env", TF_CPP_MIN_LOG_LEVEL=level)
        assert given.returncode == 0, given.stderr
        assert f"Related environment:\n  TF_CPP_MIN_LOG_LEVEL={level}\n" in given.stdout, (
            given.stdout
        )


# What a client run through absl's app.run printed when it connected (TensorFlow 2.21's Python
# logger at INFO, in absl's format): one record of 21 lines, ending with a blank line.
_SESSION_CONFIG = [
    "I1206 05:32:33.117920 139773943569280 remote.py:225] default session config: device_count {",
    '  key: "GPU"',
    "  value: 0",
    "}",
    "device_count {",
    '  key: "CPU"',
    "  value: 1",
    "}",
    "gpu_options {",
    "  experimental {",
    "  }",
    "}",
    "allow_soft_placement: true",
    "experimental {",
    '  collective_group_leader: "/job:ps/replica:0/task:0"',
    "}",
    "pluggable_device_options {",
    "  experimental {",
    "  }",
    "}",
    "",
]


def test_the_filter_drops_a_multi_line_record_whole():
    """The record's first line is TensorFlow's (absl's format); the lines that go on it (a
    protocol buffer in text format, up to its blank line) go with it. What follows is kept,
    a program's "key: value" line included, and so is a record's dump cut short by a line
    that is not in that format."""
    after = ["loss: 0.25", "epoch 1", "Traceback (most recent call last):"]
    lines = LineFilterOf("\n".join(_SESSION_CONFIG + after))
    assert lines.kept == after
    assert lines.dropped == len(_SESSION_CONFIG)
    cut = _SESSION_CONFIG[:3] + ["epoch 1", '  key: "GPU"']
    assert LineFilterOf("\n".join(cut)).kept == ["epoch 1", '  key: "GPU"']


def test_launch_drops_a_multi_line_record_whole(tmp_path):
    """`dpkeras launch`'s filter runs a line at a time: a program that writes the record then
    its own lines shows on standard error the same lines as one that writes only its own."""
    record = "\n".join(_SESSION_CONFIG) + "\n"
    outputs = []
    for written in (record, ""):
        path = tmp_path / "program.py"
        path.write_text(
            f"import sys\nsys.stderr.write({written!r})\nsys.stderr.write('loss: 0.25\\n')\n"
            "print('done')\n"
        )
        proc = subprocess.run(
            [sys.executable, "-m", "dpkeras", "launch", "--ps", "0", "--workers", "1", "--"]
            + [sys.executable, str(path)],
            capture_output=True,
            text=True,
            env=_env(),
            timeout=120,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        outputs.append(proc)
    with_record, without = (set(proc.stderr.splitlines()) for proc in outputs)
    assert with_record == without == {"[chief:0] loss: 0.25", "[worker:0] loss: 0.25"}
    assert re.search(  # all 21 lines, in each of the 2 tasks
        r"^dpkeras launch: 42 lines of TensorFlow's logs hidden", outputs[0].stdout, re.M
    )


# A program run plainly, or through absl's app.run (as TF1 programs are), logging to the
# dpkeras logger as dpkeras does; argv[1]: "plain" or "absl", the rest is absl's argv.
_LOGS = """
import logging, sys
import dpkeras

def main(argv):
    if "--own-level" in sys.argv:
        logging.getLogger("dpkeras").setLevel(logging.INFO)
    logging.getLogger("dpkeras").info("dpkeras: an INFO record")
    logging.getLogger("dpkeras").warning("dpkeras: a WARNING record")

if sys.argv[1] == "absl":
    from absl import app
    app.run(main, argv=[sys.argv[0]] + [a for a in sys.argv[2:] if a != "--own-level"])
else:
    main(sys.argv)
"""


@pytest.mark.parametrize(
    "argv, info_shown",
    [
        (["plain"], False),
        (["absl"], False),  # absl's default: INFO on the root logger, not asked for
        (["absl", "--verbosity=0"], True),  # asked for
        (["absl", "--own-level"], True),  # a level set on dpkeras's logger
    ],
    ids=["plain", "absl", "absl-verbosity-0", "absl-own-level"],
)
def test_dpkeras_s_info_records_show_under_absl_only_when_asked_for(argv, info_shown):
    proc = subprocess.run(
        [sys.executable, "-c", _LOGS, *argv],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert ("dpkeras: an INFO record" in proc.stderr) == info_shown, proc.stderr
    assert "dpkeras: a WARNING record" in proc.stderr


# The same program plainly and under absl's app.run: a client of a cluster that trains.
_CLIENT = """
import sys
import numpy as np

def main(argv):
    import dpkeras, keras
    with dpkeras.scope(cluster={spec!r}):
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
        model.compile("sgd", "mse")
    model.fit(np.ones((32, 4), "float32"), np.ones((32, 2), "float32"), batch_size=16, verbose=0)
    print("TRAINED", flush=True)

if sys.argv[1:] == ["absl"]:
    from absl import app
    app.run(main, argv=sys.argv[:1])
else:
    main(sys.argv)
"""


def test_a_client_under_absl_prints_what_it_prints_without_absl():
    """TensorFlow's "default session config" (~25 lines, when dpkeras connects) and dpkeras's
    INFO records showed under absl's app.run alone. Lines compared as sets, numbers (times,
    process ids, ports) blanked; each run is a fresh client of the same two tasks."""
    with LocalCluster(ps=1, workers=1, cpus=1) as local:
        runs = {}
        for how in ("plain", "absl"):
            proc = subprocess.run(
                [sys.executable, "-c", _CLIENT.format(spec=local.spec), how],
                capture_output=True,
                text=True,
                env=server_env(),
                timeout=300,
            )
            assert proc.returncode == 0, proc.stderr[-3000:]
            assert proc.stdout.split() == ["TRAINED"]
            runs[how] = {re.sub(r"\d+", "N", line) for line in proc.stderr.splitlines()}
    assert runs["absl"] == runs["plain"], (
        runs["absl"] - runs["plain"],
        runs["plain"] - runs["absl"],
    )


def test_tensorflow_s_records_are_judged_only_while_dpkeras_connects():
    """`tensorflow_info_dropped` filters the `tensorflow` and `absl` loggers within its block
    only, also when the block raises: TensorFlow's INFO records logged later (a program's own,
    asked for with absl's flags or not) are as TensorFlow makes them."""
    loggers = [logging.getLogger(name) for name in ("tensorflow", "absl")]
    before = [list(logger.filters) for logger in loggers]
    with _quiet.tensorflow_info_dropped():
        assert all(_quiet._TENSORFLOW_S in logger.filters for logger in loggers)
    assert [list(logger.filters) for logger in loggers] == before
    with pytest.raises(RuntimeError):
        with _quiet.tensorflow_info_dropped():
            raise RuntimeError("connecting failed")
    assert [list(logger.filters) for logger in loggers] == before
