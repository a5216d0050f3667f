"""keras-rs models train under dpkeras to one device's weights (issue 17, part 2).

Models in tests/keras_rs_models.py: `DistributedEmbedding` with several tables, a table
shared by two features, multi-hot features with each combiner, `DotInteraction`,
`FeatureCross`, and a small DLRM-DCNv2. Replicas are /cpu:1../cpu:3, parameters on /cpu:0 (and
/cpu:3 when sharded). Every comparison is with the same model trained without a strategy.

SGD is exact with any ids, and so is Adam under the default deduplication (each distinct id's
row is pulled once; Adam's gradient rows cross per repeat, so Keras 3's squares of the repeats
are kept); `deduplicate="sum"` would change Adam's numbers on repeated ids (README "What is
exact"). Adam is also compared on ids that do not repeat within a global batch.

Skipped when keras-rs is not installed (`pip install dpkeras[rs]`).
"""

import inspect
import json
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

keras_rs = pytest.importorskip("keras_rs")

import dpkeras  # noqa: E402
from dpkeras._patches import table as keras_patches  # noqa: E402
from dpkeras.testing import LocalCluster, assert_weights_close, cpu_strategy, server_env  # noqa: E402
from tests import keras_rs_models as rs  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
P = tf.distribute.experimental.partitioners
_REFERENCES = {}


def _reference(name, optimizer="sgd", distinct=False):
    """One device's weights and losses, computed once per model, optimizer and data."""
    key = (name, optimizer, distinct)
    if key not in _REFERENCES:
        model, history = rs.train(name, optimizer, distinct=distinct)
        _REFERENCES[key] = (model.get_weights(), history["loss"])
    return _REFERENCES[key]


STRATEGIES = {
    "2 replicas": lambda: cpu_strategy(2),
    "3 replicas": lambda: cpu_strategy(3),
    "2 replicas, 3 shards on 2 devices": lambda: dpkeras.get_strategy(
        ["/cpu:1", "/cpu:2"], ["/cpu:0", "/cpu:3"], partitioner=P.FixedShardsPartitioner(3)
    ),
    # Tables (sharded) on the parameter devices, the dense layers replicated (placement.hybrid).
    "2 replicas, hybrid, 3 shards on 2 devices": lambda: dpkeras.get_strategy(
        ["/cpu:1", "/cpu:2"],
        dpkeras.placement.hybrid(["/cpu:0", "/cpu:3"]),
        partitioner=P.FixedShardsPartitioner(3),
    ),
}


def _assert_like_one_device(name, strategy, optimizer="sgd", distinct=False):
    model, history = rs.train(name, optimizer, strategy, distinct)
    weights, losses = _reference(name, optimizer, distinct)
    assert_weights_close(weights, model.get_weights())
    np.testing.assert_allclose(history["loss"], losses, rtol=1e-5)
    return model


@pytest.mark.parametrize("name", ["features", "dlrm"])
@pytest.mark.parametrize("layout", list(STRATEGIES))
def test_keras_rs_models_train_to_one_device_weights_under_sgd(name, layout):
    model = _assert_like_one_device(name, STRATEGIES[layout]())
    tables = [v for v in model.trainable_variables if "embedding" in v.path]
    assert len(tables) == 3  # the shared table is one variable
    replicated = [
        v for v in model.trainable_variables if isinstance(v.value, dpkeras.ReplicatedVariable)
    ]
    assert len(replicated) == (len(model.trainable_variables) - 3 if "hybrid" in layout else 0)
    for table in tables:
        shards = getattr(table.value, "shards", None)
        if "shards" in layout:
            assert len(shards) == 3 and {s.device[-5:] for s in shards} == {"CPU:0", "CPU:3"}
        else:
            assert shards is None and table.value.device.endswith("CPU:0")


@pytest.mark.parametrize("name", ["features", "dlrm"])
def test_adam_on_ids_that_do_not_repeat_within_a_batch(name):
    _assert_like_one_device(name, cpu_strategy(2), "adam", distinct=True)


@pytest.mark.parametrize("layout", list(STRATEGIES))
def test_adam_on_repeated_ids_equals_one_device_under_the_default_deduplication(layout):
    _assert_like_one_device("dlrm", STRATEGIES[layout](), "adam", distinct=False)


def test_the_sharded_dlrm_under_adam_on_distinct_ids():
    _assert_like_one_device("dlrm", STRATEGIES["2 replicas, 3 shards on 2 devices"](), "adam", True)


def test_the_shared_table_is_one_variable_read_by_both_features():
    with cpu_strategy(2).scope():
        model = rs.features_model()
    layer = model.get_layer("embedding")
    tables = layer.get_embedding_tables()
    assert sorted(tables) == ["rows_mean", "rows_sqrtn", "rows_sum"]
    assert [tuple(t.shape) for _, t in sorted(tables.items())] == [(80, 4), (30, 4), (50, 4)]


# -- TableConfig fields under dpkeras ---------------------------------------------------------


def test_the_table_optimizer_is_not_used_the_models_optimizer_trains_every_table():
    # keras-rs off TPU trains every table with the model's optimizer; dpkeras does the same.
    expected, _ = rs.train("features")
    with cpu_strategy(2).scope():
        model = rs.features_model(table_optimizer=keras_rs_optimizer())
    x, y = rs.features_data()
    model.fit(x, y, batch_size=rs.BATCH, epochs=2, shuffle=False, verbose=0)
    assert_weights_close(expected.get_weights(), model.get_weights())


def keras_rs_optimizer():
    import keras

    return keras.optimizers.Adagrad(learning_rate=100.0)  # would show if it were applied


@pytest.mark.parametrize("placement", ["auto", "default_device"])
def test_auto_and_default_device_tables_live_on_the_parameter_device(placement):
    with cpu_strategy(2).scope():
        model = rs.features_model(placement=placement)
    report = dpkeras.placement_report(model)
    rows = [r for r in report.rows if "embedding" in r.path]
    assert len(rows) == 3 and {r.device for r in rows} == {"/cpu:0"}


def _sparsecore_layer():
    tables = rs.table_configs({"big": (100, "sum"), "small": (10, "mean")})
    tables["big"].placement = "sparsecore"
    features = {"f1": ("big", 1), "f2": ("big", 2), "f3": ("small", 1)}
    return keras_rs.layers.DistributedEmbedding(rs.feature_configs(features, tables))


def test_a_sparsecore_table_is_refused_naming_the_table_its_features_and_what_works():
    strategy = cpu_strategy(2)
    before = len(strategy.extended.variables())
    with pytest.raises(ValueError) as e:
        with strategy.scope():
            _sparsecore_layer()
    message = str(e.value)
    assert "table 'big' (features 'f1', 'f2')" in message
    assert "small" not in message.split("Received")[0]
    assert "Received: placement='sparsecore' under ParameterDeviceStrategy with replicas" in message
    assert "Expected: placement='auto' or 'default_device'" in message
    assert len(strategy.extended.variables()) == before  # nothing half-created


SPARSECORE = keras_patches.entry("DistributedEmbedding._sparsecore_init")


def _sparsecore_wrapped():
    return hasattr(keras_rs.layers.DistributedEmbedding._sparsecore_init, "__dpkeras_original__")


def test_the_sparsecore_check_is_installed_only_during_a_dpkeras_scope():
    """An entry of dpkeras's one table, with its lifecycle: it stays while a scope is entered
    or a dpkeras variable lives. From `uninstall()` (models of earlier tests in this process
    would keep the table installed), the scope of a new strategy that makes no variable (a
    cached strategy's variables from earlier tests would keep it) installs it for its duration
    only."""
    keras_patches.uninstall()
    original = keras_patches.keras_original(SPARSECORE)
    strategy = dpkeras.ParameterDeviceStrategy(["/cpu:2", "/cpu:3"], "/cpu:1")  # no variables
    with strategy.scope():
        assert _sparsecore_wrapped()
        with strategy.scope():
            assert _sparsecore_wrapped()
        assert _sparsecore_wrapped()
    assert not _sparsecore_wrapped()
    assert keras_rs.layers.DistributedEmbedding._sparsecore_init is original
    # Outside dpkeras keras-rs refuses by itself, as before.
    with pytest.raises(ValueError, match="not running under a TPU strategy"):
        _sparsecore_layer()


def test_the_keras_rs_method_dpkeras_wraps_is_still_there_with_its_signature():
    # Fails when a keras-rs upgrade renames or changes the method (dpkeras then wraps nothing).
    assert SPARSECORE.available()
    method = keras_patches.keras_original(SPARSECORE)
    assert f"({', '.join(inspect.signature(method).parameters)})" == SPARSECORE.signature


# -- on a cluster ------------------------------------------------------------------------------

CLIENT = """
import json, sys
import numpy as np
import dpkeras
from tests import keras_rs_models as rs

spec = json.loads(sys.argv[1])
dpkeras.cluster.connect(spec)  # first: connecting resets TensorFlow's context
reference, expected = rs.train("dlrm")
strategy = dpkeras.get_strategy(cluster=spec)
model, history = rs.train("dlrm", strategy=strategy)
print(json.dumps({
    "replicas": list(strategy.extended.worker_devices),
    "devices": sorted({v.value.device for v in model.trainable_variables}),
    "max_diff": max(float(np.abs(a - b).max())
                    for a, b in zip(reference.get_weights(), model.get_weights())),
    "loss": history["loss"], "expected": expected["loss"],
}))
"""


def test_a_dlrm_on_a_cluster_of_one_ps_and_two_workers_trains_to_one_process_weights():
    with LocalCluster(ps=1, workers=2, cpus=1) as cluster:
        proc = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(CLIENT), json.dumps(cluster.spec)],
            capture_output=True,
            text=True,
            env=server_env(),
            cwd=ROOT,
            timeout=240,
        )
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["replicas"] == [f"/job:worker/replica:0/task:{t}/device:CPU:0" for t in (0, 1)]
    assert {d.rsplit("/device:", 1)[0] for d in out["devices"]} == {"/job:ps/replica:0/task:0"}
    assert out["max_diff"] < 1e-5
    np.testing.assert_allclose(out["loss"], out["expected"], rtol=1e-5)
