"""The variables dpkeras gives Keras, and how a replica reads and writes them.

- `replica_step`: the step a replica is running (its id, device, gradient weight, inputs);
- `variables`: `ParameterVariable`, one copy on a parameter device, read once per replica;
  `writes`: its writes inside a replica, by the variable's kind;
- `replicated`: `ReplicatedVariable`, a copy on every compute device (`placement.REPLICATED`);
- `partitioning`: TensorFlow's partitioners, validated, and the row split of a variable
  (rows per shard, and a tensor's or ids' part in each shard);
- `sharded`: `ShardedParameterVariable`, one full-shape variable over shards, and how it is
  saved; `sharded_reads` and `sharded_writes`: its reads gathered from the shards and its
  writes cut into them; `shard_updates`: the optimizer's sum and update, shard by shard;
- `lookups`: embedding lookups gathered where the table is;
- `dedup`: each distinct id crosses once (the modes, unique ids, summed gradient rows);
- `task_pulls`: a worker's replicas share one pull of each distinct id (on a cluster), through
  `Union`, the per-task merge of ids that `DynamicEmbedding`'s step ids use too.
"""
