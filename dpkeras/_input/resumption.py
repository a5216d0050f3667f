"""Resuming an epoch's input where a backup was taken: at its batch, not at its first batch.

Keras 3.15's `BackupAndRestore` restores a backup taken in the middle of an epoch by restarting
that epoch from its first batch: the batches before the backup are trained a second time.
Where the input's order is deterministic (it depends only on the data and the epoch, not on
the run: `why_order_may_differ`), the epoch is resumed instead at the batch after the backup:
Keras's epoch loop runs as it always does, and `resumed` reads the batches before the resume
point from the iterator without training on them, then hands the loop on at the true step
number. The run then trains the same batches, in the same order, as an uninterrupted run.

With `steps_per_epoch`, Keras keeps one iterator across epochs (the stream is not restarted at
each epoch): a restarted run must also pass over the batches earlier epochs read from it
(`stream_position`), or even a backup taken at an epoch's end resumes on other batches.
"""

import dataclasses
import math

import tensorflow as tf

from dpkeras import _tf_internals
from dpkeras._input import seeds


def why_order_may_differ(dataset):
    """Why a restarted run may read `dataset`'s batches in another order than an uninterrupted
    run reads them at the same epoch (a phrase), or None: its order is deterministic.

    Args:
        dataset: the `tf.data.Dataset` an epoch reads (Keras's pipeline of NumPy arrays, or the
            user's dataset), or None for input dpkeras cannot see (a Python generator or a
            `keras.utils.PyDataset`).
    """
    if dataset is None:
        return "it is a Python generator or a PyDataset, whose order dpkeras cannot see"
    if not isinstance(dataset, tf.data.Dataset):
        return f"it is a {type(dataset).__name__}, not a tf.data.Dataset dpkeras can read"
    if _tf_internals.runs_python(dataset):
        return "its pipeline calls Python (py_function, numpy_function or from_generator)"
    unseeded, stateful = set(), set()
    for current in _tf_internals.pipeline(dataset):
        if _tf_internals.dataset_seeds_unset(current):
            unseeded.add(type(current).__name__.lstrip("_"))
        for node in _tf_internals.function_nodes(current):
            if seeds.unseeded(node):
                unseeded.add(node.op)
            if node.op in _STATE_CHANGING_OPS or node.op.startswith("Stateful"):
                stateful.add(node.op)
    if unseeded:
        return (
            f"its random ops have no seed ({', '.join(sorted(unseeded))}): call "
            f"keras.utils.set_random_seed before building the data, or give them seeds"
        )
    if stateful:
        return (
            f"it changes state that lives on from one epoch to the next "
            f"({', '.join(sorted(stateful))}: a tf.random.Generator, a Keras random layer's "
            f"seed generator, a variable), so a restarted run draws other values"
        )
    drawing = sorted(
        {
            type(d).__name__.lstrip("_")
            for d in _tf_internals.pipeline(dataset)
            if _tf_internals.draws_anew_each_iteration(d)
        }
    )
    if drawing:
        return (
            f"it draws a new order each time it is iterated ({', '.join(drawing)} with "
            f"reshuffle_each_iteration=True): its n-th epoch depends on how many epochs the "
            f"same dataset object ran before, which a restarted run does not repeat"
        )
    return None


# Ops by which a pipeline's function changes state that outlives an epoch: a
# `tf.random.Generator`'s draws (`RngReadAndSkip`, `Stateful*`), a Keras `SeedGenerator`'s or any
# variable's update (`Assign*VariableOp`). Its n-th epoch then depends on the epochs before.
_STATE_CHANGING_OPS = frozenset(
    {
        "AssignVariableOp",
        "AssignAddVariableOp",
        "AssignSubVariableOp",
        "RngReadAndSkip",
        "RngSkip",
    }
)


def stream_position(epoch, steps_per_epoch, steps_per_execution, num_batches):
    """How many batches Keras's epoch loop has read from its iterator when epoch `epoch`
    (0-based) begins, in a run that started at epoch 0, or None when a restarted run cannot
    know it (a stream of unknown length).

    Keras 3.15's `EpochIterator`: without `steps_per_epoch` each epoch makes a new iterator
    (0). With it, one iterator serves the epochs one after the other; each call of the step
    function reads `steps_per_execution` batches (the last call of an epoch too, past
    `steps_per_epoch` when it is not a multiple), and the iterator is made again once
    `num_batches` batches have been read from it (never, for an infinite dataset:
    `num_batches` None). tests/test_resume_mid_epoch.py checks this against Keras's loop.
    """
    if not steps_per_epoch:
        return 0
    if num_batches is None:
        calls = math.ceil(steps_per_epoch / steps_per_execution)
        return epoch * calls * steps_per_execution
    seen = 0
    for _ in range(epoch):
        for _ in range(0, steps_per_epoch, steps_per_execution):
            if seen >= num_batches:
                break
            seen += steps_per_execution
        if seen >= num_batches:
            seen = 0
    return seen


@dataclasses.dataclass(frozen=True)
class Resumption:
    """Where a restarted run's first epoch begins in its input.

    Attributes:
        first_step: the step (batch index within the epoch) training resumes at: the batch
            after the backup, or 0 for a backup taken at an epoch's end.
        before: batches the epoch's iterator yields before the epoch's first batch
            (`stream_position`).
        epoch_ended: the epoch has no batch after `first_step`: a backup of data of unknown
            length taken at its epoch's last batch (`ended_at`), which is an epoch's end.
    """

    first_step: int
    before: int = 0
    epoch_ended: bool = False


def ended_at(dataset, batches):
    """Whether `dataset` (of unknown length) has no element after its first `batches`: a
    backup taken after them was at its epoch's end. Reads `batches` + 1 elements at most."""
    for _ in dataset.skip(batches).take(1):
        return False
    return True


def _discard(iterator, count):
    for _ in range(count):
        next(iterator)


def resumed(enumeration, resumption, on_resume):
    """Keras's enumeration of one epoch, `(begin step, end step, iterator)` per call of the
    step function, resumed at `resumption`: the batches before it are read and dropped, and
    the first call trains from `resumption.first_step`. `on_resume()` is called once, before
    the first batch is trained (the metrics' states of the backup are restored then).

    A call that straddles the resume point (a backup taken with another
    `steps_per_execution`) gets its remaining batches as a list, which Keras's step function
    runs one by one, and reports the true first step.
    """
    positioned = resumed_yet = False
    for begin, end, iterator in enumeration:
        if not positioned:
            _discard(iterator, resumption.before)
            positioned = True
        if end < resumption.first_step:
            _discard(iterator, end - begin + 1)
            continue
        if not resumed_yet:
            on_resume()
            resumed_yet = True
        if begin < resumption.first_step:
            _discard(iterator, resumption.first_step - begin)
            batches = []
            for _ in range(end - resumption.first_step + 1):
                try:
                    batches.append(next(iterator))
                except (StopIteration, tf.errors.OutOfRangeError):
                    break
            if not batches:  # the data ended at the resume point
                return
            yield resumption.first_step, end, batches
            continue
        yield begin, end, iterator
