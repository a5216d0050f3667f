"""Building an unbuilt Keras model from the data's spec, so that no batch is lost."""

import tensorflow as tf

from dpkeras import _keras_internals, _tf_internals
from dpkeras._extended.extended import extended_of


def _zeros(spec):
    spec = _tf_internals.replica_spec(spec)
    if not isinstance(spec, tf.TensorSpec) or spec.shape.rank is None:
        raise TypeError(f"no placeholder for {spec!r}")
    shape = [1 if d is None else d for d in spec.shape.as_list()]
    if spec.dtype == tf.string:
        return tf.fill(shape, "")
    return tf.zeros(shape, spec.dtype)


def batch_from_spec(element_spec):
    """A batch of zeros of `element_spec`'s structure, shapes and dtypes, or None when a
    component is not a dense tensor of known rank (ragged, sparse, optional)."""
    try:
        return tf.nest.map_structure(_zeros, element_spec)
    except TypeError:
        return None


def maybe_symbolic_build(original, model, iterator=None, data_batch=None):
    """Wraps `TensorFlowTrainer._maybe_symbolic_build`: for a model of a dpkeras strategy,
    builds from the epoch's element spec instead of its first batch.

    Keras 3.15's TF trainer, under any `tf.distribute` strategy, builds an unbuilt model at
    the start of `fit` and `evaluate` by taking the first batch from the epoch's iterator,
    reducing it to one device, and tracing the model on it. A `tf.data` dataset starts again
    at the next epoch, but a Python generator or a `keras.utils.PyDataset` cannot give that
    batch back: under MirroredStrategy 8 batches with `steps_per_epoch=8` train on 7, and
    `evaluate` skips one. The build only needs shapes and dtypes: under dpkeras it is given a
    batch of zeros made from the dataset's element spec (an unknown dimension counts as 1), so
    nothing is taken from the data and no batch is pulled to one device.
    """
    if iterator is not None and data_batch is None and extended_of(model) is not None:
        dataset = _keras_internals.distributed_epoch_dataset(iterator)
        batch = None if dataset is None else batch_from_spec(dataset.element_spec)
        if batch is not None:
            return original(model, data_batch=batch)
    return original(model, iterator=iterator, data_batch=data_batch)
