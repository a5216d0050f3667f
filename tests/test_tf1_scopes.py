"""dpkeras.tf1._scopes: scopes prefix names and decide reuse (TF1 idioms 5 and 6)."""

import threading

import numpy as np
import pytest
import tensorflow as tf

import dpkeras
from dpkeras.tf1 import (
    AUTO_REUSE,
    VariableScope,
    VariableStore,
    get_variable,
    get_variable_scope,
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


# ---------------------------------------------------------------------------------------------
# The root scope: TF1's `tf.get_variable_scope()` at top level, and its reuse_variables(), the
# tower loop's idiom.


def _tower(x):
    """A TF1 tower: get_variable in a scope of its own."""
    with variable_scope("fc"):
        w = get_variable("weights", (3, 2))
        b = get_variable("biases", (2,), initializer=0.0)
    return tf.matmul(x, w) + b, (w, b)


def test_get_variable_scope_is_the_innermost_scope_else_the_root():
    root = get_variable_scope()
    assert (root.name, root.reuse) == ("", False)
    assert get_variable_scope() is root  # one root per store and thread
    with variable_scope("model") as scope:
        assert get_variable_scope() is scope
        with variable_scope("inner") as inner:
            assert get_variable_scope() is inner
    assert get_variable_scope() is root
    assert dpkeras.get_variable_scope is get_variable_scope


def test_the_tower_loop_as_written_in_tf1_shares_one_set_of_variables():
    """`for i in range(n): with tf.device(...), tf.name_scope(f"tower_{i}"): loss = tower(...);
    tf.get_variable_scope().reuse_variables()`, under dpkeras's scope."""
    x = tf.ones((4, 3))
    made = []
    with dpkeras.scope(["/cpu:1", "/cpu:2"], "/cpu:0"):
        for i in range(2):
            with tf.device("/cpu:0"), tf.name_scope(f"tower_{i}"):
                loss, variables = _tower(x)
                made.append(variables)
            get_variable_scope().reuse_variables()
    assert made[1][0] is made[0][0] and made[1][1] is made[0][1]
    assert get_variable_store().paths() == ["fc/weights", "fc/biases"]
    assert made[0][0].value.device.endswith("CPU:0")
    assert get_variable_scope().reuse is True  # as TF1's root scope: for good, in this store
    with VariableStore():
        assert get_variable_scope().reuse is False  # a new store (a new graph in TF1)
    get_variable_store().clear()
    assert get_variable_scope().reuse is False  # tf.reset_default_graph()


def test_reentering_the_root_keeps_the_reuse_to_the_block():
    """cifar10_multi_gpu_train's `with tf.variable_scope(tf.get_variable_scope()):` around the
    loop: after it, the root creates again (the optimizer's variables, say)."""
    x = tf.ones((4, 3))
    with variable_scope(get_variable_scope()) as root:
        assert (root.name, root.reuse) == ("", False)
        for i in range(3):
            with tf.name_scope(f"tower_{i}"):
                _, variables = _tower(x)
            get_variable_scope().reuse_variables()
            assert get_variable_scope() is root and root.reuse is True
    assert get_variable_scope().reuse is False
    assert get_variable("global_step", (), initializer=0).path == "global_step"
    assert get_variable_store().paths() == ["fc/weights", "fc/biases", "global_step"]
    with variable_scope(get_variable_scope(), reuse=True):
        with variable_scope("fc"):
            assert get_variable("weights") is variables[0]


def test_the_root_scope_s_reuse_is_this_thread_s():
    get_variable_scope().reuse_variables()
    store = get_variable_store()
    seen = []

    def other():
        with store:
            seen.append(get_variable_scope().reuse)

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    assert seen == [False] and get_variable_scope().reuse is True


def test_error_reusing_at_top_level_a_name_that_does_not_exist():
    get_variable("w", (2,))
    get_variable_scope().reuse_variables()
    assert get_variable("w") is get_variable("w")
    with pytest.raises(
        ValueError,
        match=r"^get_variable\('v'\): variable 'v' does not exist, and the root scope "
        r"\(dpkeras.get_variable_scope\(\)\) has reuse=True, which only reuses existing "
        r"variables. None of the 1 names in the store is close to it",
    ):
        get_variable("v", (2,))
    with pytest.raises(ValueError, match=r"variable 'conv/v' does not exist, and scope 'conv'"):
        with variable_scope("conv"):  # inherits the root's reuse
            get_variable("v", (2,))
    assert get_variable_store().paths() == ["w"]  # nothing was made


def test_error_variable_scope_of_an_empty_name_names_the_root_scope():
    with pytest.raises(
        ValueError,
        match=r"^variable_scope\(\): name_or_scope must be a non-empty name .* "
        r"Received: name_or_scope=''\. To re-enter the root scope, pass "
        r"dpkeras.get_variable_scope\(\) at top level\.$",
    ):
        with variable_scope(""):
            pass
    assert get_variable_scope().name == "" and len(get_variable_store()) == 0
