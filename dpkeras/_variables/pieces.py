"""One piece of a variable at a time: the optimizer's update of shard i, and its pass for copy j.

The optimizer updates a sharded variable shard by shard (`shard`), and the replicated
variables copy by copy (`copy`). Inside either block, the variables concerned act as that
piece: a sharded variable cut like the one being updated reads and writes its shard i; a
replicated variable reads and writes its copy j. Both are recorded on one thread-local stack:
the optimizer's update runs in the thread that merges the replicas, and a block entered inside
another hides it for the variables it concerns, until it exits.
"""

import contextlib
import threading

_local = threading.local()


@contextlib.contextmanager
def _entered(entry):
    stack = getattr(_local, "stack", ())
    _local.stack = stack + (entry,)
    try:
        yield
    finally:
        _local.stack = stack


def _innermost(what, key=None):
    for entry in reversed(getattr(_local, "stack", ())):
        if entry[0] == what and (key is None or entry[1] == key):
            return entry
    return None


def shard(variable, index):
    """Sharded variables cut like `variable` act as their shard `index` in this block.

    The optimizer updates a sharded variable shard by shard, on each shard's device: inside
    this block every sharded variable of the same row split (the variable and its optimizer
    slots, which are sharded like it) reads and writes shard `index`, so Keras's update step,
    weight decay and EMA run unchanged on shard-sized tensors.
    """
    return _entered(("shard", None, (variable.rows, index, variable)))


def current_shard():
    """`(rows, index, variable)` of the innermost `shard` block on this thread, or None."""
    entry = _innermost("shard")
    return None if entry is None else entry[2]


def copy(extended, index):
    """Declares that the optimizer applies the summed gradients to copy `index` of every
    replicated variable of `extended` (`dpkeras._extended.optimizer_apply`), or that a write
    reaches that copy.

    Inside it, a replicated variable reads and writes its copy `index`, and a variable that is
    not replicated is written only in pass 0 (`writes_skipped`).
    """
    return _entered(("copy", id(extended), index))


def copy_index(extended):
    """The copy of `extended`'s replicated variables this thread works on, or None."""
    entry = _innermost("copy", id(extended))
    return None if entry is None else entry[2]


def writes_skipped(extended):
    """Whether a write to a variable of `extended` that is not replicated is skipped here: in
    the optimizer's pass for copy j > 0.

    The optimizer runs once per copy of the replicated variables (pass j on compute device j,
    passes run from the last to 0), and every pass computes the same update of a variable that
    is not replicated (it lives once, on a parameter device, as do its gradient's sum and its
    optimizer state). It is written once, in pass 0, which runs last: every pass then reads what
    pass 0 reads, so the copies of the replicated variables are updated alike.
    """
    return bool(copy_index(extended))
