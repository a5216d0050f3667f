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
