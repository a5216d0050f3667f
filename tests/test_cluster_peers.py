"""The cluster benchmark's peers (benchmarks/peers.py): who runs, how, and that a peer that
cannot run or fails becomes a row with its reason. No cluster and no tf-keras needed: the
clients here are small Python processes standing in for the real ones, and one tiny
one-process client (`benchmarks/peer_client.py`) trains in this process to show which examples
it trains on and which it holds out."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from benchmarks import peer_client, peers


def test_the_peers_are_tensorflows_cluster_strategies_beside_dpkeras():
    assert peers.PEERS == (
        "dpkeras",
        "dpkeras_hybrid",
        "dpkeras_baseline",
        "pss",
        "mwms",
        "mwms_tf_keras",
    )
    frameworks = {p: peer_client.FRAMEWORK[p] for p in peers.PEERS}
    assert frameworks == {
        "dpkeras": "keras",
        "dpkeras_hybrid": "keras",
        "dpkeras_baseline": "keras",
        "pss": "tf_keras",
        "mwms": "keras",
        "mwms_tf_keras": "tf_keras",
    }
    assert peers.REFERENCE == {"keras": "one_process", "tf_keras": "one_process_tf_keras"}


def test_a_tf_keras_peer_runs_in_a_process_of_its_own_with_legacy_keras(monkeypatch):
    monkeypatch.setenv("TF_USE_LEGACY_KERAS", "1")  # must not leak into Keras 3 clients
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {}}')
    config = {"strategy": "pss", "model": "dlrm", "k": 10}
    argv = peers.client_command(config)
    assert argv[:3] == [sys.executable, "-m", "benchmarks.peer_client"]
    assert json.loads(argv[3]) == config
    assert peers.client_env("pss")["TF_USE_LEGACY_KERAS"] == "1"
    assert "TF_CONFIG" not in peers.client_env("pss")
    for keras_3 in ("dpkeras", "mwms", "one_process"):
        assert "TF_USE_LEGACY_KERAS" not in peers.client_env(keras_3)
    tf_config = {"cluster": {"worker": ["127.0.0.1:1"]}, "task": {"type": "worker", "index": 0}}
    env = peers.client_env("mwms_tf_keras", tf_config)
    assert json.loads(env["TF_CONFIG"]) == tf_config and env["TF_USE_LEGACY_KERAS"] == "1"


def _nothing_may_start(*args, **kwargs):
    raise AssertionError("nothing may start for a peer that cannot run")


def test_without_tf_keras_its_peers_are_rows_saying_so(monkeypatch, tmp_path):
    real = peers.importlib.util.find_spec
    monkeypatch.setattr(
        peers.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "tf_keras" else real(name, *a),
    )
    monkeypatch.setattr(peers, "run_processes", _nothing_may_start)
    monkeypatch.setattr(peers, "LocalCluster", _nothing_may_start)
    settings = peers.Settings(out=str(tmp_path))
    for peer in ("pss", "mwms_tf_keras", "one_process_tf_keras"):
        record = peers.run_peer(peer, "dlrm", 10, 2, settings)
        assert record["skipped"] == peers.TF_KERAS_MISSING, record
        assert "error" not in record and "samples_per_s" not in record
    assert peers.unavailable("dpkeras") is None and peers.unavailable("mwms") is None
    table = peers.markdown([record], settings)
    assert "| dlrm | one_process_tf_keras | 2 | 10 | not run: tf-keras is not installed" in table


# A stand-in client: worker 0 fails as Keras 3's MWMS does under fit; the others wait for it
# forever, as MWMS workers wait for their peers.
_FAILING_CLIENT = """
import json, sys, time
config = json.loads(sys.argv[1])
def _maybe_symbolic_build():
    raise ValueError("Attempt to convert a value ({'ids': PerReplica:{0: 1}}) with an "
                     "unsupported type (<class 'dict'>) to a Tensor.")
if config.get("task_index", 0) == 0:
    _maybe_symbolic_build()
time.sleep(600)
"""


def test_a_peer_that_raises_is_a_row_with_its_message_not_a_crash(monkeypatch, tmp_path):
    monkeypatch.setattr(
        peers,
        "client_command",
        lambda config: [sys.executable, "-c", _FAILING_CLIENT, json.dumps(config)],
    )
    monkeypatch.setattr(peers, "GRACE_SECONDS", 1)
    settings = peers.Settings(out=str(tmp_path), timeout=120)
    record = peers.run_peer("mwms", "recommender", 10, 2, settings)
    assert record["error"].startswith("process 0 of 2: ValueError: Attempt to convert a value")
    assert record["error"].endswith("to a Tensor."), record
    assert record["error_frames"][-1] == "<string>:_maybe_symbolic_build"
    assert (record["strategy"], record["workers"], record["framework"]) == ("mwms", 2, "keras")
    table = peers.markdown([record], settings)
    assert "| recommender | mwms | 2 | 10 | failed: process 0 of 2: ValueError: Attempt" in table
    header, *rows = [line for line in table.splitlines() if line.startswith("| ")]
    assert [row.count("|") for row in rows] == [header.count("|")]  # every column, empty


def test_a_killed_process_and_a_silent_one_are_failures_too():
    base = {"strategy": "pss"}
    killed = peers.outcome(base, [(None, "", "")])
    assert killed["error"] == "killed (timed out, or a peer failed)"
    silent = peers.outcome(base, [(0, "no json here\n", "")])
    assert silent["error"] == "process 0 printed no record"
    # an error exit is reported before the peers killed because of it
    both = peers.outcome(base, [(None, "", ""), (1, "", "Traceback\nRuntimeError: boom\n")])
    assert both["error"] == "process 1 of 2: RuntimeError: boom"
    assert peers.outcome(base, [(0, '{"a": 1}\n', "")]) == [{"a": 1}]


def test_mwms_workers_merge_into_one_row_without_a_client():
    workers = [
        {"strategy": "mwms_tf_keras", "client_cpu_ms_per_step": 5.0 + i, "samples_per_s": 9.0,
         "task_cpu_ms_per_step": {"client": 5.0 + i}, "wire_bytes_per_step": {"client": [i, 2]}}
        for i in range(2)
    ]  # fmt: skip
    record = peers.merge_workers(workers)
    assert record["client_cpu_ms_per_step"] is None
    assert record["task_cpu_ms_per_step"] == {"worker:0": 5.0, "worker:1": 6.0}
    assert record["wire_bytes_per_step"] == {"worker:0": [0, 2], "worker:1": [1, 2]}


def test_distances_from_one_device_per_framework(tmp_path):
    def weights(name, *arrays):
        path = str(tmp_path / f"{name}.npz")
        np.savez(path, *arrays)
        return path

    def record(strategy, framework, loss, path):
        return dict(strategy=strategy, framework=framework, model="mlp", k=10,
                    held_out_loss=loss, weights_path=path)  # fmt: skip

    ones = np.ones((2, 2), np.float32)
    records = [
        record("one_process", "keras", 0.5, weights("a", ones)),
        record("one_process_tf_keras", "tf_keras", 0.6, weights("b", ones)),
        record("dpkeras", "keras", 0.5, weights("c", ones * 1.5)),
        record("pss", "tf_keras", 0.7, weights("d", ones * 3)),
        record("mwms_tf_keras", "tf_keras", 0.6, weights("e", np.ones(3))),
    ]
    peers.add_distances(records)
    _, _, ours, pss, shapes = records
    assert ours["reference_loss"] == 0.5 and ours["weights_vs_reference"] == (0.5, 0.5)
    assert pss["reference_loss"] == 0.6 and "weights_vs_reference" not in pss  # asynchronous
    assert shapes["weights_vs_reference"] is None  # arrays that do not match: no distance


@pytest.mark.parametrize(
    "warm, steps, repeats, expected",
    [(20, 200, 1, [(0, 20), (20, 20), (40, 220)]), (4, 4, 2, [(0, 4), (4, 4), (8, 8), (16, 4),
                                                                (20, 8)])],
)  # fmt: skip
def test_the_data_is_one_pass_warm_up_then_short_and_long_fits(warm, steps, repeats, expected):
    plan = peer_client.data_plan(warm, steps, repeats)
    assert plan == expected
    assert all(a + n == b for (a, n), (b, _) in zip(plan, plan[1:]))  # consecutive, no repeat


def test_the_peers_dlrm_is_built_from_keras_layers_even_with_keras_rs_installed():
    """The same computation as tf-keras's (which cannot use keras-rs) unless asked."""
    pytest.importorskip("keras_rs")
    from benchmarks import models

    kinds = {type(layer).__name__ for layer in models.build("dlrm", 0.002, keras_rs=False).layers}
    assert "Embedding" in kinds and "FeatureCross" in kinds and "DistributedEmbedding" not in kinds
    kinds = {type(layer).__name__ for layer in models.build("dlrm", 0.002).layers}
    assert "DistributedEmbedding" in kinds  # the other benchmarks' default is unchanged


def test_the_baseline_peer_runs_another_checkouts_dpkeras_with_these_benchmarks(tmp_path):
    """`dpkeras_baseline` (a before/after in one run): its client imports `dpkeras` from the
    `--baseline` checkout, first on its path, and the benchmarks from this one; without a
    checkout there it is a row saying what to give."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    reason = peers.unavailable("dpkeras_baseline", peers.Settings(baseline=str(tmp_path)))
    assert reason == (
        f"--baseline={str(tmp_path)!r} is not a dpkeras checkout (a directory holding "
        f"dpkeras/__init__.py: `git worktree add DIR COMMIT`)"
    )
    assert peers.unavailable("dpkeras_baseline", peers.Settings(baseline=root)) is None
    record = peers.run_peer("dpkeras_baseline", "mlp", 10, 2, peers.Settings(out=str(tmp_path)))
    assert record["skipped"].startswith("--baseline='' is not a dpkeras checkout"), record
    path = peers.baseline_path(root, str(tmp_path))
    assert os.listdir(path) == ["dpkeras"]
    assert os.path.realpath(os.path.join(path, "dpkeras")) == os.path.join(root, "dpkeras")
    # Run as the benchmark runs it, from this checkout (where `python -m` would find its own
    # dpkeras first), with a stand-in for `benchmarks.peer_client`'s module.
    argv = peers.client_command({"strategy": "dpkeras_baseline"}, path)
    probe = argv[2].replace("benchmarks.peer_client", "probe_module")
    (tmp_path / "probe_module.py").write_text(
        "import sys, benchmarks, dpkeras\n"
        "print(dpkeras.__file__, benchmarks.__file__, sys.argv[1], sep='\\n')\n"
    )
    env = dict(peers.client_env("dpkeras_baseline"))
    env["PYTHONPATH"] = env["PYTHONPATH"] + os.pathsep + str(tmp_path)
    found = subprocess.run(
        [argv[0], "-c", probe, *argv[3:]],
        env=env,
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
    )
    imported = found.stdout.splitlines()
    assert imported[0] == os.path.join(path, "dpkeras", "__init__.py"), found.stderr[-2000:]
    assert json.loads(imported[2]) == {"strategy": "dpkeras_baseline"}
    assert imported[1] == os.path.join(root, "benchmarks", "__init__.py")


def test_each_peers_auc_is_beside_its_own_frameworks_one_device():
    """The AUC "(one device)" of a peer is its framework's one-process reference's, not its
    own: Keras 3's for dpkeras, tf-keras's for PSS."""
    records = [
        dict(strategy=s, framework=peer_client.FRAMEWORK[s], model="dlrm", k=10,
             held_out_loss=0.5, held_out_auc=auc)
        for s, auc in (("one_process", 0.81), ("one_process_tf_keras", 0.82), ("dpkeras", 0.79),
                       ("pss", 0.75))
    ]  # fmt: skip
    _, _, ours, pss = peers.add_distances(records)
    assert (ours["reference_auc"], pss["reference_auc"]) == (0.81, 0.82)
    assert (ours["held_out_auc"], pss["held_out_auc"]) == (0.79, 0.75)


def test_every_peer_runs_at_every_w_beside_one_device_of_its_own_keras(monkeypatch, tmp_path):
    """Each model's references run first, once, one per Keras the peers use (no workers);
    dpkeras's peers share one cluster of 1 ps + W workers per W, the others start their own;
    every peer's record gets its Keras's one-device loss beside it."""
    ran, clusters = [], []

    class Cluster:
        def __init__(self, ps, workers, cpus):
            clusters.append((ps, workers, cpus))

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    def run_peer(strategy, model, k, workers, settings, cluster=None):
        ran.append((strategy, workers, cluster is not None))
        framework = peer_client.FRAMEWORK[strategy]
        loss = {"keras": 0.5, "tf_keras": 0.6}[framework] + workers
        return dict(strategy=strategy, framework=framework, model=model, k=k, workers=workers,
                    held_out_loss=loss)  # fmt: skip

    monkeypatch.setattr(peers, "run_peer", run_peer)
    monkeypatch.setattr(peers, "LocalCluster", Cluster)
    settings = peers.Settings(out=str(tmp_path))
    chosen = ["dpkeras", "dpkeras_hybrid", "pss", "mwms_tf_keras"]
    records = peers.run_all([1, 2], ["mlp"], [10], chosen, settings, echo=lambda *a: None)
    assert ran == [
        ("one_process", 0, False),
        ("one_process_tf_keras", 0, False),
        *[(peer, w, peer.startswith("dpkeras")) for w in (1, 2) for peer in chosen],
    ]
    assert clusters == [(1, 1, 1), (1, 2, 1)]
    for r in records[2:]:
        assert r["reference_loss"] == {"keras": 0.5, "tf_keras": 0.6}[r["framework"]], r


def test_the_median_repeat_is_reported():
    runs = [peer_client.Window({}, None) for _ in range(3)]
    for run, seconds in zip(runs, (3.0, 1.0, 2.0)):
        run.seconds = seconds
    assert peer_client.median_run(runs).seconds == 2.0
    assert peer_client.median_run(runs[:2]).seconds == 1.0  # of two, the faster
    assert peer_client.median_run(runs[:1]).seconds == 3.0


def test_a_client_holds_out_examples_it_never_trains_on_and_trains_on_each_once(monkeypatch):
    """A one-process client on a tiny MLP, each example marked by its row: its fits (the
    warm-up, then each repeat's short and long fit) train on the first examples of the draw,
    each once, in order; the loss and AUC are taken on the `eval_examples` after them, none of
    which any fit saw."""
    real_data, real_fit_data = peer_client.models.synthetic_data, peer_client.make_fit_data
    trained, held = [], []

    def marked(name, examples, size):
        x, y = real_data(name, examples, size)
        x[:, 0] = np.arange(examples) + 1000  # row i's mark, outside the features' [0, 1)
        return x, y

    def make_fit_data(config, tf, data):
        fit_data = real_fit_data(config, tf, data)

        def recorded(first, batches):
            kwargs = fit_data(first, batches)
            trained.extend(int(v) for b in kwargs["x"].as_numpy_iterator() for v in b[0][:, 0])
            return kwargs

        return recorded

    def held_out(config, keras, model, x, y):
        held.extend(int(v) for v in x[:, 0])
        return {"held_out_loss": 0.0}

    monkeypatch.setattr(peer_client.models, "synthetic_data", marked)
    monkeypatch.setattr(peer_client, "make_fit_data", make_fit_data)
    monkeypatch.setattr(peer_client, "held_out", held_out)
    config = dict(strategy="one_process", model="mlp", k=1, workers=0, size=0.02, steps=2,
                  repeats=2, batch=4, eval_examples=12, warm=1, weights_out=None)  # fmt: skip
    record = peer_client.train(config)
    rows = (1 + 2 * (1 + 3)) * 4  # the warm-up fit, then 2 x (a short fit and a long one)
    assert trained == list(range(1000, 1000 + rows))
    assert held == list(range(1000 + rows, 1000 + rows + 12))
    assert record["samples"] == rows and record["held_out_loss"] == 0.0


def test_input_with_peers_is_a_usage_error_naming_both():
    """`--input` picks what dpkeras's own runs fit; every peer fits one dataset of global
    batches (PSS cannot take arrays), so `--input` beside `--peers` would be ignored while
    the run's label said arrays: refused before any process starts."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.cluster",
            "--peers=dpkeras",
            "--input=numpy",
            "--workers=0",  # refused too, after: a run ignoring --input ends here
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-2000:])
    assert "--input=numpy applies to --strategies runs. Received it with --peers" in (
        proc.stdout + proc.stderr
    ), proc.stderr[-2000:]


@pytest.mark.parametrize("given", ["--input=dataset", "--input=numpy"])
def test_input_with_peers_is_refused_even_as_its_default_and_before_a_merge(tmp_path, given):
    """`--input` given beside `--peers` is refused whatever its value (`dataset` is the default,
    but naming it still says dpkeras fits what the flag picks), as absl's usage error (status
    1, no traceback), before anything runs: here before a `--merge` of peers' results writes
    its report."""
    merged = tmp_path / "peers.jsonl"
    merged.write_text("")
    out = tmp_path / "out"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.cluster",
            "--peers=dpkeras",
            given,
            f"--merge={merged}",
            f"--out={out}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-2000:])
    assert f"{given} applies to --strategies runs. Received it with --peers" in (
        proc.stdout + proc.stderr
    ), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert not out.exists()
