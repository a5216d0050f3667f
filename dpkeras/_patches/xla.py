"""Keras's steps of a dpkeras model compiled with `jit_compile=True`: whether XLA compiles them,
decided once, and `predict` compiled whole.

One decision (`why_not_xla`), asked by `fit`, `evaluate` and `predict` alike: XLA compiles a
function for one device and cannot read a resource that lives on another, so a model whose
variables say XLA cannot compile a step that reads them (`PlacedVariable.why_not_xla`: a
replicated variable, with a copy on every compute device; a variable on another task of a
cluster) runs its steps without XLA, with one warning per model, and gives the same numbers.
A model without variables yet is decided by its strategy: on a cluster a step runs on a task,
away from the variables; Keras builds a model made without an `Input` in its first step, which
`predict` (unlike `fit` and `evaluate`) makes before building it, so the strategy's policy
decides (a `placement.hybrid()` policy replicates every variable but tables and metric state,
and a strategy that has replicated a variable has a policy that does).

`predict` compiled whole: Keras 3.15's TF trainer compiles `fit`'s and `evaluate`'s step whole
(the function that calls `strategy.run`), but `predict`'s per replica: the XLA function each
replica runs reads the model's variables, and XLA cannot read a resource that lives on another
device (the parameter device): "Trying to access resource ... located in CPU:0 from device
CPU:2". MirroredStrategy escapes this because each replica has its own copy of every variable.
For a dpkeras model, `predict` is compiled as `fit` is: the per-replica step without XLA, the
distributed step (or the K steps of `steps_per_execution`) with it. The numbers are the same.
"""

import logging
import weakref

import keras
import tensorflow as tf

from dpkeras import placement
from dpkeras._extended.extended import extended_of
from dpkeras._variables import placed

_log = logging.getLogger("dpkeras")
_warned = weakref.WeakSet()  # models told that their steps run without XLA


def _variables_say(variables):
    for variable in variables:
        ours = placed.of(variable)
        reason = None if ours is None else ours.why_not_xla()
        if reason:
            return reason
    return None


def why_not_xla(model):
    """Why XLA cannot compile `model`'s steps under its dpkeras strategy (a phrase), or None:
    XLA can, or the model is not dpkeras's (see the module)."""
    reason = _variables_say(
        v.value if isinstance(v, keras.Variable) else v for v in model.variables
    )
    if reason:
        return reason
    extended = extended_of(model)
    if extended is None:
        return None
    reason = placed.why_xla_cannot_reach(extended)
    if reason:
        return reason
    if model.built:
        return None
    if placement.is_hybrid(extended.placement_policy):
        return "placement.hybrid() replicates its variables, and XLA compiles a step for one device"
    return _variables_say(extended.variables())


def without_xla_if_it_cannot(original, model, force=False):
    """Wraps Keras's `make_{train,test,predict}_function`: a model with `jit_compile=True` that
    XLA cannot compile (`why_not_xla`) gets its step built without XLA, with one warning per
    model (see the module)."""
    if not model.jit_compile or model.run_eagerly:
        return original(model, force)
    reason = why_not_xla(model)
    if reason is None:
        return original(model, force)
    if model not in _warned:
        _warned.add(model)
        _log.warning(
            "dpkeras: model %r was compiled with jit_compile=True, but its steps run without "
            "XLA: %s. Proceeding with jit_compile=False for its steps.",
            model.name,
            reason,
        )
    model.jit_compile = False
    try:
        return original(model, force)
    finally:
        model.jit_compile = True


def whole_step_compiled(original, model, force=False):
    """Wraps Keras's `make_predict_function` (see the module): for a dpkeras model with
    `jit_compile=True`, XLA compiles the distributed step instead of each replica's."""
    if (
        extended_of(model) is None
        or not model.jit_compile
        or model.run_eagerly
        or (model.predict_function is not None and not force)
    ):
        return original(model, force)
    if why_not_xla(model) is not None:
        return without_xla_if_it_cannot(original, model, force)
    model.jit_compile = False  # Keras then builds the per-replica step without XLA
    try:
        original(model, force)
    finally:
        model.jit_compile = True
    model.predict_function = tf.function(
        model.predict_function.python_function, reduce_retracing=True, jit_compile=True
    )
    return model.predict_function
