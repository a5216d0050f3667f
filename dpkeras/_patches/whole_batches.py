"""Keras's epoch loop on one machine of CPU replicas reads whole batches; the step cuts them.

Keras's `TFEpochIterator` hands its dataset to `strategy.experimental_distribute_dataset`,
and each epoch makes the result's iterator, for training and again for validation.
TensorFlow's distributed iterator traces functions for every device it feeds as it is made
(~0.13 s with 2 replicas on a 2-core machine): most of what a small `fit` costs, per epoch,
where no strategy pays ~0.01 s for `iter(dataset)`. When the replicas are this machine's CPUs
(`InputPlan.reads_whole_batches`), the epoch iterator keeps the dataset itself: its iterator
yields whole global batches on the host, and each replica's step runs on its share of the batch
(`dpkeras._input.shares.cut_whole_batch`), the rows TensorFlow's rebatching would have given it.
Replicas on GPUs keep TensorFlow's distributed iterator, which prefetches each share into its
device's memory.

This wrapper is the entry's seam into Keras only: it finds the strategy's `InputPlan`
(`extended_of`, which stands above `dpkeras._input`); the decision and the cut are input's
(`InputPlan.reads_whole_batches`, `InputPlan.whole_batches`, `dpkeras._input.shares`).
"""

from dpkeras._extended.extended import extended_of


def reading_whole_batches(original, iterator, distribute_strategy=None, *args, **kwargs):
    """Wraps Keras's `TFEpochIterator.__init__` (see the module)."""
    extended = None if distribute_strategy is None else extended_of(distribute_strategy)
    if extended is None or not extended.input_plan.reads_whole_batches():
        return original(iterator, distribute_strategy, *args, **kwargs)
    with extended.input_plan.whole_batches():
        return original(iterator, distribute_strategy, *args, **kwargs)
