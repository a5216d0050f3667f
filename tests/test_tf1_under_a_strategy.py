"""`dpkeras.variable_scope` under `dpkeras.scope()`, entered in either order.

Variables made by name live on the parameter device like all others, towers still share, and
training with 2 replicas equals one device with one layer called twice. The 4 logical CPU
devices come from conftest.py (`/cpu:0` holds the variables).
"""

import re

import keras
import numpy as np
import pytest
import tensorflow as tf

import dpkeras
from dpkeras.testing import cpu_strategy
from dpkeras.tf1 import VariableStore, get_variable, local_variable, model_variable, variable_scope
from tests.tf1_models import INPUT_SHAPE, Towers, assert_towers_share, images, reference_like

pytestmark = pytest.mark.skipif(
    not hasattr(dpkeras, "ParameterDeviceStrategy"),
    reason="dpkeras.ParameterDeviceStrategy (the core strategy) is not available",
)

ORDERS = ["strategy_outside", "variable_scope_outside"]


@pytest.fixture(autouse=True)
def _fresh_store():
    with VariableStore() as store:
        yield store


def enter(order, strategy, name="model"):
    """Enters the strategy scope and a variable scope, in the given order."""
    import contextlib

    stack = contextlib.ExitStack()
    if order == "strategy_outside":
        stack.enter_context(strategy.scope())
        stack.enter_context(variable_scope(name))
    else:
        stack.enter_context(variable_scope(name))
        stack.enter_context(strategy.scope())
    return stack


def parameter_device(strategy):
    """Where dpkeras puts any variable: that of a plain keras.Variable made in its scope."""
    with strategy.scope():
        return keras.Variable(0.0).value.device


@pytest.mark.parametrize("order", ORDERS)
def test_shared_variables_live_on_the_parameter_device(order):
    strategy = cpu_strategy(2)
    with enter(order, strategy):
        model = Towers()
        model.build(INPUT_SHAPE)
        weights = get_variable("weights", (2, 2))
        params = model_variable("params", (3,))
        seen = local_variable("seen", ())
    assert_towers_share(model)
    device = parameter_device(strategy)
    for v in [*model.weights, weights, params, seen.variable]:
        assert isinstance(v.value, dpkeras.ParameterVariable), v.path
        assert v.value.device == device, (v.path, v.value.device)
    assert [w.path for w in model.tower1.weights] == [
        "model/towers/Layer/kernel",
        "model/towers/Layer/bias",
    ]


@pytest.mark.parametrize("order", ORDERS)
def test_two_replicas_train_like_one_device_with_one_layer_called_twice(order):
    x, y = images(n=8)
    strategy = cpu_strategy(2)
    with enter(order, strategy):
        model = Towers()
        model.build(INPUT_SHAPE)
        model.compile(keras.optimizers.Adam(0.05), "mse")
    reference = reference_like(model)
    reference.compile(keras.optimizers.Adam(0.05), "mse")
    for _ in range(3):
        history = model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
        reference_history = reference.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
        np.testing.assert_allclose(
            history.history["loss"], reference_history.history["loss"], rtol=1e-5
        )
        for mine, theirs in [
            (model.tower2.kernel, reference.conv.kernel),
            (model.head.kernel, reference.head.kernel),
        ]:
            np.testing.assert_allclose(mine.numpy(), theirs.numpy(), rtol=1e-5, atol=1e-6)
    assert_towers_share(model)
    assert len(model.optimizer.variables) == len(reference.optimizer.variables)


def test_lazily_built_model_under_dpkeras_fails_saying_to_build_it_inside_the_scope():
    x, y = images(n=8)
    with cpu_strategy(2).scope():
        model = Towers()
        model.compile(keras.optimizers.SGD(0.1), "mse")
    with pytest.raises(
        RuntimeError,
        match=r"variable_scope\('towers'\).*symbolically.*"
        r"Build the model inside the scope",
    ):
        model.fit(x, y, batch_size=8, verbose=0)


def test_reusing_under_another_strategy_fails_naming_both():
    with variable_scope("model"):
        get_variable("w", (2,))
    with cpu_strategy(2).scope(), variable_scope("model", reuse=True):
        with pytest.raises(
            ValueError,
            match=(
                r"variable 'model/w' was created under no strategy and is being reused under "
                r"strategy ParameterDeviceStrategy.*same dpkeras.scope\(\)"
            ),
        ):
            get_variable("w", (2,))


def test_reuse_outside_the_strategy_reads_the_same_variable():
    with cpu_strategy(2).scope(), variable_scope("model"):
        w = get_variable("w", initializer=[1.0, 2.0])
    with variable_scope("model", reuse=True):
        assert get_variable("w", (2,)) is w
    assert isinstance(w.value, dpkeras.ParameterVariable)
    assert not tf.distribute.has_strategy()


# ---------------------------------------------------------------------------------------------
# A device the user names for a variable: honoured, as TF1 did, when it is one of the strategy's
# devices; any other is an error. Never placed elsewhere without a word.


def _named(form, make, device):
    """`make(device=...)` (form "argument") or `make()` inside `tf.device` (form "tf.device")."""
    if form == "argument":
        return make(device=device)
    with tf.device(device):
        return make()


MAKERS = {
    "get_variable": lambda **kw: get_variable("w", (2,), **kw),
    "variable": lambda **kw: dpkeras.variable("w", shape=(2,), **kw),
}


@pytest.mark.parametrize("maker", sorted(MAKERS))
@pytest.mark.parametrize("form", ["argument", "tf.device"])
def test_a_device_named_for_a_variable_is_where_it_lives(form, maker):
    with dpkeras.scope(["/cpu:1", "/cpu:2"], "/cpu:0"):
        with variable_scope("compute"):
            on_compute = _named(form, MAKERS[maker], "/cpu:2")
        with variable_scope("parameter"):
            on_parameter = _named(form, MAKERS[maker], "/device:CPU:0")
        with variable_scope("unnamed"):
            unnamed = MAKERS[maker]()
    assert on_compute.value.device.endswith("CPU:2")
    assert on_parameter.value.device.endswith("CPU:0")
    assert unnamed.value.device.endswith("CPU:0")
    with dpkeras.scope(["/cpu:1", "/cpu:2"], "/cpu:0"), variable_scope("compute", reuse=True):
        assert MAKERS[maker]() is on_compute


def test_a_device_named_with_tf_device_in_a_tf_function_is_where_the_variable_lives():
    """The same, made while a `tf.function` is traced (`_tf_internals.device_scope` reads the
    graph's device stack there): TF 2.21's stack holds `_UserDeviceSpec`s."""
    made = {}

    @tf.function
    def make():
        if "on_compute" not in made:
            with tf.device("/cpu:2"):
                made["on_compute"] = get_variable("traced_w", (2,))
        return made["on_compute"].value.read_value()

    with dpkeras.scope(["/cpu:1", "/cpu:2"], "/cpu:0"):
        make()
    assert made["on_compute"].value.device.endswith("CPU:2")


@pytest.mark.parametrize("maker", sorted(MAKERS))
@pytest.mark.parametrize(
    "form,received",
    [
        ("argument", r"device='/cpu:3'"),
        ("tf.device", r"tf.device\('/job:localhost/replica:0/task:0/device:CPU:3'\)"),
    ],
)
def test_error_a_device_named_that_is_not_the_strategy_s(form, received, maker, _fresh_store):
    with dpkeras.scope(["/cpu:1", "/cpu:2"], "/cpu:0"):
        with pytest.raises(
            ValueError,
            match=r"^get_variable\('w'\): the device named for it is not one of the strategy's "
            rf"devices, .* Received: {received}( around it)?\. Valid: /cpu:0, /cpu:1, /cpu:2 "
            r"\(parameter and compute devices\); or name none, and the placement policy "
            r"decides\.$",
        ):
            _named(form, MAKERS[maker], "/cpu:3")
    assert _fresh_store.paths() == []  # nothing was made


def test_error_a_device_named_for_a_partitioned_variable(_fresh_store):
    partitioner = tf.distribute.experimental.partitioners.FixedShardsPartitioner(2)
    with dpkeras.scope(["/cpu:1", "/cpu:2"], ["/cpu:0", "/cpu:3"]):
        with pytest.raises(ValueError, match=r"^get_variable\('t'\): a partitioned variable's"):
            get_variable("t", (4, 2), device="/cpu:0", partitioner=partitioner)
    assert _fresh_store.paths() == []


def test_ema_of_a_get_variable_through_its_value_in_a_tf_function_step():
    """TF1's `ExponentialMovingAverage` needs `tf.Variable`s: pass `v.value` (a keras.Variable's
    dtype is a string, which it cannot read). Its average lives beside the variable."""
    with dpkeras.scope(["/cpu:1", "/cpu:2"], "/cpu:0"):
        v = get_variable("w", (2,), initializer=1.0)
        ema = tf.compat.v1.train.ExponentialMovingAverage(decay=0.5)
        ema.apply([v.value])  # the averages are made eagerly, before the step is traced

        @tf.function
        def step():
            v.assign_add(tf.ones(2))
            ema.apply([v.value])

        step()
        step()
    average = ema.average(v.value)
    np.testing.assert_allclose(v.numpy(), [3.0, 3.0])
    np.testing.assert_allclose(average.numpy(), [2.25, 2.25])  # 0.5 * 1.5 + 0.5 * 3
    assert average.device.endswith("CPU:0")
    with pytest.raises(AttributeError, match=r"'str' object has no attribute 'base_dtype'"):
        tf.compat.v1.train.ExponentialMovingAverage(0.5).apply([v])  # the raw keras.Variable


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "tf-function"])
def test_scopes_entered_around_strategy_run_are_in_effect_in_every_replica(traced):
    """`strategy.run` runs each replica in a thread of its own; the variable scopes of the
    thread that runs it (a scope entered around it, the root scope told to reuse) are in
    effect there, as TF1's towers, built in the caller's graph, saw the caller's scopes."""
    strategy = cpu_strategy(2)
    with strategy.scope():
        with variable_scope("model"):
            kernel = get_variable("kernel", (3, 2))
        dpkeras.get_variable_scope().reuse_variables()

    def tower(x):
        with variable_scope("model"):  # reuses: the root scope's reuse, from the caller
            assert get_variable("kernel", (3, 2)) is kernel
        with variable_scope("model", reuse=True) as scope:
            assert scope.name == "model"
        return tf.reduce_sum(x @ kernel.value)

    def step():
        return strategy.run(tower, args=(tf.ones((1, 3)),))

    losses = strategy.experimental_local_results(tf.function(step)() if traced else step())
    assert len(losses) == 2

    with variable_scope("outer", reuse=True):  # a scope entered around the step

        def inner(x):
            assert dpkeras.get_variable_scope().name == "outer"
            return x

        strategy.run(inner, args=(tf.ones(()),))


class _TF1Body(keras.layers.Layer):
    """A TF1 body kept as is: a plain `tf.Variable` made in `build()`."""

    def build(self, input_shape):
        self.w = tf.Variable(tf.ones([input_shape[-1], 2]), name="w")

    def call(self, x):
        return x @ self.w


class _PortedBody(keras.layers.Layer):
    """The same, ported: `dpkeras.get_variable` in `build()`."""

    def build(self, input_shape):
        self.w = get_variable("w", (input_shape[-1], 2), initializer="ones")

    def call(self, x):
        return x @ self.w


def _untracked_warnings(layer):
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with cpu_strategy(2).scope():
            model = keras.Sequential(
                [
                    keras.Input((3,)),
                    layer,
                    keras.layers.BatchNormalization(),
                    keras.layers.Dropout(0.1),
                    keras.layers.Dense(1),
                ]
            )
            model.compile(optimizer="adam", loss="mse", metrics=["mae"])
        model.fit(np.ones((8, 3)), np.ones((8, 1)), batch_size=8, epochs=2, verbose=0)
    return [str(w.message) for w in caught if "Keras does not track" in str(w.message)]


def test_a_plain_tf_variable_made_in_a_layer_s_build_is_named_in_one_warning():
    """Keras never trains nor saves a `tf.Variable` a layer makes itself, and says only "The
    model does not have any trainable weights" (if that): under dpkeras one warning names it,
    once (two fits, two traces), and says what to use instead."""
    found = _untracked_warnings(_TF1Body(name="tf1_body"))
    assert len(found) == 1, found
    assert re.fullmatch(
        r"tf\.Variable 'sequential(_\d+)?/tf1_body/w' was made by a Keras layer \(_TF1Body\) "
        r"\(TF1 code in build\(\) or call\(\)\): Keras does not track a tf\.Variable, so it is "
        r"never trained nor saved\. Make it with dpkeras\.get_variable\(\.\.\.\) or "
        r"self\.add_weight\(\.\.\.\) instead\.",
        found[0],
    ), found


def test_keras_s_own_variables_and_get_variable_in_build_warn_nothing():
    """Layer weights, `dpkeras.get_variable`, BatchNormalization's statistics, Dropout's seed,
    the optimizer's slots and the metrics are `keras.Variable`s: no warning."""
    assert _untracked_warnings(_PortedBody(name="ported_body")) == []


def test_the_keras_internals_see_a_keras_variable_making_its_tf_variable():
    """`_keras_internals.making_a_keras_variable`, asked from a creator: True under
    `keras.Variable(...)` (eager and deferred values), False under a plain `tf.Variable`. Fails
    loudly if Keras moves where it makes the `tf.Variable`."""
    from dpkeras import _keras_internals

    seen = []

    def creator(next_creator, **kwargs):
        seen.append(_keras_internals.making_a_keras_variable())
        return next_creator(**kwargs)

    with tf.variable_creator_scope(creator):
        keras.Variable(np.ones((2,)), name="eager")
        keras.Variable(keras.initializers.Zeros(), shape=(2,), name="deferred")
        tf.Variable(1.0)
    assert seen == [True, True, False]


def test_a_variable_store_block_alone_around_strategy_run_is_in_effect_in_every_replica():
    """A `with VariableStore():` block around `strategy.run`, without any variable scope or
    root reuse, is the store of top-level code in every replica thread, as in the caller."""
    strategy = cpu_strategy(2)
    seen = []
    with VariableStore() as store:

        def inner(x):
            seen.append(dpkeras.get_variable_store())
            return x

        strategy.run(inner, args=(tf.ones(()),))
    assert len(seen) == 2 and all(s is store for s in seen), (seen, store)
