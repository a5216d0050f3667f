r"""`make gpu-check`: on a machine with GPUs, every test that skips without them and the benchmark
on the GPUs, in one command and one results file.

    python -m benchmarks.gpu_check                 # make gpu-check
    python -m benchmarks.gpu_check --split=4       # one GPU seen as 4 (default 2)
    python -m benchmarks.gpu_check --cpu --models=mlp --steps=2 --repeats=1   # the same steps
                                                   # on logical CPU devices (tests this command)

1. The tests marked `gpu` (`pytest -m gpu`: tests/gpu.py's `needs_gpus`, and the docs'
   `needs-gpu` examples): replicas on GPUs against one device, NCCL under `placement.hybrid()`,
   mixed precision, the parameter device on a GPU, the GPUs as default devices.
2. The benchmark (benchmarks/compare.py): dpkeras all-on-ps and hybrid against MirroredStrategy,
   CentralStorageStrategy and one device, on the MLP and the DLRM.

With one GPU, it is split into `--split` logical GPUs (`dpkeras.testing.split_gpu`), as the CPU
is split where there is no GPU, so that several replicas run; with several, they are used as
they are. On a machine without GPUs it says so and exits 0. Writes `<out>/gpu-check.json` (the
machine, the split, each test's outcome, each benchmark pair's record, the seconds of each part)
beside pytest's JUnit XML and the benchmark's files; exits 1 if a test or a pair failed. Made to
finish within 8 minutes on one GPU (`--budget`; exceeding it is reported, not fatal).
"""

import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

from absl import app, flags

if __package__ in (None, ""):  # run as `python benchmarks/gpu_check.py`
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import machine, results

FLAGS = flags.FLAGS

STRATEGIES = ("one_device", "dpkeras", "dpkeras_hybrid", "mirrored", "central_storage")
CPU_REPLICAS = 2  # --cpu: replicas on logical CPU devices


def plan(gpus, split=2, cpu=False):
    """`(replicas, logical_gpus)` for this machine: every GPU; one GPU split into `split`
    logical GPUs; with `cpu`, `CPU_REPLICAS` simulated devices. `(0, 0)`: nothing to run."""
    from dpkeras.testing._gpus import logical_split

    if cpu:
        return CPU_REPLICAS, 0
    if not gpus:
        return 0, 0
    logical = logical_split(gpus, split)
    return (logical or len(gpus)), logical


def test_command(junit):
    """The pytest command of the tests marked `gpu`, one process, in the checkout."""
    return [
        sys.executable,
        "-m",
        "pytest",
        "-m",
        "gpu",
        "-q",
        "-p",
        "no:xdist",
        "-p",
        "no:cacheprovider",
        f"--junitxml={junit}",
        "tests",
    ]


def bench_command(out, replicas, logical_gpus, cpu, models, steps, repeats):
    """The benchmark's command line (benchmarks/compare.py)."""
    command = [
        sys.executable,
        "-m",
        "benchmarks.compare",
        f"--models={','.join(models)}",
        f"--strategies={','.join(STRATEGIES)}",
        f"--replicas={replicas}",
        f"--repeats={repeats}",
        "--nodedup_baseline",
        f"--out={out}",
    ]
    if logical_gpus:
        command.append(f"--logical_gpus={logical_gpus}")
    if steps:
        command.append(f"--steps={steps}")
    if cpu:
        command.append("--nochart")
    return command


def read_junit(path):
    """`{"passed", "failed", "skipped", "tests": [{"name", "outcome", "message"}]}` of a JUnit
    XML file written by pytest."""
    tests = []
    for case in ET.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name')}"
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            found = case.find(tag)
            if found is not None:
                outcome = "skipped" if tag == "skipped" else "failed"
                message = (found.get("message") or "").splitlines()[0:1]
                message = message[0] if message else ""
                break
        tests.append({"name": name, "outcome": outcome, "message": message})
    counts = {k: sum(t["outcome"] == k for t in tests) for k in ("passed", "failed", "skipped")}
    return {**counts, "tests": tests}


def _run(command, env, log):
    start = time.perf_counter()
    with open(log, "w") as f:
        f.write(f"$ {' '.join(command)}\n\n")
        f.flush()
        proc = subprocess.run(
            command, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=machine.repo_root()
        )
    return proc.returncode, time.perf_counter() - start


def _env(logical_gpus):
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    root = machine.repo_root()
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("DPKERAS_TEST_LOGICAL_GPUS", None)
    if logical_gpus:
        env["DPKERAS_TEST_LOGICAL_GPUS"] = str(logical_gpus)
    return env


def check(
    out,
    gpus,
    split=2,
    cpu=False,
    tests=True,
    bench=True,
    models=("mlp", "dlrm"),
    steps=None,
    repeats=3,
    budget=480,
    echo=print,
):
    """Runs the check; returns the results (also written to `<out>/gpu-check.json`)."""
    started = time.perf_counter()
    replicas, logical = plan(gpus, split, cpu)
    summary = {
        "gpus": list(gpus),
        "devices": "simulated" if cpu else ("gpu" if gpus else None),
        "logical_gpus": logical,
        "replicas": replicas,
        "seconds": {},
        "budget_seconds": budget,
    }
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "gpu-check.json")
    if not replicas:
        summary["status"] = "no GPU"
        echo(
            "gpu-check: TensorFlow finds no GPU on this machine, so there is nothing to check "
            "here. Run it where there are GPUs (--cpu runs the same steps on logical CPU "
            "devices, to check this command)."
        )
        _write(path, summary)
        return summary
    layout = (
        f"{CPU_REPLICAS} logical CPU devices (--cpu)"
        if cpu
        else f"{gpus[0]} split into {logical} logical GPUs"
        if logical
        else f"{len(gpus)} GPUs"
    )
    echo(f"gpu-check: {layout}; {replicas} replicas. Results in {os.path.abspath(out)}")
    env = _env(logical)
    failed = []
    if tests:
        junit = os.path.join(out, "tests.xml")
        echo("gpu-check: the tests marked gpu (pytest -m gpu) ...", flush=True)
        code, seconds = _run(
            test_command(os.path.abspath(junit)), env, os.path.join(out, "tests.log")
        )
        summary["seconds"]["tests"] = seconds
        if os.path.exists(junit):
            summary["tests"] = read_junit(junit)
        else:
            summary["tests"] = {"error": f"pytest exited with {code} and wrote no JUnit XML"}
        t = summary["tests"]
        echo(
            f"  {t.get('passed', 0)} passed, {t.get('failed', 0)} failed, "
            f"{t.get('skipped', 0)} skipped in {seconds:.0f} s"
        )
        if code not in (0, 5) or t.get("failed") or "error" in t:  # 5: none collected
            failed.append(f"tests (pytest exited with {code}; see tests.log)")
    if bench:
        bench_out = os.path.join(out, "bench")
        echo("gpu-check: the benchmark (benchmarks/compare.py) ...", flush=True)
        command = bench_command(
            os.path.abspath(bench_out), replicas, logical, cpu, models, steps, repeats
        )
        code, seconds = _run(command, env, os.path.join(out, "bench.log"))
        summary["seconds"]["bench"] = seconds
        jsonl = os.path.join(bench_out, "bench.jsonl")
        records = results.read_jsonl(jsonl) if os.path.exists(jsonl) else []
        summary["bench"] = {"command": " ".join(command[1:]), "exit": code, "records": records}
        bad = [f"{r['model']}/{r['strategy']}" for r in records if r.get("status") != "ok"]
        echo(f"  {len(records) - len(bad)} of {len(records)} pairs ran in {seconds:.0f} s")
        if code or bad or not records:
            failed.append(f"benchmark (exit {code}; failed pairs: {', '.join(bad) or '-'})")
    elapsed = time.perf_counter() - started
    summary["seconds"]["total"] = elapsed
    summary["over_budget"] = elapsed > budget
    summary["status"] = "failed" if failed else "passed"
    summary["failed"] = failed
    _write(path, summary)
    echo(
        f"gpu-check: {summary['status']} in {elapsed / 60:.1f} min"
        + (f" (over the {budget} s budget)" if elapsed > budget else "")
        + (f": {'; '.join(failed)}" if failed else "")
        + f". {os.path.abspath(path)}"
    )
    return summary


def _write(path, summary):
    info = machine.describe(summary["gpus"], max(summary["replicas"], 1), "/cpu:0")
    with open(path, "w") as f:
        json.dump({"machine": info, **summary}, f, indent=1, default=str)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(
            f"Unexpected arguments: {' '.join(argv[1:])}. All options are --flags; see --helpfull."
        )
    summary = check(
        FLAGS.out,
        [] if FLAGS.cpu else machine.find_gpus(),
        split=FLAGS.split,
        cpu=FLAGS.cpu,
        tests=FLAGS.tests,
        bench=FLAGS.bench,
        models=FLAGS.models,
        steps=FLAGS.steps,
        repeats=FLAGS.repeats,
        budget=FLAGS.budget,
    )
    return 1 if summary["status"] == "failed" else 0


def _define_flags():
    """The command's flags, defined when it runs (not at import: the tests import this module
    beside benchmarks/compare.py, whose flags have the same names)."""
    flags.DEFINE_string("out", os.path.join("results", "gpu-check"), "Directory for the results.")
    flags.DEFINE_integer(
        "split", 2, "Logical GPUs made of the GPU when there is exactly one.", lower_bound=1
    )
    flags.DEFINE_bool("tests", True, "Run the tests marked `gpu`.")
    flags.DEFINE_bool("bench", True, "Run the benchmark on the GPUs.")
    flags.DEFINE_bool(
        "cpu",
        False,
        "Run the same steps without GPUs, on logical CPU devices (the GPU tests then skip): "
        "checks this command where there is no GPU.",
    )
    flags.DEFINE_list("models", ["mlp", "dlrm"], "The benchmark's models.")
    flags.DEFINE_integer("steps", None, "Timed steps per repeat (default: per model).")
    flags.DEFINE_integer("repeats", 3, "Timed repeats per benchmark pair.", lower_bound=1)
    flags.DEFINE_integer("budget", 480, "Seconds the whole check should take.", lower_bound=1)


if __name__ == "__main__":
    _define_flags()
    app.run(main)
