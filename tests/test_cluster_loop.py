"""The on-cluster loop: the client is out of the per-step path, and every K is exact.

A real cluster of 1 ps + 2 workers (`dpkeras serve` on loopback); each client runs in a fresh
process (a process connects to one cluster for its lifetime) and compares with a model of the
same process that has no strategy (built after connecting, so its variables are local).
Bytes are the kernel's TCP counters of the client process (`dpkeras.testing.TrafficMeter`):
machine-independent counts, not timings.
"""

import json
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from dpkeras.testing import LocalCluster, server_env

CLIENT_TIMEOUT = 420


@pytest.fixture(scope="module")
def cluster():
    with LocalCluster(ps=1, workers=2, cpus=1) as running:
        yield running


_MODEL = """
def build(k):
    keras.utils.set_random_seed(1)
    model = keras.Sequential([
        keras.Input((4,), dtype="int32"), keras.layers.Embedding(300, 8),
        keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(16, activation="relu"),
        keras.layers.Dense(3)])
    model.compile(optimizer=keras.optimizers.Adam(0.01),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"], steps_per_execution=k)
    return model


def table_model():  # a 20000 x 32 table looked up by 8 ids per example, SGD
    keras.utils.set_random_seed(1)
    model = keras.Sequential([
        keras.Input((8,), dtype="int32"), keras.layers.Embedding(20000, 32),
        keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss="mse")
    return model
"""


def _client(code, spec, pids=None):
    prefix = textwrap.dedent(f"""
        import gc, json, os
        import numpy as np
        import dpkeras, keras, tensorflow as tf
        SPEC = json.loads({json.dumps(json.dumps(spec))})
        PIDS = json.loads({json.dumps(json.dumps(pids or {}))})
        """) + textwrap.dedent(_MODEL)
    try:
        proc = subprocess.run(
            [sys.executable, "-c", prefix + textwrap.dedent(code)],
            capture_output=True,
            text=True,
            env=server_env(),
            timeout=CLIENT_TIMEOUT,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"the client hung: no exit within {CLIENT_TIMEOUT} s")
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("k", [1, 3])
def test_every_steps_per_execution_equals_one_process(cluster, k):
    """Uneven last batch, validation, callbacks, evaluate, predict; no loop's number of steps is
    a multiple of 3, so with K=3 each ends with a shorter group: fit 7 steps (106 = 6 x 16 +
    10), validation (a tf.data pipeline with a map, cut to the workers) and evaluate 4 (53 =
    3 x 16 + 5), predict 4 (29 = 3 x 8 + 5). Compiled with `run_eagerly=True`, a small Dense
    model trains to one process's weights and history too, each step run eagerly (Keras's own
    loop, `dpkeras._patches.step_loop`): 5 steps (36 = 4 x 8 + 4)."""
    out = _client(
        f"""
        K = {k}
        rng = np.random.RandomState(0)
        x, y = rng.randint(0, 300, (106, 4)).astype("int32"), rng.randint(0, 3, 106)
        xv, yv = rng.randint(0, 300, (53, 4)).astype("int32"), rng.randint(0, 3, 53)
        xe, ye = rng.rand(36, 3).astype("float32"), rng.rand(36, 1).astype("float32")

        def validation():  # a tf.data pipeline with a map, cut to the workers
            rows = tf.data.Dataset.from_tensor_slices((xv, yv))
            return rows.map(lambda a, b: (299 - a, b)).batch(16)

        class Seen(keras.callbacks.Callback):
            def __init__(self):
                super().__init__()
                self.batches = []
            def on_train_batch_end(self, batch, logs=None):
                self.batches.append(["train", batch])
            def on_test_batch_end(self, batch, logs=None):
                self.batches.append(["test", batch])
            def on_predict_batch_end(self, batch, logs=None):
                self.batches.append(["predict", batch])

        def train(model):
            seen = Seen()
            schedule = keras.callbacks.LearningRateScheduler(lambda e, lr: lr * 0.5)
            history = model.fit(x, y, batch_size=16, epochs=3, shuffle=False, verbose=0,
                                validation_data=validation(), callbacks=[seen, schedule])
            evaluation = model.evaluate(xv, yv, batch_size=16, verbose=0, callbacks=[seen])
            predictions = model.predict(x[:29], batch_size=8, verbose=0, callbacks=[seen])
            return history.history, seen.batches, evaluation, predictions.tolist()

        eager_calls = []  # per call of the layer below (a replica, a step): whether eagerly

        class Eagerness(keras.layers.Layer):
            def call(self, inputs):
                eager_calls.append(bool(tf.executing_eagerly()))
                return inputs

        def dense(run_eagerly):
            keras.utils.set_random_seed(1)
            model = keras.Sequential([
                keras.Input((3,)), Eagerness(), keras.layers.Dense(4, activation="relu"),
                keras.layers.Dense(1)])
            model.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse", metrics=["mae"],
                          steps_per_execution=K, run_eagerly=run_eagerly)
            return model

        def train_dense(model):
            del eager_calls[:]
            history = model.fit(xe, ye, batch_size=8, epochs=1, shuffle=False, verbose=0)
            return history.history, list(eager_calls)

        dpkeras.cluster.connect(SPEC)
        reference = build(K)  # after connecting: its variables are this process's
        expected = train(reference)
        dense_reference = dense(False)
        expected_dense, _ = train_dense(dense_reference)
        with dpkeras.scope(cluster=SPEC):
            model = build(K)
            eager = dense(True)
        actual = train(model)
        eager_history, eager_seen = train_dense(eager)
        print(json.dumps({{
            "max_diff": max(float(np.abs(a - b).max())
                            for a, b in zip(reference.get_weights(), model.get_weights())),
            "expected": expected, "actual": actual,
            "replicas": model.distribute_strategy.num_replicas_in_sync,
            "eager": {{
                "max_diff": max(float(np.abs(a - b).max()) for a, b in
                                zip(dense_reference.get_weights(), eager.get_weights())),
                "expected": expected_dense, "history": eager_history, "seen": eager_seen,
                "steps": int(eager.optimizer.iterations.numpy()),
            }},
        }}))
        """,
        cluster.spec,
    )
    assert out["replicas"] == 2
    assert out["max_diff"] < 1e-5
    expected_history, expected_batches, expected_eval, expected_pred = out["expected"]
    history, batches, evaluation, predictions = out["actual"]
    assert set(history) == set(expected_history) >= {"loss", "accuracy", "val_loss"}
    for name, values in expected_history.items():
        assert history[name] == pytest.approx(values, rel=1e-5, abs=1e-6), name
    assert batches == expected_batches  # the callbacks see the same batches
    assert sum(kind == "train" for kind, _ in batches) == 3 * -(-7 // k)  # 7 steps an epoch
    assert evaluation == pytest.approx(expected_eval, rel=1e-5)
    np.testing.assert_allclose(predictions, expected_pred, rtol=1e-5, atol=1e-6)
    eager = out["eager"]
    assert eager["steps"] == 5, eager
    # Each step ran eagerly, on each of the 2 replicas (Keras's symbolic build before the
    # first step is traced).
    assert eager["seen"].count(True) == 5 * 2, eager
    assert eager["max_diff"] < 1e-5, eager
    assert set(eager["history"]) == set(eager["expected"]) == {"loss", "mae"}, eager
    for name, values in eager["expected"].items():
        assert eager["history"][name] == pytest.approx(values, rel=1e-5, abs=1e-6), name


def test_backup_and_restore_resumes_a_multi_step_execution_exactly(cluster, tmp_path):
    """K=3: a fit interrupted after its second epoch resumes at the third from the backup and
    ends at the weights of an uninterrupted run; the resumed run trains only what is left."""
    out = _client(
        f"""
        rng = np.random.RandomState(0)
        x, y = rng.randint(0, 300, (90, 4)).astype("int32"), rng.randint(0, 3, 90)

        class Interrupt(keras.callbacks.Callback):
            def on_epoch_end(self, epoch, logs=None):
                if epoch == 1:
                    raise RuntimeError("interrupted")

        def fit(model, callbacks):
            return model.fit(x, y, batch_size=16, epochs=4, shuffle=False, verbose=0,
                             callbacks=callbacks).history

        dpkeras.cluster.connect(SPEC)
        reference = build(3)
        expected = fit(reference, [])
        with dpkeras.scope(cluster=SPEC):
            model = build(3)
        backup = keras.callbacks.BackupAndRestore({str(tmp_path / "backup")!r})
        try:
            fit(model, [backup, Interrupt()])
        except RuntimeError:
            pass
        with dpkeras.scope(cluster=SPEC):
            model = build(3)
        epochs_seen = []
        seen = keras.callbacks.LambdaCallback(on_epoch_begin=lambda e, logs: epochs_seen.append(e))
        resumed = fit(model, [keras.callbacks.BackupAndRestore({str(tmp_path / "backup")!r}), seen])
        print(json.dumps({{
            "max_diff": max(float(np.abs(a - b).max())
                            for a, b in zip(reference.get_weights(), model.get_weights())),
            "epochs_seen": epochs_seen, "resumed": resumed["loss"], "expected": expected["loss"],
        }}))
        """,
        cluster.spec,
    )
    assert out["epochs_seen"] == [2, 3], out  # it really resumed
    assert out["max_diff"] < 1e-5, out
    assert out["resumed"] == pytest.approx(out["expected"][2:], rel=1e-5), out


def test_the_step_function_runs_on_a_task_not_on_the_client(cluster):
    """The client instantiates no partition of the step: the loop task does."""
    out = _client(
        """
        x = np.zeros((64, 4), "int32"); y = np.zeros(64)
        with dpkeras.scope(cluster=SPEC):
            model = build(4)
        with dpkeras.record_transfers() as recorder:  # the step is instantiated in here
            model.fit(x, y, batch_size=16, epochs=1, verbose=0)
        on_client = [sorted(r.devices) for r in recorder.reports()
                     if any(d.startswith("/job:worker") for d in r.devices)]
        report = dpkeras.train_step_transfers(model, x[:16], y[:16])  # counts from the client
        print(json.dumps({"on_client": on_client, "counted": sorted(report.devices)}))
        """,
        cluster.spec,
    )
    assert out["on_client"] == []
    assert any("worker/task:1" in d for d in out["counted"])


def test_evaluate_and_predict_run_on_a_task_as_fit_does(cluster):
    """Their step functions too: the client instantiates no partition of them. Run from the
    client (`on_the_client`, as without dpkeras's loop), the same calls record the partitions
    on every task: the recorder sees them when the client runs them."""
    out = _client(
        """
        import contextlib
        from dpkeras.cluster import _loop
        x = np.zeros((64, 4), "int32"); y = np.zeros(64)
        with dpkeras.scope(cluster=SPEC):
            model = build(4)
        calls = {"evaluate": lambda: model.evaluate(x, y, batch_size=16, verbose=0),
                 "predict": lambda: model.predict(x, batch_size=16, verbose=0)}
        seen = {}
        for where, block in (("task", contextlib.nullcontext), ("client", _loop.on_the_client)):
            for name, call in calls.items():
                model.test_function = model.predict_function = None  # traced in the block
                with dpkeras.record_transfers() as recorder, block():
                    call()
                seen[f"{name} on the {where}"] = [
                    sorted(r.devices) for r in recorder.reports()
                    if any(d.startswith("/job:worker") for d in r.devices)]
        print(json.dumps(seen))
        """,
        cluster.spec,
    )
    assert out["evaluate on the task"] == [], out
    assert out["predict on the task"] == [], out
    for name in ("evaluate", "predict"):
        assert any("worker/task:1" in d for r in out[f"{name} on the client"] for d in r), out


def _client_bytes_per_step(cluster, run):
    """Marginal bytes per step the client sends at K=1 and K=10, `{"1": ..., "10": ...}`: `run`
    (code with `model`, `ds` and `steps`) called for 40 and 200 steps after a first call that
    traces, so per-call costs cancel."""
    return _client(
        f"""
        from dpkeras.testing import TrafficMeter
        x = np.random.RandomState(0).randint(0, 300, (16 * 200, 4)).astype("int32")
        y = np.zeros(16 * 200)
        ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(16).repeat()
        with dpkeras.scope(cluster=SPEC):
            models = {{k: build(k) for k in (1, 10)}}
        per_step = {{}}
        for k, model in models.items():
            steps = 20
            {run}  # traced
            sent = []
            for steps in (40, 200):
                with TrafficMeter({{"client": os.getpid()}}) as meter:
                    {run}
                sent.append(meter.traffic["client"].sent)
            per_step[k] = (sent[1] - sent[0]) / 160
        print(json.dumps(per_step))
        """,
        cluster.spec,
    )


@pytest.mark.skipif(shutil.which("ss") is None, reason="counting TCP bytes needs Linux's ss")
def test_evaluate_sends_once_per_execution_not_once_per_step(cluster):
    """As for fit. (predict's client fetches every batch itself, in Keras's predict loop, so its
    bytes per step cannot show where its step function runs.)"""
    out = _client_bytes_per_step(cluster, "model.evaluate(ds, steps=steps, verbose=0)")
    assert out["1"] > 0
    assert out["10"] <= 0.2 * out["1"], out  # K=10: one dispatch per 10 steps


@pytest.mark.skipif(shutil.which("ss") is None, reason="counting TCP bytes needs Linux's ss")
def test_the_client_sends_once_per_execution_not_once_per_step(cluster):
    out = _client_bytes_per_step(
        cluster, "model.fit(ds, steps_per_epoch=steps, epochs=1, verbose=0)"
    )
    assert out["1"] > 0
    assert out["10"] <= 0.2 * out["1"], out  # K=10: one dispatch per 10 steps


def test_a_model_from_before_connecting_is_refused_by_name(cluster):
    out = _client(
        """
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="early")])
        model.compile("sgd", "mse")
        model.fit(np.ones((4, 3)), np.ones((4, 2)), verbose=0)
        try:
            dpkeras.scope(cluster=SPEC).__enter__()
            refused = None
        except RuntimeError as e:
            refused = str(e)
        del model
        gc.collect()
        with dpkeras.scope(cluster=SPEC):  # nothing left from before: it connects
            fresh = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
            fresh.compile("sgd", "mse")
        loss = fresh.fit(np.ones((4, 3)), np.ones((4, 2)), verbose=0).history["loss"]
        print(json.dumps({"refused": refused, "loss": loss}))
        """,
        cluster.spec,
    )
    assert out["refused"] is not None
    assert "'sequential/early/kernel'" in out["refused"]
    assert "Connect first" in out["refused"] and "del model" in out["refused"]
    assert len(out["loss"]) == 1


def test_each_worker_maps_its_share_and_training_equals_one_process(cluster, tmp_path):
    """AUTO: the elements are cut to the workers before the map; 90 rows in batches of 16.
    Each call of the map on the cluster appends the element's index and the pid of the process
    running it to a file: each worker maps exactly the rows of its replica's slice of each
    batch (8 of 16; 5 of the last 10), once per pass, and no other."""
    log = str(tmp_path / "mapped.txt")
    out = _client(
        f"""
        rng = np.random.RandomState(0)
        x, y = rng.randint(0, 300, (90, 4)).astype("int32"), rng.randint(0, 3, 90)

        def dataset(log=None):
            def shift(i, row):
                if log:  # "<pid of the process mapping> <index>"
                    stat = tf.data.TextLineDataset("/proc/self/stat").get_single_element()
                    tf.print(tf.strings.split(stat, " ")[0], i, output_stream="file://" + log)
                return row[0] + 1, row[1]
            rows = tf.data.Dataset.from_tensor_slices((x, y)).enumerate()
            return rows.map(shift, num_parallel_calls=2).batch(16)

        dpkeras.cluster.connect(SPEC)
        reference = build(2)
        expected = reference.fit(dataset(), epochs=2, verbose=0).history
        expected_predict = reference.predict(dataset(), verbose=0)
        with dpkeras.scope(cluster=SPEC):
            model = build(2)
        history = model.fit(dataset({log!r}), epochs=2, verbose=0).history
        predict_diff = float(np.abs(model.predict(dataset({log!r}), verbose=0)
                                    - expected_predict).max())
        mapped = {{}}
        with open({log!r}) as f:
            for line in f:
                pid, index = line.split()
                mapped.setdefault(pid.strip('"'), []).append(int(index))
        print(json.dumps({{
            "max_diff": max(float(np.abs(a - b).max())
                            for a, b in zip(reference.get_weights(), model.get_weights())),
            "history": history, "expected": expected, "predict_diff": predict_diff,
            "mapped": {{pid: sorted(indices) for pid, indices in mapped.items()}},
        }}))
        """,
        cluster.spec,
    )
    assert out["max_diff"] < 1e-5 and out["predict_diff"] < 1e-5
    for name, values in out["expected"].items():
        assert out["history"][name] == pytest.approx(values, rel=1e-5), name

    def first_half(i):  # worker 0's replica: the first half of its batch (of 16, or the last 10)
        rows = 16 if i < 80 else 10
        return i % 16 < rows // 2

    pids = cluster.pids()
    passes = 3  # two epochs of fit, one predict
    assert out["mapped"] == {
        str(pids["worker:0"]): sorted([i for i in range(90) if first_half(i)] * passes),
        str(pids["worker:1"]): sorted([i for i in range(90) if not first_half(i)] * passes),
    }, {pid: len(indices) for pid, indices in out["mapped"].items()}


def test_each_distinct_id_crosses_once_per_worker_each_way(cluster):
    """The issue's case: a 20000 x 32 table looked up by 256 x 8 ids drawn from 16 distinct ids,
    SGD. Bytes are the ps's own TCP counters, marginal per step (two fits, per-fit costs
    cancel); the same client measures `deduplicate=False` for comparison."""
    ps_pid = cluster.pids()["ps:0"]
    out = _client(
        f"""
        from dpkeras.testing import TrafficMeter
        rng = np.random.RandomState(0)
        x = rng.choice(rng.permutation(20000)[:16], (256 * 60, 8)).astype("int32")
        y = rng.normal(size=(256 * 60, 1)).astype("float32")
        ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(256).repeat()

        dpkeras.cluster.connect(SPEC)
        reference = table_model()
        reference.fit(ds, steps_per_epoch=10, epochs=1, verbose=0)
        per_step, diff = {{}}, {{}}
        for mode in (True, False):
            with dpkeras.scope(cluster=SPEC, deduplicate=mode):
                model = table_model()
            model.fit(ds, steps_per_epoch=10, epochs=1, verbose=0)  # traced; equal to reference
            diff[str(mode)] = max(float(np.abs(a - b).max())
                                  for a, b in zip(reference.get_weights(), model.get_weights()))
            traffic = []
            for steps in (10, 40):
                with TrafficMeter({{"ps": {ps_pid}}}) as meter:
                    model.fit(ds, steps_per_epoch=steps, epochs=1, verbose=0)
                traffic.append(meter.traffic["ps"])
            per_step[str(mode)] = [(traffic[1].sent - traffic[0].sent) / 30,
                                   (traffic[1].received - traffic[0].received) / 30]
        print(json.dumps({{"per_step": per_step, "diff": diff}}))
        """,
        cluster.spec,
    )
    assert max(out["diff"].values()) < 1e-5, out
    sent, received = out["per_step"]["True"]
    assert sent <= 40_000 and received <= 40_000, out  # 16 rows x 128 B per worker, each way
    without_sent, without_received = out["per_step"]["False"]
    assert without_sent > 4 * sent and without_received > 4 * received, out


def test_an_ordinary_error_on_a_healthy_cluster_is_itself_and_the_next_fit_trains(cluster):
    """An id out of the Embedding's range (300 of [0, 300)) in the first batch, every task up:
    the user gets TensorFlow's InvalidArgumentError naming the index and the range (not
    TaskFailedError: no task is dead), no weight changes, and the next `fit` trains.

    (Not compared with one process after the failure: Keras's `apply` counts the step with no
    data dependency on the gradient, so a failed step may advance `optimizer.iterations`, on
    one device too.)"""
    out = _client(
        """
        rng = np.random.RandomState(0)
        x, y = rng.randint(0, 300, (64, 4)).astype("int32"), rng.randint(0, 3, 64)
        bad = x.copy()
        bad[1, 2] = 300

        def fit(model, features):
            return model.fit(features, y, batch_size=16, epochs=1, shuffle=False,
                             verbose=0).history["loss"]

        def weights():
            return [w.tolist() for w in model.get_weights()]

        with dpkeras.scope(cluster=SPEC):
            model = build(1)
        fit(model, x)
        before = weights()
        try:
            fit(model, bad)
            error = None
        except Exception as e:
            error = [type(e).__module__ + "." + type(e).__name__, str(e)]
        failed = weights()
        loss = fit(model, x)
        print(json.dumps({"error": error, "before": before, "failed": failed,
                          "after": weights(), "loss": loss}))
        """,
        cluster.spec,
    )
    assert out["error"] is not None, out
    kind, message = out["error"]
    assert kind == "tensorflow.python.framework.errors_impl.InvalidArgumentError", kind
    assert "= 300 is not in [0, 300)" in message, message[-2000:]
    assert "Restart that task" not in message
    assert out["failed"] == out["before"]  # the failed step applied nothing
    assert len(out["loss"]) == 1 and np.isfinite(out["loss"][0])
    moved = [np.abs(np.array(a) - np.array(b)).max() for a, b in zip(out["after"], out["failed"])]
    assert min(moved) > 0, moved  # every variable trained in the next fit


def test_one_step_per_execution_runs_no_loop_on_any_task(cluster):
    """At `steps_per_execution=1` (Keras's default) the workers' own reading runs its one step
    without a `tf.while_loop` around it: a loop puts its control on every task the step
    touches (`Enter` for each value it reads, the predicate sent to each task every
    iteration): on the benchmark's recommender at W=2, 26 ops a step on the ps, 9 on each
    worker and 50 on the loop's task. At K=2 the loop is there, as it must be. Counted from
    the step's partition graphs (the loop run from the client), not timed."""
    out = _client(
        """
        import collections
        from dpkeras import _tf_internals
        from dpkeras.cluster import _loop
        x = np.arange(64 * 4).reshape(64, 4).astype("int32") % 300; y = np.arange(64) % 3
        with dpkeras.scope(cluster=SPEC):
            models = {k: build(k) for k in (1, 2)}
        reference = {k: build(k) for k in (1, 2)}  # after connecting: local variables
        counts = {}
        for k, model in models.items():
            _tf_internals.enable_run_metadata()
            with _loop.on_the_client():
                history = model.fit(x, y, batch_size=16, epochs=2, verbose=0, shuffle=False)
            metadata = _tf_internals.export_and_disable_run_metadata()
            step = max(metadata.function_graphs, key=lambda f: len(f.partition_graphs))
            ops = collections.Counter(
                node.op for partition in step.partition_graphs for node in partition.node)
            expected = reference[k].fit(x, y, batch_size=16, epochs=2, verbose=0, shuffle=False)
            counts[k] = {
                "loop": sum(ops[t] for t in ("Enter", "Exit", "NextIteration", "LoopCond")),
                "partitions": len(step.partition_graphs),
                "loss": history.history["loss"], "expected": expected.history["loss"]}
        print(json.dumps(counts))
        """,
        cluster.spec,
    )
    one, two = out["1"], out["2"]
    assert one["partitions"] == two["partitions"] >= 4, out  # client, ps, both workers
    assert one["loop"] == 0 and two["loop"] > 0, out
    for case in (one, two):
        np.testing.assert_allclose(case["loss"], case["expected"], rtol=1e-5)


def test_a_workers_batch_is_read_on_the_worker_and_never_crosses_to_the_loop(cluster):
    """Keras's loop over K steps carries the next batch as a loop variable; on a cluster its
    loop runs on worker 0, so each other worker's share crossed to worker 0 and back every step
    (issue 43: a Dense model on 4096 float features, global batch 256, two workers: 2 MB sent
    and 2 MB received by each worker per step, its whole share, for 16 KB of weights). Each
    host now reads its own batch (`dpkeras._patches.step_loop`): a worker exchanges with the
    loop's task only the loop's control and its logs, endless data or not, and its bytes per
    step are the weights', not the batch's. Counted from the client's partitions (the loop
    run from the client) and from the kernel's TCP counters: not timings."""
    out = _client(
        """
        from dpkeras.cluster import _loop
        from dpkeras.testing import TrafficMeter
        x = np.arange(64 * 4).reshape(64, 4).astype("int32") % 300; y = np.arange(64) % 3
        with dpkeras.scope(cluster=SPEC) as strategy:
            model = build(4)
        source = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
        counts = {}
        for name, ds in (("endless", source.repeat()), ("finite", source.repeat(3))):
            model.train_function = None
            with dpkeras.record_transfers() as recorder, _loop.on_the_client():
                model.fit(ds, steps_per_epoch=4, epochs=1, verbose=0)
            report = recorder.report()
            counts[name] = {
                "from_worker_1": sum(1 for t in report.transfers if "worker/task:1" in t.source
                                     and not t.destination.startswith("/job:")),
                "to_worker_1": sum(1 for t in report.transfers if "worker/task:1" in t.destination
                                   and not t.source.startswith("/job:")),
                "batch_crossing": sum(1 for t in report.transfers if "worker/task:" in t.source
                                      and (t.of_the_batch or t.dtype == "variant")),
            }
        F = 4096
        features = np.random.RandomState(0).rand(256 * 50, F).astype("float32")
        with dpkeras.scope(cluster=SPEC):
            wide = keras.Sequential([keras.Input((F,)), keras.layers.Dense(1)])
            wide.compile(optimizer="sgd", loss="mse", steps_per_execution=5)
        rows = tf.data.Dataset.from_tensor_slices((features, features[:, :1]))
        rows = rows.batch(256, drop_remainder=True)
        wide.fit(rows.take(10), epochs=1, verbose=0)
        pids = {name.replace(":", ""): pid for name, pid in PIDS.items()}
        traffic = []
        for steps in (10, 40):
            with TrafficMeter(pids) as meter:
                wide.fit(rows.take(steps), epochs=1, verbose=0)
            traffic.append(meter.traffic["worker1"])
        print(json.dumps({"counts": counts, "worker_1_per_step": [
            (traffic[1].sent - traffic[0].sent) / 30,
            (traffic[1].received - traffic[0].received) / 30]}))
        """,
        cluster.spec,
        pids=cluster.pids(),
    )
    endless, finite = out["counts"]["endless"], out["counts"]["finite"]
    assert endless == finite, out  # no per-step check for the end of finite data either
    assert finite["from_worker_1"] <= 2 and finite["to_worker_1"] <= 1, out  # was 10 and 6
    assert finite["batch_crossing"] == 0, out
    share = 128 * 4096 * 4  # worker 1's share of a global batch, bytes
    sent, received = out["worker_1_per_step"]
    assert sent < share / 20 and received < share / 20, out  # was about 1.0 x share each


def test_the_dense_gradients_a_worker_sends_to_its_ps_cross_packed_and_training_is_exact(cluster):
    """Every tensor sent between tasks is a gRPC call of its own (issue 43): a worker sends
    the dense gradients bound for one ps (here the two Dense layers' kernels and biases,
    128 + 16 + 48 + 3 = 195 floats) as one tensor, and the ps splits them back; the ps sends
    the same variables' values to the worker as one tensor too. With packs of
    at most 600 bytes the 512 + 64 bytes of the first layer and the 192 + 12 of the second go
    in two. The embedding's sparse gradient is not packed. Weights, history and predictions
    equal one process's either way."""
    out = _client(
        """
        from dpkeras._extended import packing
        from dpkeras.cluster import _loop
        rng = np.random.RandomState(0)
        x, y = rng.randint(0, 300, (96, 4)).astype("int32"), rng.randint(0, 3, 96)
        dpkeras.cluster.connect(SPEC)
        reference = build(2)
        expected = reference.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
        out = {}
        for limit in (packing.PACK_BYTES, 600):
            packing.PACK_BYTES = limit
            with dpkeras.scope(cluster=SPEC):
                model = build(2)
            history = model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
            max_diff = max(float(np.abs(a - b).max())
                           for a, b in zip(reference.get_weights(), model.get_weights()))
            model.test_function = None  # traced inside the block, run from the client
            with dpkeras.record_transfers() as recorder, _loop.on_the_client():
                model.evaluate(x, y, batch_size=16, verbose=0)  # evaluate packs reads too
            evaluated = recorder.report()
            report = dpkeras.train_step_transfers(model, x[:16], y[:16])
            out[str(limit)] = {
                "to_ps": sorted(([list(t.shape), t.dtype] for t in report.transfers
                                 if "worker/task:1" in t.source and "/job:ps" in t.destination),
                                key=str),
                "from_ps": sorted(([list(t.shape), t.dtype] for t in report.transfers
                                   if "/job:ps" in t.source and "worker/task:1" in t.destination),
                                  key=str),
                "evaluate_from_ps": sorted(
                    ([list(t.shape), t.dtype] for t in evaluated.transfers
                     if "/job:ps" in t.source and "worker/task:1" in t.destination), key=str),
                "max_diff": max_diff,
                "loss": history.history["loss"],
            }
        out["expected_loss"] = expected.history["loss"]
        print(json.dumps(out))
        """,
        cluster.spec,
    )
    one, two = out[str(4 << 20)], out["600"]
    float_shapes = {
        name: [shape for shape, dtype in run["to_ps"] if dtype == "float32"]
        for name, run in (("one", one), ("two", two))
    }
    dense = [[8, 16], [16], [16, 3], [3]]
    assert [195] in float_shapes["one"] and [144] not in float_shapes["one"], out
    assert [144] in float_shapes["two"] and [51] in float_shapes["two"], out
    for shapes in float_shapes.values():
        assert not [s for s in shapes if s in dense], out  # no dense gradient crosses alone
    assert len(float_shapes["two"]) == len(float_shapes["one"]) + 1, out
    # the same variables' reads, ps -> worker, packed the same way, with the four metric
    # scalars each replica reads to add to them (loss and accuracy, total and count): 199
    # floats, or 144 and 48 + 3 + 4 = 55; the table (300 x 8), which Keras reads whole before
    # dpkeras gathers its rows, never crosses whole: only its looked-up rows do
    reads = {
        name: [shape for shape, dtype in run["from_ps"] if dtype == "float32"]
        for name, run in (("one", one), ("two", two))
    }
    assert [199] in reads["one"] and [144] not in reads["one"], out
    assert [144] in reads["two"] and [55] in reads["two"], out
    for shapes in reads.values():
        assert not [s for s in shapes if s in dense or s == [300, 8]], out
    assert len(reads["two"]) == len(reads["one"]) + 1, out
    evaluated = [shape for shape, dtype in one["evaluate_from_ps"] if dtype == "float32"]
    assert [s for s in evaluated if s and (s[0] or 0) >= 195], out  # the weights, one tensor
    assert not [s for s in evaluated if s in dense], out
    for run in (one, two):
        assert run["max_diff"] < 1e-5, out
        assert run["loss"] == pytest.approx(out["expected_loss"], rel=1e-5), out


def test_the_workers_own_loop_keeps_kerass_semantics_where_a_call_ends_early(cluster):
    """`fit` and `evaluate` at K=3 through the loop that reads each worker's batch on the worker
    (`dpkeras._patches.step_loop`), against one process: data of unknown length (a `filter`:
    the last call of an epoch finds no batch and ends it, the empty one raises
    StopIteration), `steps_per_epoch` over finite data, an input given as None (Keras's
    optional inputs), and the logs every batch's callbacks see (the last step's of each
    call). A dataset the user distributes per worker, with workers of unequal lengths, is
    read by Keras's own loop: no worker's batch is dropped (worker 1's 5 batches an epoch,
    not worker 0's 3)."""
    out = _client(
        """
        rng = np.random.RandomState(0)
        x, y = rng.randint(0, 300, (100, 4)).astype("int32"), rng.randint(0, 3, 100)

        class Logs(keras.callbacks.Callback):
            def __init__(self):
                super().__init__()
                self.seen = []
            def on_train_batch_end(self, batch, logs=None):
                self.seen.append(["train", batch, {k: float(v) for k, v in logs.items()}])
            def on_test_batch_end(self, batch, logs=None):
                self.seen.append(["test", batch, {k: float(v) for k, v in logs.items()}])

        def unknown_length():
            rows = tf.data.Dataset.from_tensor_slices((x, y)).filter(lambda a, b: b < 5)
            return rows.batch(16)

        def train(model):
            logs = Logs()
            first = model.fit(unknown_length(), epochs=2, verbose=0, callbacks=[logs],
                              validation_data=unknown_length())
            second = model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(16).take(5),
                               steps_per_epoch=3, epochs=1, verbose=0, callbacks=[logs])
            evaluation = model.evaluate(unknown_length(), verbose=0, callbacks=[logs])
            return first.history, second.history, evaluation, logs.seen

        def optional_input(model_k):
            keras.utils.set_random_seed(2)
            a = keras.Input((3,), name="a")
            b = keras.Input((3,), name="b", optional=True)
            class Add(keras.layers.Layer):
                def call(self, a, b=None):
                    return a if b is None else a + b
            out = keras.layers.Dense(1)(Add()(a, b))
            model = keras.Model({"a": a, "b": b}, out)
            model.compile(optimizer="sgd", loss="mse", steps_per_execution=model_k)
            return model

        features = {"a": rng.rand(48, 3).astype("float32"), "b": None}
        target = rng.rand(48, 1).astype("float32")
        dpkeras.cluster.connect(SPEC)
        reference = build(3)
        expected = train(reference)
        plain = optional_input(3)
        expected_optional = plain.fit(features, target, batch_size=8, epochs=2, shuffle=False,
                                      verbose=0).history["loss"]
        with dpkeras.scope(cluster=SPEC) as strategy:
            model = build(3)
            distributed = optional_input(3)
        actual = train(model)
        optional = distributed.fit(features, target, batch_size=8, epochs=2, shuffle=False,
                                   verbose=0).history["loss"]

        def per_worker(context):  # worker 0: 3 batches of 8 an epoch, worker 1: 5
            n = 24 + 16 * context.input_pipeline_id
            rows = tf.data.Dataset.range(n).map(
                lambda i: (tf.fill([4], tf.cast(i % 300, tf.int32)), i % 3))
            return rows.filter(lambda a, b: True).batch(8)

        with dpkeras.scope(cluster=SPEC) as strategy:
            uneven = build(3)
        uneven.fit(strategy.distribute_datasets_from_function(per_worker), epochs=2, verbose=0)
        print(json.dumps({
            "max_diff": max(float(np.abs(a - b).max())
                            for a, b in zip(reference.get_weights(), model.get_weights())),
            "expected": expected, "actual": actual,
            "optional": [expected_optional, optional],
            "uneven_steps": int(uneven.optimizer.iterations.numpy()),
        }))
        """,
        cluster.spec,
    )
    assert out["max_diff"] < 1e-5, out
    (e_first, e_second, e_eval, e_seen), (first, second, evaluation, seen) = (
        out["expected"],
        out["actual"],
    )
    for expected, actual in ((e_first, first), (e_second, second)):
        assert set(actual) == set(expected)
        for name in expected:
            assert actual[name] == pytest.approx(expected[name], rel=1e-5, abs=1e-6), name
    assert evaluation == pytest.approx(e_eval, rel=1e-5)
    assert [s[:2] for s in seen] == [s[:2] for s in e_seen]  # the same batches, in order
    for (_, _, logs), (_, _, e_logs) in zip(seen, e_seen):
        assert logs == pytest.approx(e_logs, rel=1e-5, abs=1e-6)  # each call's last step's
    expected_optional, optional = out["optional"]
    assert optional == pytest.approx(expected_optional, rel=1e-5)
    assert out["uneven_steps"] == 2 * 5, out
