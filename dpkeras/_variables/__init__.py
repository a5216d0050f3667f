"""The variables dpkeras gives Keras, and how a replica reads and writes them.

Three kinds, each answering for itself what the strategy asks of it (`placed.PlacedVariable`:
update, sum its gradient, write, where it lives, whether XLA can compile a step that reads it).

- `placed`: `PlacedVariable`, the protocol every kind implements, and `of`, the one test of
  "is this a dpkeras variable?";
- `pieces`: one piece at a time: the optimizer's update of shard i, its pass for copy j, and
  the rule that a variable that is not replicated is written in pass 0 only;
- `replica_step`: the step a replica is running (its id, device, gradient weight, inputs);
- `variables`: `WholeVariable`, a variable kept whole, read once per replica, and
  `ParameterVariable`, one copy on a parameter device; `writes`: its writes inside a replica,
  by the variable's kind;
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
