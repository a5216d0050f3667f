"""What dpkeras installs into Keras and TensorFlow while it is in use: checked and reversible.

Keras has no public hook for how files are written, how an unbuilt model is built, or what
a failed cluster task is called, so the Keras-private functions in `PATCHES` are replaced by
wrappers that act for dpkeras models and call Keras's original, unchanged, for every other
model. The `tf.gather` dispatcher of `dpkeras._variables.lookups` is registered with them.

- `table`: the Keras functions wrapped, checked at install, and the lifecycle;
- `resume`: crash-safe saving and exact resume (docs/reliability.md);
- `atomic_files`: files that are at every moment old or new (standard library only);
- `symbolic_build`: an unbuilt model built from the data's spec, not its first batch;
- `task_failures`: `fit`, `evaluate` and `predict` name the cluster task that failed;
- `cluster_loop`: on a cluster, Keras's step functions run on a task, not on the client.
- `keras_rs`: keras-rs tables placed on "sparsecore" refused by name (no TPU here).
"""
