"""Each distinct id crosses once: deduplicated lookups, and one summed gradient row per id.

A recommender's batch repeats ids (popularity is Zipf-shaped): 2048 lookups may name 16
distinct rows. Without deduplication every repeat is gathered on the parameter device and sent,
and every repeat's gradient row is sent back. With it (the default), a replica sends its
distinct ids, receives one row per distinct id and expands them locally; its gradient goes back
as one summed row per distinct id whenever summing first keeps Keras's numbers, which is when
the optimizer is linear in the gradient (`keras.optimizers.SGD`, with or without momentum, and
without clipping). Optimizers that square the gradient (Adam, Adagrad, RMSprop, ...) and
clipping see each repeat separately in Keras 3 on one device, so their repeats are sent as
they are, unless the user chose `Deduplicate.SUM` (`deduplicate="sum"`): the tf.keras and TF1
semantics, where repeated ids' gradients are summed before the optimizer (one row per distinct
id of the whole global batch, so N replicas still equal one device under the same choice).
The modes are `dpkeras._config.Deduplicate`'s, resolved with the other settings.
"""

import keras
import tensorflow as tf

from dpkeras._config import Deduplicate


def unique_ids(indices):
    """`(distinct ids, positions)` of `indices` flattened: `ids[positions]` is the flat ids.

    Runs where the ids are (the replica), so only the distinct ids travel to the table.
    """
    return tf.unique(tf.reshape(indices, [-1]))


def expand_rows(rows, positions, indices, name=None):
    """The rows of every looked-up id, in the shape of `indices`, from the distinct ids' rows."""
    gathered = tf.gather(rows, positions)
    return tf.reshape(gathered, tf.concat([tf.shape(indices), tf.shape(rows)[1:]], 0), name=name)


def sum_repeats(slices):
    """`slices` with one summed row per distinct id, computed where its values are."""
    with tf.device(slices.values.device or None):
        ids, positions = tf.unique(slices.indices)
        values = tf.math.unsorted_segment_sum(slices.values, positions, tf.shape(ids)[0])
        return tf.IndexedSlices(values, ids, slices.dense_shape)


def sums_gradient_rows(mode, optimizer):
    """Whether gradient rows of repeated ids are summed before they cross, for `optimizer`.

    Always under `Deduplicate.SUM`, never under `OFF`; under `ON` only where summing keeps
    Keras's numbers on one device: an SGD (any momentum, Nesterov or not) that neither clips
    nor overrides SGD's update. Clipping by norm or value, and every optimizer that squares or
    takes the sign of the gradient, see each repeat on its own in Keras 3.
    """
    if mode is Deduplicate.SUM:
        return True
    if mode is not Deduplicate.ON:
        return False
    return (
        isinstance(optimizer, keras.optimizers.SGD)
        and type(optimizer).update_step is keras.optimizers.SGD.update_step
        and optimizer.clipnorm is None
        and optimizer.global_clipnorm is None
        and optimizer.clipvalue is None
    )
