"""Cross-replica reductions, and the ledger that lets an update find them where they are."""

import tensorflow as tf

from dpkeras import _device_names as device_names
from dpkeras._cache import GraphCache
from dpkeras._variables import dedup


def normalize_op(how):
    """`tf.VariableAggregation.SUM`, `ReduceOp.SUM` or `"sum"` -> `"SUM"`."""
    return str(getattr(how, "name", how)).upper()


def _combine(parts):
    if all(isinstance(c, tf.IndexedSlices) for c in parts):
        return tf.IndexedSlices(
            tf.concat([c.values for c in parts], 0),
            tf.concat([c.indices for c in parts], 0),
            parts[0].dense_shape,
        )
    return tf.add_n([tf.convert_to_tensor(c) for c in parts])


def source_host(component, device):
    """The host of the task `component` was computed on, if that is not `device`'s task."""
    source = getattr(
        component.values if isinstance(component, tf.IndexedSlices) else component, "device", ""
    )
    try:
        return device_names.host_of(source) if device_names.pull_device(device, source) else None
    except ValueError:  # no device, or a partial one: leave it where TensorFlow puts it
        return None


def presum_by_task(components, device):
    """`(source host, component)` pairs: the components, with those of each other task's
    replicas summed on that task's host.

    A worker of a cluster then sends one locally summed gradient per variable, not one per
    replica. Components on `device`'s own task (every replica on one machine) are left as
    they are, with source host None. Sums and concatenations are exact regroupings of the
    same terms. The order of the pairs is the order their sum adds them in; it depends only
    on the components' source hosts (`dpkeras._extended.packing` relies on it).
    """
    hosts = [source_host(c, device) for c in components]
    groups = {}
    for host, c in zip(hosts, components):
        groups.setdefault(host, []).append(c)
    if len(components) < 2 or all(
        host is None or len(parts) == 1 for host, parts in groups.items()
    ):
        return list(zip(hosts, components))
    out = [(None, c) for c in groups.pop(None, [])]
    for host, parts in groups.items():
        with tf.device(host):
            out.append((host, _combine(parts) if len(parts) > 1 else parts[0]))
    return out


def sum_dense(components, device):
    """The SUM of dense `components` (presummed, see `presum_by_task`) on `device`."""
    with tf.device(device):
        dense = [tf.convert_to_tensor(c) for c in components]
        return tf.add_n(dense) if len(dense) > 1 else tf.identity(dense[0])


class ReductionLedger:
    """Reduces per-replica values onto a device, and remembers what it reduced.

    Keras reduces gradients in replica context (`ReplicaContext.all_reduce`), before it knows which
    variable each belongs to, and `ReplicaContext.all_reduce` wraps what the merge returns in a
    `custom_gradient` IdentityN on each replica's device. The ledger remembers every reduction
    this strategy made, by graph and tensor name, so that an update (a) uses the reduction where it
    is rather than the copy on replica 0, and (b) redoes a sum on the variable's own device when
    variables are spread over several parameter devices (the first sum, unused, is pruned).

    Example with 2 replicas, SUM: replica 0 contributes [1, 2], replica 1 [3, 4]; the result,
    computed on the parameter device, is [4, 6]. MEAN gives [2, 3]. ONLY_FIRST_REPLICA gives [1, 2].

    Args:
        num_replicas: int, replicas in sync.
        local_results: callable, a `DistributedValues` -> its per-replica components.
    """

    def __init__(self, num_replicas, local_results):
        self._n = num_replicas
        self._local_results = local_results
        self._made = GraphCache()  # name of a reduction's result -> aggregate()'s arguments

    def __len__(self):
        """How many live graphs it keeps reductions of (it must not grow over a long run)."""
        return len(self._made)

    def local_results(self, value):
        """The per-replica components of `value` (a value that is not per-replica: itself)."""
        return self._local_results(value)

    def check_same_shapes(self, value):
        """Raises ValueError if the components of per-replica `value` differ in shape."""
        shapes = [getattr(c, "shape", None) for c in self._local_results(value)]
        known = [s for s in shapes if s is not None and s.is_fully_defined()]
        if len(known) == len(shapes) and len({tuple(s) for s in known}) > 1:
            raise ValueError(
                f"Cannot reduce per-replica values of different shapes "
                f"{[tuple(s) for s in known]} element-wise. With uneven per-replica batches, "
                f"reduce along the batch axis (strategy.reduce(op, value, axis=0)) or use a "
                f"global batch size divisible by {self._n}."
            )

    def components(self, value, from_every_replica):
        """Per-replica components of `value`.

        A value that is not per-replica is either a write every replica made with the same
        value (`from_every_replica=True`: N contributions) or a tensor captured from outside
        `strategy.run`, the same object in every replica, that a reduction receives
        (`False`: one contribution, as MirroredStrategy counts it, so its SUM is itself).
        """
        if isinstance(value, tf.distribute.DistributedValues):
            return list(self._local_results(value))
        return [value] * (self._n if from_every_replica else 1)

    def aggregate(self, how, value, device, from_every_replica=True, sum_repeats=False):
        """Reduces `value` onto `device`.

        Args:
            how: a `tf.VariableAggregation` or `tf.distribute.ReduceOp` (or its name).
            value: a `DistributedValues`, or one value; see `components`.
            device: where the result is computed.
            from_every_replica: bool; see `components`.
            sum_repeats: bool; see `reduce_components`.

        Returns:
            A tensor (or `tf.IndexedSlices`, kept sparse) on `device`.

        Raises:
            ValueError: for an op other than SUM, MEAN or ONLY_FIRST_REPLICA.
        """
        how = normalize_op(how)
        components = self.components(value, from_every_replica)
        if how == "ONLY_FIRST_REPLICA":
            return components[0]
        result = self.reduce_components(how, components, device, sum_repeats)
        self._remember(result, (how, value, from_every_replica, sum_repeats))
        return result

    def reduce_components(self, how, components, device, sum_repeats=False):
        """SUM or MEAN of a list of components onto `device` (kept sparse if all are sparse).

        Components on other tasks of a cluster are first summed on their task's host. With
        `sum_repeats`, sparse components carry one summed row per distinct id before they
        leave their device (or task), and so does the result (`dedup.sum_repeats`).
        """
        how = normalize_op(how)
        if how not in ("SUM", "MEAN"):
            raise ValueError(
                f"Cannot reduce with {how!r}; expected SUM, MEAN or ONLY_FIRST_REPLICA."
            )
        n = len(components)
        components = [c for _, c in presum_by_task(components, device)]
        sum_repeats = sum_repeats and all(isinstance(c, tf.IndexedSlices) for c in components)
        if sum_repeats:
            components = [dedup.sum_repeats(c) for c in components]
        with tf.device(device):
            if all(isinstance(c, tf.IndexedSlices) for c in components):
                values = tf.concat([c.values for c in components], axis=0)
                if how == "MEAN":
                    values = values / tf.cast(n, values.dtype)
                result = tf.IndexedSlices(
                    values, tf.concat([c.indices for c in components], 0), components[0].dense_shape
                )
                if sum_repeats and len(components) > 1:
                    result = dedup.sum_repeats(result)
            else:
                result = sum_dense(components, device)
                if how == "MEAN":
                    result = (
                        result // n
                        if result.dtype.is_integer
                        else result / tf.cast(n, result.dtype)
                    )
        return result

    def _remember(self, result, recipe):
        if tf.executing_eagerly():
            return
        key = result.values if isinstance(result, tf.IndexedSlices) else result
        self._made.set(key.name, recipe, graph=key.graph)

    def _lookup(self, tensor):
        return self._made.get(tensor.name, graph=tensor.graph)

    def source(self, t):
        """The reduction `t` forwards, if `t` is an identity of one this ledger made, else `t`."""
        if not isinstance(t, tf.Tensor) or tf.executing_eagerly():
            return t
        if t.op.type in ("Identity", "IdentityN"):
            source = t.op.inputs[t.value_index if t.op.type == "IdentityN" else 0]
            if self._lookup(source) is not None:
                return source
        return t

    def on_device(self, x, device):
        """`x`, with a reduction this ledger made redone on `device` if it was elsewhere."""
        sparse = isinstance(x, tf.IndexedSlices)
        key = self.source(x.values if sparse else x)
        if sparse and key is not x.values:
            x = tf.IndexedSlices(key, self.source(x.indices), x.dense_shape)
        elif not sparse:
            x = key
        if (
            isinstance(key, tf.Tensor)
            and not tf.executing_eagerly()
            and device
            and (key.device != device)
        ):
            recipe = self._lookup(key)
            if recipe is not None:
                return self.aggregate(recipe[0], recipe[1], device, *recipe[2:])
        return x

    def select_single_value(self, structure, device=None):
        """Replica 0's component of each per-replica value; reductions moved to `device`."""

        def select(x):
            if isinstance(x, tf.distribute.DistributedValues):
                x = self._local_results(x)[0]
            if isinstance(x, (tf.Tensor, tf.IndexedSlices)):
                return self.on_device(x, device)
            return x

        return tf.nest.map_structure(select, structure)
