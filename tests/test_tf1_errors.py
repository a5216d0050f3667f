"""dpkeras.tf1._errors: every error names the full path and what is valid."""

import pytest
import tensorflow as tf

import dpkeras
from dpkeras.tf1 import (
    add_model_variable,
    get_variable,
    get_variables,
    variable_scope,
)
from tests.tf1_models import (
    INPUT_SHAPE,
    L,
    _fresh_store,  # noqa: F401 (an autouse fixture)
)

# ---------------------------------------------------------------------------------------------
# Errors: each names the full path and what is valid.


def test_error_reusing_a_variable_that_does_not_exist_lists_close_names():
    with variable_scope("model/conv1"):
        get_variable("weights", (2,))
        get_variable("biases", (2,))
    with pytest.raises(
        ValueError,
        match=(
            r"get_variable\('model/conv1/weight'\): variable 'model/conv1/weight' does not "
            r"exist, and scope 'model/conv1' has reuse=True.*Close names: "
            r"'model/conv1/weights'.*reuse=dpkeras.AUTO_REUSE"
        ),
    ):
        with variable_scope("model/conv1", reuse=True):
            get_variable("weight", (2,))


def test_error_reusing_a_layer_weight_that_does_not_exist_names_the_layer_and_path():
    with variable_scope("towers"):
        L.Conv2D(4, 3, name="Layer").build(INPUT_SHAPE)
    with pytest.raises(
        ValueError,
        match=(
            r"Keras layer 'Layr' \(Conv2D\) creating weight 'kernel': variable 'towers/Layr/kernel'"
            r" does not exist.*Close names: 'towers/Layer/kernel'"
        ),
    ):
        with variable_scope("towers", reuse=True):
            L.Conv2D(4, 3, name="Layr").build(INPUT_SHAPE)


def test_error_creating_a_variable_that_exists_without_reuse():
    with variable_scope("model"):
        get_variable("w", (2, 3))
    with pytest.raises(
        ValueError,
        match=(
            r"variable 'model/w' already exists \(shape \(2, 3\), float32\), and scope 'model' "
            r"has reuse=False.*reuse=True or dpkeras.AUTO_REUSE"
        ),
    ):
        with variable_scope("model"):
            get_variable("w", (2, 3))


def test_error_creating_a_layer_weight_that_exists_hints_at_explicit_reuse_false():
    with variable_scope("model"), variable_scope("towers"):
        L.Conv2D(4, 3, name="Layer").build(INPUT_SHAPE)
    with pytest.raises(
        ValueError,
        match=(
            r"creating weight 'kernel': variable 'model/towers/Layer/kernel' already exists.*"
            r"enclosing scope 'model' has reuse=True.*pass reuse=None to inherit"
        ),
    ):
        with variable_scope("model", reuse=True), variable_scope("towers", reuse=False):
            L.Conv2D(4, 3, name="Layer").build(INPUT_SHAPE)


@pytest.mark.parametrize("builder", ["get_variable", "layer"])
def test_error_reusing_with_another_shape(builder):
    with variable_scope("model"):
        if builder == "get_variable":
            get_variable("w", (3, 3))
        else:
            L.Dense(3, name="fc").build((None, 3))
    expected = r"'model/w' with shape \(3, 4\): it was created with shape \(3, 3\)"
    if builder == "layer":
        expected = r"'model/fc/kernel' with shape \(3, 4\): it was created with shape \(3, 3\)"
    with pytest.raises(ValueError, match=expected + r".*keeps the shape and dtype"):
        with variable_scope("model", reuse=True):
            if builder == "get_variable":
                get_variable("w", (3, 4))
            else:
                L.Dense(4, name="fc").build((None, 3))


@pytest.mark.parametrize("builder", ["get_variable", "layer"])
def test_error_reusing_with_another_dtype(builder):
    with variable_scope("model"):
        if builder == "get_variable":
            get_variable("w", (3, 3))
        else:
            L.Dense(3, name="fc").build((None, 3))
    path = "model/w" if builder == "get_variable" else "model/fc/kernel"
    with pytest.raises(
        ValueError,
        match=(
            rf"'{path}' with dtype float64: it was created with dtype float32.*keeps the shape "
            r"and dtype"
        ),
    ):
        with variable_scope("model", reuse=True):
            if builder == "get_variable":
                get_variable("w", (3, 3), dtype="float64")
            else:
                L.Dense(3, name="fc", dtype="float64").build((None, 3))


def test_error_invalid_arguments_name_the_rule():
    with pytest.raises(
        ValueError,
        match=r"reuse=\.\.\.\) must be True, False, None \(inherit\) "
        r"or dpkeras.AUTO_REUSE. Received: reuse='yes'",
    ):
        with variable_scope("model", reuse="yes"):
            pass
    with pytest.raises(
        ValueError,
        match=r"name_or_scope must be a non-empty name.*"
        r"Received: name_or_scope='a//b'",
    ):
        with variable_scope("a//b"):
            pass
    with pytest.raises(TypeError, match=r"scope name \(str\) or a VariableScope.*of type int"):
        with variable_scope(3):
            pass
    with pytest.raises(ValueError, match=r"get_variable\(\): name must be a non-empty name"):
        get_variable("", (1,))
    with pytest.raises(TypeError, match=r"keras.Variable or a tf.Variable.*of type str"):
        add_model_variable("w")
    with pytest.raises(
        TypeError,
        match=r"scope must be None, a dpkeras VariableScope, a path "
        r"string or a Keras layer/model. Received: scope=3",
    ):
        get_variables(3)


# ---------------------------------------------------------------------------------------------
# TensorFlow's own variable_scope: TF2 neither names nor shares Keras variables by it, so
# around dpkeras's variables it is refused by name instead of being ignored.

_TF_SCOPE = (
    r" inside tf.compat.v1.variable_scope\('towers'\), which dpkeras does not follow: .* "
    r"Use dpkeras.variable_scope\('towers', reuse=...\) instead"
)


def _under_dpkeras():
    return dpkeras.scope(["/cpu:1", "/cpu:2"])


def _get_variable(tf_scope):
    with tf_scope():
        get_variable("w", (2,))


def _variable_scope(tf_scope):
    with tf_scope():
        with variable_scope("model"):
            pass


def _layer_in_a_dpkeras_scope(tf_scope):
    with variable_scope("model"):
        with tf_scope():
            L.Dense(3, name="Layer").build((None, 4))


def _layer_under_dpkeras(tf_scope):
    with tf_scope():
        L.Dense(3, name="Layer").build((None, 4))


@pytest.mark.parametrize(
    "build,what",
    [
        (_get_variable, r"^dpkeras.get_variable\('w'\) is called"),
        (_variable_scope, r"^dpkeras.variable_scope\('model'\) is entered"),
        (
            _layer_in_a_dpkeras_scope,
            r"^Keras layer 'Layer' \(Dense\) creating weight 'kernel' in "
            r"dpkeras.variable_scope\('model'\)",
        ),
        (_layer_under_dpkeras, r"^A Keras layer creating weight 'Layer/kernel' under dpkeras"),
    ],
    ids=["get_variable", "variable_scope", "layer-in-a-dpkeras-scope", "layer-under-dpkeras"],
)
@pytest.mark.parametrize("reuse", [True, None])
def test_tensorflow_s_variable_scope_around_dpkeras_variables_is_refused(build, what, reuse):
    """TF1 code ported half-way: `tf.compat.v1.variable_scope(..., reuse=True)` would share
    nothing (and name nothing) without a word."""
    first = get_variable("first", (2,))  # a name that a reusing scope might have shared

    def tf_scope():
        return tf.compat.v1.variable_scope("towers", reuse=reuse)

    with _under_dpkeras():
        with pytest.raises(RuntimeError, match=what + _TF_SCOPE):
            build(tf_scope)
    assert [v.path for v in get_variables()] == [first.path]  # nothing was made
    with _under_dpkeras():  # the replacement the error names shares by name
        with variable_scope("towers"):
            v = get_variable("w", (2,))
        with variable_scope("towers", reuse=True):
            assert get_variable("w", (2,)) is v


def test_tensorflow_s_variable_scope_is_left_to_keras_without_dpkeras():
    """Without dpkeras (no dpkeras.scope(), variable_scope or get_variable), a Keras layer in
    TensorFlow's scope is Keras's business, as with any other strategy."""
    with tf.compat.v1.variable_scope("towers", reuse=True):
        layer = L.Dense(3, name="Layer")
        layer.build((None, 4))
    assert layer.kernel.path == "Layer/kernel"


# ---------------------------------------------------------------------------------------------
# TensorFlow's own get_variable (what tf_upgrade_v2 writes): under dpkeras's strategy it would
# make one variable per eager build and per tf.function trace, all of one name; refused by name.


def _upgraded_conv1():
    with tf.compat.v1.variable_scope("conv1", reuse=tf.compat.v1.AUTO_REUSE):
        return tf.compat.v1.get_variable("weights", [3, 3])


@pytest.mark.parametrize("where", ["eager", "tf.function"])
def test_tensorflow_s_get_variable_under_dpkeras_is_refused_naming_the_replacement(where):
    strategy = dpkeras.get_strategy(["/cpu:1", "/cpu:2"])
    before = len(dpkeras.placement_report(strategy).rows)
    build = _upgraded_conv1 if where == "eager" else tf.function(_upgraded_conv1)
    with strategy.scope():
        with pytest.raises(
            RuntimeError,
            # (a tf.function adds its traceback before TensorFlow's "RuntimeError: ")
            match=r"(?:^|\n    RuntimeError: )tf.compat.v1.get_variable\('conv1/weights'\) "
            r"was called under dpkeras's "
            r"strategy; in TensorFlow 2 it shares nothing, even with reuse=AUTO_REUSE: .* "
            r"Use dpkeras.get_variable\('weights'\) inside "
            r"dpkeras.variable_scope\('conv1', reuse=...\): .*shared by name\.$",
        ):
            build()
        with pytest.raises(RuntimeError, match=r"Use dpkeras.get_variable\('step'\): "):
            tf.compat.v1.get_variable("step", [], initializer=tf.zeros_initializer())
    assert len(dpkeras.placement_report(strategy).rows) == before  # nothing was made
    assert get_variables() == []


def test_tensorflow_s_get_variable_without_dpkeras_is_tensorflow_s():
    assert _upgraded_conv1().shape == (3, 3)  # no dpkeras strategy: TensorFlow's behaviour


def test_the_tf_internals_see_tensorflow_s_get_variable_on_the_stack():
    """Fails loudly if a TensorFlow upgrade wraps `tf.compat.v1.get_variable` (its code object
    would no longer be on the stack, and the refusal above would go silent)."""
    from dpkeras import _tf_internals

    seen = []

    def creator(next_creator, **kwargs):
        seen.append(_tf_internals.called_from_tf1_get_variable())
        return next_creator(**kwargs)

    with tf.variable_creator_scope(creator):
        tf.compat.v1.get_variable("w", [2])
        tf.Variable(1.0)
        tf.compat.v1.Variable(1.0)
    assert seen == [True, False, False]
