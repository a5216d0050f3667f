"""Input: feeding the replicas their shares of each global batch.

One pipeline per input host (this process's CPU for its own replicas, each worker task's host
CPU for that task's), each feeding its replicas their contiguous slices of every global batch,
as TensorFlow's rebatching cuts it. Above `cluster/` (which task is which), below `_extended/`
(the strategy's `tf.distribute` input methods delegate here).

- `plan`: `InputPlan`, which input host feeds which replicas, and the strategy's input methods
  (`experimental_distribute_dataset`, `distribute_datasets_from_function`, values);
- `at_first_use`: TensorFlow's distributed datasets, whose epoch iterators make the input hosts'
  iterators when first read (subclasses of TensorFlow's private classes, their overridden
  members listed and checked in tests/test_architecture.py);
- `sharding`: what each input host's pipeline reads and yields on a cluster, by the dataset's
  `auto_shard_policy`;
- `seeds`: the same seeds on every input host for a pipeline's unseeded random ops;
- `shares`: TensorFlow's split of a global batch into the replicas' shares, and a Keras step's
  whole batch cut by it;
- `batch_rows`: a batch's rows, whatever its components (dense, ragged, sparse, None);
- `resumption`: where a run restored from a backup resumes its epoch's input (the batch after
  the backup, where the input's order is deterministic).

Keras's epoch loop reading whole batches on one machine of CPU replicas is an entry of the
patch table (`dpkeras._patches.whole_batches`), the one seam into Keras; what it decides and
does is here (`InputPlan.reads_whole_batches`, `InputPlan.whole_batches`, `shares`).
"""
