"""`PlacedVariable`: what every kind of variable dpkeras makes answers for itself.

Three kinds implement it: `ParameterVariable` (one copy on a parameter device),
`ShardedParameterVariable` (its rows in shards on parameter devices) and `ReplicatedVariable`
(a copy on every compute device). The strategy, the optimizer, the creator and the report ask
the variable, never its class, as TensorFlow's `MirroredExtended._update` asks each variable
kind for its own `_update_replica`. `of` is the one test of "is this a dpkeras variable?".
"""

import tensorflow as tf

from dpkeras import _device_names as device_names


class PlacedVariable:
    """A variable made under a dpkeras strategy, of any kind: the questions every kind answers.

    Users do not construct it; `isinstance(v, PlacedVariable)` holds for every variable a
    dpkeras strategy made. Each kind provides `_extended` and `_spec`, and implements:

    - `update(fn, args, kwargs, group)`: tf.distribute's `extended.update` of it, in
      cross-replica context: `fn(variable, *args, **kwargs)` where its values live;
    - `sum_gradient(reductions, grad, sum_repeats)`: the optimizer's sum of its per-replica
      gradient, made where it is consumed (None: summed per copy, by an all-reduce);
    - its writes (`assign`, `scatter_*`) by context: cross-replica, replica k of n, the
      optimizer's update of one piece (`dpkeras._variables.pieces`);
    - where it lives: `device`, `parts` (the variables holding its values: its shards, or
      itself), `copy_devices` (empty unless replicated), `lives_on(task)`, `slot_device` and
      `slot_rows` (how a slot created beside it is placed);
    - `why_not_xla()`: why XLA cannot compile a step that reads it, or None.
    """

    @property
    def extended(self):
        """The `ParameterDeviceExtended` that created it."""
        return self._extended

    @property
    def spec(self):
        """The `dpkeras.placement.VariableSpec` the placement policy saw."""
        return self._spec

    @property
    def kind(self):
        """The `dpkeras.placement.VariableKind` it was created as."""
        return self._spec.kind

    @property
    def parts(self):
        """The variables holding its values, in row order: its shards (each a
        `ParameterVariable`) for a variable cut into shards, else itself alone."""
        return (self,)

    @property
    def copy_devices(self):
        """The compute devices its copies live on, in replica order, for a replicated
        variable; else empty."""
        return ()

    @property
    def slot_device(self):
        """Where a variable created beside it (an optimizer slot, `colocate_vars_with`)
        lives: its device, or `placement.REPLICATED`."""
        return self.device

    @property
    def slot_rows(self):
        """Rows per shard of a variable created beside it (sharded like it), or None (kept
        whole)."""
        return None

    def update(self, fn, args, kwargs, group):
        """`fn(self, *args, **kwargs)` in cross-replica context (tf.distribute's
        `extended.update`), where its values live; per-replica arguments give the component
        that place needs. Returns what `fn` returned (`group`: grouped to one op)."""
        raise NotImplementedError

    def sum_gradient(self, reductions, grad, sum_repeats):
        """The sum over the replicas of its per-replica gradient `grad`, made where the
        update consumes it (`reductions`: the strategy's `ReductionLedger`), or None when the
        optimizer sums it per copy (`dpkeras._extended.optimizer_apply`)."""
        raise NotImplementedError

    @property
    def dense_sum_device(self):
        """The device `sum_gradient` sums a dense gradient on as one plain sum (`add_n` of the
        replicas' components), which lets the sums of several be packed
        (`dpkeras._extended.packing`); None when it sums another way (by shard, per copy)."""
        return None

    def why_not_xla(self):
        """Why XLA cannot compile a step that reads it (a phrase), or None."""
        raise NotImplementedError

    def lives_on(self, task):
        """Whether any of its values (a part) live on `task` (a task name such as
        `/job:worker/replica:0/task:1`). A replicated variable's copies are not counted: a
        task's copies are left out with its replicas."""
        return any(device_names.task_of(part.device) == task for part in self.parts)

    def remake_on(self, task):
        """Makes again, uninitialised, what of it lived on `task` (a task of the cluster that
        restarted and lost this client's resources); returns how many resources it made. The
        values then come from a backup (`dpkeras._patches.lost_tasks`)."""
        return sum(part.remake_on(task) for part in self.parts if part is not self)


def why_xla_cannot_reach(extended):
    """Why XLA cannot compile a step of `extended` that reads a variable on its parameter
    devices, or None. On a cluster a step runs on a worker task and the variables live on the
    ps tasks: XLA cannot read a resource on another device ("Trying to access resource ...
    located in device /job:ps/... from device /job:worker/...", XLA's known issue
    tfvariable_on_a_different_device), and a compiled function called on a remote task is
    refused too ("KernelAndDeviceOp does not support EagerFunctionParams"). On one machine,
    Keras's XLA compilation is kept."""
    if extended.cluster_spec is None:
        return None
    return (
        "on a cluster its steps run on a task, and XLA cannot read variables that live on "
        "other tasks (the ps tasks)"
    )


def skipped_update(group):
    """What an update skipped in the optimizer's pass for copy j > 0 returns
    (`pieces.writes_skipped`): nothing, or an op that does nothing."""
    return None if group or tf.executing_eagerly() else tf.no_op()


def of(variable):
    """`variable` (a `tf.Variable`) when a dpkeras strategy made it, else None."""
    return variable if isinstance(variable, PlacedVariable) else None
