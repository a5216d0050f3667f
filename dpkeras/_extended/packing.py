"""Dense gradients a task sends to one parameter device, and the dense variables it reads
from one, cross as one tensor per step.

Each tensor a step sends from one task of a cluster to another is one gRPC call, whatever
its size: about 40 us of CPU on each side on a 2-core machine (a loop reading 20 small
variables from a ps and sending 20 gradients back took 2.35 ms per iteration; the same
values concatenated into one tensor each way, 0.85 ms). A model's dense layers have a
kernel and a bias each, most of them small, and every worker sent each one's gradient to
its ps separately. Here the optimizer's sums (`dpkeras._extended.optimizer_apply`) pack
them: on each worker's host, the dense gradients bound for one parameter device are
flattened and concatenated (up to `PACK_BYTES` per pack), cross as one tensor, and are
split back and summed per variable on that device.

Each variable's sum adds the same terms in the same order as its own sum would
(`reductions.presum_by_task`, then `add_n`); packing only moves them together. (TensorFlow's
graph optimizer may still regroup a sum of three or more terms differently in the two graphs:
equal within float rounding, not always bit for bit.) Sparse gradients (embedding rows),
gradients of unknown shape and variables that sum another way (shards, replicated copies)
are summed as before, and so is everything on one machine, where nothing crosses between
tasks.

The other way, the reads (`pack_reads`): each worker pulled each dense variable of a ps to
its host as a tensor of its own. After the replicas are traced, the pulls from one parameter
device to one host are concatenated on the device and split on the host instead; each pulled
copy, already used by the step, takes its value from its piece.
"""

import tensorflow as tf

from dpkeras import _tf_internals
from dpkeras._extended import reductions

PACK_BYTES = 4 << 20  # a gradient larger than this crosses alone; packs hold at most this


def _packable(components):
    """Whether per-replica gradient `components` can be packed: dense, of one dtype and a
    fully known shape."""
    return (
        all(isinstance(c, tf.Tensor) and c.shape.is_fully_defined() for c in components)
        and len({c.dtype for c in components}) == 1
    )


def sum_packed(entries):
    """The sums of dense gradients, the ones bound for one device from one task packed.

    Args:
        entries: list of `(components, device)`: a gradient's per-replica components and
            the device its sum is made on, the device of the variable it updates.

    Returns:
        A list with, for each entry, its sum on its device (a tensor) if it was packed with
        others, else None (the caller sums it as before).
    """
    if tf.executing_eagerly():
        return [None] * len(entries)
    groups = {}
    for i, (components, device) in enumerate(entries):
        if not components or not _packable(components):
            continue
        sources = tuple(reductions.source_host(c, device) for c in components)
        if any(sources):  # something crosses between tasks
            groups.setdefault((device, components[0].dtype, sources), []).append(i)
    sums = [None] * len(entries)
    for (device, dtype, _), members in groups.items():
        for pack in _packs(members, entries, dtype):
            if len(pack) > 1:
                for i, total in zip(pack, _sum_pack([entries[i][0] for i in pack], device)):
                    sums[i] = total
    return sums


def _packs(members, entries, dtype):
    """`members` (entry indices) cut, in order, into packs of at most `PACK_BYTES`."""
    return _cut(members, lambda i: entries[i][0][0].shape.num_elements() * dtype.size)


def _cut(items, nbytes):
    """`items` cut, in order, into lists of at most `PACK_BYTES` (`nbytes(item)` each); an
    item larger than that is a list of its own."""
    packs, current, size = [], [], 0
    for item in items:
        if current and size + nbytes(item) > PACK_BYTES:
            packs.append(current)
            current, size = [], 0
        current.append(item)
        size += nbytes(item)
    if current:
        packs.append(current)
    return packs


def _sum_pack(gradients, device):
    """The sums on `device` of `gradients` (each a list of per-replica components, from the
    same source hosts in the same order, so that their presummed terms line up)."""
    presummed = [reductions.presum_by_task(components, device) for components in gradients]
    shapes = [pairs[0][1].shape for pairs in presummed]
    sizes = [s.num_elements() for s in shapes]
    terms = [[] for _ in gradients]  # per gradient, its terms in the order they are added
    for k, (host, _) in enumerate(presummed[0]):
        if host is None:  # on the device's own task: not sent
            for j, pairs in enumerate(presummed):
                terms[j].append(pairs[k][1])
            continue
        with tf.device(host):
            packed = tf.concat([tf.reshape(pairs[k][1], [-1]) for pairs in presummed], 0)
        with tf.device(device):
            for j, (piece, shape) in enumerate(zip(tf.split(packed, sizes), shapes)):
                terms[j].append(tf.reshape(piece, shape))
    return [reductions.sum_dense(t, device) for t in terms]


def pack_reads(pulls):
    """Sends the variables one step reads from one ps on one worker as one tensor.

    Each replica reads a variable of another task from the copy its task's host pulled
    (`WholeVariable._new_replica_read`), one tensor per variable, worker and step. After the
    replicas are traced, the first reads (`replica_step.Pulls`) from one parameter device to
    one host, of one dtype, are flattened and concatenated on the parameter device, cross as
    one tensor (packs of at most `PACK_BYTES`; a larger variable crosses alone), and are split
    back on the host, where each pulled copy now takes its value from its piece. The values,
    and where each read runs, are unchanged.

    Args:
        pulls: the `replica_step.Pulls` of one call of `strategy.run`, or None.
    """
    if pulls is None or tf.executing_eagerly() or len(pulls.entries) < 2:
        return
    groups = {}
    for _variable, host, read, pulled in pulls.entries:
        if not _used(pulled):
            continue  # TensorFlow sends nothing for it (a table read whole but looked up)
        key = (read.device, host, read.dtype)
        groups.setdefault(key, []).append((read, pulled))
    for (device, host, dtype), members in groups.items():
        for pack in _cut(members, lambda m, size=dtype.size: m[0].shape.num_elements() * size):
            if len(pack) < 2:
                continue
            reads = [read for read, _ in pack]
            with tf.device(device):
                packed = tf.concat([tf.reshape(r, [-1]) for r in reads], 0)
            with tf.device(host):
                pieces = tf.split(packed, [r.shape.num_elements() for r in reads])
                for (read, pulled), piece in zip(pack, pieces):
                    _tf_internals.replace_input(pulled.op, 0, tf.reshape(piece, read.shape))


def _used(tensor):
    """Whether the step uses `tensor`, as traced so far.

    A read nothing consumes crosses nowhere (TensorFlow prunes it): an embedding table read
    whole by Keras's `ops.take` before dpkeras's lookup gathers its rows instead. Packed, it
    would cross whole every step. A read used later, outside the call, is left unpacked. (A
    use of its shape alone is no use: the shape is known, so `tf.shape` makes a constant.)
    """
    return bool(tensor.consumers())
