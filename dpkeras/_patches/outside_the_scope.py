"""A model compiled outside its strategy, or trained beside a cluster strategy never entered.

Both were silent or raw before: Keras 3 lets a model built under a strategy be compiled outside
its scope (the optimizer's and metrics' variables then land outside the strategy, and an
optimizer with slots fails in `fit` with TensorFlow's "Mixing different tf.distribute.Strategy
objects"), and a model built without any strategy trains on the client alone while the cluster
a `ParameterDeviceStrategy(cluster=...)` joined idles. Each is refused by name, before Keras
creates anything:

- `compiling_in_the_model_scope` wraps `compile`;
- `refusing_an_idle_cluster` wraps `fit`;
- `awaiting_entry` / `entered` keep, weakly, the cluster strategies made and not yet entered.
"""

import threading
import weakref

import keras
import tensorflow as tf

from dpkeras import _keras_internals
from dpkeras._extended.extended import extended_of, extended_of_variable


class _Clusters:
    """The cluster strategies of this process made but never entered, and whether one was."""

    def __init__(self):
        self.lock = threading.Lock()
        self.unentered = weakref.WeakSet()
        self.one_was_entered = False


_CLUSTERS = _Clusters()

# Models made outside any scope that adopted their variables' strategy at a first compile
# (keras-io's end-to-end wrapper): compiled again, with no scope, they adopt it again instead
# of counting as "built under" it (adopting sets the model's strategy).
_ADOPTED = weakref.WeakSet()


def awaiting_entry(strategy):
    """Notes a strategy on a cluster, made and not yet entered (called when it is made)."""
    with _CLUSTERS.lock:
        _CLUSTERS.unentered.add(strategy)


def entered(strategy):
    """Notes that `strategy`'s scope was entered (called at each entry; cheap after the first)."""
    if extended_of(strategy).cluster_spec is None:
        return
    with _CLUSTERS.lock:
        _CLUSTERS.unentered.discard(strategy)
        _CLUSTERS.one_was_entered = True


def _scope_text(strategy):
    if not tf.distribute.has_strategy():
        return "no strategy is in scope"
    if extended_of(strategy) is None:
        return f"a {type(strategy).__name__} is in scope"
    return f"{strategy!r} is in scope"


def _holders(model):
    """{extended or None: names of `model`'s direct sub-layers holding such variables}, in
    order: which of the layers a model is made of hold variables of which dpkeras strategy
    (None: of no dpkeras strategy)."""
    holders, seen = {}, set()
    for layer in getattr(model, "layers", None) or ():
        for v in layer.variables:
            seen.add(id(v))
            holders.setdefault(extended_of_variable(v), []).append(layer.name)
    for v in model.variables:  # the model's own variables, of no sub-layer
        if id(v) not in seen:
            holders.setdefault(extended_of_variable(v), []).append(model.name)
    return {owner: list(dict.fromkeys(names)) for owner, names in holders.items()}


def _names(names):
    return ", ".join(f"'{name}'" for name in names)


def _of_one_strategy(model, extended):
    """Returns if every variable of `model`, made outside any strategy's scope (keras-io's
    end-to-end inference wrapper around a model trained under a strategy), belongs to
    `extended`'s strategy, which it then adopts. Variables of another strategy, or of none,
    beside them: ValueError (fit would fail on the first one not of the strategy), naming the
    layers holding each.
    """
    strategy = extended.strategy
    holders = _holders(model)
    mine = holders.pop(extended, [])
    if not holders:
        return
    others = "; ".join(
        f"{_names(names)} of {'no strategy' if owner is None else repr(owner.strategy)}"
        for owner, names in holders.items()
    )
    raise ValueError(
        f"Model '{model.name}' was made outside any strategy's scope and holds variables of "
        f"more than one strategy: {_names(mine)} of {strategy!r}; {others}. A model trains "
        f"under one strategy, and holds variables made in that strategy's scope only. Make "
        f"the other layers (and the model) inside `with strategy.scope():` of {strategy!r} "
        f"(or `dpkeras.scope(...)`)."
    )


def compiling_in_the_model_scope(original, model, *args, **kwargs):
    """Wraps Keras's `compile`: a model of a dpkeras strategy compiles in that strategy's scope.

    Keras's TF optimizer belongs to the strategy in scope when it is made and a metric's
    variables to the one in scope when `compile` makes them, so for a model built under a
    dpkeras strategy, `compile` outside its scope (no strategy or another one in scope), or
    with an optimizer object made outside it, raises ValueError naming the model, its strategy
    and the fix, before anything is created.

    A model made outside any scope whose variables all belong to one dpkeras strategy (keras-io's
    end-to-end inference wrapper, `keras.Model(inputs, model(vectorize(inputs)))` around a
    model trained under the strategy) adopts that strategy: compiled in its scope (with none or
    that one in scope), its fit, evaluate and predict run under it, as for a model made there.
    Made outside any scope with variables of another strategy or of none beside them, it is
    refused naming the layers holding each. Every other model is Keras's own.
    """
    extended = extended_of(model)
    if extended is None:
        return original(model, *args, **kwargs)
    strategy = extended.strategy
    current = tf.distribute.get_strategy()
    adopting = _keras_internals.built_outside_any_strategy(model) or model in _ADOPTED
    if adopting:
        _of_one_strategy(model, extended)
        if not tf.distribute.has_strategy():
            current = strategy  # compiled in the scope of the strategy it adopts
    if extended_of(current) is not extended:
        if adopting:
            holders = _names(_holders(model)[extended])
            made = (
                f"was made outside any strategy's scope and holds {holders}, whose variables "
                f"belong to {strategy!r}; it is compiled in another strategy's scope"
            )
        else:
            made = f"was built under {strategy!r} and is compiled outside its scope"
        raise ValueError(
            f"Model '{model.name}' {made} ({_scope_text(current)}): Keras would make the "
            f"optimizer's and the metrics' variables outside that strategy (and an optimizer "
            f"with slots, such as Adam, would fail in fit with TensorFlow's \"Mixing different "
            f'tf.distribute.Strategy objects"). Compile the model inside the scope it was '
            f"built in: `with dpkeras.scope(...):` or `with strategy.scope():`, then "
            f"`model.compile(...)`; fit, evaluate and predict may run outside it."
        )
    optimizer = kwargs["optimizer"] if "optimizer" in kwargs else (args[0] if args else None)
    for made in (optimizer, getattr(optimizer, "inner_optimizer", None)):
        if not isinstance(made, keras.optimizers.Optimizer):
            continue
        owner = _keras_internals.optimizer_strategy(made)
        if owner is not None and extended_of(owner) is not extended:
            raise ValueError(
                f"Model '{model.name}' is compiled with optimizer '{made.name}' "
                f"({type(made).__name__}), which was made outside the scope of {strategy!r}, "
                f"the strategy the model was built under (it belongs to {owner!r}): its slots "
                f"could not be made beside the model's variables. Make the optimizer inside "
                f"`with strategy.scope():` (or `dpkeras.scope(...)`), or pass it by name "
                f'(such as optimizer="adam"): compile then makes it in the scope.'
            )
    if not adopting:
        return original(model, *args, **kwargs)
    setattr(model, _keras_internals.strategy_attribute(), strategy)  # as if made in its scope
    _ADOPTED.add(model)
    with strategy.scope():
        return original(model, *args, **kwargs)


def refusing_an_idle_cluster(fit, model, *args, **kwargs):
    """Runs `fit`, unless it would train on this process alone beside an idle cluster.

    Refused (ValueError naming the model, the strategy and its cluster, and the fix): a model
    built without any strategy, trained with none in scope, in a process that made a
    `ParameterDeviceStrategy` on a cluster (alive) and has entered no cluster strategy's scope
    yet. That is a script that forgot `with strategy.scope():`. Once any cluster strategy was
    entered, a model trained on this process alone is taken as meant (a reference, say).
    """
    if (
        not tf.distribute.has_strategy()
        and model.distribute_strategy is tf.distribute.get_strategy()
    ):
        with _CLUSTERS.lock:
            waiting = [] if _CLUSTERS.one_was_entered else list(_CLUSTERS.unentered)
        if waiting and extended_of(model) is None:
            strategy = waiting[0]
            jobs = extended_of(strategy).cluster_spec.as_dict()
            raise ValueError(
                f"Model '{model.name}' was built and compiled without a strategy, so fit would "
                f"train it on this process alone, while this process joined the cluster "
                f"{jobs} for {strategy!r} and never entered that strategy's scope: its tasks "
                f"would idle. Build and compile the model inside `with strategy.scope():` (or "
                f"`with dpkeras.scope(cluster=...):`); fit may run outside it. (A model meant "
                f"for this process alone is trained as asked once the strategy's scope has "
                f"been entered.)"
            )
    return fit(model, *args, **kwargs)
