"""Bad input, as a table: each case fails with its error type, a message that names what was
received and what is valid, and leaves nothing half-done.

"Nothing half-done" is checked the same way for every case: no variable was created during the
call (a `tf.variable_creator_scope` spy around it, which sees every variable, also those made
under a dpkeras scope), none of a failed build's variables is still alive on any dpkeras
strategy, no strategy and no `dpkeras.variable_scope` is left entered, the default strategy is
back, no strategy was added to `dpkeras.get_strategy`'s cache, and a model handed to the call
has the weights and optimizer iteration count it had before.

Some of these cases are also tested, one by one, in test_errors.py, test_placement.py and
tests/test_tf1_*.py; this table adds the "nothing half-done" checks to all of them. Where the
error is TensorFlow's or Keras's, not dpkeras's, the case says so.
"""

import contextlib
import dataclasses
import gc
from collections.abc import Callable

import keras
import numpy as np
import pytest
import tensorflow as tf

import dpkeras
from dpkeras import placement
from dpkeras._strategy import scope as scope_module
from dpkeras.testing import cpu_strategy
from dpkeras.tf1 import VariableStore
from dpkeras.tf1 import _state as state
from tests.models import build_model, make_data

TWO = ["/cpu:1", "/cpu:2"]


@dataclasses.dataclass
class Case:
    """One bad input.

    Attributes:
        action: called with the value `setup` returned (or None); must raise.
        error: the exception type expected.
        match: regex the message must match (searched): what was received and what is valid.
        setup: builds what the action needs (a model, say), outside the checks.
        env: environment variables set for the case.
        builds: the action builds a model that fails part-way, after creating variables.
    """

    action: Callable
    error: type
    match: str
    setup: Callable = None
    env: dict = dataclasses.field(default_factory=dict)
    builds: bool = False  # a failed build may create variables; none of them may survive


def enter(compute=None, parameter=None):
    with dpkeras.scope(compute, parameter):
        pytest.fail("the scope must not be entered")


def policy_case(policy, match):
    """A model built in a scope whose placement policy fails on one of its variables."""

    def build(strategy):
        with strategy.scope():
            keras.Sequential([keras.Input((12,)), keras.layers.Dense(4)])

    return Case(
        build,
        ValueError,
        match,
        builds=True,
        setup=lambda: dpkeras.get_strategy(["/cpu:1"], policy),
    )


def build_under(policy):
    with dpkeras.scope(["/cpu:1"], policy()):
        pytest.fail("the scope must not be entered")


def dense_model(strategy=None):
    with strategy.scope() if strategy else contextlib.nullcontext():
        return build_model("dense")


def fit(data, **kwargs):
    """An action fitting the set-up model on `data` (x, y) or a dataset."""

    def action(model):
        if isinstance(data, tf.data.Dataset):
            model.fit(data, epochs=1, verbose=0, **kwargs)
        else:
            model.fit(*data, batch_size=24, epochs=1, verbose=0, **kwargs)

    return action


def dataset(n, drop_remainder=False):
    x, y = make_data("dense", 96)
    return tf.data.Dataset.from_tensor_slices((x[:n], y[:n])).batch(24, drop_remainder)


def variable_scope_case(match, body, reuse=None, setup_body=None):
    """A case running `body()` in `variable_scope("m", reuse)` under a dpkeras scope, with a
    store of its own (after `setup_body()` ran in `variable_scope("m")`)."""

    def setup():
        store = VariableStore()
        if setup_body is not None:
            with store, cpu_strategy(2).scope(), dpkeras.variable_scope("m"):
                setup_body()
        return store

    def action(store):
        with store, cpu_strategy(2).scope(), dpkeras.variable_scope("m", reuse=reuse):
            body()

    return Case(action, ValueError, match, setup=setup)


def get_w(shape=(2,)):
    return dpkeras.get_variable("w", shape)


def _mixed_scopes(outer, inner):
    def action(_):
        with outer().scope():
            with inner():
                pytest.fail("the inner scope must not be entered")

    return action


def _raising_policy(spec):
    raise KeyError(spec.path)


X, Y = make_data("dense", 96)

CASES = {
    # -- devices ------------------------------------------------------------------------------
    "device-without-index": Case(
        lambda _: enter(["gpu"]),
        ValueError,
        r"must name a type and an index, such as '/gpu:0' or '/cpu:1', or a task, such as "
        r"'/job:ps/task:0' \(its CPU:0\). Received: 'gpu'",
    ),
    "device-unparseable": Case(
        lambda _: enter(["/cpu:1"], "/cpu:0/cpu:1"),
        ValueError,
        r"Cannot parse device '/cpu:0/cpu:1'.*Expected a device such as '/gpu:0'",
    ),
    "device-not-a-string": Case(
        lambda _: enter(["/cpu:1", 5]),
        ValueError,
        r"must be a string such as '/gpu:0' or '/cpu:0'. Received: 5 \(of type int\)",
    ),
    "compute-device-absent": Case(
        lambda _: enter(["/cpu:7"]),
        ValueError,
        r"compute device /cpu:7 does not exist.*Available devices: /cpu:0, /cpu:1, /cpu:2, "
        r"/cpu:3.*simulate_cpu_devices",
    ),
    "gpu-absent": Case(
        lambda _: enter(["/gpu:0", "/gpu:1"]),
        ValueError,
        r"compute device /gpu:0 does not exist.*Available devices: /cpu:0",
    ),
    "parameter-device-absent": Case(
        lambda _: enter(None, "/cpu:9"),
        ValueError,
        r"parameter device /cpu:9 does not exist.*Available devices: /cpu:0",
    ),
    "device-of-another-job": Case(
        lambda _: enter(["/job:worker/task:1/device:CPU:0"]),
        ValueError,
        r"'/job:worker/task:1/device:CPU:0' names another job.*Use a local device such as",
    ),
    "duplicate-compute-devices": Case(
        lambda _: enter(["/cpu:1", "/device:CPU:1"]),
        ValueError,
        r"lists /cpu:1 twice \('/cpu:1' and '/device:CPU:1'\); each compute device runs one "
        r"replica",
    ),
    "zero-replicas": Case(
        lambda _: enter([]),
        ValueError,
        r"at least one device. Received: compute_devices=\[\]. Pass None to use every GPU",
    ),
    "one-string-for-compute-devices": Case(
        lambda _: enter("/cpu:1"),
        ValueError,
        r"a list of device strings, not one string. Received: compute_devices='/cpu:1'; did "
        r"you mean \['/cpu:1'\]",
    ),
    "parameter-device-of-wrong-type": Case(
        lambda _: enter(None, 5),
        ValueError,
        r"parameter_device must be a device string, a list of devices, or a placement policy.*"
        r"Received: 5 \(of type int\)",
    ),
    "parameter-devices-duplicated": Case(
        lambda _: enter(None, ["/cpu:0", "/device:CPU:0"]),
        ValueError,
        r"greedy_by_size\(\) lists a device twice. Received: \['/cpu:0', '/device:CPU:0'\]",
    ),
    "parameter-devices-empty": Case(
        lambda _: enter(None, []),
        ValueError,
        r"greedy_by_size\(\) needs a non-empty list of devices, such as \['/gpu:0', '/gpu:1'\]"
        r". Received: \[\]",
    ),
    "environment-list-malformed": Case(
        lambda _: enter(),
        ValueError,
        r"DPKERAS_COMPUTE_DEVICES must be a comma-separated list of devices such as "
        r"'/gpu:0,/gpu:1'. Received: DPKERAS_COMPUTE_DEVICES='/cpu:1,,/cpu:2'",
        env={"DPKERAS_COMPUTE_DEVICES": "/cpu:1,,/cpu:2"},
    ),
    # Fixed: the message did not say the device came from the environment.
    "environment-device-absent": Case(
        lambda _: enter(TWO),
        ValueError,
        r"parameter device /cpu:9 does not exist.*Available devices: /cpu:0.*come from the "
        r"environment: DPKERAS_PARAMETER_DEVICE='/cpu:9'",
        env={"DPKERAS_PARAMETER_DEVICE": "/cpu:9"},
    ),
    "environment-compute-device-absent": Case(
        lambda _: enter(),
        ValueError,
        r"compute device /cpu:8 does not exist.*come from the environment: "
        r"DPKERAS_COMPUTE_DEVICES='/cpu:1, /cpu:8'",
        env={"DPKERAS_COMPUTE_DEVICES": "/cpu:1, /cpu:8"},
    ),
    # -- simulated devices --------------------------------------------------------------------
    "simulate-after-tensorflow-initialised": Case(
        lambda _: dpkeras.simulate_cpu_devices(2),
        RuntimeError,
        r"simulate_cpu_devices\(2\) must be called before TensorFlow initialises its devices; "
        r"this process already runs with 4 logical CPU device\(s\). Call it first thing",
    ),
    "simulate-zero-devices": Case(
        lambda _: dpkeras.simulate_cpu_devices(0),
        ValueError,
        r"needs a positive integer number of CPU devices. Received: n=0",
    ),
    # -- placement policies -------------------------------------------------------------------
    "policy-raises": policy_case(
        _raising_policy,
        r"The placement policy .*_raising_policy.* failed for variable 'sequential/dense/"
        r"kernel' \(weight, shape \(12, 4\)\): KeyError",
    ),
    "policy-returns-an-absent-device": policy_case(
        lambda spec: "/gpu:3",
        r"placed variable 'sequential/dense/kernel' on /gpu:3, which does not exist in this "
        r"process. Available devices: /cpu:0, /cpu:1, /cpu:2, /cpu:3",
    ),
    "policy-returns-a-non-device": policy_case(
        lambda spec: 3,
        r"returned an invalid device for variable 'sequential/dense/kernel': A device must be "
        r"a string such as '/gpu:0'.*Received: 3",
    ),
    # The kernel is placed, then the bias fails: the kernel must not survive.
    "by-path-without-a-rule-for-a-variable": policy_case(
        placement.by_path({r"kernel$": "/cpu:0"}),
        r"failed for variable 'sequential/dense/bias'.*no by_path\(\) rule matches "
        r"'sequential/dense/bias' and there is no default. Rules: \['kernel\$'\]",
    ),
    "by-path-bad-regex": Case(
        lambda _: build_under(lambda: placement.by_path({r"dense(": "/cpu:0"})),
        ValueError,
        r"by_path\(\): 'dense\(' is not a valid regular expression",
    ),
    "round-robin-of-one-string": Case(
        lambda _: build_under(lambda: placement.round_robin("/cpu:0")),
        ValueError,
        r"round_robin\(\) needs a non-empty list of devices, such as \['/gpu:0', '/gpu:1'\]. "
        r"Received: '/cpu:0'",
    ),
    # -- scopes and strategies ----------------------------------------------------------------
    "dpkeras-scope-inside-another-dpkeras-scope": Case(
        _mixed_scopes(lambda: cpu_strategy(3), lambda: dpkeras.scope(TWO)),
        ValueError,
        r"dpkeras.scope\(\) cannot be entered inside the scope of another strategy: "
        r"ParameterDeviceStrategy\(compute_devices=\[/cpu:1, /cpu:2, /cpu:3\].* is active and "
        r"this scope would be ParameterDeviceStrategy\(compute_devices=\[/cpu:1, /cpu:2\].*"
        r"Leave the other scope first",
    ),
    "dpkeras-scope-inside-mirrored": Case(
        _mixed_scopes(lambda: tf.distribute.MirroredStrategy(TWO), lambda: dpkeras.scope(TWO)),
        ValueError,
        r"cannot be entered inside the scope of another strategy: .*Mirrored",
    ),
    # TensorFlow's message (the other strategy's scope refuses): it names both strategies.
    "other-scope-inside-dpkeras-scope": Case(
        _mixed_scopes(
            lambda: cpu_strategy(2), lambda: tf.distribute.OneDeviceStrategy("/cpu:1").scope()
        ),
        RuntimeError,
        r"Mixing different tf.distribute.Strategy objects: .*ParameterDeviceStrategy"
        r"\(compute_devices=\[/cpu:1, /cpu:2\].* is not .*OneDeviceStrategy",
    ),
    "model-built-without-strategy-trained-in-scope": Case(
        lambda model: _fit_in(cpu_strategy(2), model),
        ValueError,
        r"Model 'sequential' has variable 'sequential/dense/kernel' that was not created under "
        r"this strategy's scope.*Create the model \(and compile it\) inside `with "
        r"dpkeras.scope\(\):`",
        setup=lambda: dense_model(),
    ),
    # Keras hands strategy.run a closure for predict, not a bound step: checked all the same.
    "model-built-without-strategy-predicted-in-scope": Case(
        lambda model: _predict_in(cpu_strategy(2), model),
        ValueError,
        r"Model 'sequential' has variable 'sequential/dense/kernel' that was not created under "
        r"this strategy's scope",
        setup=lambda: dense_model(),
    ),
    # TensorFlow's message, raised when Keras distributes the data: it names both strategies.
    "model-built-under-another-dpkeras-strategy": Case(
        lambda model: _fit_in(cpu_strategy(3), model),
        RuntimeError,
        r"Mixing different tf.distribute.Strategy objects: ParameterDeviceStrategy\("
        r"compute_devices=\[/cpu:1, /cpu:2, /cpu:3\].* is not ParameterDeviceStrategy\("
        r"compute_devices=\[/cpu:1, /cpu:2\]",
        setup=lambda: dense_model(cpu_strategy(2)),
    ),
    # TensorFlow's message: the optimizer was created outside, under the default strategy.
    "model-compiled-outside-the-scope": Case(
        lambda model: model.compile(optimizer="adam", loss="mse"),
        ValueError,
        r"Model 'sequential' was built under ParameterDeviceStrategy\(.*\) and is compiled "
        r"outside its scope \(no strategy is in scope\).*Compile the model inside the scope",
        setup=lambda: _compiled_outside(),
    ),
    # -- variables ----------------------------------------------------------------------------
    "integer-variable-with-mean-aggregation": Case(
        lambda _: _variable(
            0, dtype=tf.int32, name="counter", aggregation=tf.VariableAggregation.MEAN
        ),
        ValueError,
        r"Variable 'counter' has dtype int32 and aggregation=MEAN; the mean of integers across "
        r"replicas is not an integer. Use aggregation SUM, ONLY_FIRST_REPLICA or NONE",
    ),
    "unknown-aggregation": Case(
        lambda _: _variable(1.0, name="v", aggregation="average"),
        ValueError,
        r"Variable 'v': aggregation must be one of \['NONE', 'SUM', 'MEAN', "
        r"'ONLY_FIRST_REPLICA'\]. Received: aggregation='average'",
    ),
    "update-of-a-variable-from-outside-the-scope": Case(
        lambda foreign: _update(foreign),
        ValueError,
        r"Variable 'foreign:0' was not created under this strategy's scope.*Create the model "
        r"\(and compile it\) inside `with dpkeras.scope\(\):`. Received a ResourceVariable",
        setup=lambda: tf.Variable(1.0, name="foreign"),
    ),
    "reduce-sum-of-a-value-that-is-not-per-replica": Case(
        lambda _: cpu_strategy(2).reduce("SUM", tf.constant(1.0), axis=None),
        ValueError,
        r"cannot be reduced with SUM over 2 replicas.*Received: <tf.Tensor: .*numpy=1.0>. Return "
        r"it from "
        r"strategy.run to get a per-replica value, or reduce with MEAN",
    ),
    # -- variable scopes ----------------------------------------------------------------------
    "variable-scope-reuse-of-a-missing-variable": variable_scope_case(
        r"get_variable\('m/w'\): variable 'm/w' does not exist, and scope 'm' has reuse=True, "
        r"which only reuses existing variables.*reuse=dpkeras.AUTO_REUSE",
        get_w,
        reuse=True,
    ),
    "variable-scope-variable-exists": variable_scope_case(
        r"variable 'm/w' already exists \(shape \(2,\), float32\), and scope 'm' has "
        r"reuse=False.*enter the scope with reuse=True or dpkeras.AUTO_REUSE",
        get_w,
        setup_body=get_w,
    ),
    "variable-scope-reuse-with-another-shape": variable_scope_case(
        r"cannot reuse variable 'm/w' with shape \(3,\): it was created with shape \(2,\)",
        lambda: get_w((3,)),
        reuse=True,
        setup_body=get_w,
    ),
    "variable-scope-bad-reuse-value": variable_scope_case(
        r"variable_scope\(reuse=...\) must be True, False, None \(inherit\) or "
        r"dpkeras.AUTO_REUSE. Received: reuse='yes'",
        get_w,
        reuse="yes",
    ),
    # The message names the strategy type twice (dpkeras.tf1._errors); see the report.
    "variable-shared-across-two-strategies": Case(
        lambda store: _reuse_under(store, cpu_strategy(3)),
        ValueError,
        r"variable 'm/w' was created under .*ParameterDeviceStrategy.* and is being reused "
        r"under .*ParameterDeviceStrategy.*Variables shared by name must live under one "
        r"strategy: build every user of it inside the same dpkeras.scope\(\)",
        setup=lambda: _store_with_w(cpu_strategy(2)),
    ),
    "get-variable-without-a-shape": variable_scope_case(
        r"the shape of a new variable must be known. Pass shape=..., or an initializer that "
        r"implies one.*Received: shape=None",
        lambda: dpkeras.get_variable("w"),
    ),
    # -- data ---------------------------------------------------------------------------------
    # Fixed: Keras stopped with a bare StopIteration (MirroredStrategy too).
    "empty-dataset": Case(
        fit(dataset(0)),
        ValueError,
        r"Cannot distribute an empty dataset: it yields no batch \(cardinality 0\).*Received: "
        r"<_BatchDataset element_spec=.*Give it at least one batch",
        setup=lambda: dense_model(cpu_strategy(2)),
    ),
    "fewer-examples-than-one-batch-with-drop-remainder": Case(
        fit(dataset(10, drop_remainder=True)),
        ValueError,
        r"Cannot distribute an empty dataset.*TensorSpec\(shape=\(24, 12\).*drop_remainder=True"
        r"\) on fewer examples than one batch",
        setup=lambda: dense_model(cpu_strategy(2)),
    ),
    "per-replica-input-pipelines": Case(
        lambda _: cpu_strategy(2).experimental_distribute_dataset(
            dataset(96),
            tf.distribute.InputOptions(
                experimental_replication_mode=tf.distribute.InputReplicationMode.PER_REPLICA
            ),
        ),
        NotImplementedError,
        r"supports InputReplicationMode.PER_WORKER \(the default\).*Received: "
        r"experimental_replication_mode=PER_REPLICA",
    ),
    # Keras's messages, unchanged by the replicas that raise them.
    "input-shape-does-not-match-the-model": Case(
        fit((np.ones((96, 13), "float32"), Y)),
        ValueError,
        r"Input 0 .* of layer 'dense' is incompatible with the layer: expected axis -1 of input "
        r"shape to have value 12, but received input with shape \(24, 13\)",  # as one device
        setup=lambda: dense_model(cpu_strategy(2)),
    ),
    "x-and-y-of-different-lengths": Case(
        fit((X, Y[:90])),
        ValueError,
        r"Data cardinality is ambiguous.*'x' sizes: 96\s+'y' sizes: 90",
        setup=lambda: dense_model(cpu_strategy(2)),
    ),
}


def _store_with_w(strategy):
    store = VariableStore()
    with store, strategy.scope(), dpkeras.variable_scope("m"):
        get_w()
    return store


def _reuse_under(store, strategy):
    with store, strategy.scope(), dpkeras.variable_scope("m", reuse=True):
        get_w()


def _fit_in(strategy, model):
    with strategy.scope():
        model.fit(X, Y, batch_size=24, epochs=1, verbose=0)


def _predict_in(strategy, model):
    with strategy.scope():
        model.predict(X, batch_size=24, verbose=0)


def _compiled_outside():
    with cpu_strategy(2).scope():
        return keras.Sequential([keras.Input((12,)), keras.layers.Dense(4)])


def _variable(value, **kwargs):
    with cpu_strategy(2).scope():
        tf.Variable(value, **kwargs)


def _update(foreign):
    strategy = cpu_strategy(2)
    with strategy.scope():
        strategy.extended.update(foreign, lambda v, d: v.assign_add(d), args=(1.0,))


def _live_variables():
    gc.collect()
    return {id(s): len(s.extended.variables()) for s in scope_module._strategies.values()}


def _model_state(target):
    if isinstance(target, keras.Model):
        optimizer = getattr(target, "optimizer", None)  # None before compile
        iterations = optimizer.iterations.numpy() if optimizer else None
        return [w.copy() for w in target.get_weights()], iterations
    if isinstance(target, tf.Variable):
        return [target.numpy()], None
    return None


def test_the_table_has_at_least_25_cases():
    assert len(CASES) >= 25


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_bad_input(case, monkeypatch):
    # The strategies cases use exist beforehand, under each name they are asked by.
    cpu_strategy(2), cpu_strategy(3), dpkeras.get_strategy(TWO)
    for name, value in case.env.items():
        monkeypatch.setenv(name, value)
    target = case.setup() if case.setup else None
    default = tf.distribute.get_strategy()
    cached = dict(scope_module._strategies)
    live = _live_variables()
    before = _model_state(target)
    created = []

    def spy(next_creator, **kwargs):
        created.append(kwargs.get("name"))
        return next_creator(**kwargs)

    with tf.variable_creator_scope(spy):
        with pytest.raises(case.error, match=case.match):
            case.action(target)
    # Nothing was half-done.
    assert not tf.distribute.has_strategy()
    assert tf.distribute.get_strategy() is default
    assert tf.distribute.get_replica_context().strategy is default  # the default context
    assert state.current_scope() is None
    assert scope_module._strategies == cached
    assert {k: v for k, v in _live_variables().items() if k in live} == live
    if not case.builds:
        assert created == []
    after = _model_state(target)
    if before is not None:
        for a, b in zip(before[0], after[0]):
            np.testing.assert_array_equal(a, b)
        assert before[1] == after[1]


# -- not errors: inputs a new user may expect to fail ---------------------------------------


def test_the_parameter_device_computes_only_when_listed(monkeypatch):
    """The parameter device is a compute device only when named in compute_devices (TF1's
    --local_parameter_device), and dpkeras says so; by default it is left out."""
    assert "/device:CPU:0" not in "".join(dpkeras.get_strategy(None, "/cpu:0").compute_devices)
    strategy = dpkeras.get_strategy(["/cpu:0", "/cpu:1"], "/cpu:0")
    assert strategy.compute_devices[0].endswith("/device:CPU:0")
    assert "parameter device(s) /cpu:0 also compute" in strategy.extended.device_reason


def test_a_dataset_of_unknown_size_trains_without_steps_per_epoch():
    """It trains as the same batches of known size do. (Without a strategy, Keras 3.15 counts
    an extra optimizer iteration at the end of each epoch of unknown size; dpkeras does not:
    test_long_runs.py::test_epochs_of_unknown_size_do_not_drift.)"""
    x, y = make_data("dense", 58)
    known = tf.data.Dataset.from_tensor_slices((x, y)).batch(24)  # 24, 24, 10
    unknown = known.unbatch().filter(lambda a, b: True).batch(24)
    assert unknown.cardinality().numpy() == tf.data.UNKNOWN_CARDINALITY
    with cpu_strategy(3).scope():
        model = build_model("dense")
    model.fit(unknown, epochs=2, verbose=0)
    reference = build_model("dense")
    reference.fit(known, epochs=2, verbose=0)
    assert model.optimizer.iterations.numpy() == reference.optimizer.iterations.numpy() == 6
    for a, b in zip(reference.get_weights(), model.get_weights()):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)


def test_an_infinite_dataset_without_steps_per_epoch_is_one_endless_epoch():
    """Keras 3 does not refuse it (Keras 2 did): the epoch ends when a callback stops training.
    dpkeras does the same, so that a program behaves as it does without a strategy."""
    x, y = make_data("dense", 48)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(24).repeat()
    assert data.cardinality().numpy() == tf.data.INFINITE_CARDINALITY

    class StopAfter(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 4:
                self.model.stop_training = True

    with cpu_strategy(2).scope():
        model = build_model("dense")
    history = model.fit(data, epochs=3, verbose=0, callbacks=[StopAfter()])
    assert model.optimizer.iterations.numpy() == 5 and len(history.history["loss"]) == 1
