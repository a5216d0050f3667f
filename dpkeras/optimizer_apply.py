"""The optimizer runs once, where the variables live, on the summed gradient.

One device clips, decays and accumulates the gradient of the whole batch. Keras under a
`tf.distribute` strategy does those per replica, on each replica's partial gradient, and sums
last: with `clipnorm=0.1` and 3 replicas, each replica's third of the gradient is clipped to
0.1 and the sum can reach 0.3 (MirroredStrategy gives exactly these wrong numbers), and
`gradient_accumulation_steps` fails (a merge inside Keras's `cond`).

Under dpkeras, a Keras optimizer created in the strategy's scope sums first: its `apply`,
called in a replica, merges the replicas' gradients, sums each on its variable's device, and
runs Keras's own `apply` once, in cross-replica context, on the sums. Clipping
(`clipnorm`, `global_clipnorm`, `clipvalue`), weight decay, accumulation (the accumulators live
with their variables; the sum crosses once per step, not per update), EMA and the iteration
count then see what one device sees. With 3 replicas whose gradients are [1], [2] and [3] and
`clipvalue=4`, the update uses clip(6) = 4, as one device would, not 1 + 2 + 3 = 6.

A value that is not per-replica (one gradient tensor captured in every replica) counts once,
as under MirroredStrategy. Keras's LossScaleOptimizer is left as it is: it already moves to
cross-replica context and calls its inner optimizer in each replica, whose `apply` sums.
"""

import weakref

import keras
import tensorflow as tf

from dpkeras import _keras_internals, replica_step
from dpkeras.sharded_variables import ShardedParameterVariable, sum_by_shard

__all__ = ["attach"]

_attached = weakref.WeakKeyDictionary()  # optimizer -> the extended it sums for


def attach(optimizer, extended):
    """Makes `optimizer` sum its gradients across `extended`'s replicas before it applies them.

    Idempotent; LossScaleOptimizers are left alone (see the module docstring).
    """
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer) or optimizer in _attached:
        return
    _attached[optimizer] = extended
    keras_apply = optimizer.apply  # the bound method of the optimizer's class

    def apply(grads, trainable_variables=None):
        ctx = tf.distribute.get_replica_context()
        if ctx is None or ctx.strategy.extended is not extended:
            return keras_apply(grads, trainable_variables)
        return ctx.merge_call(_apply_summed, args=(list(grads), trainable_variables))

    def _apply_summed(strategy, grads, trainable_variables):
        variables = (
            trainable_variables
            if trainable_variables is not None
            else optimizer.trainable_variables
        )
        summed = [_sum(g, v) for g, v in zip(grads, variables)]
        # Ops Keras does not place (the iteration count's `+ 1`, the clipping norm) run on the
        # home parameter device, not wherever the placer would put them.
        with (
            tf.device(extended.parameter_devices[0]),
            replica_step.state_of(extended).after_inputs(0),
        ):
            return keras_apply(summed, trainable_variables)

    def _sum(grad, variable):
        if grad is None:
            return None
        sharded = getattr(variable, "value", variable)
        if isinstance(sharded, ShardedParameterVariable):
            components = extended.reductions.components(grad, from_every_replica=False)
            return sum_by_shard(sharded, components, extended.reductions.reduce_components)
        return extended.aggregate("SUM", grad, _device_of(variable), from_every_replica=False)

    _keras_internals.route_optimizer_apply(optimizer, apply)


def _device_of(variable):
    return getattr(variable, "value", variable).device
