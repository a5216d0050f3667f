"""The public API: names, types, defaults and configuration precedence."""

import keras
import tensorflow as tf

import dpkeras
from dpkeras import _tf_internals
from dpkeras.testing import cpu_strategy, run_python
from tests.gpu import needs_gpus
from tests.models import build_model, make_data

CPU = "/job:localhost/replica:0/task:0/device:CPU:{}"


def test_public_names():
    assert sorted(dpkeras.__all__) == sorted(
        [
            "ParameterDeviceStrategy",
            "ParameterVariable",
            "ReplicatedVariable",
            "TransferReport",
            "__version__",
            "get_strategy",
            "record_transfers",
            "scope",
            "Deduplicate",
            "simulate_cpu_devices",
            "TaskFailedError",
            "uninstall",
            "train_step_transfers",
            "placement",
            "layers",
            "placement_report",
            "PlacementReport",
            "AUTO_REUSE",
            "VariableScope",
            "VariableStore",
            "get_variable",
            "get_variable_scope",
            "get_variable_store",
            "variable_scope",
            "LocalVariable",
            "add_model_variable",
            "get_local_variables",
            "get_model_variables",
            "get_variables",
            "local_variable",
            "model_variable",
            "regularization_losses",
            "variable",
        ]
    )
    for name in dpkeras.__all__:
        assert hasattr(dpkeras, name), name
    assert dpkeras.__version__.count(".") == 2


def test_strategy_is_a_real_tf_distribute_strategy():
    strategy = cpu_strategy(2)
    assert isinstance(strategy, tf.distribute.Strategy)
    assert isinstance(strategy.extended, _tf_internals.StrategyExtendedV1)
    assert type(strategy.extended).__name__ == "ParameterDeviceExtended"
    assert strategy.num_replicas_in_sync == 2


def test_defaults_use_every_cpu_but_the_parameter_device():
    strategy = dpkeras.ParameterDeviceStrategy()
    assert strategy.parameter_device == CPU.format(0)
    assert strategy.compute_devices == tuple(CPU.format(i) for i in (1, 2, 3))
    assert "no GPU" in strategy.extended.device_reason


def test_device_names_are_canonical_and_scope_reuses_the_strategy():
    with dpkeras.scope(
        ["GPU:0".replace("GPU", "CPU").replace("0", "1"), "/device:CPU:2"], "cpu:0"
    ) as first:
        assert tf.distribute.get_strategy() is first
    with dpkeras.scope(["/cpu:1", "/cpu:2"]) as second:
        pass
    assert first is second
    assert repr(first) == (
        "ParameterDeviceStrategy(compute_devices=[/cpu:1, /cpu:2], parameter_device='/cpu:0')"
    )


def test_environment_settings_and_argument_precedence(monkeypatch):
    monkeypatch.setenv("DPKERAS_COMPUTE_DEVICES", "/cpu:2, /cpu:3")
    monkeypatch.setenv("DPKERAS_PARAMETER_DEVICE", "/cpu:1")
    strategy = dpkeras.ParameterDeviceStrategy()
    assert strategy.compute_devices == (CPU.format(2), CPU.format(3))
    assert strategy.parameter_device == CPU.format(1)
    explicit = dpkeras.ParameterDeviceStrategy(["/cpu:3"], "/cpu:0")
    assert explicit.compute_devices == (CPU.format(3),)
    assert explicit.parameter_device == CPU.format(0)


def test_parameter_device_may_also_compute():
    """tf_cnn_benchmarks' --local_parameter_device: one device holds variables and computes."""
    strategy = dpkeras.get_strategy(["/cpu:0", "/cpu:1"], "/cpu:0")
    assert "/cpu:0 also compute" in strategy.extended.device_reason
    x, y = make_data("dense", 96)
    with strategy.scope():
        model = build_model("dense")
    model.fit(x, y, batch_size=48, epochs=1, verbose=0)
    reference = build_model("dense")
    reference.fit(x, y, batch_size=48, epochs=1, verbose=0)
    for a, b in zip(reference.get_weights(), model.get_weights()):
        assert abs(a - b).max() < 1e-5


def test_single_cpu_machine_runs_one_replica_on_it():
    out = run_python("""
        import dpkeras, keras, numpy as np
        s = dpkeras.ParameterDeviceStrategy()
        print(s.num_replicas_in_sync, s.compute_devices[0][-5:], s.parameter_device[-5:])
        with dpkeras.scope():
            m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
            m.compile(optimizer="sgd", loss="mse")
        m.fit(np.ones((8, 3)), np.ones(8), batch_size=4, verbose=0)
        print(m.weights[0].value.device[-5:])
        """)
    assert out.split() == ["1", "CPU:0", "CPU:0", "CPU:0"]


def test_keras_workflow_unchanged_inside_and_outside_the_scope(tmp_path):
    """fit, evaluate, predict, callbacks and save, called outside the `with` block."""
    x, y = make_data("dense", 96)
    with dpkeras.scope(["/cpu:1", "/cpu:2"]):
        model = build_model("dense")
    seen = []
    callback = keras.callbacks.LambdaCallback(on_epoch_end=lambda e, logs: seen.append(logs))
    model.fit(
        x,
        y,
        batch_size=48,
        epochs=2,
        verbose=0,
        validation_split=0.5,
        callbacks=[callback, keras.callbacks.ModelCheckpoint(tmp_path / "m.keras")],
    )
    assert len(seen) == 2 and "val_loss" in seen[0]
    assert model.predict(x, batch_size=48, verbose=0).shape == (96, 4)
    assert (tmp_path / "m.keras").exists()


@needs_gpus(1)
def test_gpus_are_the_default_compute_devices():
    strategy = dpkeras.ParameterDeviceStrategy()
    gpus = tf.config.list_logical_devices("GPU")
    assert [d.rsplit("/device:", 1)[1] for d in strategy.compute_devices] == [
        g.name.rsplit("/device:", 1)[1] for g in gpus
    ]
    with strategy.scope():
        model = build_model("dense")
    x, y = make_data("dense", 96 * len(gpus))
    model.fit(x, y, batch_size=48 * len(gpus), epochs=1, verbose=0)
    assert all(v.value.device.endswith("CPU:0") for v in model.weights + model.optimizer.variables)
    assert keras.backend.backend() == "tensorflow"
