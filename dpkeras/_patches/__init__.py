"""Every change dpkeras makes to Keras, TensorFlow and keras-rs: one table, checked and reversible.

Keras has no public hook for how files are written, how an unbuilt model is built, what a
failed cluster task is called, where a step function runs, how the epoch loop reads a dataset,
or where gradients are summed relative to clipping; each such change is an entry of
`table.ENTRIES`, of a kind declared in `entries` (a Keras function wrapped, an optional
library's function wrapped, a TensorFlow dispatcher), naming the hook that would retire it. No
other module of dpkeras changes Keras, TensorFlow or keras-rs (tests/test_keras_patches.py).

- `entries`: the kinds of entry, each checked before it is installed and reversible;
- `table`: the entries, and their one lifecycle (installed by a dpkeras scope, or by a cluster
  strategy until it is entered; put back when no scope is entered and no dpkeras variable
  lives, or by `dpkeras.uninstall()`);
- `resume`: crash-safe saving and exact resume (docs/reliability.md);
- `atomic_files`: files that are at every moment old or new (standard library only);
- `symbolic_build`: an unbuilt model built from the data's spec, not its first batch;
- `task_failures`: `fit`, `evaluate` and `predict` name the cluster task that failed;
- `lost_tasks`: on a cluster, a worker lost in the middle of `fit` is left out (and taken back
  once it answers again), a ps waited for (bounded) and its variables made again; every
  variable is restored from the backup, and `fit` goes on;
- `cluster_loop`: on a cluster, Keras's step functions run on a task, not on the client, and
  `fit`'s and `evaluate`'s loop reads each worker's batch on the worker (`step_loop`);
- `xla`: with `jit_compile=True`, one decision whether XLA can compile a model's steps (its
  variables answer), one warning when it cannot; `predict` compiles the whole step, as `fit`
  does;
- `whole_batches`: on one machine of CPU replicas, Keras's epoch loop reads whole batches on
  the host and each replica's step cuts its share (no distributed iterator per epoch);
- `keras_rs`: keras-rs tables placed on "sparsecore" refused by name (no TPU here);
- `outside_the_scope`: `compile` outside a model's strategy, and `fit` of a model without one
  beside a cluster strategy never entered, refused by name;
- `shared_weights`: a layer built under TF1 `reuse` holds the first layer's variable (the one
  write to a Keras object's private state; it is the model's structure, so it stays).

The rule: what dpkeras changes in Keras, TensorFlow or keras-rs themselves (their functions,
classes and process-wide registries, shared by every model in the process) is an entry of the
table, and `uninstall()` puts it back. A user's own objects are not Keras: what dpkeras sets on
a model or a layer through Keras's public attributes is the model's, as when Keras sets it, and
no entry (`uninstall()` leaves models as they are). So `dpkeras.tf1` names a second TF1 tower's
layer `conv_1` (`layer.name`, Keras's own suffix for a duplicate name; the functional model it
is in refuses two layers of one name, and its saved files keep the name), and
`dpkeras.train_step_transfers` sets `model.train_function = None` (as Keras's `compile` does)
so the step is traced where its transfers are recorded (as `lost_tasks` does, for a step that held
a lost task's resources). A model's structure that only Keras's
private state can hold (`shared_weights`) is written here, beside the table, and stays too.
tests/test_keras_patches.py holds the rest of dpkeras to it: nothing outside `_patches/`
assigns to Keras, TensorFlow or keras-rs, or registers with TensorFlow's dispatch.
"""
