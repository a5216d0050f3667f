"""The optimizer's slots of a `DynamicEmbedding`'s rows, and resetting a reassigned row's."""

import concurrent.futures

import keras
import numpy as np
import tensorflow as tf

from dpkeras import _keras_internals

_AVERAGE = "average"  # EMA's copy of the variable (use_ema): reset to the row's new vector


def slots_of(optimizer, variable):
    """`{slot name: slot variable}` of `optimizer`'s variables made from `variable`."""
    return _keras_internals.optimizer_slots(optimizer, variable)


def initial_slot_values(optimizer):
    """`{slot name: its initial value}` for `optimizer`'s kind and settings.

    Keras creates slots with initializers it does not keep (zeros for most, Adagrad's and
    Ftrl's `initial_accumulator_value`): a fresh optimizer of the same configuration is built
    on a 1 x 1 probe variable and its slots are read. That runs in a thread of its own, where
    no `tf.function` is being traced and no strategy scope is entered (both are per thread),
    since this is asked while the training step is traced.
    """
    inner = getattr(optimizer, "inner_optimizer", optimizer)

    def probe():
        probe_optimizer = type(inner).from_config(inner.get_config())
        variable = keras.Variable(np.zeros((1, 1), "float32"), name="dynamic_embedding_probe")
        probe_optimizer.build([variable])
        return {
            name: float(np.asarray(v.numpy()).reshape(-1)[0])
            for name, v in slots_of(probe_optimizer, variable).items()
        }

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(probe).result(timeout=120)


class SlotResetter:
    """Resets the slots of rows handed to new ids, for the optimizers that train the rows.

    The optimizer is found when the layer is traced inside `model.fit` (the model whose
    `train_step` runs), or given with `DynamicEmbedding.track_optimizer` for custom loops.
    It must be built (`optimizer.build(model.trainable_variables)`) before the step is traced.
    """

    def __init__(self):
        self._optimizers = []
        self.told = False  # `track` was called: the layer's user said which optimizers (if any)

    def track(self, optimizer, told=False):
        self.told = self.told or told
        if optimizer is not None and all(o is not optimizer for o in self._optimizers):
            self._optimizers.append(optimizer)

    @property
    def known(self):
        """Whether the optimizers that train the rows are known (found, or told)."""
        return bool(self._optimizers) or self.told

    def discover(self):
        """Tracks the optimizer of the model whose `train_step` is calling, if any."""
        model = _keras_internals.training_model()
        self.track(getattr(model, "optimizer", None) if model is not None else None)

    def plan(self, variable):
        """`[(slot variable, initial value or None for the row's vector)]` to reset."""
        plan = []
        for optimizer in self._optimizers:
            slots = slots_of(optimizer, variable)
            if not slots:
                continue
            initial = initial_slot_values(optimizer)
            for name, slot in slots.items():
                if name == _AVERAGE:
                    plan.append((slot, None))
                elif name in initial:
                    plan.append((slot, initial[name]))
                else:
                    raise ValueError(
                        f"DynamicEmbedding cannot reset slot {slot.name!r} of optimizer "
                        f"{optimizer.name!r}: a fresh {type(optimizer).__name__} has no slot "
                        f"{name!r} to take its initial value from"
                    )
        return plan


def reset_rows(plan, rows, vectors):
    """Writes each slot's initial value (or `vectors`, for EMA's average) into `rows`."""
    for slot, value in plan:
        target = _keras_internals.underlying_variable(slot)
        fill = (
            tf.cast(vectors, target.dtype)
            if value is None
            else tf.fill(tf.shape(vectors), tf.constant(value, target.dtype))
        )
        target.scatter_update(tf.IndexedSlices(fill, rows))
