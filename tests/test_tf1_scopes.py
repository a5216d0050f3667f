"""dpkeras.tf1._scopes: scopes prefix names and decide reuse (TF1 idioms 5 and 6)."""

import numpy as np
import tensorflow as tf

from dpkeras.tf1 import (
    AUTO_REUSE,
    VariableScope,
    get_variable,
    get_variable_store,
    variable_scope,
)
from tests.tf1_models import (
    _fresh_store,  # noqa: F401 (an autouse fixture)
    conv_relu,
    images,
)

# ---------------------------------------------------------------------------------------------
# Idiom 5: variable_scope prefixes names, so one builder makes distinct variables per scope.


def test_idiom5_scopes_prefix_names_and_nest():
    x, _ = images()
    with variable_scope("model"):
        with variable_scope("conv1"):
            relu1 = conv_relu(x, (3, 3, 3, 4), (4,))
        with variable_scope("conv2"):
            conv_relu(relu1, (3, 3, 4, 4), (4,))
    assert get_variable_store().paths() == [
        "model/conv1/weights",
        "model/conv1/biases",
        "model/conv2/weights",
        "model/conv2/biases",
    ]
    with variable_scope("model/conv1", reuse=True) as scope:
        assert scope.name == "model/conv1"
        assert get_variable("weights").path == "model/conv1/weights"


# ---------------------------------------------------------------------------------------------
# Idiom 6: sharing a whole model: reuse=True around a second call, scope.reuse_variables(),
# re-entering the scope object, and AUTO_REUSE.


def image_filter(x):
    with variable_scope("conv1"):
        relu1 = conv_relu(x, (3, 3, 3, 4), (4,))
    with variable_scope("conv2"):
        return conv_relu(relu1, (3, 3, 4, 4), (4,))


def test_idiom6_reuse_true_around_a_second_call():
    x1, _ = images(seed=1)
    with variable_scope("model"):
        out1 = image_filter(x1)
    with variable_scope("model", reuse=True):
        out2 = image_filter(x1)
    np.testing.assert_allclose(out1, out2)
    assert len(get_variable_store()) == 4


def test_idiom6_reuse_variables_inside_the_first_scope():
    x1, _ = images(seed=1)
    with variable_scope("model") as scope:
        out1 = image_filter(x1)
        assert scope.reuse is False
        scope.reuse_variables()
        assert scope.reuse is True
        out2 = image_filter(x1)
    np.testing.assert_allclose(out1, out2)


def test_idiom6_reentering_the_scope_object_anywhere():
    x1, _ = images(seed=1)
    with variable_scope("model") as model_scope:
        out1 = image_filter(x1)
    with variable_scope("elsewhere"):
        with variable_scope(model_scope, reuse=True) as scope:
            assert isinstance(scope, VariableScope)
            assert scope.name == "model"  # the object's full path, not elsewhere/model
            out2 = image_filter(x1)
    np.testing.assert_allclose(out1, out2)


def test_idiom6_auto_reuse_creates_when_missing_and_reuses_otherwise():
    def counter():
        with variable_scope("counters", reuse=AUTO_REUSE):
            return get_variable("count", (), initializer=0.0)

    first = counter()
    assert counter() is first
    with variable_scope("counters", reuse=tf.compat.v1.AUTO_REUSE) as scope:
        assert scope.reuse is AUTO_REUSE
        assert get_variable("count", ()) is first
    assert repr(AUTO_REUSE) == "dpkeras.AUTO_REUSE"


def test_idiom6_reuse_is_inherited_by_inner_scopes():
    with variable_scope("outer", reuse=AUTO_REUSE):
        with variable_scope("inner") as inner:
            assert inner.reuse is AUTO_REUSE
    with variable_scope("top") as top:
        top.reuse_variables()
        with variable_scope("child") as child:
            assert child.reuse is True
    with variable_scope(top) as reentered:  # reuse=None: the scope object's reuse
        assert reentered.reuse is True
    with variable_scope(top, reuse=False) as explicit:
        assert explicit.reuse is False
