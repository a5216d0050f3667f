"""The all-reduce of replicated variables' gradients among the compute devices.

Each replica's gradient of a replicated variable (`dpkeras._variables.replicated`) stays on
its compute device; every device ends with the sum, computed among the devices themselves:
on one machine between the local devices, on a cluster worker to worker. Nothing goes through a
parameter device or the client.

In a traced step (`tf.function`, what Keras's `fit` runs) the sum is TensorFlow's collective
all-reduce (`CollectiveReduceV2`, a ring; NCCL between GPUs), one per dtype over the gradients
packed into one flat buffer, so a step makes one collective however many layers the model has.
Every device receives the same bits (a ring reduces each chunk once and forwards it), so the
copies stay identical. Each device's collective is ordered by a resource of its own (one
copy's handle): with one shared or no ordering token, TensorFlow's automatic control
dependencies chain the devices' collectives one after the other in the graph and they wait for
each other forever (measured on TF 2.21, loopback, 1 ps + 2 workers: `ordering_token=[]` ends
in `DeadlineExceededError ... Collective has timed out waiting for other workers`).

Run eagerly (`run_eagerly=True`) the ops run one at a time, so a collective would wait for
peers never launched: each device then sums the components itself (`tf.add_n`, in replica
order, identical on every device). So does a client once a task was lost (`lost`), a worker
or a ps: from then on every device receives each other device's gradients, (n - 1) buffers
where the ring moves about two, for the rest of the process.
"""

import itertools
import os
import threading
import time
import zlib

import tensorflow as tf

from dpkeras._device_names import short_device

# A peer that never joins a collective (a task that died, a bug) turns into an error after
# this long instead of a hang; dpkeras's cluster health watch names a dead task sooner.
TIMEOUT_SECONDS = 600.0

_lock = threading.Lock()
_group_keys = {}  # tuple of devices -> group key: one group per set of devices in a process
_instance_keys = itertools.count(1)


# A cluster's tasks outlive their clients and remember every collective group they have seen,
# by key: a later client reusing a key for another set of devices would be refused. Keys are
# therefore drawn per process (the devices, this process and when it started).
_PROCESS = f"{os.getpid()}-{time.time_ns()}"


# Tasks lost while this process was connected to them. Once one is, the copies' gradients are
# exchanged among the devices instead of summed by TensorFlow's collectives, for the rest of
# the process: every other task's collectives keep the incarnation of each device they met and
# refuse a group with a restarted one ("exists in cache with a different incarnation", after
# which they stay aborted), a collective cancelled by a peer's loss can leave them aborted
# too (see `_every_replica_ready`), and after this client connected again to a restarted ps a
# worker crashed (SIGSEGV) in its next collectives, even in a group of new keys (TF 2.21).
_lost = set()


def lost(task):
    """Notes that `task` (a worker or a ps) was lost: from now on sums are exchanged, not
    collective."""
    with _lock:
        _lost.add(task)


def collectives_trusted():
    """Whether the all-reduce uses TensorFlow's collectives (no task lost yet)."""
    return not _lost


def _group_key(devices):
    with _lock:
        if tuple(devices) not in _group_keys:
            seed = f"{_PROCESS}-{len(_group_keys)}-{devices}".encode()
            _group_keys[tuple(devices)] = zlib.crc32(seed) % (2**31 - 1) + 1
        return _group_keys[tuple(devices)]


def _instance_key():
    with _lock:
        return next(_instance_keys)


def _dense_on(component, device):
    if not isinstance(component, tf.IndexedSlices):
        return component
    with tf.device(device):
        return tf.convert_to_tensor(component)  # sums to the dense gradient


def _shaped(component, shape, device):
    """`component`, a gradient of a variable of `shape`, with that static shape.

    The gradient of a variable always has the variable's shape, but its static shape can be
    partly unknown: a Dense kernel's on rank-3 input is computed through a reshape of the batch
    dimensions, which are unknown in a step traced for a partial last batch.
    """
    shape = tf.TensorShape(shape)
    if not shape.is_fully_defined():
        raise ValueError(
            f"A replicated variable has an unknown shape {shape}; replicated variables need "
            f"fully known shapes."
        )
    if not component.shape.is_compatible_with(shape):
        raise ValueError(
            f"The gradient of a replicated variable of shape {shape} has shape "
            f"{component.shape}; a gradient has its variable's shape."
        )
    if component.shape.is_fully_defined():
        return component
    with tf.device(device):
        return tf.ensure_shape(component, shape)


def sum_per_copy(per_replica, devices, tokens, shapes):
    """Every device's sum of each variable's per-replica gradients.

    Args:
        per_replica: one list per variable of its N per-replica gradients (tensors or
            `tf.IndexedSlices`, which are made dense: a replicated variable's copies are
            dense), component i on (or sent to) device i.
        devices: the N compute devices, in replica order.
        tokens: N resource handles, token i on device i (the collectives' ordering tokens).
        shapes: each variable's shape, which its gradients take (`_shaped`).

    Returns:
        One list per variable of N tensors: the sum on each device, identical on all.
    """
    n = len(devices)
    dense = [
        [_shaped(_dense_on(parts[i], devices[i]), shape, devices[i]) for i in range(n)]
        for parts, shape in zip(per_replica, shapes, strict=True)
    ]
    if n == 1:
        return dense
    if tf.executing_eagerly() or not collectives_trusted():
        out = []
        for parts in dense:
            sums = []
            for device in devices:
                with tf.device(device):
                    sums.append(tf.add_n(parts))
            out.append(sums)
        return out
    groups = {}  # dtype -> indices of the variables packed together
    for index, parts in enumerate(dense):
        groups.setdefault(parts[0].dtype, []).append(index)
    out = [None] * len(dense)
    gpus = all("GPU" in short_device(d).upper() for d in devices)
    group_key = _group_key(devices)
    ready = _every_replica_ready(dense, devices)
    for indices in groups.values():
        sizes = [int(dense[i][0].shape.num_elements()) for i in indices]
        instance_key = _instance_key()
        per_device = []
        for r, device in enumerate(devices):
            with tf.device(device), tf.control_dependencies(ready):
                flat = tf.concat([tf.reshape(dense[i][r], [-1]) for i in indices], 0)
                total = tf.raw_ops.CollectiveReduceV2(
                    input=flat,
                    group_size=n,
                    group_key=group_key,
                    instance_key=instance_key,
                    ordering_token=[tokens[r]],
                    merge_op="Add",
                    final_op="Id",
                    communication_hint="nccl" if gpus else "auto",
                    timeout_seconds=TIMEOUT_SECONDS,
                )
                pieces = tf.split(total, sizes)
                per_device.append(
                    [tf.reshape(p, dense[i][r].shape) for p, i in zip(pieces, indices)]
                )
        for k, i in enumerate(indices):
            out[i] = [per_device[r][k] for r in range(n)]
    return out


def _every_replica_ready(dense, devices):
    """One op per device, done when that replica's gradients are: no device joins a collective
    before every replica has its gradients.

    A replica whose step fails (an id out of a table's range, a failing check) then stops
    every collective before it starts. A collective cancelled midway (a peer's step failed
    while it waited) aborts TensorFlow's collective executor on its worker for this client:
    every later step's collective failed ("Collective ops is aborted by: group is cancelled")
    or waited out its timeout, seen on a cluster after about 1 in 8 failing steps. Every
    device's collective waits for all replicas anyway; the barrier adds one control message
    per pair of devices.
    """
    ready = []
    for r, device in enumerate(devices):
        with tf.device(device):
            ready.append(tf.group(*[parts[r] for parts in dense], name="dpkeras_replica_ready"))
    return ready
