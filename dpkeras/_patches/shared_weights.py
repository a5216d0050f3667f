"""A layer built under TF1 `reuse` holds the first layer's `keras.Variable`, not a copy.

Keras deduplicates `model.weights` by object identity, and its optimizers key state by the
underlying `tf.Variable`: two `keras.Variable` wrappers of one shared `tf.Variable` would be
listed twice and updated twice. A Keras layer creates its own wrapper in `add_weight` and takes
no existing one, so once a layer built under `reuse` has tracked its wrapper, `hold` swaps it
for the first layer's, in the layer's tracking lists (in place, keeping the weight order saving
relies on) and in its attributes (through `setattr`, so TensorFlow checkpoints track the new
object too). This is the one write dpkeras makes to a Keras object's private state; it is the
model's structure (the weight is shared), so `uninstall()` leaves it (the rule:
`dpkeras._patches`). The Keras hook that would
retire it: `Layer.add_weight` accepting an existing variable. Where Keras keeps the lists is
read from `dpkeras._keras_internals`.
"""

from dpkeras import _keras_internals


def hold(layer, old, new):
    """Makes `layer` hold `new` wherever it holds `old`; returns whether it held `old`."""
    stores = _keras_internals.tracking_stores(layer)
    if stores is None:
        return False
    found = False
    for values, ids in stores:
        for index, value in enumerate(values):
            if value is old:
                values[index] = new
                ids.discard(id(old))
                ids.add(id(new))
                found = True
    if not found:
        return False
    tracker = _keras_internals.tracker_of(layer)
    was_locked = tracker.locked
    tracker.unlock()
    try:
        for attribute, value in list(vars(layer).items()):
            if value is old:
                setattr(layer, attribute, new)
    finally:
        if was_locked:
            tracker.lock()
    return True
