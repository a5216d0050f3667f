"""Bad input fails early, says what it received and what is valid, and leaves nothing behind."""

import contextlib

import keras
import numpy as np
import pytest
import tensorflow as tf

import dpkeras
from dpkeras._strategy import scope as scope_module
from dpkeras.testing import cpu_strategy
from tests.models import build_model, make_data

BAD_DEVICES = [
    # (compute_devices, parameter_device, message regex)
    (
        ["/cpu:7"],
        None,
        r"compute device /cpu:7 does not exist.*Available devices: /cpu:0, "
        r"/cpu:1, /cpu:2, /cpu:3",
    ),
    (["/gpu:0"], None, r"compute device /gpu:0 does not exist"),
    (None, "/cpu:9", r"parameter device /cpu:9 does not exist"),
    (["gpu"], None, r"must name a type and an index.*Received: 'gpu'"),
    (["/cpu:1", 5], None, r"must be a string.*Received: 5 \(of type int\)"),
    (["/job:worker/task:1/device:CPU:0"], None, r"another job, replica or task"),
    (["/cpu:1", "/device:CPU:1"], None, r"lists /cpu:1 twice \('/cpu:1' and '/device:CPU:1'\)"),
    ([], None, r"at least one device.*Received: compute_devices=\[\]"),
    ("/cpu:1", None, r"list of device strings, not one string.*did you mean \['/cpu:1'\]"),
    (
        None,
        5,
        r"parameter_device must be a device string, a list of devices, or a placement "
        r"policy.*Received: 5 \(of type int\)",
    ),
    (None, ["/cpu:0", "/cpu:0"], r"greedy_by_size\(\) lists a device twice"),
    (None, [], r"greedy_by_size\(\) needs a non-empty list of devices"),
    (["/replica:0"], None, r"a type and an index.*or a task, such as '/job:ps/task:0'"),
    (
        None,
        dpkeras.placement.REPLICATED,
        r"parameter_device=placement.REPLICATED would replicate metric state too.*Use "
        r"placement.hybrid\(\).*Received: parameter_device=dpkeras.placement.REPLICATED",
    ),
    (
        None,
        dpkeras.placement.round_robin,
        r"parameter_device=placement.round_robin is the function that makes a policy, not a "
        r"policy: call it, such as placement.round_robin\(\['/gpu:0', '/gpu:1'\]\)",
    ),
    (
        None,
        dpkeras.placement.by_path,
        r"parameter_device=placement.by_path is the function that makes a policy, not a "
        r"policy: call it, such as placement.by_path\(\{r'embedding': '/cpu:0'\}, "
        r"default='/gpu:0'\)",
    ),
    (
        None,
        dpkeras.placement.single,
        r"parameter_device=placement.single is the function that makes a policy, not a "
        r"policy: call it, such as placement.single\('/cpu:0'\)",
    ),
    (
        None,
        dpkeras.placement.greedy_by_size,
        r"parameter_device=placement.greedy_by_size is the function that makes a policy, not "
        r"a policy: call it, such as placement.greedy_by_size\(\['/gpu:0', '/gpu:1'\]\)",
    ),
    (["/cpu:1"], "/cpu:0/cpu:1", r"Cannot parse device '/cpu:0/cpu:1'"),
]


@pytest.mark.parametrize("compute,parameter,message", BAD_DEVICES)
def test_bad_devices_fail_before_anything_is_created(compute, parameter, message):
    cached = dict(scope_module._strategies)
    with pytest.raises(ValueError, match=message):
        with dpkeras.scope(compute, parameter):
            pytest.fail("the scope must not be entered")
    with pytest.raises(ValueError, match=message):
        dpkeras.ParameterDeviceStrategy(compute, parameter)
    assert scope_module._strategies == cached
    assert not tf.distribute.has_strategy()


def test_bad_environment_setting(monkeypatch):
    monkeypatch.setenv("DPKERAS_COMPUTE_DEVICES", "/cpu:1,,/cpu:2")
    with pytest.raises(
        ValueError,
        match=r"DPKERAS_COMPUTE_DEVICES must be a comma-separated "
        r"list.*Received: DPKERAS_COMPUTE_DEVICES='/cpu:1,,",
    ):
        dpkeras.ParameterDeviceStrategy()


@pytest.mark.parametrize("n", [0, -1, 2.5, "4", True])
def test_simulate_cpu_devices_rejects_non_positive_integers(n):
    with pytest.raises(ValueError, match=rf"positive integer.*Received: n={n!r}"):
        dpkeras.simulate_cpu_devices(n)


def test_simulate_cpu_devices_after_initialisation():
    dpkeras.simulate_cpu_devices(4)  # what this process already has: a no-op
    with pytest.raises(
        RuntimeError,
        match=r"simulate_cpu_devices\(2\) must be called before "
        r"TensorFlow initialises.*already runs with 4",
    ):
        dpkeras.simulate_cpu_devices(2)
    assert len(tf.config.list_logical_devices("CPU")) == 4


@pytest.mark.parametrize("outer", ["one_device", "other_dpkeras"])
def test_scope_inside_another_strategy_scope(outer):
    other = tf.distribute.OneDeviceStrategy("/cpu:1") if outer == "one_device" else cpu_strategy(3)
    with other.scope():
        with pytest.raises(
            ValueError,
            match=r"cannot be entered inside the scope of another "
            r"strategy: .* is active",
        ):
            with dpkeras.scope(["/cpu:1", "/cpu:2"]):
                pass
        assert tf.distribute.get_strategy() is other
    with cpu_strategy(2).scope():
        with dpkeras.scope(["/cpu:1", "/cpu:2"]) as same:  # re-entering the same one is fine
            assert same is cpu_strategy(2)


def test_model_built_outside_the_scope_fails_before_training():
    model = build_model("dense")
    initial = model.get_weights()
    x, y = make_data("dense", 96)
    with dpkeras.scope(["/cpu:1", "/cpu:2"]):
        with pytest.raises(
            ValueError,
            match=r"variable .sequential/dense/kernel. that was not "
            r"created under this strategy.s scope.*"
            r"inside `with dpkeras.scope\(\):`",
        ):
            model.fit(x, y, batch_size=48, epochs=1, verbose=0)
    for a, b in zip(initial, model.get_weights()):
        np.testing.assert_array_equal(a, b)


def _dense():
    return keras.Sequential([keras.Input((12,)), keras.layers.Dense(4)])


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
@pytest.mark.parametrize("outside", ["no strategy", "another strategy", "another dpkeras"])
def test_compile_outside_the_model_scope_is_one_clear_error(optimizer, outside):
    """Keras lets this through: with Adam, fit then fails with TensorFlow's raw "Mixing
    different tf.distribute.Strategy objects"; with SGD, the optimizer's and the loss's
    variables silently land outside the strategy (MirroredStrategy does the same). The scope
    of another dpkeras strategy is outside the model's scope too."""
    with dpkeras.scope(["/cpu:1", "/cpu:2"], "/cpu:3") as strategy:
        model = _dense()
    around = {
        "no strategy": contextlib.nullcontext,
        "another strategy": lambda: tf.distribute.OneDeviceStrategy("/cpu:0").scope(),
        "another dpkeras": lambda: dpkeras.scope(["/cpu:0", "/cpu:1"], "/cpu:2"),
    }[outside]
    with around():
        with pytest.raises(
            ValueError,
            match=r"^Model 'sequential' was built under ParameterDeviceStrategy\(compute_devices="
            r"\[/cpu:1, /cpu:2\], parameter_device='/cpu:3'\) and is compiled outside its scope "
            r"\((no strategy|a OneDeviceStrategy|ParameterDeviceStrategy\(compute_devices="
            r"\[/cpu:0, /cpu:1\], parameter_device='/cpu:2'\)) is in scope\).*Mixing different.*"
            r"Compile the model inside the scope it was built in: `with dpkeras.scope\(...\):` "
            r"or `with strategy.scope\(\):`",
        ):
            model.compile(optimizer=optimizer, loss="mse")
    assert not model.compiled and not hasattr(model, "optimizer")  # nothing was made
    with strategy.scope():  # the fix
        model.compile(optimizer=optimizer, loss="mse")
    x, y = make_data("dense", 8)
    model.fit(x, keras.ops.one_hot(y, 4), batch_size=4, verbose=0)
    report = dpkeras.placement_report(model)  # the optimizer's and the loss's variables too
    assert {row.device for row in report.rows} == {"/cpu:3"}, report


def _wrapped(*inner):
    inputs = keras.Input((12,))
    return keras.Model(inputs, keras.layers.Add()([layer(inputs) for layer in inner]))


def test_a_model_made_outside_any_scope_with_variables_of_two_strategies_is_refused():
    """keras-io's end-to-end wrapper adopts the strategy of the model it holds
    (tests/test_end_to_end_wrapper.py); beside a layer of no strategy or of another strategy,
    fit would fail on the first foreign variable: refused at compile, naming each layer."""
    with dpkeras.scope(["/cpu:1", "/cpu:2"], "/cpu:3"):
        trained = _dense()
    outside = keras.Sequential([keras.Input((12,)), keras.layers.Dense(4)], name="head")
    with dpkeras.scope(["/cpu:0", "/cpu:1"], "/cpu:2"):
        other = keras.Sequential([keras.Input((12,)), keras.layers.Dense(4)], name="other")
    for inner, named in ((outside, "'head' of no strategy"), (other, "'other' of Parameter")):
        model = _wrapped(trained, inner)
        with pytest.raises(
            ValueError,
            match=rf"^Model '{model.name}' was made outside any strategy's scope and holds "
            r"variables of more than one strategy: 'sequential' of ParameterDeviceStrategy\("
            rf"compute_devices=\[/cpu:1, /cpu:2\], parameter_device='/cpu:3'\); {named}.*"
            r"Make the other layers \(and the model\) inside `with strategy.scope\(\):`",
        ):
            model.compile(optimizer="sgd", loss="mse")
        assert not model.compiled


def test_a_model_with_variables_of_two_strategies_is_refused_in_either_s_scope_too():
    """Compiled inside the scope of the strategy it would adopt, the wrapper of the test above
    is refused the same: fit would fail on its layer of no strategy all the same."""
    with dpkeras.scope(["/cpu:1", "/cpu:2"], "/cpu:3") as strategy:
        trained = _dense()
    outside = keras.Sequential([keras.Input((12,)), keras.layers.Dense(4)], name="head")
    model = _wrapped(trained, outside)
    with strategy.scope():
        with pytest.raises(
            ValueError,
            match=rf"^Model '{model.name}' was made outside any strategy's scope and holds "
            r"variables of more than one strategy: 'sequential' of ParameterDeviceStrategy\(.*"
            r"\); 'head' of no strategy\.",
        ):
            model.compile(optimizer="sgd", loss="mse")
    assert not model.compiled


class _Scaled(keras.Model):
    """A subclassed wrapper with a variable of its own, of no sub-layer."""

    def __init__(self, inner):
        super().__init__(name="scaled")
        self.inner = inner
        self.scale = self.add_weight(shape=(), initializer="ones", name="scale")

    def call(self, x):
        return self.inner(x) * self.scale


def test_a_wrapper_made_outside_any_scope_with_a_variable_of_its_own_is_refused():
    """The wrapper's own variable (made outside any scope, of no strategy) counts as a layer's:
    refused at compile, naming the model, instead of adopted and failing in fit."""
    with dpkeras.scope(["/cpu:1", "/cpu:2"], "/cpu:3"):
        trained = _dense()
    model = _Scaled(trained)
    model(np.zeros((1, 12), "float32"))
    with pytest.raises(
        ValueError,
        match=r"^Model 'scaled' was made outside any strategy's scope and holds variables of "
        r"more than one strategy: 'sequential' of ParameterDeviceStrategy\(.*\); 'scaled' of "
        r"no strategy\.",
    ):
        model.compile(optimizer="sgd", loss="mse")
    assert not model.compiled


def test_a_wrapper_made_outside_any_scope_compiled_in_another_strategy_is_refused():
    with dpkeras.scope(["/cpu:1", "/cpu:2"], "/cpu:3") as strategy:
        trained = _dense()
    model = _wrapped(trained)
    with tf.distribute.OneDeviceStrategy("/cpu:0").scope():
        with pytest.raises(
            ValueError,
            match=rf"^Model '{model.name}' was made outside any strategy's scope and holds "
            r"'sequential', whose variables belong to ParameterDeviceStrategy\(.*\); it is "
            r"compiled in another strategy's scope \(a OneDeviceStrategy is in scope\).*"
            r"Compile the model inside the scope it was built in",
        ):
            model.compile(optimizer="sgd", loss="mse")
    assert not model.compiled
    with strategy.scope():  # in its strategy's scope, as with none: it adopts the strategy
        model.compile(optimizer="sgd", loss="mse")
    assert model.distribute_strategy is strategy


def test_an_optimizer_made_outside_the_model_scope_is_one_clear_error():
    optimizer = keras.optimizers.Adam(0.01)  # made with no strategy in scope
    with dpkeras.scope(["/cpu:1", "/cpu:2"]):
        model = _dense()
        with pytest.raises(
            ValueError,
            match=r"^Model 'sequential' is compiled with optimizer 'adam' \(Adam\), which was "
            r"made outside the scope of ParameterDeviceStrategy\(.*\), the strategy the model "
            r"was built under .*Make the optimizer inside `with strategy.scope\(\):`",
        ):
            model.compile(optimizer=optimizer, loss="mse")
        assert not model.compiled
        model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")  # made inside: fine
    x, y = make_data("dense", 8)
    model.fit(x, keras.ops.one_hot(y, 4), batch_size=4, verbose=0)


def test_integer_variable_with_mean_aggregation():
    with cpu_strategy(2).scope():
        with pytest.raises(ValueError, match=r"'counter' has dtype int32 and aggregation=MEAN"):
            tf.Variable(0, dtype=tf.int32, name="counter", aggregation=tf.VariableAggregation.MEAN)


def test_update_of_a_foreign_variable_in_a_custom_loop():
    foreign = tf.Variable(1.0)
    strategy = cpu_strategy(2)
    with pytest.raises(ValueError, match=r"was not created under this strategy's scope"):
        with strategy.scope():
            strategy.extended.update(foreign, lambda v, d: v.assign_add(d), args=(1.0,))
    assert float(foreign.numpy()) == 1.0
    assert keras.backend.backend() == "tensorflow"
