"""`predict` of a dpkeras model compiled with `jit_compile=True`: XLA compiles the whole step.

Keras 3.15's TF trainer compiles `fit`'s and `evaluate`'s step whole (the function that calls
`strategy.run`), but `predict`'s per replica: the XLA function each replica runs reads the
model's variables, and XLA cannot read a resource that lives on another device (the parameter
device): "Trying to access resource ... located in CPU:0 from device CPU:2". MirroredStrategy
escapes this because each replica has its own copy of every variable. For a dpkeras model,
`predict` is compiled as `fit` is: the per-replica step without XLA, the distributed step (or
the K steps of `steps_per_execution`) with it. The numbers are the same.

A model with replicated variables (`placement.REPLICATED`, `placement.hybrid()`) runs its
steps without XLA: XLA compiles a function for one device, and a replicated variable lives on
every compute device ("Trying to access resource ... located in CPU:1 from device CPU:0").
`fit`, `evaluate` and `predict` warn once and give the same numbers. Keras builds a model
made without an `Input` in its first step, which `predict` (unlike `fit` and `evaluate`) makes
before building it: for such a model the strategy's policy decides (`_replicates`).
"""

import logging
import weakref

import keras
import tensorflow as tf

from dpkeras import placement
from dpkeras._extended.extended import extended_of
from dpkeras._variables.replicated import ReplicatedVariable

_log = logging.getLogger("dpkeras")
_warned = weakref.WeakSet()  # models told that their steps run without XLA


def _has_replicated(model):
    return any(
        isinstance(v.value if isinstance(v, keras.Variable) else v, ReplicatedVariable)
        for v in model.variables
    )


def _replicates(model):
    """Whether `model` has replicated variables, or will have them once built.

    A model not built yet (Keras builds a model made without an `Input` in its first step,
    which `predict` traces after choosing XLA or not) is decided by its strategy: a
    `placement.hybrid()` policy replicates every variable but tables and metric state, and a
    strategy that has replicated a variable has a policy that does.
    """
    if _has_replicated(model):
        return True
    extended = extended_of(model)
    if extended is None or model.built:
        return False
    return placement.is_hybrid(extended.placement_policy) or any(
        isinstance(v, ReplicatedVariable) for v in extended.variables()
    )


def without_xla_if_replicated(original, model, force=False):
    """Wraps Keras's `make_{train,test,predict}_function`: a model with `jit_compile=True`
    and replicated variables gets its step built without XLA (see the module)."""
    if not model.jit_compile or model.run_eagerly or not _replicates(model):
        return original(model, force)
    if model not in _warned:
        _warned.add(model)
        _log.warning(
            "dpkeras: model %r has replicated variables (placement.REPLICATED); XLA compiles "
            "a step for one device, so its steps run without XLA (jit_compile=True is ignored).",
            model.name,
        )
    model.jit_compile = False
    try:
        return original(model, force)
    finally:
        model.jit_compile = True


def whole_step_compiled(original, model, force=False):
    """Wraps Keras's `make_predict_function` (see the module): for a dpkeras model with
    `jit_compile=True`, XLA compiles the distributed step instead of each replica's."""
    if _replicates(model):
        return without_xla_if_replicated(original, model, force)
    if (
        extended_of(model) is None
        or not model.jit_compile
        or model.run_eagerly
        or (model.predict_function is not None and not force)
    ):
        return original(model, force)
    model.jit_compile = False  # Keras then builds the per-replica step without XLA
    try:
        original(model, force)
    finally:
        model.jit_compile = True
    model.predict_function = tf.function(
        model.predict_function.python_function, reduce_retracing=True, jit_compile=True
    )
    return model.predict_function
