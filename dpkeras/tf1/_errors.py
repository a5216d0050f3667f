"""Validating the arguments of the TF1 layer, and its error messages, defined once.

Every error names the full path of the variable and what is valid: reusing a name that does
not exist lists the close names in the store; creating one that exists says how to reuse it.
"""

import difflib
import re

import keras
import numpy as np
import tensorflow as tf

from dpkeras.tf1._store import AUTO_REUSE

REUSE_VALUES = "True, False, None (inherit) or dpkeras.AUTO_REUSE"
_NAME_COMPONENT = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_.\-]*")


def validate_reuse(reuse):
    if reuse is AUTO_REUSE or reuse is None or reuse is True or reuse is False:
        return reuse
    if reuse is tf.compat.v1.AUTO_REUSE:
        return AUTO_REUSE
    raise ValueError(f"variable_scope(reuse=...) must be {REUSE_VALUES}. Received: reuse={reuse!r}")


def validate_name(name, function, argument, hint=""):
    valid = isinstance(name, str) and all(
        _NAME_COMPONENT.fullmatch(part) for part in name.split("/")
    )
    if not valid:
        raise ValueError(
            f"{function}(): {argument} must be a non-empty name made of letters, digits and "
            "'_', '.', '-', with '/' between nested names (such as 'model/conv1'). "
            f"Received: {argument}={name!r}.{hint if name == '' else ''}"
        )


def standardize_shape(what, shape):
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)
    try:
        dims = tuple(tf.TensorShape(shape).as_list())
    except (TypeError, ValueError) as error:
        raise ValueError(
            f"{what}: shape must be an int or a sequence of ints. Received: shape={shape!r}"
        ) from error
    if any(d is None for d in dims):
        raise ValueError(
            f"{what}: shape must be fully defined (no None dimensions). Received: shape={shape!r}"
        )
    return dims


def standardize_dtype(what, dtype):
    try:
        return keras.backend.standardize_dtype(dtype)
    except ValueError as error:
        raise ValueError(f"{what}: invalid dtype. Received: dtype={dtype!r}") from error


def dtype_name(dtype):
    if isinstance(dtype, tf.DType):
        dtype = dtype.base_dtype.name
    return keras.backend.standardize_dtype(dtype)


def join_path(prefix, name):
    return f"{prefix}/{name}" if prefix and name else prefix or name


def _scope_description(scope):
    if scope is None or (not scope.name and scope.reuse is False):
        return "outside every dpkeras.variable_scope, where variables are only created"
    if not scope.name:
        return f"the root scope (dpkeras.get_variable_scope()) has reuse={scope.reuse!r}"
    return f"scope '{scope.name}' has reuse={scope.reuse!r}"


def missing_error(what, path, scope, store):
    """The error for reusing `path`, missing from `store`, listing the names close to it."""
    paths = store.paths()
    leaf = path.rpartition("/")[2]
    close = difflib.get_close_matches(path, paths, n=5, cutoff=0.6)
    close += [p for p in paths if p.rpartition("/")[2] == leaf and p not in close][:5]
    if close:
        listing = "Close names: " + ", ".join(repr(p) for p in close) + "."
    elif paths:
        listing = f"None of the {len(paths)} names in the store is close to it."
    else:
        listing = "The variable store is empty."
    return ValueError(
        f"{what}: variable '{path}' does not exist, and {_scope_description(scope)}, which "
        f"only reuses existing variables. {listing} Create it first (reuse=False or None), or "
        "use reuse=dpkeras.AUTO_REUSE to create it when it is missing."
    )


def exists_error(what, entry, scope):
    hint = ""
    parent = scope.parent if scope is not None else None
    if parent is not None and parent.reuse is not False:
        hint = (
            f" (The enclosing scope '{parent.name}' has reuse={parent.reuse!r}, but reuse=False "
            "on an inner scope is explicit; pass reuse=None to inherit.)"
        )
    return ValueError(
        f"{what}: variable '{entry.path}' already exists (shape {entry.shape}, "
        f"{entry.dtype}), and {_scope_description(scope)}, which only creates variables. To "
        "share it, enter the scope with reuse=True or dpkeras.AUTO_REUSE (or call "
        "scope.reuse_variables()); to make a distinct variable, use another name or scope."
        f"{hint}"
    )


def check_reuse(what, entry, shape, dtype):
    if shape is not None and tuple(shape) != tuple(entry.shape):
        raise ValueError(
            f"{what}: cannot reuse variable '{entry.path}' with shape {tuple(shape)}: it was "
            f"created with shape {tuple(entry.shape)}. A reused variable keeps the shape and "
            "dtype it was created with."
        )
    if dtype is not None and dtype != entry.dtype:
        raise ValueError(
            f"{what}: cannot reuse variable '{entry.path}' with dtype {dtype}: it was created "
            f"with dtype {entry.dtype}. A reused variable keeps the shape and dtype it was "
            "created with."
        )
    strategy = tf.distribute.get_strategy()
    if tf.distribute.has_strategy() and strategy is not entry.strategy:
        raise ValueError(
            f"{what}: variable '{entry.path}' was created under {_describe(entry.strategy)} "
            f"and is being reused under {_describe(strategy)}. Variables shared by name must "
            "live under one strategy: build every user of it inside the same dpkeras.scope()."
        )


def _describe(strategy):
    if strategy is None or type(strategy).__name__ == "_DefaultDistributionStrategy":
        return "no strategy"
    return f"strategy {strategy!r}"


def check_can_partition(what, partitioner):
    if getattr(tf.distribute.get_strategy().extended, "partitioner", False) is False:
        raise ValueError(
            f"{what}: partitioner={partitioner!r} needs dpkeras.scope() (or a "
            f"ParameterDeviceStrategy's scope), which places the shards on the parameter "
            f"devices. Received it under {tf.distribute.get_strategy()!r}."
        )


def late_message(scope, weights):
    return (
        f"dpkeras.variable_scope('{scope.name}'): Keras created weights {weights[:5]} only "
        "after building a model symbolically (as it does for a model without a build() "
        "method inside fit(), evaluate() or predict()), when the layers that declared them "
        "were no longer known, so they were not shared by name and are not in the variable "
        "store. Build the model inside the scope before training: give it a "
        "build(input_shape) method that builds its layers inside dpkeras.variable_scope and "
        "call model.build(input_shape), or call the model once on a batch of data."
    )
