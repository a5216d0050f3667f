"""The installed wheel, as a user gets it.

`.ci/wheel-test` runs this with the Python of a fresh virtual environment that holds only the
wheel and its dependencies, from a directory outside the checkout and with `-I` (no script
directory, no PYTHONPATH on the path), so only the installed dpkeras can be imported. Checks:
the import comes from site-packages; the `dpkeras` command (env, serve, launch, bench); a
two-replica fit on simulated CPU devices equals one device; a two-task loopback cluster
started by `dpkeras launch` trains to one process's weights. Every wait is bounded.
"""

import importlib
import importlib.metadata
import json
import os
import subprocess
import sys
import sysconfig
import tempfile

TIMEOUT = 300  # seconds for any one process (TensorFlow's import on a loaded machine)
BIN = os.path.dirname(sys.executable)
DPKERAS = os.path.join(BIN, "dpkeras")  # the console script, as pip installed it


def check(condition, message):
    if not condition:
        sys.exit(f"wheel smoke: FAILED: {message}")


def run(argv, expect=0, **kwargs):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("PYTHONPATH", None)
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT, env=env, **kwargs)
    check(
        proc.returncode == expect,
        f"{' '.join(argv)} exited with {proc.returncode}, expected {expect}\n"
        f"--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}",
    )
    return proc


def say(message):
    print(f"wheel smoke: {message}", flush=True)


def the_import_is_the_installed_wheel():
    import dpkeras

    site = sysconfig.get_paths()["purelib"]
    here = os.path.abspath(dpkeras.__file__)
    check(os.path.commonpath([here, site]) == site, f"dpkeras imported from {here}, not {site}")
    installed = importlib.metadata.version("dpkeras")
    check(installed == dpkeras.__version__, f"metadata {installed} != {dpkeras.__version__}")
    for public in ("placement", "tf1", "cluster", "testing"):
        importlib.import_module(f"dpkeras.{public}")
    say(f"import dpkeras {dpkeras.__version__} from {os.path.dirname(here)}")
    return dpkeras.__version__


def the_command_works(version):
    out = run([DPKERAS, "env"]).stdout
    check(f"dpkeras {version} (" in out, f"`dpkeras env` does not print version {version}:\n{out}")
    for verb in ("serve", "launch"):
        usage = run([DPKERAS, verb, "--help"]).stdout
        check(f"usage: dpkeras {verb}" in usage, f"`dpkeras {verb} --help`:\n{usage}")
    bench = run([DPKERAS, "bench"], expect=2).stderr
    check("source checkout" in bench, f"`dpkeras bench` from a wheel:\n{bench}")
    say("dpkeras env, serve --help, launch --help; bench refuses clearly (no checkout)")


_MODEL = """
import json
import os
import sysconfig

import numpy as np

import dpkeras
from dpkeras.testing import assert_weights_close

here, site = os.path.abspath(dpkeras.__file__), sysconfig.get_paths()["purelib"]
assert os.path.commonpath([here, site]) == site, (here, site)


def build():
    import keras

    keras.utils.set_random_seed(1)
    model = keras.Sequential(
        [keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)]
    )
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    return model


rng = np.random.RandomState(0)
x, y = rng.randn(64, 8).astype("float32"), rng.randn(64, 1).astype("float32")
"""

_TWO_REPLICAS = (
    "import dpkeras\n\ndpkeras.simulate_cpu_devices(3)\n"
    + _MODEL
    + """
with dpkeras.scope(compute_devices=["/cpu:1", "/cpu:2"]) as strategy:
    model = build()
history = model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
reference = build()
expected = reference.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
assert_weights_close(reference.get_weights(), model.get_weights())
print("RESULT " + json.dumps({"replicas": strategy.num_replicas_in_sync,
                              "loss": history.history["loss"],
                              "expected": expected.history["loss"]}))
"""
)

_ON_A_CLUSTER = (
    _MODEL
    + """
with dpkeras.scope() as strategy:  # the ps task serves from here and ends with the client
    model = build()
history = model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
reference = build()  # after connecting: this process's own variables, no strategy
expected = reference.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
assert_weights_close(reference.get_weights(), model.get_weights())
print("RESULT " + json.dumps({"replicas": strategy.num_replicas_in_sync,
                              "loss": history.history["loss"],
                              "expected": expected.history["loss"]}))
"""
)


def _result(out):
    lines = [line for line in out.splitlines() if "RESULT " in line]
    check(len(lines) == 1, f"one RESULT line expected:\n{out[-4000:]}")
    return json.loads(lines[0].split("RESULT ", 1)[1])


def _close(a, b):
    return all(abs(p - q) <= 1e-5 * max(1.0, abs(q)) for p, q in zip(a, b))


def two_replicas_fit_on_simulated_devices(work):
    path = os.path.join(work, "two_replicas.py")
    with open(path, "w") as f:
        f.write(_TWO_REPLICAS)
    result = _result(run([sys.executable, path], cwd=work).stdout)
    check(result["replicas"] == 2, f"2 replicas expected: {result}")
    check(_close(result["loss"], result["expected"]), f"losses differ from one device: {result}")
    say(f"two replicas on simulated CPU devices equal one device (loss {result['loss']})")


def a_two_task_loopback_cluster(work):
    path = os.path.join(work, "train.py")
    with open(path, "w") as f:
        f.write(_ON_A_CLUSTER)
    argv = [DPKERAS, "launch", "--ps=1", "--workers=1", "--client=worker", "--cpus=2", "--"]
    out = run(argv + [sys.executable, path], cwd=work).stdout
    ends = sorted(line for line in out.splitlines() if " exited with status " in line)
    expected = [f"dpkeras launch: {task} exited with status 0" for task in ("ps:0", "worker:0")]
    check(ends == expected, f"both tasks should end with 0:\n{out[-4000:]}")
    result = _result(out)
    check(result["replicas"] == 2, f"2 replicas on worker 0 expected: {result}")
    check(_close(result["loss"], result["expected"]), f"losses differ from one process: {result}")
    say(f"dpkeras launch: ps:0 + worker:0 ({result['replicas']} replicas) equal one process")


def main():
    version = the_import_is_the_installed_wheel()
    the_command_works(version)
    with tempfile.TemporaryDirectory() as work:
        two_replicas_fit_on_simulated_devices(work)
        a_two_task_loopback_cluster(work)
    say("passed")


if __name__ == "__main__":
    main()
