"""The machinery behind the strategy: its extended class and the parts it delegates to.

- `extended`: `ParameterDeviceExtended`, answering TensorFlow's hooks;
- `devices`: which devices compute and hold variables (arguments, settings, defaults);
- `creator`: the one variable creator (placement, sharding);
- `reductions`: cross-replica sums where they are consumed, and the ledger of them;
- `cross_replica`: `CrossReplicaHooks`, TensorFlow's reduce, broadcast and update hooks, each
  where its value is consumed;
- `keras_steps`: what a Keras step needs around it (model check, uneven batches, "finite?");
- `optimizer_apply`: the optimizer applies the summed gradient once (once per copy of the
  replicated variables);
- `all_reduce`: replicated variables' gradients summed among the compute devices.
- `packing`: the dense gradients a worker sends to one parameter device, as one tensor.
- `sparse_rows`: Adagrad's update of a table on the gradient's rows only, with Keras's bits.

Feeding the replicas is `dpkeras._input`, one floor below.
"""
