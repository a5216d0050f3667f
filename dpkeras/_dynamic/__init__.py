"""`dpkeras.layers.DynamicEmbedding`: an embedding whose rows follow the ids it sees.

- `ids`: what ids the layer accepts, and strings hashed to int64;
- `initial`: a new row's initial vector, a function of the id and a seed only;
- `policy`: admission (`min_count`) and eviction (`lfu`, `lru`, `ttl`): which rows to free;
- `merge`: one step's ids from every replica, deduplicated per task and once more (with
  `dpkeras._variables.task_pulls.Union`, the per-task merge of every lookup);
- `collisions`: the strings behind hashed string ids, to count collisions;
- `index`: the id -> row hash table and the per-row bookkeeping beside the rows;
- `tables`: that hash table cut by id over several devices (a sharded table's index);
- `slots`: finding the optimizer's slots of the rows and resetting a reassigned row's;
- `layer`: the Keras layer.
"""
