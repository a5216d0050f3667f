"""Keras's loop over `steps_per_execution` steps, with each worker's batch read where it is used.

Keras's TF trainer runs K steps per call in a `tf.while_loop` that carries the next batch
from one iteration to the next as a loop variable: an `Optional` of every replica's batch,
made by TensorFlow's distributed iterator on the loop's device. On a cluster that device is
worker 0's host (`dpkeras.cluster._loop`), so every other worker's share of each batch
crossed to worker 0 and back, every step (measured: a Dense model on 4096 float features,
global batch 256, two workers: 2 MB sent and 2 MB received by each worker per step, its
whole 2 MB share, where the weights are 16 KB).

`reading_on_each_host` runs the same loop with nothing but the logs and two scalars carried:
each iteration reads every input host's next batch on that host, as an `Optional` made there,
and the step runs on it inside the iteration. Its semantics are Keras's: at most K steps a
call, the last step's logs returned, an empty call raising StopIteration, one read past the
last batch (at K=1, Keras's default, the one step runs without a loop around it: a loop's
control runs on every task the step touches). The loop's own device decides whether a batch is
there, from its host's `Optional` (worker 0's): dpkeras gives every input host the same number
of batches (`dpkeras._input.sharding`; a host with no rows of the last batch gets an empty
one), so one host answers for all, and a host that had none would fail the step loudly (an
empty `Optional` read), not end the epoch. Iterators whose hosts may differ
(`auto_shard_policy` FILE, a user's `distribute_datasets_from_function`), TensorFlow's own
iterators, eager steps and unrolled loops run Keras's loop as before.
"""

import functools

import tensorflow as tf

from dpkeras import _keras_internals, _tf_internals
from dpkeras._input import at_first_use


def reading_on_each_host(model, keras_function, step_function, xla):
    """Keras's step function of `model` (`keras_function`, as `make_{train,test}_function`
    made it for `step_function`, the model's `train_step` or `test_step`), calling the loop
    of this module for the iterators it applies to and `keras_function` for the rest.

    Args:
        model: a model of a dpkeras strategy on a cluster.
        keras_function: Keras's function (`function(iterator)`).
        step_function: the model's bound `train_step` or `test_step`.
        xla: bool, whether the step may be compiled with XLA.
    """
    if model.run_eagerly or _keras_internals.unrolled_steps(model) != 1:
        return keras_function
    loop = _loop(model, step_function, xla)

    @functools.wraps(keras_function)
    def function(iterator):
        if not at_first_use.hosts_yield_alike(iterator):
            return keras_function(iterator)
        outputs = loop(iterator)
        if not outputs.has_value():
            raise StopIteration
        return outputs.get_value()

    return function


def _loop(model, step_function, xla):
    strategy = model.distribute_strategy

    @tf.autograph.experimental.do_not_convert
    def run_step(data):
        outputs = strategy.run(step_function, args=(data,))
        return _keras_internals.reduce_per_replica(outputs, strategy, "auto")

    # Keras converts optional inputs (`tf.experimental.Optional`) to None around its traced
    # step; here inside it, so that the step's logs can be known from the data's spec.
    one_step = tf.function(
        _keras_internals.autoconvert_optionals(model, run_step),
        reduce_retracing=True,
        jit_compile=xla,
    )

    @tf.function(reduce_retracing=True)
    @tf.autograph.experimental.do_not_convert
    def loop(iterator):
        steps = model.steps_per_execution
        # The step traced on the batches' spec (the function its calls below use): the logs'
        # spec, for the Optional that holds no logs yet.
        traced = one_step.get_concrete_function(iterator.element_spec)
        logs = tf.nest.map_structure(tf.type_spec_from_value, traced.structured_outputs)
        nothing = tf.experimental.Optional.empty(logs)

        def cond(step, outputs, more):
            return tf.logical_and(step < steps, more)

        def body(step, outputs, more):
            optionals = _tf_internals.host_optionals(iterator)
            there = optionals[0][0].has_value()

            def run():
                data = _tf_internals.per_replica_values(iterator, optionals)
                return tf.experimental.Optional.from_value(one_step(data))

            return step + 1, tf.cond(there, run, lambda: outputs), there

        if isinstance(steps, int) and steps == 1:
            return body(tf.constant(0), nothing, tf.constant(True))[1]
        _, outputs, _ = tf.while_loop(cond, body, [tf.constant(0), nothing, tf.constant(True)])
        return outputs

    return loop
