"""The benchmark's measurement code: transfer counting, result files, failure reporting, and a
tiny end-to-end run; the dynamic-embedding and soak benchmarks; `dpkeras bench` in and outside a
checkout (benchmarks/ lives outside the package, beside this directory: only these benchmark
tests import it)."""

import json
import os
import re
import subprocess
import sys

import keras
import pytest
import tensorflow as tf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import dpkeras  # noqa: E402
from benchmarks import compare, machine, results, worker  # noqa: E402
from benchmarks.models import MODELS  # noqa: E402
from dpkeras._transfers import Transfer, TransferReport  # noqa: E402
from dpkeras.testing import run_python  # noqa: E402
from tests.gpu import needs_gpus  # noqa: E402


def _record(strategy, model="mlp", replicas=3, sps=10.0, loss=1.0, status="ok", **extra):
    r = {
        "strategy": strategy,
        "model": model,
        "size": 1.0,
        "replicas": replicas,
        "status": status,
        "error": None,
        "phase": None,
        "steps_per_sec": sps,
        "examples_per_sec": None if sps is None else sps * 240,
        "steps_per_sec_spread": 0.05,
        "tensors_to_replicas_per_step": 6.0,
        "max_tensors_to_a_replica_per_step": 6,
        "bytes_to_replicas_per_step": 1e6,
        "tensors_from_replicas_per_step": 6.0,
        "collectives_per_replica_per_step": 0.0,
        "collective_bytes_per_replica_per_step": 0.0,
        "model_variables": 6,
        "metric_variables": 4,
        "final_loss": loss,
        "eval_loss": loss,
        "check_loss": loss,
        "tensors_to_each_replica": {"/cpu:1": [6, 6, 0, 0], "/cpu:2": [6, 6, 0, 0]},
        "variable_bytes_by_device": {"/cpu:0": 8_000_000},
    }
    if status != "ok":
        r.update(
            {
                k: None
                for k in (
                    "steps_per_sec",
                    "examples_per_sec",
                    "final_loss",
                    "eval_loss",
                    "tensors_to_replicas_per_step",
                    "bytes_to_replicas_per_step",
                )
            }
        )
        r["error"] = "ValueError: it broke. And more."
        r["phase"] = "first steps"
    r.update(extra)
    return r


def _default_run():
    return [
        _record(
            "one_device",
            replicas=1,
            sps=20.0,
            loss=2.0,
            tensors_to_replicas_per_step=0,
            max_tensors_to_a_replica_per_step=0,
        ),
        _record("dpkeras", sps=19.0, loss=2.0001),
        _record(
            "mirrored",
            sps=10.0,
            loss=1.9999,
            collectives_per_replica_per_step=1.0,
            collective_bytes_per_replica_per_step=2.5e6,
            variable_bytes_by_device={"/cpu:1": 8e6, "/cpu:2": 8e6, "/cpu:3": 8e6},
        ),
        _record("central_storage", sps=15.0, loss=2.5),
        _record("central_storage", model="resnet", status="failed"),
    ]


# -- transfer counting --------------------------------------------------------------------------


def _benchmark(module, *flags, timeout=600):
    """Runs `python -m benchmarks.<module> flags...` from the checkout; asserts it succeeded and
    returns the process."""
    proc = subprocess.run(
        [sys.executable, "-m", f"benchmarks.{module}", *flags],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _transfer(src, dst, nbytes, shape=False):
    shape = (nbytes // 4,) if shape is False else shape
    return Transfer(src, dst, "t", "float32", shape, nbytes)


def test_transfer_fields_average_over_replicas():
    report = TransferReport(
        transfers=(
            _transfer("/cpu:0", "/cpu:1", 400),
            _transfer("/cpu:0", "/cpu:1", 4, ()),
            _transfer("/cpu:0", "/cpu:1", 0, None),
            _transfer("/cpu:0", "/cpu:2", 400),
            _transfer("/cpu:1", "/cpu:0", 400),
            _transfer("/cpu:2", "/cpu:0", 400),
            _transfer("/cpu:2", "/cpu:0", 8),
        ),
        collectives=(
            ("/cpu:1", "CollectiveReduceV2", 1000),
            ("/cpu:2", "CollectiveReduceV2", 1000),
        ),
        devices=("/cpu:0", "/cpu:1", "/cpu:2"),
    )
    fields = worker.transfer_fields(report, ["/cpu:1", "/cpu:2"])
    assert fields["tensors_to_each_replica"] == {"/cpu:1": [3, 1, 1, 1], "/cpu:2": [1, 1, 0, 0]}
    assert fields["scalar_tensors_to_replicas_per_step"] == 0.5
    assert fields["unknown_shape_tensors_to_replicas_per_step"] == 0.5
    assert fields["tensors_to_replicas_per_step"] == 2
    assert fields["bytes_to_replicas_per_step"] == 402
    assert fields["max_tensors_to_a_replica_per_step"] == 3
    assert fields["tensors_from_replicas_per_step"] == 1.5
    assert fields["bytes_from_replicas_per_step"] == 404
    assert fields["collectives_per_replica_per_step"] == 1
    assert fields["collective_bytes_per_replica_per_step"] == 1000
    assert fields["transfers"]["/cpu:0 -> /cpu:1"] == [3, 404]
    json.dumps(fields)  # the record must serialise


def test_transfer_fields_of_a_real_dpkeras_step():
    from dpkeras._transfers import train_step_transfers
    from dpkeras.testing import cpu_strategy

    with cpu_strategy(2).scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])
        model.compile(optimizer="sgd", loss="mse")
    x = tf.random.normal((8, 8))
    y = tf.random.normal((8, 4))
    fields = worker.transfer_fields(
        train_step_transfers(model, x, y, batch_size=8), ["/cpu:1", "/cpu:2"]
    )
    # kernel and bias arrive once per replica at least; gradients go back
    assert fields["tensors_to_replicas_per_step"] >= 2
    assert fields["bytes_to_replicas_per_step"] >= (8 * 4 + 4) * 4
    assert fields["bytes_from_replicas_per_step"] >= (8 * 4 + 4) * 4
    assert fields["collectives_per_replica_per_step"] == 0


def test_variable_bytes_by_device_counts_each_copy():
    with tf.device("/cpu:0"):
        a = tf.Variable(tf.zeros((10, 10)))  # 400 bytes
    with tf.device("/cpu:1"):
        b = tf.Variable(tf.zeros((5,), tf.int64))  # 40 bytes
    mirrored = tf.distribute.MirroredStrategy(["/cpu:1", "/cpu:2"])
    with mirrored.scope():
        c = keras.Variable(tf.zeros((3,)))  # 12 bytes on each replica
    by_device = worker.variable_bytes_by_device([a, b, a, c])
    assert by_device == {"/cpu:0": 400, "/cpu:1": 52, "/cpu:2": 12}


def test_a_cpu_reports_no_peak_memory_whatever_its_allocator_says(monkeypatch):
    """TensorFlow's CPU allocator says 0 on some machines and raises on others: never asked."""
    import tensorflow as tf

    def allocator_answer(device):
        raise AssertionError(f"the CPU allocator was asked about {device}")

    monkeypatch.setattr(tf.config.experimental, "get_memory_info", allocator_answer)
    assert worker.peak_memory_by_device(["/cpu:0", "/cpu:1"]) == {"/cpu:0": None, "/cpu:1": None}


@needs_gpus(1)
def test_a_gpu_reports_its_peak_memory():
    assert isinstance(worker.peak_memory_by_device(["/gpu:0"])["/gpu:0"], int)


@pytest.mark.parametrize(
    "argv",
    [
        ["-m", "benchmarks.compare"],
        ["benchmarks/compare.py"],
        ["-m", "benchmarks.cluster"],
        ["benchmarks/cluster.py"],
        ["-m", "benchmarks.dynamic_embedding"],
        ["-m", "benchmarks.recovery"],
        ["-m", "benchmarks.divergence"],
    ],
)
def test_the_benchmarks_run_as_modules_and_as_scripts(argv):
    proc = subprocess.run(
        [sys.executable, *argv, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "--out" in proc.stdout  # absl printed the flags (and exits 1 after --help)
    if "cluster" in " ".join(argv):
        assert "--input" in proc.stdout and "--epoch_steps" in proc.stdout


def _last_json_line_of(code):
    """Runs `code` in a Python process of its own (the benchmarks define absl flags of the same
    names) from the checkout; its stdout's last line, as JSON."""
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


_RECOVERY_SUMMARY = """
import json
from benchmarks import recovery

steps = [[0.1 * i, i, 4] for i in range(1, 6)] + [[2.5, 5, 2], [3.0, 6, 2], [4.0, 7, 4]]
record = {"steps": steps, "killed_at": 0.5, "bytes": 1024}
print(json.dumps(recovery.summary("worker-left-out", record, restart=1.5, kill_at=5)))
"""


def test_the_recovery_benchmark_reads_its_costs_from_the_client_s_steps():
    """Steps 1-5 at 0.1 s on 4 replicas, the kill after step 5 (at t=0.5), the last backup
    after step 4: step 5 again at t=2.5 on 2 replicas, all 4 again from t=4.0 (in a process
    of its own: absl flags)."""
    row = _last_json_line_of(_RECOVERY_SUMMARY)
    assert row == {
        "case": "worker-left-out",
        "step_s": pytest.approx(0.1),
        "kill_to_next_step_s": pytest.approx(2.0),
        "task_restart_s": 1.5,
        "replicas_after": 2,
        "kill_to_all_replicas_s": pytest.approx(3.5),
        "steps_trained_again": 1,
        "restored_bytes": 1024,
    }


_CLUSTER_REPORT = """
import json
from benchmarks import cluster

cluster.FLAGS(["cluster", "--epoch_steps=200"])
records = [
    {"model": "recommender", "strategy": "dpkeras", "k": 10, "workers": w, "input": "numpy",
     "loss": 0.5, "steps_per_s": 10.0, "client_cpu_ms_per_step": 1.0,
     "task_cpu_ms_per_step": {"worker:0": 5.0}, "wire_bytes_per_step": {},
     "first_fit_cpu_s": 0.5, "client_step_ms": 0.5 + 0.01 * w,
     "client_epoch_ms": 10.0 + 2.0 * w, "client_validation_ms": 20.0, "client_fit_ms": 40.0,
     "client_validation_fit_ms": 30.0}
    for w in (1, 2, 4, 8)
]
print(json.dumps({"projection": cluster.projection(records), "table": cluster.markdown(records)}))
"""


def test_the_cluster_benchmark_reports_per_epoch_costs_and_projects_them():
    """The per-epoch and per-fit columns, and the projection to 64 workers of the client's CPU
    with its per-epoch cost (in a process of its own: benchmarks.cluster and benchmarks.compare
    define the same absl flags)."""
    out = _last_json_line_of(_CLUSTER_REPORT)
    (p,) = out["projection"]
    assert p["step_ms"] == pytest.approx(0.5 + 0.64)
    assert p["epoch_ms"] == pytest.approx(10.0 + 128.0)
    assert p["epoch_total_ms"] == pytest.approx(138.0 + 200 * 1.14)
    table = out["table"]
    assert (
        "| recommender | dpkeras | numpy | 8 | 10 | 0.58 | 26.0 | 20.0 | 40.0 | 30.0 | 0.50 |"
        in table
    )
    assert "Projected to 64 workers" in table and "138 ms/epoch" in table


_MODES_REPORT = """
import json
from benchmarks import cluster

cluster.FLAGS(["cluster", "--epoch_steps=0"])
dense = 90_000
def record(strategy, w):
    hybrid = strategy == "dpkeras_hybrid"
    ring = 2 * (w - 1) / w * dense
    ps = 4_000 * w if hybrid else 100_000 * w
    worker = ring + 4_000 if hybrid else 100_000
    return {
        "model": "recommender", "strategy": strategy, "k": 10, "workers": w, "loss": 0.5,
        "steps_per_s": 20.0 if hybrid else 10.0, "client_cpu_ms_per_step": 0.5 + 0.01 * w,
        "task_cpu_ms_per_step": dict({"ps:0": 2.0}, **{f"worker:{i}": 5.0 + i for i in range(w)}),
        "wire_bytes_per_step": dict(
            {"ps:0": [ps, ps], "client": [500, 100]},
            **{f"worker:{i}": [worker, worker] for i in range(w)}),
        "dense_bytes": dense, "ring_bytes_each_way": ring,
    }
records = [record(s, w) for w in (1, 2) for s in ("dpkeras", "dpkeras_hybrid")]
records.append({"model": "dlrm", "strategy": "dpkeras_hybrid", "k": 10, "workers": 2,
                "error": "Shape mismatch"})
print(json.dumps({"projection": cluster.modes_projection(records),
                  "ratios": {str(k): v for k, v in cluster.ps_ratio(records).items()},
                  "table": cluster.markdown(records)}))
"""


def test_the_cluster_benchmark_compares_all_on_ps_with_hybrid_and_projects_both():
    """All-on-ps and hybrid side by side: CPU per process, bytes per ps task, worker link and
    client, the dense bytes and the ring's 2(W-1)/W x dense, the ps-bytes ratio; and each
    mode's ceilings at 64 workers with its first limit (in a process of its own: absl flags)."""
    out = _last_json_line_of(_MODES_REPORT)
    assert out["ratios"] == {"('recommender', 1, 10)": 0.04, "('recommender', 2, 10)": 0.04}
    table = out["table"]
    assert (
        "| recommender | all-on-ps | 2 | 10 | 10.0 | 0.52 | 2.0 | 5.5 / 6.0 | 400.0 (200.0 / 200.0)"
        " | 200.0 / 200.0 | 0.6 | 90.0 | 90.0 |  |" in table
    )
    assert (
        "| recommender | hybrid | 2 | 10 | 20.0 | 0.52 | 2.0 | 5.5 / 6.0 | 16.0 (8.0 / 8.0) | "
        "188.0 / 188.0 | 0.6 | 90.0 | 90.0 | 0.040x |" in table
    )
    assert "| dlrm | hybrid | 2 | 10 | failed: Shape mismatch |" in table
    all_on_ps, hybrid = out["projection"]
    assert (all_on_ps["strategy"], hybrid["strategy"]) == ("dpkeras", "dpkeras_hybrid")
    # all-on-ps: the ps's bytes grow with W (100 KB x 64 each way), a worker's do not
    assert all_on_ps["ps_bytes"] == pytest.approx(6_400_000)
    assert all_on_ps["ceilings"]["ps link"] == pytest.approx(3.1e9 / 6_400_000)
    assert all_on_ps["ceilings"]["worker link"] == pytest.approx(3.1e9 / 100_000)
    assert all_on_ps["ceilings"]["client"] == pytest.approx(1000 / 1.14)
    assert all_on_ps["first"] == "ps link"
    # hybrid: rows on the ps (4 KB x 64), a worker's link the ring at 64 plus its rows
    assert hybrid["ps_bytes"] == pytest.approx(256_000)
    assert hybrid["ring_bytes"] == pytest.approx(2 * 63 / 64 * 90_000)
    assert hybrid["worker_bytes"] == pytest.approx(2 * 63 / 64 * 90_000 + 4_000)
    assert hybrid["first"] == "client"
    assert (
        "| recommender | all-on-ps | 10 | 1,2 | 1.14 | 6,400.0 | 100.0 | 877 | 484 | 31,000 | "
        "ps link |" in table
    )
    assert (
        "| recommender | hybrid | 10 | 1,2 | 1.14 | 256.0 | 181.2 | 877 | 12,109 | 17,109 | "
        "client |" in table
    )


def test_timing_fields_median_and_spread():
    fields = worker.timing_fields([1.0, 2.0, 0.5], steps=10, batch_size=240)
    assert fields["steps_per_sec_runs"] == [10.0, 5.0, 20.0]
    assert fields["steps_per_sec"] == 10.0
    assert fields["examples_per_sec"] == 2400.0
    assert fields["steps_per_sec_spread"] == pytest.approx(1.5)


# -- failure reporting --------------------------------------------------------------------------


def test_first_line_of_a_keras_wrapped_error():
    error = ValueError(
        "Exception encountered when calling Dropout.call().\n\n"
        "\x1b[1mYou must specify an aggregation method.\x1b[0m\n\nArguments..."
    )
    assert worker.first_line(error) == (
        "ValueError: Exception encountered when calling Dropout.call(): "
        "You must specify an aggregation method."
    )
    assert worker.first_line(RuntimeError("one\ntwo")) == "RuntimeError: one"
    assert worker.first_line(KeyError()) == "KeyError"


def test_a_failing_pair_is_a_record_not_an_exception():
    record = worker.run(worker.PairSpec(strategy="parameter_server", model="mlp"))
    assert record["status"] == "failed"
    assert record["phase"] == "setup"
    assert record["error"].startswith("ValueError: Unknown strategy 'parameter_server'")
    assert "dpkeras, mirrored, central_storage, one_device" in record["error"]
    record = worker.run(
        worker.PairSpec(strategy="dpkeras", model="mlp", replicas=3, batch_size=100)
    )
    assert record["status"] == "failed"
    assert "does not split evenly over 3 replicas" in record["error"]


def test_pair_spec_rejects_unknown_fields():
    with pytest.raises(ValueError, match=r"Unknown pair fields \['colour'\]"):
        worker.PairSpec.from_json('{"strategy": "dpkeras", "model": "mlp", "colour": 1}')


def test_worker_output_without_a_result_line_is_a_failure():
    spec = worker.PairSpec(strategy="mirrored", model="mlp")
    record = compare.parse_worker_output(spec, -11, "some output\n", "warning\nSegmentation\n")
    assert record["status"] == "failed"
    assert record["error"] == "worker exited with code -11 without a result: Segmentation"
    assert record["phase"] == "process"
    ok = {"status": "ok", "strategy": "mirrored"}
    line = worker.RESULT_PREFIX + json.dumps(ok)
    assert compare.parse_worker_output(spec, 0, f"noise\n{line}\n", "") == ok


def test_run_pair_reports_a_crash_and_keeps_the_log(tmp_path):
    spec = worker.PairSpec(strategy="dpkeras", model="mlp")
    log = tmp_path / "logs" / "pair.log"
    crash = [sys.executable, "-c", "import sys; sys.stderr.write('boom\\n'); sys.exit(3)"]
    record = compare.run_pair(spec, timeout=60, log_path=str(log), command=crash)
    assert record["status"] == "failed"
    assert record["error"] == "worker exited with code 3 without a result: boom"
    assert record["strategy"] == "dpkeras" and record["model"] == "mlp"
    assert "boom" in log.read_text()


def test_run_pair_reports_a_timeout():
    spec = worker.PairSpec(strategy="dpkeras", model="mlp")
    sleep = [sys.executable, "-c", "import time; time.sleep(30)"]
    record = compare.run_pair(spec, timeout=1, command=sleep)
    assert record["status"] == "failed"
    assert record["error"] == "TimeoutError: the pair did not finish within 1 s"


# -- plan and flags -----------------------------------------------------------------------------


def _config(**kw):
    base = dict(
        models=["mlp", "resnet"],
        strategies=["dpkeras", "one_device", "mirrored"],
        replica_counts=[3],
        sizes=[1.0],
        steps=None,
        check_steps=2,
        warmup_steps=1,
        repeats=2,
        batch_size=None,
        scaling=False,
        out="results",
        pair_timeout=60,
        seed=1,
        parameter_device="/cpu:0",
        devices="simulated",
    )
    base.update(kw)
    return compare.Config(**base)


def test_plan_runs_one_device_first_and_once():
    pairs = compare.plan(_config(scaling=True, replica_counts=[1, 2, 4], sizes=[0.5, 1.0]))
    assert len(pairs) == 2 * 2 * (1 + 2 * 3)
    first = pairs[:7]
    assert [(p.strategy, p.replicas) for p in first] == [
        ("one_device", 1),
        ("dpkeras", 1),
        ("mirrored", 1),
        ("dpkeras", 2),
        ("mirrored", 2),
        ("dpkeras", 4),
        ("mirrored", 4),
    ]
    assert {p.batch_size for p in pairs if p.model == "mlp"} == {MODELS["mlp"].batch_size}
    assert {p.steps for p in pairs if p.model == "resnet"} == {MODELS["resnet"].steps}


def test_default_batches_split_over_every_scaling_count():
    for m in MODELS.values():
        for n in (1, 2, 3, 4, 6, 8):
            assert m.batch_size % n == 0, (m.name, n)


def test_indivisible_batch_is_a_usage_error():
    with pytest.raises(compare.app.UsageError, match="batch 100 over 3 replicas"):
        compare._check_batches(_config(batch_size=100))


class _Flags(dict):
    """Stands in for absl's FLAGS: `f.name` is the value, `f[name].present` whether it was
    given on the command line (here: whether it is in `present`)."""

    def __init__(self, values, present=()):
        super().__init__(values)
        self.present = set(present)

    def __getattr__(self, name):
        return dict.__getitem__(self, name)

    def __getitem__(self, name):
        return type(
            "Flag", (), {"present": name in self.present, "value": dict.__getitem__(self, name)}
        )()


OFF = "dpkeras_no_dedup"


def _flags(present=(), **kw):
    values = dict(
        models=list(MODELS),
        strategies=[
            s
            for s in worker.STRATEGIES
            if s not in ("dpkeras_sharded", "dpkeras_no_dedup", "dpkeras_hybrid")
        ],
        replicas=None,
        steps=None,
        check_steps=5,
        warmup_steps=3,
        repeats=5,
        batch_size=None,
        size=1.0,
        scaling=False,
        scaling_replicas=["1", "2", "4", "8"],
        scaling_sizes=["0.5", "1"],
        out="results",
        pair_timeout=60,
        seed=1,
        parameter_device="/cpu:0",
        chart=False,
        partition=0,
        dedup_baseline=False,
        logical_gpus=0,
    )
    values.update(kw)
    return _Flags(values, present)


def test_config_defaults_on_cpu_and_gpu():
    config = compare.config_from_flags(_flags(), gpus=[])
    assert config.replica_counts == [3] and config.devices == "simulated"
    config = compare.config_from_flags(_flags(), gpus=["GPU:0", "GPU:1"])
    assert config.replica_counts == [2] and config.devices == "gpu"
    config = compare.config_from_flags(_flags(scaling=True), gpus=["GPU:0", "GPU:1"])
    assert config.replica_counts == [1, 2] and config.models == ["mlp"]
    config = compare.config_from_flags(
        _flags(scaling=True, models=["resnet"], present=["models"]), gpus=[]
    )
    assert config.replica_counts == [1, 2, 4, 8] and config.models == ["resnet"]
    with pytest.raises(compare.app.UsageError, match="only 2 GPU"):
        compare.config_from_flags(_flags(replicas=4), gpus=["GPU:0", "GPU:1"])
    with pytest.raises(
        compare.app.UsageError, match="--strategies must be .*Received: --strategies=horovod"
    ):
        compare.config_from_flags(_flags(strategies=["horovod"]), gpus=[])


def test_partition_adds_the_sharded_dpkeras_beside_dpkeras():
    config = compare.config_from_flags(_flags(partition=3), gpus=[])
    assert config.strategies == [
        "dpkeras",
        "dpkeras_sharded",
        "mirrored",
        "central_storage",
        "one_device",
    ]
    pairs = compare.plan(config)
    assert {(p.strategy, p.partition) for p in pairs if p.model == "mlp"} == {
        ("one_device", 0),
        ("dpkeras", 0),
        ("dpkeras_sharded", 3),
        ("mirrored", 0),
        ("central_storage", 0),
    }
    assert "dpkeras_sharded" not in compare.config_from_flags(_flags(), gpus=[]).strategies
    with pytest.raises(compare.app.UsageError, match="needs --partition=N with N >= 2"):
        compare.config_from_flags(_flags(strategies=["dpkeras_sharded"]), gpus=[])


# -- derived columns, targets, files ------------------------------------------------------------


def test_derive_ratios_and_loss_check():
    records = results.derive(_default_run(), {"mlp": 1e-4})
    by = {(r["model"], r["strategy"]): r for r in records}
    dp = by["mlp", "dpkeras"]
    assert dp["ratio_to_one_device"] == pytest.approx(0.95)
    assert dp["ratio_to_mirrored"] == pytest.approx(1.9)
    assert dp["loss_vs_one_device"] == pytest.approx(5e-5)
    assert dp["check_loss_vs_one_device"] == pytest.approx(5e-5)
    assert dp["loss_check"] == "ok"
    drifted = results.derive(
        [dict(r, final_loss=3.0) if r["strategy"] == "dpkeras" else r for r in _default_run()]
    )
    assert drifted[1]["loss_vs_one_device"] == pytest.approx(0.5)
    assert drifted[1]["loss_check"] == "ok"  # judged on the first steps' loss
    assert by["mlp", "central_storage"]["loss_check"] == "DIFFERS"
    assert by["mlp", "one_device"]["loss_check"] == "reference"
    assert by["mlp", "one_device"]["ratio_to_mirrored"] == pytest.approx(2.0)
    failed = by["resnet", "central_storage"]
    assert failed["ratio_to_one_device"] is None and failed["loss_vs_one_device"] is None


def test_targets_say_met_missed_and_by_how_much():
    records = results.derive(_default_run())
    targets = {t["target"]: t for t in results.check_targets(records)}
    assert targets["steps/s >= central_storage's"]["met"] is True
    assert targets["steps/s >= 1.3x mirrored's"]["met"] is True
    assert targets["steps/s within 10% of one_device's"]["value"] == pytest.approx(0.95)
    assert targets["tensors to each replica <= one per model variable"]["met"] is True
    assert targets["metrics add no tensors to replicas"]["met"] is True
    chatty = [
        dict(r, tensors_to_each_replica={"/cpu:1": [11, 6, 5, 0], "/cpu:2": [12, 7, 4, 1]})
        if r["strategy"] == "dpkeras"
        else r
        for r in _default_run()
    ]
    targets = {t["target"]: t for t in results.check_targets(results.derive(chatty))}
    assert targets["tensors to each replica <= one per model variable"]["met"] is False
    assert targets["tensors to each replica <= one per model variable"]["value"] == 7
    assert (
        "plus 1 of unknown shape"
        in targets["tensors to each replica <= one per model variable"]["detail"]
    )
    metrics = targets["metrics add no tensors to replicas"]
    assert (metrics["met"], metrics["value"]) == (False, 5)
    assert metrics["detail"].startswith("5 scalar tensors to /cpu:1 per step")
    slow = [dict(r, steps_per_sec=5.0) if r["strategy"] == "dpkeras" else r for r in _default_run()]
    targets = {t["target"]: t for t in results.check_targets(results.derive(slow))}
    assert targets["steps/s >= 1.3x mirrored's"]["met"] is False
    assert "= 0.500x (needs >= 1.30x)" in targets["steps/s >= 1.3x mirrored's"]["detail"]
    lines = results.format_targets(results.check_targets(results.derive(slow)))
    assert any(line.startswith("  [MISSED] 3 replicas: steps/s >= 1.3x") for line in lines)


def test_result_files_have_the_required_fields(tmp_path):
    records = results.derive(_default_run())
    jsonl, md = results.write_results(
        records,
        str(tmp_path / "out"),
        "bench",
        "title",
        ["Machine: test"],
        results.check_targets(records),
    )
    lines = results.read_jsonl(jsonl)
    assert len(lines) == len(records)
    for line in lines:
        assert set(results.REQUIRED_FIELDS) <= set(line)
        assert line["status"] in ("ok", "failed")
    failed = [line for line in lines if line["status"] == "failed"]
    assert failed[0]["error"] == "ValueError: it broke. And more."
    text = open(md).read()
    assert "Machine: test" in text
    assert "| mlp | 1 | dpkeras | 3 | ok | 19.00 |" in text
    assert "resnet / central_storage / 3 replicas, in first steps: ValueError: it broke." in text
    assert "[MET   ]" in text


def test_terminal_table_shows_failures_with_their_first_line():
    table = results.format_table(results.derive(_default_run()))
    header = table.splitlines()[0]
    assert header.split()[:5] == ["model", "size", "strategy", "repl", "status"]
    assert "FAILED (first steps)" in table
    assert "resnet / central_storage / 3 replicas, in first steps: ValueError: it broke." in table
    assert "ok (+0.005%)" in table and "DIFFERS (+25%)" in table
    assert "3 x 8.00" in table  # mirrored: a copy on each replica


def test_short_error():
    assert results.short_error("ValueError: first. second. third") == "ValueError: first."
    assert results.short_error("x" * 200, 20) == "x" * 17 + "..."
    assert results.short_error(None) == ""


def test_charts_are_written(tmp_path):
    pytest.importorskip("matplotlib")
    from benchmarks import chart

    records = results.derive(_default_run())
    path = chart.comparison_chart(records, str(tmp_path / "bench.png"), "test")
    assert os.path.getsize(path) > 1000
    scaling = results.derive(
        [
            _record("one_device", replicas=1, sps=20.0),
            _record("dpkeras", replicas=1, sps=18.0),
            _record("dpkeras", replicas=2, sps=16.0),
            _record("mirrored", replicas=1, sps=17.0),
            _record("mirrored", replicas=2, status="failed"),
        ]
    )
    path = chart.scaling_chart(scaling, str(tmp_path / "scaling.png"))
    assert os.path.getsize(path) > 1000
    tables = "\n".join(results.scaling_tables(scaling))
    assert "| strategy | 1 replica | 2 replicas |" in tables
    assert "| dpkeras | 0.90 | 0.80 |" in tables
    assert "| mirrored | 0.85 | failed |" in tables


def test_machine_description_says_devices_are_simulated():
    info = machine.describe([], 3, "/cpu:0")
    text = "\n".join(machine.lines(info))
    assert info["devices"] == "simulated"
    assert "SIMULATED" in text and "/cpu:1../cpu:3" in text and "not a speed-up" in text


def test_the_benchmark_header_prints_the_version():
    software = machine.lines(machine.describe([], 1, "/cpu:0"))[1]
    assert f", dpkeras {dpkeras.__version__}" in software, software


def test_the_dynamic_embedding_benchmark_feeds_raw_non_negative_63_bit_ids_with_a_zipf_head():
    out = run_python("""
        import numpy as np
        from benchmarks import dynamic_embedding  # its own process: absl flags are global

        ids = dynamic_embedding.raw_ids(np, np.random.RandomState(0), 2000, 1.1)
        assert ids.shape == (2000, 26) and ids.dtype == np.int64 and ids.min() >= 0
        assert ids.max() > 2**60  # hashed over the whole range, no vocabulary
        _, counts = np.unique(ids[:, 0], return_counts=True)
        assert counts.max() > 100 and (counts == 1).sum() > 100  # a hot head, a long tail
        assert not set(ids[:, 0].tolist()) & set(ids[:, 1].tolist())  # features hash apart
        print("ok")
    """)
    assert out.strip() == "ok"


# -- end to end ---------------------------------------------------------------------------------


def _compare(out, *flags):
    """Runs a tiny `python -m benchmarks.compare` (2 replicas, 2 steps) into `out`; asserts exit 0.

    `flags` add to (or, by absl's last-wins rule, override) the tiny defaults.
    """
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.compare",
            "--strategies=one_device,dpkeras",
            "--replicas=2",
            "--size=0.05",
            "--steps=2",
            "--check_steps=2",
            "--warmup_steps=0",
            "--pair_timeout=240",
            f"--out={out}",
            "--nochart",
            *flags,
        ],
        cwd=ROOT,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
        capture_output=True,
        text=True,
        timeout=500,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_smoke_one_tiny_pair_end_to_end(tmp_path):
    out = tmp_path / "results"
    proc = _compare(out, "--models=mlp", "--repeats=2")
    assert "SIMULATED" in proc.stdout
    assert "[ 2/2] mlp" in proc.stdout
    assert str(out / "bench.jsonl") in proc.stdout
    lines = results.read_jsonl(out / "bench.jsonl")
    assert [(r["strategy"], r["status"]) for r in lines] == [
        ("one_device", "ok"),
        ("dpkeras", "ok"),
    ]
    dp = lines[1]
    assert dp["replicas"] == 2 and dp["steps_per_sec"] > 0
    assert dp["tensors_to_replicas_per_step"] >= dp["model_variables"]
    assert dp["variable_bytes_by_device"].keys() == {"/cpu:0"}
    assert abs(dp["loss_vs_one_device"]) < 1e-3
    assert (out / "bench.md").exists() and (out / "logs").is_dir()


def test_the_sharded_recommender_spreads_its_table_and_equals_one_device(tmp_path):
    out = tmp_path / "results"
    proc = _compare(
        out,
        "--models=recommender",
        "--partition=2",
        "--parameter_device=/cpu:0,/cpu:3",
        "--batch_size=96",
        "--repeats=1",
    )
    lines = {r["strategy"]: r for r in results.read_jsonl(out / "bench.jsonl")}
    assert {s: r["status"] for s, r in lines.items()} == {
        "one_device": "ok",
        "dpkeras": "ok",
        "dpkeras_sharded": "ok",
    }
    sharded, whole = lines["dpkeras_sharded"], lines["dpkeras"]
    assert sharded["partition"] == 2
    held = sharded["variable_bytes_by_device"]
    assert held.keys() == {"/cpu:0", "/cpu:3"}
    # The 5000 x 32 item table and its Adagrad slot are halved; greedy placement alone,
    # with whole variables, leaves one device holding most of the bytes.
    assert max(held.values()) / sum(held.values()) < 0.6
    assert max(whole["variable_bytes_by_device"].values()) / sum(held.values()) > 0.7
    assert abs(sharded["loss_vs_one_device"]) < 1e-4
    # The looked-up rows have a size known only when the step runs: said, not counted as 0.
    assert sharded["runtime_size_tensors_to_replicas_per_step"] > 0
    assert "of run-time size (a sharded lookup's rows), not counted" in proc.stdout


def test_soak_benchmark_runs_and_summarizes(tmp_path):
    """`benchmarks/soak.py` end to end, briefly: a JSON line per window and a summary."""
    out = tmp_path / "soak.jsonl"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.soak",
            "--steps=30",
            "--every=10",
            "--replicas=2",
            "--batch_size=16",
            f"--out={out}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    header, windows = lines[0], lines[1:]
    assert header["run"]["strategy"] == "dpkeras" and header["run"]["replicas"] == 2
    assert [w["step"] for w in windows] == [10, 20, 30]
    assert header["summary"]["variables_constant"] is True
    assert all(w["rss_mib"] > 0 and w["step_ms_median"] > 0 for w in windows)
    assert "RSS:" in proc.stdout and "Variables constant" in proc.stdout


def test_fit_costs_benchmark_compares_per_fit_costs(tmp_path):
    """`benchmarks/fit_costs.py` end to end, briefly: a row per strategy, against none."""
    out = tmp_path / "fit_costs.jsonl"
    proc = _benchmark("fit_costs", "--fits=1", "--strategies=none,dpkeras", f"--out={out}")
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["strategy"], r["replicas"]) for r in rows] == [("none", 1), ("dpkeras", 2)]
    for r in rows:
        assert r["cpu_s_per_fit"] > 0 and set(r["profile_shares"]) == {
            "making iterators",
            "tracing",
        }
        assert 0 < r["profile_shares"]["making iterators"] < 1
    assert re.search(r"^dpkeras +2 +[\d.]+s +[\d.]+ ", proc.stdout, re.M), proc.stdout


def test_fit_memory_benchmark_reads_every_process_per_fit(tmp_path):
    """`benchmarks/fit_memory.py` end to end, briefly, on a local cluster: resident memory of
    the client and of every task after each fit, and the client's context functions, which a
    dropped model does not leave behind."""
    out = tmp_path / "fit_memory.jsonl"
    proc = _benchmark("fit_memory", "--fits=2", "--first=1", "--modes=cluster", f"--out={out}")
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert row["mode"] == "cluster" and [r["fit"] for r in row["records"]] == [1, 2]
    first, last = row["records"]
    assert {k for k in last if k.endswith("_mib")} == {
        "client_mib",
        "ps:0_mib",
        "worker:0_mib",
        "worker:1_mib",
    }
    assert all(last[k] > 0 for k in last if k.endswith("_mib"))
    assert last["functions"] == first["functions"]
    assert re.search(r"^cluster +worker:1 +-?[\d.]+ ", proc.stdout, re.M), proc.stdout


# -- GPU arithmetic and the command line --------------------------------------------------------


def test_pcie_arithmetic():
    from benchmarks import pcie

    per_gpu, host = pcie.parameter_device_bytes(25e6, 4)
    assert (per_gpu, host) == (100e6, 400e6)
    assert pcie.allreduce_bytes(25e6, 4) == pytest.approx(150e6)  # 2 (N - 1) / N x 100 MB
    assert pcie.allreduce_bytes(25e6, 2) == pytest.approx(100e6)
    lines = pcie.table(25e6, [4], pcie_gbps=10.0, nvlink_gbps=100.0)
    assert lines[-1] == "| 4 | 100 | 400 | 10.0 | 40.0 | 150 | 15.0 | 1.50 |"


def test_cli_env_prints_versions_devices_and_the_default_choice(capsys, monkeypatch):
    from dpkeras import _cli as cli

    monkeypatch.setenv("DPKERAS_PARAMETER_DEVICE", "/cpu:0")
    assert cli.main(["env", "--simulate_cpu_devices", "4"]) == 0
    text = capsys.readouterr().out
    assert f"TensorFlow {tf.__version__}" in text and f"Keras {keras.__version__}" in text
    assert "/cpu:3" in text
    assert "compute devices:  /cpu:1, /cpu:2, /cpu:3" in text
    assert "parameter device: '/cpu:0'" in text or "parameter device: /cpu:0" in text
    assert "DPKERAS_PARAMETER_DEVICE=/cpu:0" in text


def test_cli_usage_and_unknown_command(capsys):
    from dpkeras import _cli as cli

    assert cli.main(["--help"]) == 0
    assert "bench" in capsys.readouterr().out
    assert cli.main(["train"]) == 2
    assert "unknown command 'train'; valid commands: env, bench" in capsys.readouterr().err


def test_cli_bench_outside_a_checkout_refuses_in_one_line(capsys, monkeypatch):
    from dpkeras import _cli as cli
    from dpkeras._cli import bench

    monkeypatch.setattr(bench, "_checkout_root", lambda: None)
    monkeypatch.setattr(bench.subprocess, "call", lambda *a, **k: pytest.fail("ran something"))
    assert cli.main(["bench"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert "needs a dpkeras source checkout" in err  # .ci/wheel_smoke.py: "source checkout"


def test_cli_bench_in_a_checkout_runs_compare_in_a_process_of_its_own(monkeypatch):
    from dpkeras import _cli as cli
    from dpkeras._cli import bench

    calls = []

    def call(argv, env):
        calls.append((argv, env))
        return 7

    monkeypatch.setattr(bench.subprocess, "call", call)
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    path, doc = list(sys.path), sys.modules["__main__"].__doc__
    assert cli.main(["bench", "--models=mlp"]) == 7  # compare's exit status
    argv, env = calls[0]
    assert argv == [sys.executable, os.path.join(ROOT, "benchmarks", "compare.py"), "--models=mlp"]
    assert env["PYTHONPATH"] == ROOT + os.pathsep + "/elsewhere"
    assert sys.path == path and sys.modules["__main__"].__doc__ == doc  # this process untouched


def test_cli_bench_help_is_the_benchmarks_from_any_directory(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "dpkeras", "bench", "--help"],
        cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert compare.__doc__.splitlines()[0] in proc.stdout  # absl prints __main__'s docstring
    assert "--out" in proc.stdout


def test_command_line_for_the_report():
    assert compare.command_line(["/x/benchmarks/compare.py", "--models=mlp"]) == (
        "python -m benchmarks.compare --models=mlp"
    )
    info = machine.describe([], 8, "/cpu:0", [1, 2, 4, 8])
    assert "replicas + 1 logical devices (2 to 9)" in info["layout"]


def test_a_list_of_parameter_devices_spreads_dpkeras_variables():
    spec = worker.PairSpec(
        strategy="dpkeras", model="mlp", replicas=2, parameter_device="/cpu:0, /cpu:3"
    )
    assert worker.parameter_device_list(spec.parameter_device) == ["/cpu:0", "/cpu:3"]
    strategy = worker.make_strategy(spec)
    assert [d[-5:] for d in strategy.extended.parameter_devices] == ["CPU:0", "CPU:3"]
    assert "greedy_by_size" in repr(strategy.extended.placement_policy)
    css = worker.make_strategy(
        worker.PairSpec(
            strategy="central_storage", model="mlp", replicas=2, parameter_device="/cpu:0,/cpu:3"
        )
    )
    assert css.extended.parameter_devices[0].lower().endswith("cpu:0")


def test_seeds_benchmark_compares_seeded_and_unseeded_epochs(tmp_path):
    """`benchmarks/seeds.py` end to end, briefly: a seeded and an unseeded client's costs."""
    out = tmp_path / "seeds.jsonl"
    proc = _benchmark(
        "seeds", "--rows=2000", "--turns=1", "--epochs=2", "--steps=2", f"--out={out}"
    )
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["seeded"], r["rows"], r["workers"]) for r in rows] == [
        (True, 2000, 2),
        (False, 2000, 2),
    ]
    assert all(r["client_cpu_ms_per_epoch"] > 0 and r["wall_ms_per_epoch"] > 0 for r in rows)
    assert "unseeded: client CPU" in proc.stdout


_DIVERGENCE = """
import json
import numpy as np
from benchmarks import divergence

# Integer weights: every pre-activation exact. Unit 1 reads the user features only, and user
# 2's are zero: example 2's unit 1 is its bias alone, 7.45e-9 in one run, -1.86e-9 in the other.
one = [np.arange(10, dtype="float32").reshape(5, 2) + 1,
       np.array([[3, 1], [2, 2], [0, 0]], "float32"),
       np.array([[1, 0, 2], [1, 0, -1], [0, 1, 1], [0, 1, 0]], "float32"),
       np.array([0.5, 7.45e-9, -0.5], "float32")]
items, users = np.array([0, 4, 2]), np.array([1, 0, 2])
cluster = [w.copy() for w in one]
cluster[3][1] = np.float32(-1.86e-9)
found = divergence.flips(items, users, one, cluster)
record = dict(workers=4, batch=3, steps=9, threshold=1e-6, parted_at=8, largest_before=9e-8,
              largest_at=3.2e-5, flips=[[1, 1, 7.45e-9, -1.86e-9]])
quiet = dict(record, parted_at=None, largest_at=None, flips=[])
print(json.dumps([found, divergence.report(record), divergence.report(quiet)]))
"""


def test_the_divergence_benchmark_names_the_example_and_unit_whose_relu_flipped():
    found, parted, quiet = _last_json_line_of(_DIVERGENCE)
    assert found == [[2, 1, pytest.approx(7.45e-9, rel=1e-6), pytest.approx(-1.86e-9, rel=1e-6)]]
    assert "step 8 parts them by 3.2e-05" in parted[1]
    assert parted[2] == (
        "  example 1 of that batch, first Dense unit 1: pre-activation 7.45e-09 on one "
        "device, -1.86e-09 under dpkeras (ReLU on one side, off on the other)"
    )
    assert quiet[1] == "  no step parted them by more than 1e-06 in 9 steps (largest 9e-08)"


def test_the_sparse_update_benchmark_times_both_updates_and_finds_them_bit_identical():
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.sparse_update", "--rows=300,2000", "--steps=3"]
        + ["--repeats=1", "--batch=16", "--dim=4"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| 3") or "2,000" in line]
    assert len(rows) == 2 and all(line.endswith("| True |") for line in rows), proc.stdout


def test_the_recommender_report_puts_one_devices_auc_beside_every_strategy_at_any_k(tmp_path):
    """benchmarks/recsys.py reporting earlier records (`--records`, no training): every data
    plan is the same at every K, so MirroredStrategy's row (K=1) has one device's AUC (K=10)
    beside its own, and PSS's has tf-keras's one device's; the published figures follow,
    marked as other hardware."""

    def record(strategy, framework, k, auc, workers=0):
        return dict(strategy=strategy, framework=framework, model="dlrm", k=k, workers=workers,
                    samples=163840, samples_per_s=1000.0, whole_fit_samples_per_s=900.0,
                    held_out_loss=0.59, held_out_auc=auc, client_cpu_ms_per_step=1.0)  # fmt: skip

    records = tmp_path / "recsys.jsonl"
    records.write_text(
        "".join(
            json.dumps(r) + "\n"
            for r in (
                record("one_process", "keras", 10, 0.7570),
                record("one_process_tf_keras", "tf_keras", 10, 0.7571),
                record("local_mirrored", "keras", 1, 0.7569),
                record("pss", "tf_keras", 10, 0.7395, workers=2),
            )
        )
    )
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.recsys", f"--records={records}", f"--out={tmp_path}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    table = (tmp_path / "recsys.md").read_text()
    assert (
        "| one machine | local_mirrored | 2 simulated devices | 1 | 1,000 | 900 | 0.7569 (0.7570)"
        in table
    )
    assert (
        "| loopback cluster | pss | 1 ps + 2 workers | 10 | 1,000 | 900 | 0.7395 (0.7571)" in table
    )
    assert "Published, on other hardware (not measured here):" in table
