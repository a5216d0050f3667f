"""Adagrad's update of a table reads and writes the gradient's rows only, with Keras's numbers.

Keras 3's `Adagrad.update_step` on a sparse gradient (an embedding table's `IndexedSlices`)
adds the squared rows to the accumulator, then divides the gradient's rows by
`sqrt(accumulator + epsilon)`, which it computes for the whole table: `add` and `sqrt` over
every row, then a check of every row for a zero or a NaN (`sparse.elementwise_division`: a
zero or NaN divisor outside the gradient's rows would make those rows NaN), and only then the
gather of the gradient's rows. On the parameter device that is five passes over the
accumulator on every step, whatever the batch: 0.37 ms of a 0.45 ms update for a table of
25,000 x 32 rows (one CPU core; BENCHMARKS.md), growing with the table, where TensorFlow's
own sparse Adagrad (tf.keras, ParameterServerStrategy) touches the gradient's rows only.

For an optimizer dpkeras sums for (`optimizer_apply.attached`), `rows_only` computes the same
values from the gradient's rows: `sqrt(gather(accumulator) + epsilon)` is
`gather(sqrt(accumulator + epsilon))` element for element, and the accumulator and the variable
are updated by Keras's own `assign_add` and `assign_sub` (scatters), so every row ends with the
bits Keras gives it (tests/test_sparse_rows.py compares every bit). Keras's check can only find
a zero or a NaN that training cannot make when `epsilon`, in the variable's dtype, is above 0
and not subnormal (TensorFlow flushes a subnormal float32, float64 or bfloat16 to 0) and the
accumulator starts at 0 or more (not NaN): the accumulator then never falls below 0, so
`accumulator + epsilon` is never 0, and a row's accumulator is NaN only after a NaN gradient
row, which made that row of the variable NaN in the same update. Otherwise (an `epsilon` of 0
or one below 1.2e-38 in float32 or bfloat16, or 2.2e-308 in float64; a negative or NaN start;
a dense gradient) Keras's own `update_step` runs.

Where they differ: once a row of the accumulator is NaN (a NaN gradient), Keras 3.15 divides
on the union of the gradient's rows and the NaN rows, which writes NaN into other rows of the
step and fails on repeated ids (`indices[4] = 10 is not in [0, 9)`); here the NaN stays in its
own row and every other row is updated by Adagrad's formula. The same holds for an accumulator
set by hand to hold a NaN or a negative value.
"""

import numpy as np
import tensorflow as tf
from keras import ops

from dpkeras import _keras_internals
from dpkeras._extended import optimizer_apply


def _exact(optimizer, gradient, variable):
    """Whether the rows-only update gives Keras's numbers for this update (see above)."""
    if not isinstance(gradient, tf.IndexedSlices) or optimizer_apply.attached(optimizer) is None:
        return False
    epsilon, start = optimizer.epsilon, optimizer.initial_accumulator_value
    if not all(isinstance(v, (int, float)) for v in (epsilon, start)) or not start >= 0:
        return False  # `not >=`: a NaN start too
    dtype = tf.as_dtype(variable.dtype)
    if not dtype.is_floating:
        return False
    # TensorFlow's kernels flush a subnormal float32 or float64 to 0 (the CPU's flush-to-zero
    # mode; on GPUs too); bfloat16 is computed in float32; float16 keeps its subnormals.
    smallest = (
        0.0
        if dtype == tf.float16
        else np.finfo(np.float64 if dtype == tf.float64 else np.float32).tiny
    )
    return np.asarray(epsilon, dtype.as_numpy_dtype) > 0 and epsilon >= smallest


def rows_only(keras_update_step, optimizer, gradient, variable, learning_rate):
    """Stands in for Keras's `Adagrad.update_step(gradient, variable, learning_rate)`.

    Registered by an entry of dpkeras._patches.table; calls Keras's own `update_step` for
    every update it does not change (see the module's docstring).
    """
    if not _exact(optimizer, gradient, variable):
        return keras_update_step(optimizer, gradient, variable, learning_rate)
    # Keras 3.15's Adagrad.update_step, with the divisor computed on the gradient's rows.
    lr = ops.cast(learning_rate, variable.dtype)
    gradient = ops.cast(gradient, variable.dtype)
    accumulator = _keras_internals.adagrad_accumulator(optimizer, variable)
    optimizer.assign_add(accumulator, ops.square(gradient))
    # Each distinct id's row once, then gathered per index: the divisor reaches the division
    # through a gather, as in Keras's graph, so Grappler rewrites neither `x / sqrt(y)` into
    # `x * rsqrt(y)` (which rounds differently: one ulp in a few values, measured).
    ids, positions = tf.unique(gradient.indices)
    rows = accumulator.value.sparse_read(ids)
    divisor = tf.gather(ops.sqrt(ops.add(rows, optimizer.epsilon)), positions)
    step = ops.multiply(lr, gradient)
    divided = ops.divide(step.values, divisor)
    optimizer.assign_sub(variable, tf.IndexedSlices(divided, step.indices, step.dense_shape))
