"""Model, regular and local variables, and the lists slim kept of them."""

import keras
import numpy as np
import tensorflow as tf

from dpkeras.tf1._errors import dtype_name
from dpkeras.tf1._get_variable import get_or_create
from dpkeras.tf1._scopes import VariableScope
from dpkeras.tf1._sharing import process_pending
from dpkeras.tf1._state import get_variable_store
from dpkeras.tf1._store import LOCAL, MODEL, REGULAR, Entry, same_variable, store_of_model


class LocalVariable:
    """A transient variable, as returned by `local_variable`: usable like one, never saved.

    It wraps a non-trainable `keras.Variable` without being one, and is not a TensorFlow
    trackable either: a Keras layer that holds it as an attribute does not count it among its
    `weights` (so `.keras` files leave it out), and TensorFlow checkpoints do not see it.
    It converts to a tensor wherever one is expected (`keras.ops`, `tf` functions, arithmetic)
    and has `assign`, `assign_add`, `assign_sub`, `numpy()`, `value`, `path`, `shape`, `dtype`.

    Example:

    ```python
    import dpkeras

    with dpkeras.VariableStore():
        seen = dpkeras.local_variable("examples_seen", (), dtype="int64")
        seen.assign_add(32)
        assert int(seen.numpy()) == 32 and dpkeras.get_variables() == []
    ```
    """

    def __init__(self, variable):
        self._variable = variable

    @property
    def variable(self):
        """The wrapped `keras.Variable`."""
        return self._variable

    @property
    def value(self):
        return self._variable.value

    @property
    def name(self):
        return self._variable.name

    @property
    def path(self):
        return self._variable.path

    @property
    def shape(self):
        return self._variable.shape

    @property
    def dtype(self):
        return self._variable.dtype

    @property
    def trainable(self):
        return False

    def numpy(self):
        return self._variable.numpy()

    def assign(self, value):
        self._variable.assign(value)
        return self

    def assign_add(self, value):
        self._variable.assign_add(value)
        return self

    def assign_sub(self, value):
        self._variable.assign_sub(value)
        return self

    def __tf_tensor__(self, dtype=None, name=None):
        return tf.convert_to_tensor(self._variable.value, dtype=dtype, name=name)

    def __array__(self, dtype=None, copy=None):
        return np.asarray(self.numpy(), dtype=dtype)

    def __add__(self, other):
        return self._variable + other

    def __radd__(self, other):
        return other + self._variable

    def __sub__(self, other):
        return self._variable - other

    def __rsub__(self, other):
        return other - self._variable

    def __mul__(self, other):
        return self._variable * other

    def __rmul__(self, other):
        return other * self._variable

    def __truediv__(self, other):
        return self._variable / other

    def __rtruediv__(self, other):
        return other / self._variable

    def __neg__(self):
        return -self._variable

    def __getitem__(self, index):
        return self._variable[index]

    def __repr__(self):
        return f"<LocalVariable path={self.path!r} shape={tuple(self.shape)} dtype={self.dtype}>"


def variable(
    name,
    shape=None,
    dtype="float32",
    initializer=None,
    regularizer=None,
    trainable=True,
    device=None,
):
    """Creates (or, in a reusing scope, returns) a regular variable; slim's `variable`.

    Regular variables are listed by `get_variables()` but not by `get_model_variables()`.
    One call sets the initializer, attaches a regularizer and places the variable.

    Args:
        name: str, the name in the current `dpkeras.variable_scope`.
        shape: int or tuple of ints; may be implied by `initializer`. Defaults to `None`.
        dtype: str or dtype. Defaults to `"float32"`.
        initializer: a Keras initializer or a value. Defaults to glorot uniform (floats)
            or zeros.
        regularizer: a Keras regularizer or callable. Its loss counts in a Keras model that
            holds the variable and is listed by `regularization_losses()`. Defaults to `None`.
        trainable: bool. Defaults to `True`.
        device: str, such as `"/CPU:0"`. Defaults to `None`.

    Returns:
        A `keras.Variable`.

    Example:

    ```python
    import keras
    import dpkeras

    with dpkeras.VariableStore():
        weights = dpkeras.variable(
            "weights",
            shape=(10, 10, 3, 3),
            initializer=keras.initializers.TruncatedNormal(stddev=0.1),
            regularizer=keras.regularizers.L2(0.05),
            device="/CPU:0",
        )
        assert len(dpkeras.regularization_losses()) == 1
    ```
    """
    return get_or_create(
        name,
        shape=shape,
        dtype=dtype,
        initializer=initializer,
        regularizer=regularizer,
        trainable=trainable,
        device=device,
        kind=REGULAR,
    )


def model_variable(
    name,
    shape=None,
    dtype="float32",
    initializer=None,
    regularizer=None,
    trainable=True,
    device=None,
):
    """Creates (or, in a reusing scope, returns) a model variable; slim's `model_variable`.

    Model variables are the parameters of the model, listed by `get_model_variables()` as
    the weights of Keras layers built inside a `dpkeras.variable_scope` are. Arguments as for
    `variable`.

    Returns:
        A `keras.Variable`.

    Example:

    ```python
    import dpkeras

    with dpkeras.VariableStore():
        w = dpkeras.model_variable("w", (2, 2))
        assert dpkeras.get_model_variables() == [w]
    ```
    """
    return get_or_create(
        name,
        shape=shape,
        dtype=dtype,
        initializer=initializer,
        regularizer=regularizer,
        trainable=trainable,
        device=device,
        kind=MODEL,
    )


def local_variable(name, shape=None, dtype="float32", initializer="zeros", device=None):
    """Creates (or, in a reusing scope, returns) a local variable, which is never saved.

    Local variables are transient (counters, streaming sums): not trainable, not among a
    layer's `weights` even when a layer holds one, absent from `.keras` files and TensorFlow
    checkpoints, and listed only by `get_local_variables()`. slim's
    `local_variable(initial_value, name)` is `local_variable(name, initializer=initial_value)`.

    Args:
        name: str, the name in the current `dpkeras.variable_scope`.
        shape: int or tuple of ints; may be implied by `initializer`. Defaults to `None`.
        dtype: str or dtype. Defaults to `"float32"`.
        initializer: a Keras initializer or a value. Defaults to `"zeros"`.
        device: str, such as `"/CPU:0"`. Defaults to `None`.

    Returns:
        A `LocalVariable`.

    Example:

    ```python
    import dpkeras

    with dpkeras.VariableStore():
        total = dpkeras.local_variable("total", initializer=0.0)
        total.assign_add(2.5)
        assert dpkeras.get_local_variables() == [total]
    ```
    """
    return get_or_create(
        name,
        shape=shape,
        dtype=dtype,
        initializer=initializer,
        regularizer=None,
        trainable=False,
        device=device,
        kind=LOCAL,
        wrap=LocalVariable,
    )


def get_variables(scope=None):
    """Returns the model and regular variables (not local ones); slim's `get_variables`.

    slim sorted variables into kinds. A *model variable* is a parameter of the model: trained or
    fine-tuned, and loaded from checkpoints for inference; Keras layers create model variables. A
    *regular variable* (`global_step`, a moving average) is used while training or evaluating but
    is not needed for inference. A *local variable* is transient and never saved. `variable`,
    `model_variable` and `local_variable` create variables of each kind by name (with
    `dpkeras.variable_scope` reuse); these functions list them:

    ```python
    import keras
    import dpkeras

    with dpkeras.VariableStore():
        with dpkeras.variable_scope("net"):
            l2 = keras.regularizers.L2(0.05)
            weights = dpkeras.model_variable("weights", (3, 2), regularizer=l2)
            step = dpkeras.variable("global_step", (), dtype="int64", trainable=False)
            seen = dpkeras.local_variable("examples_seen", (), dtype="int64")
            keras.layers.Dense(2, name="fc").build((None, 3))
        print([v.path for v in dpkeras.get_model_variables()])
        # ['net/weights', 'net/fc/kernel', 'net/fc/bias']
        print([v.path for v in dpkeras.get_variables()])
        # ['net/weights', 'net/global_step', 'net/fc/kernel', 'net/fc/bias']
        print(len(dpkeras.regularization_losses()))  # 1
    ```

    Lists are read from the current `dpkeras.VariableStore` (see `dpkeras.get_variable_store`);
    pass a scope, a path or a Keras model to narrow them.

    Args:
        scope: `None` for every variable of the current store; a `VariableScope` or a path
            string (`"model/conv1"`) for those at or below that path; a Keras model or layer
            for the variables it was built with. Defaults to `None`.

    Returns:
        A list of `keras.Variable`, in creation order, each shared variable once.

    Example:

    ```python
    import dpkeras

    with dpkeras.VariableStore():
        with dpkeras.variable_scope("a"):
            x = dpkeras.get_variable("x", ())
        with dpkeras.variable_scope("b"):
            y = dpkeras.get_variable("y", ())
        assert dpkeras.get_variables("a") == [x]
    ```
    """
    return [entry.public for entry in _entries(scope, (MODEL, REGULAR))]


def get_model_variables(scope=None):
    """Returns the model variables; slim's `get_model_variables`.

    These are the weights of Keras layers built inside a `dpkeras.variable_scope`, variables
    made with `model_variable`, and those registered with `add_model_variable`.

    Args:
        scope: as for `get_variables`. Defaults to `None`.

    Returns:
        A list of `keras.Variable`, in creation order.

    Example:

    ```python
    import keras
    import dpkeras

    with dpkeras.VariableStore():
        with dpkeras.variable_scope("net"):
            keras.layers.Dense(2, name="fc").build((None, 3))
        assert [v.path for v in dpkeras.get_model_variables()] == ["net/fc/kernel", "net/fc/bias"]
    ```
    """
    return [entry.public for entry in _entries(scope, (MODEL,))]


def get_local_variables(scope=None):
    """Returns the local variables (see `local_variable`).

    Args:
        scope: as for `get_variables`. Defaults to `None`.

    Returns:
        A list of `LocalVariable`, in creation order.
    """
    return [entry.public for entry in _entries(scope, (LOCAL,))]


def add_model_variable(variable):
    """Registers a variable made by custom code as a model variable; slim's.

    A variable that the current store already holds becomes a model variable; any other is
    added to the store under its Keras path (`variable.path`), or its TensorFlow name.

    Args:
        variable: a `keras.Variable` or `tf.Variable`.

    Raises:
        TypeError: for anything else.
        ValueError: for a local variable, which is never saved, or when another variable
            already has the same path.

    Example:

    ```python
    import keras
    import dpkeras

    with dpkeras.VariableStore():
        counter = keras.Variable(0.0, name="counter")
        dpkeras.add_model_variable(counter)
        assert dpkeras.get_model_variables() == [counter]
    ```
    """
    if isinstance(variable, LocalVariable):
        raise ValueError(
            f"add_model_variable(): '{variable.path}' is a local variable. Model variables "
            "are saved with the model and local variables never are, so a variable cannot be "
            "both; create it with model_variable() instead."
        )
    if not isinstance(variable, (keras.Variable, tf.Variable)):
        raise TypeError(
            "add_model_variable() takes a keras.Variable or a tf.Variable. Received: "
            f"variable={variable!r} (of type {type(variable).__name__})"
        )
    process_pending()
    store = get_variable_store()
    with store.lock:
        entry = store.find(variable)
        if entry is not None:
            entry.kind = MODEL
            return
        if isinstance(variable, keras.Variable):
            path = variable.path
        else:
            path = variable.name.split(":")[0]
        if path in store:
            raise ValueError(
                f"add_model_variable(): the store already holds another variable named "
                f"'{path}'. Each name in a store belongs to one variable; give this one "
                "another name."
            )
        entry = Entry(
            path=path,
            kind=MODEL,
            shape=tuple(tf.TensorShape(variable.shape).as_list()),
            dtype=dtype_name(variable.dtype),
            strategy=tf.distribute.get_strategy(),
        )
        if isinstance(variable, keras.Variable):
            entry.keras_variable = variable
        else:
            entry.raw = variable
        store.add(entry)


def regularization_losses(scope=None):
    """Returns the current regularization losses of the variables that have a regularizer.

    For a variable that belongs to a Keras model, Keras already adds this loss to the model's
    loss (`model.losses`); use the list for custom training loops, as TF1 code used
    `tf.losses.get_regularization_losses()`.

    Args:
        scope: as for `get_variables`. Defaults to `None`.

    Returns:
        A list of scalar tensors, one per regularized variable.

    Example:

    ```python
    import keras
    import dpkeras

    with dpkeras.VariableStore():
        dpkeras.get_variable("w", initializer=[3.0, 4.0], regularizer=keras.regularizers.L2(0.5))
        assert float(sum(dpkeras.regularization_losses())) == 12.5
    ```
    """
    losses = []
    for entry in _entries(scope, (MODEL, REGULAR)):
        keras_variable = entry.keras_variable
        if keras_variable is not None and keras_variable.regularizer is not None:
            losses.append(keras_variable.regularizer(keras_variable))
    return losses


def _entries(scope, kinds):
    """The store entries of the given kinds that `scope` selects (see get_variables)."""
    process_pending()
    if scope is None:
        entries = get_variable_store().entries()
    elif isinstance(scope, VariableScope):
        entries = _below(scope.store.entries(), scope.name)
    elif isinstance(scope, str):
        entries = _below(get_variable_store().entries(), scope.rstrip("/"))
    elif isinstance(scope, keras.layers.Layer):
        own = store_of_model(scope)
        if own is not None:
            entries = own.entries()
        else:
            held = list(scope.variables)
            entries = [
                entry
                for entry in get_variable_store().entries()
                if any(same_variable(entry.variable, v) for v in held)
            ]
    else:
        raise TypeError(
            "scope must be None, a dpkeras VariableScope, a path string or a Keras "
            f"layer/model. Received: scope={scope!r} (of type {type(scope).__name__})"
        )
    return [entry for entry in entries if entry.kind in kinds]


def _below(entries, path):
    if not path:
        return entries
    return [e for e in entries if e.path == path or e.path.startswith(path + "/")]
