"""`make gpu-check` (benchmarks/gpu_check.py), the parts a machine without GPUs can check: the
plan and the split of one GPU, the command line, the results file, and that every test needing
a GPU is one it runs. On a machine with GPUs the command itself is the test."""

import json
import os
import re
import subprocess
import sys

import pytest

from benchmarks import gpu_check
from dpkeras.testing import split_gpu
from dpkeras.testing._gpus import logical_split
from tests.gpu import gpu_count

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
no_gpu_here = pytest.mark.skipif(gpu_count() > 0, reason="checks the machine without GPUs")


def test_one_gpu_is_split_several_are_used_as_they_are():
    assert gpu_check.plan([], 2) == (0, 0)
    assert gpu_check.plan(["GPU:0"], 2) == (2, 2)
    assert gpu_check.plan(["GPU:0"], 4) == (4, 4)
    assert gpu_check.plan(["GPU:0"], 1) == (1, 0)
    assert gpu_check.plan(["GPU:0", "GPU:1", "GPU:2"], 2) == (3, 0)
    assert gpu_check.plan([], 2, cpu=True) == (gpu_check.CPU_REPLICAS, 0)
    with pytest.raises(ValueError, match=r"positive integer\. Received: split=0"):
        logical_split(["GPU:0"], 0)


def test_the_benchmark_runs_both_placements_against_the_peers():
    command = gpu_check.bench_command("out", 2, 2, False, ["mlp", "dlrm"], None, 3)
    assert "--strategies=one_device,dpkeras,dpkeras_hybrid,mirrored,central_storage" in command
    assert "--models=mlp,dlrm" in command and "--replicas=2" in command
    assert "--logical_gpus=2" in command
    assert not any(
        c.startswith("--logical_gpus")
        for c in gpu_check.bench_command("out", 3, 0, False, ["mlp"], None, 3)
    )


@no_gpu_here
@pytest.mark.parametrize(
    "n, memory, error",
    [(0, 1024, ValueError), (2, -1, ValueError), (True, 1024, ValueError), (2, 1024, RuntimeError)],
)
def test_split_gpu_refuses_what_it_cannot_do(n, memory, error):
    with pytest.raises(error, match=r"Received|needs a GPU; TensorFlow sees none"):
        split_gpu(n, memory)


def _run(tmp_path, *flags):
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_check", f"--out={out}", *flags],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    results = out / "gpu-check.json"
    return proc, (json.loads(results.read_text()) if results.exists() else None)


@no_gpu_here
def test_without_gpus_it_says_so_and_exits_0(tmp_path):
    proc, results = _run(tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "finds no GPU on this machine, so there is nothing to check" in proc.stdout
    assert results["status"] == "no GPU" and results["gpus"] == []
    assert "tests" not in results and "bench" not in results


def _gpu_tests():
    """The tests that need GPUs, found in the sources: `needs_gpus` and `needs-gpu` blocks."""
    names = set()
    for name in sorted(os.listdir(os.path.join(ROOT, "tests"))):
        if name.startswith("test_") and name.endswith(".py"):
            text = open(os.path.join(ROOT, "tests", name)).read()
            for match in re.finditer(r"@needs_gpus\(\d\)\n(?:@.*\n)*def (test_\w+)", text):
                names.add(f"{name[:-3]}::{match.group(1)}")
    return names


@no_gpu_here
def test_on_cpu_devices_it_runs_every_gpu_test_and_the_benchmark(tmp_path):
    proc, results = _run(tmp_path, "--cpu", "--models=mlp", "--steps=2", "--repeats=1", "--split=3")
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert results["status"] == "passed" and results["devices"] == "simulated"
    tests = results["tests"]
    # Without GPUs each one skips; gpu-check runs every one, and nothing else.
    assert tests["skipped"] == len(tests["tests"]) and not tests["passed"] + tests["failed"]
    ran = {re.sub(r"\[.*\]$", "", t["name"]).replace("tests.", "", 1) for t in tests["tests"]}
    expected = _gpu_tests()
    assert len(expected) >= 8, expected
    assert expected <= ran, expected - ran
    assert any("test_block_runs" in name for name in ran), "the docs' needs-gpu examples"
    assert all("GPU" in t["message"] for t in tests["tests"]), tests["tests"]
    records = results["bench"]["records"]
    assert sorted(r["strategy"] for r in records) == sorted(gpu_check.STRATEGIES)
    assert all(r["status"] == "ok" for r in records), [r.get("error") for r in records]
    assert {r["replicas"] for r in records if r["strategy"] != "one_device"} == {2}
    by_strategy = {r["strategy"]: r["variable_bytes_by_device"] for r in records}
    assert set(by_strategy["dpkeras"]) == {"/cpu:0"}
    hybrid = by_strategy["dpkeras_hybrid"]  # the MLP's dense weights: a copy on each replica
    assert hybrid["/cpu:1"] == hybrid["/cpu:2"] > 100 * hybrid.get("/cpu:0", 0)
    assert (tmp_path / "out" / "tests.xml").exists()
    assert (tmp_path / "out" / "bench" / "bench.md").exists()


def test_every_test_that_needs_a_gpu_carries_the_gpu_mark():
    """Only tests/gpu.py (and the docs examples, which count the GPUs a block names) ask
    TensorFlow for GPUs in a skip: a test skipping on its own would escape `pytest -m gpu`."""
    allowed = {"gpu.py", "test_docs_examples.py", "test_gpu_check.py"}
    asking = [
        name
        for name in sorted(os.listdir(os.path.join(ROOT, "tests")))
        if name.endswith(".py")
        and name not in allowed
        and re.search(
            r"list_(physical|logical)_devices\(\"GPU\"\)",
            open(os.path.join(ROOT, "tests", name)).read(),
        )
        and re.search(r"skip", open(os.path.join(ROOT, "tests", name)).read())
        and "needs_gpus" not in open(os.path.join(ROOT, "tests", name)).read()
    ]
    assert not asking, f"skip on GPUs through tests.gpu.needs_gpus: {asking}"


def _junit(path, cases):
    """Writes a JUnit XML file as pytest writes one: `cases` of `(name, outcome)`, an outcome
    of "passed", "failure", "error" or "skipped"."""
    body = "".join(
        f'<testcase classname="tests.test_gpu" name="{name}" time="0.1">'
        + ("" if outcome == "passed" else f'<{outcome} message="{outcome} of {name}">x</{outcome}>')
        + "</testcase>"
        for name, outcome in cases
    )
    with open(path, "w") as f:
        f.write(f'<?xml version="1.0"?><testsuites><testsuite name="pytest">{body}</testsuite>'
                "</testsuites>")  # fmt: skip


def _stand_in(calls, cases, records, test_exit=0):
    """`gpu_check._run` without running anything: records each command and its environment;
    the tests' command writes a JUnit XML of `cases` and exits `test_exit`, the benchmark's a
    bench.jsonl of `records` and exits 0 (benchmarks/compare.py exits 0 when a pair fails)."""

    def run(command, env, log):
        calls.append((command, env))
        if "pytest" in command:
            junit = next(c for c in command if c.startswith("--junitxml="))
            _junit(junit.split("=", 1)[1], cases)
            return test_exit, 2.0
        out = next(c for c in command if c.startswith("--out=")).split("=", 1)[1]
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "bench.jsonl"), "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
        return 0, 3.0

    return run


def _pairs(failed=()):
    return [
        {"model": "mlp", "strategy": s, "status": "error" if s in failed else "ok"}
        for s in gpu_check.STRATEGIES
    ]


def _quiet(*args, **kwargs):
    pass


def test_on_one_gpu_both_parts_see_the_split_and_the_results_file_holds_every_part(
    tmp_path, monkeypatch
):
    """One GPU: the tests (through `DPKERAS_TEST_LOGICAL_GPUS`, tests/conftest.py) and the
    benchmark (`--logical_gpus`) both run on its 2 logical GPUs; gpu-check.json holds the
    machine, the split, each test's outcome, each pair's record and the seconds of each part.
    Several GPUs: used as they are, no split for either part."""
    calls = []
    cases = [("test_replicas", "passed"), ("test_nccl", "skipped")]
    monkeypatch.setattr(gpu_check, "_run", _stand_in(calls, cases, _pairs()))
    monkeypatch.setenv("DPKERAS_TEST_LOGICAL_GPUS", "7")  # a stale value is not passed on
    gpu_check.check(str(tmp_path), ["/physical_device:GPU:0"], echo=_quiet)
    results = json.loads((tmp_path / "gpu-check.json").read_text())
    assert results["status"] == "passed" and results["failed"] == []
    assert (results["devices"], results["logical_gpus"], results["replicas"]) == ("gpu", 2, 2)
    assert results["machine"]["gpus"] == ["/physical_device:GPU:0"]
    assert set(results["seconds"]) == {"tests", "bench", "total"}
    assert (results["seconds"]["tests"], results["seconds"]["bench"]) == (2.0, 3.0)
    assert results["budget_seconds"] == 480 and results["over_budget"] is False
    tests = results["tests"]
    assert (tests["passed"], tests["failed"], tests["skipped"]) == (1, 0, 1)
    assert [t["outcome"] for t in tests["tests"]] == ["passed", "skipped"]
    assert results["bench"]["records"] == _pairs() and results["bench"]["exit"] == 0
    (test_command, test_env), (bench_command, bench_env) = calls
    assert test_env["DPKERAS_TEST_LOGICAL_GPUS"] == bench_env["DPKERAS_TEST_LOGICAL_GPUS"] == "2"
    assert "--logical_gpus=2" in bench_command and "--replicas=2" in bench_command
    calls.clear()
    gpus = ["/physical_device:GPU:0", "/physical_device:GPU:1", "/physical_device:GPU:2"]
    gpu_check.check(str(tmp_path / "three"), gpus, echo=_quiet)
    results = json.loads((tmp_path / "three" / "gpu-check.json").read_text())
    assert (results["logical_gpus"], results["replicas"]) == (0, 3)
    assert all("DPKERAS_TEST_LOGICAL_GPUS" not in env for _, env in calls)
    assert "--replicas=3" in calls[1][0]


def test_a_failing_or_erroring_test_and_a_failed_pair_each_fail_the_check(tmp_path, monkeypatch):
    """A test that fails and one that errors (in a fixture, say) are each counted failed, never
    passed; a benchmark pair whose record is not "ok" fails the check though
    benchmarks/compare.py exits 0."""
    cases = [("test_a", "passed"), ("test_b", "failure"), ("test_c", "error")]
    monkeypatch.setattr(gpu_check, "_run", _stand_in([], cases, _pairs(), test_exit=1))
    summary = gpu_check.check(str(tmp_path / "tests"), ["GPU:0"], echo=_quiet)
    assert (summary["tests"]["passed"], summary["tests"]["failed"]) == (1, 2)
    assert summary["status"] == "failed" and summary["failed"][0].startswith("tests")
    cases = [("test_a", "passed")]
    monkeypatch.setattr(gpu_check, "_run", _stand_in([], cases, _pairs(failed=["mirrored"])))
    summary = gpu_check.check(str(tmp_path / "bench"), ["GPU:0"], echo=_quiet)
    assert summary["status"] == "failed", summary
    assert summary["failed"] == ["benchmark (exit 0; failed pairs: mlp/mirrored)"]
    saved = json.loads((tmp_path / "bench" / "gpu-check.json").read_text())
    assert saved["status"] == "failed"


def test_a_failed_check_exits_1(tmp_path):
    """The command's exit status says a failure (here the benchmark refuses an unknown model;
    --cpu, so on any machine)."""
    proc, results = _run(tmp_path, "--cpu", "--notests", "--models=no_such_model", "--repeats=1")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert results["status"] == "failed" and results["bench"]["exit"] != 0, results
