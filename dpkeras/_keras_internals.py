"""Every Keras internal dpkeras relies on, in one place, each with its reason.

Each function answers, from Keras-private state, a question no public API answers (mostly: what
a `tf.variable_creator_scope` creator cannot know, such as the Keras path of the variable and
who creates it) and says why. Where a release of dpkeras's span (`dpkeras._version.KERAS`)
differs, the function answers for each (`keras_minor`); they are tested against the Keras
installed, with the version faked for each release, and by the matrix (noxfile.py) on the
releases where an answer changes. If Keras changes them, tests fail rather than dpkeras
silently going wrong.
"""

import dataclasses

import keras
from keras.src.backend.common import global_state, stateless_scope


def name_scope_stack():
    """Returns the entries of the Keras name-scope stack of this thread, outermost first.

    Each entry has `.name` and `.caller`. A Keras layer pushes an entry whose caller is the
    layer itself while it builds (`Layer._open_name_scope`, `Layer.add_weight`), so the stack
    tells the variable creator which layer is creating a weight. `keras.name_scope` is public
    but the stack it maintains is not; `keras.src.backend.common.name_scope.current_path()`
    only gives the joined names, not the callers.
    """
    return list(global_state.get_global_attribute("name_scope_stack") or ())


def in_stateless_scope():
    """Whether Keras is running code inside a `keras.StatelessScope` in this thread.

    Keras traces unbuilt models symbolically (`backend.compute_output_spec`, used by `fit`
    and by the first call of a model without `build()`) inside a StatelessScope, where new
    variables are only registered and are created when the outermost StatelessScope exits.
    `keras.StatelessScope` is public; asking whether one is active is not.
    """
    return stateless_scope.in_stateless_scope()


def deferred_variables():
    """Returns the Keras variables registered for deferred creation in this thread.

    See `in_stateless_scope`: these variables get their `tf.Variable` only when the outermost
    StatelessScope exits, outside any scope that was active when they were declared.
    """
    return list(global_state.get_global_attribute("uninitialized_variables") or ())


def keras_variable_being_created(initial_value):
    """Returns the `keras.Variable` whose callable `initial_value` a creator received, or None.

    Keras creates its `tf.Variable` with `lambda: initializer(self._shape, dtype=self._dtype)`
    (`keras/src/backend/tensorflow/core.py`), so a creator learns the requested shape only by
    calling it, which computes a throwaway tensor and advances a `SeedGenerator` seed. The
    lambda's closure holds the Keras variable, whose shape is known.
    """
    for cell in getattr(initial_value, "__closure__", None) or ():
        try:
            content = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if isinstance(content, keras.Variable):
            return content
    return None


def underlying_variable(keras_variable):
    """Returns the `tf.Variable` a `keras.Variable` wraps (None while creation is deferred).

    The public `keras.Variable.value` returns a cast tensor instead inside a layer running in
    mixed precision (an AutocastScope), where identity and handles cannot be compared.
    """
    return keras_variable._value


def tracked_variables(layer):
    """Returns the variables a Keras layer tracks itself (not those of its sub-layers)."""
    tracker = getattr(layer, "_tracker", None)
    if tracker is None:
        return []
    return list(layer._trainable_variables) + list(layer._non_trainable_variables)


def tracking_stores(layer):
    """Where `layer` lists the variables it tracks itself: `[(values, ids), ...]`, or None.

    One pair per Keras 3.15 `Tracker` store of variables (trainable, non-trainable): the
    layer's ordered list of variables (the order saving relies on) and the set of their ids
    that Keras deduplicates tracking by. These are Keras's own containers, returned for
    `dpkeras._patches.shared_weights` to change; nothing here changes them. Keras has no public
    way to hand a layer an existing variable (`Tracker.replace_tracked_value` finds the value
    with `==`, which Keras variables overload elementwise).
    """
    tracker = getattr(layer, "_tracker", None)
    if tracker is None:
        return None
    return [
        (tracker.config[store][1], tracker.stored_ids[store])
        for store in ("trainable_variables", "non_trainable_variables")
    ]


def tracker_of(layer):
    """The Keras `Tracker` of `layer` (locked after build: `setattr` then refuses new
    variables until it is unlocked), or None for an object Keras does not track."""
    return getattr(layer, "_tracker", None)


def predict_step_model(fn):
    """Returns the model whose `predict` step `fn` is, or None.

    Keras 3.15's TF trainer passes `strategy.run` a bound `train_step` / `test_step` for
    `fit` and `evaluate`, but for `predict` a closure (`make_predict_function`'s
    `one_step_on_data`, possibly a `tf.function`, possibly wrapped by `_autoconvert_optionals`)
    that calls `self.predict_step`. No public API says which model a step belongs to; the
    closure's cells hold it.
    """
    pending, seen = [fn], set()
    while pending:
        f = pending.pop()
        f = getattr(f, "python_function", f)  # a tf.function's Python function
        if id(f) in seen or not callable(f):
            continue
        seen.add(id(f))
        cells = getattr(f, "__closure__", None) or ()
        qualname = getattr(f, "__qualname__", "")
        for cell in cells:
            try:
                content = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            if "make_predict_function" in qualname and isinstance(content, tensorflow_trainer()):
                return content
            if callable(content) and not isinstance(content, tensorflow_trainer()):
                pending.append(content)
    return None


def creating_optimizer():
    """The Keras optimizer creating a variable right now (innermost on the stack), or None.

    A Keras optimizer creates its variables (`iterations`, slots, accumulators) inside
    `backend.name_scope(self.name, caller=self)`; see `name_scope_stack`.
    """
    for entry in reversed(name_scope_stack()):
        caller = getattr(entry, "caller", None)
        if isinstance(caller, keras.optimizers.Optimizer):
            return caller
    return None


def optimizer_strategy(optimizer):
    """The `tf.distribute.Strategy` a Keras optimizer was made under, or None.

    Keras 3.15's TF optimizer records the strategy in scope when it is constructed
    (`TFOptimizer._distribution_strategy`) and creates its slots under it (its
    `colocate_vars_with`): an optimizer made outside a model's strategy fails later, in `fit`,
    with TensorFlow's "Mixing different tf.distribute.Strategy objects". No public API says
    which strategy an optimizer belongs to; `dpkeras._patches.outside_the_scope` reads it to
    refuse such a `compile` by name instead.
    """
    return getattr(optimizer, "_distribution_strategy", None)


def built_outside_any_strategy(model):
    """Whether no `tf.distribute` strategy was in scope when `model` was made.

    Keras 3.15's TF trainer records the strategy in scope at construction
    (`TensorFlowTrainer._distribute_strategy`, None when there was none) and its public
    `distribute_strategy` falls back to the strategy current at each call, so the public
    property cannot tell "made outside any scope" from "made in the scope current now".
    """
    return model._distribute_strategy is None


def strategy_attribute():
    """The name of the attribute in which Keras 3.15's TF trainer records the strategy a model
    runs `fit`/`evaluate`/`predict` under (`_distribute_strategy`, set at construction, see
    `built_outside_any_strategy`); no public API sets it. `dpkeras._patches.outside_the_scope`
    sets it on a model made outside any scope whose variables all belong to one dpkeras
    strategy (keras-io's end-to-end inference wrapper around a model trained under it).
    """
    return "_distribute_strategy"


# -- saving (used by dpkeras/_patches/__init__.py and dpkeras/_patches/resume.py)
# ------------------------


def saving_module():
    """Returns `keras.src.saving.saving_lib`, the module whose functions write every file.

    `model.save` (`.keras`) and `model.save_weights` (`.weights.h5`), and so `ModelCheckpoint`
    and `BackupAndRestore`, end in `saving_lib.save_model` / `save_weights_only`, looked up on
    this module at each call. Keras offers no public hook to change how a file is written, so
    dpkeras/_patches/__init__.py wraps these two functions (their signatures are checked at
    install, tests/test_keras_patches.py).
    """
    from keras.src.saving import saving_lib

    return saving_lib


def is_remote_path(path):
    """Whether Keras writes `path` through a remote file system (`gs://`, `s3://`, ...).

    dpkeras renames only local files into place; `keras.src.utils.file_utils.is_remote_path`
    is the test Keras itself uses to choose its writer, and no public API exposes it.
    """
    from keras.src.utils import file_utils

    return bool(file_utils.is_remote_path(path))


def distributed_epoch_dataset(epoch_iterator):
    """The distributed dataset a Keras `TFEpochIterator` iterates, or None.

    Keras 3.15's TF trainer builds an unbuilt model by taking the first batch of the epoch's
    iterator (`TensorFlowTrainer._maybe_symbolic_build`); a Python generator or a `PyDataset` cannot
    give it back, so that batch is never trained or evaluated. dpkeras builds from the dataset's
    element spec instead (`dpkeras._patches.symbolic_build`), which only the iterator's private
    `_distributed_dataset` exposes.
    """
    return getattr(epoch_iterator, "_distributed_dataset", None)


def tensorflow_trainer():
    """Keras's `TensorFlowTrainer` class, whose `fit`/`evaluate`/`predict` and
    `_maybe_symbolic_build` dpkeras wraps (see `dpkeras._patches`)."""
    from keras.src.backend.tensorflow.trainer import TensorFlowTrainer

    return TensorFlowTrainer


def tf_epoch_iterator():
    """Keras's `TFEpochIterator` class, the epoch loop of the TF trainer, whose `__init__`
    dpkeras wraps (`dpkeras._patches.whole_batches`): it is where Keras hands a dataset to
    `strategy.experimental_distribute_dataset`, and Keras exposes no hook for it."""
    from keras.src.backend.tensorflow.trainer import TFEpochIterator

    return TFEpochIterator


def base_trainer():
    """Keras's backend-independent `Trainer` class, whose `compile` dpkeras wraps (see
    `dpkeras._patches.outside_the_scope`).

    `compile` is defined there, not on `TensorFlowTrainer`, and Keras's loading compares
    `model.__class__.compile` with `Trainer.compile` to tell a custom `compile` (then it skips
    compiling a loaded model): the wrapper must replace `Trainer.compile` itself.
    """
    from keras.src.trainers.trainer import Trainer

    return Trainer


def is_functional(model):
    """Whether `model` is a functional model (`keras.Model(inputs, outputs)`, not Sequential).

    A `.keras` file stores a functional model's layers one by one, with the graph between them; two
    distinct layers sharing variables load unshared (dpkeras._patches.resume warns). Keras's
    `Functional` class is not public (`keras.Model(inputs, outputs)` returns one).
    """
    from keras.src.models.functional import Functional

    return isinstance(model, Functional) and not isinstance(model, keras.Sequential)


@dataclasses.dataclass(frozen=True)
class BackupFiles:
    """The files a `keras.callbacks.BackupAndRestore` writes (see `backup_files`)."""

    weights: str
    metadata: str
    previous_weights: str
    previous_metadata: str


def backup_files(callback):
    """The paths a `BackupAndRestore` writes its backup to, as a `BackupFiles`.

    dpkeras writes a backup itself for its models (atomically, with the seed states: see
    dpkeras/_patches/resume.py) into the files Keras would read back; Keras 3.15 keeps their paths
    only in private attributes set in `__init__`, with no public way to ask where they are.
    """
    return BackupFiles(
        weights=callback._weights_path,
        metadata=callback._training_metadata_path,
        previous_weights=callback._prev_weights_path,
        previous_metadata=callback._prev_training_metadata_path,
    )


def backup_position(callback):
    """`(epoch, last batch seen)` a `BackupAndRestore` would record in a backup now.

    Keras 3.15 tracks them in private attributes, updated by its batch and epoch hooks. Keras
    3.11+ call `on_train_batch_end` with the last batch of a call of the step function
    (`steps_per_execution` batches); Keras 3.8-3.10 with its first, so the last batch trained
    is counted from it here (at most the epoch's last).
    """
    epoch, batch = callback._current_epoch, callback._last_batch_seen
    if keras_minor() < (3, 11) and callback.model is not None:
        batch += (callback.model.steps_per_execution or 1) - 1
        steps = (callback.params or {}).get("steps")
        if steps:
            batch = min(batch, steps - 1)
    return epoch, batch


def keras_minor():
    """`(major, minor)` of the Keras imported: where its internals differ within dpkeras's
    span (`dpkeras._version.KERAS`), the functions here answer for each release."""
    major, minor = keras.__version__.split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def step_spans(epoch_iterator, enumeration):
    """Keras's enumeration of an epoch (`EpochIterator._enumerate_iterator`) as `(begin step,
    end step, iterator)` per call of the step function, as Keras 3.11+ yields it. Keras
    3.8-3.10 yield `(step, iterator)`, a call covering `steps_per_execution` steps from `step`.
    """
    if keras_minor() >= (3, 11):
        yield from enumeration
        return
    for step, iterator in enumeration:
        yield step, step + epoch_iterator.steps_per_execution - 1, iterator


def as_keras_enumeration(spans):
    """The reverse of `step_spans`: what the Keras imported expects its enumeration to yield."""
    if keras_minor() >= (3, 11):
        yield from spans
        return
    for begin, _, iterator in spans:
        yield begin, iterator


def epoch_iterator_class():
    """Keras's `EpochIterator` class, whose `_enumerate_iterator` (one epoch's enumeration of
    `(begin step, end step, iterator)`) dpkeras wraps to resume an epoch at the batch after a
    backup (`dpkeras._patches.resume`): Keras 3.15 has no way to start an epoch at a batch."""
    from keras.src.trainers.epoch_iterator import EpochIterator

    return EpochIterator


def epoch_dataset(epoch_iterator):
    """The `tf.data.Dataset` an epoch iterator reads (Keras's pipeline of NumPy arrays or
    tensors, or the user's dataset), or None for input dpkeras cannot see (a Python generator,
    a `PyDataset`, a torch DataLoader, grain). Keras's adapters are private classes, chosen by
    `get_data_adapter`; the adapter is the iterator's `data_adapter`, the dataset it distributed
    its private `_distributed_dataset` (`distributed_epoch_dataset`).

    For arrays, the pipeline the iterator made is returned, not a new one from the adapter
    (`get_tf_dataset` converts every array to a tensor again: a second copy of the data): as
    it is on one machine of CPU replicas (`dpkeras._input.plan.InputPlan.reads_whole_batches`),
    or the one TensorFlow's `DistributedDataset` keeps in its private `_original_dataset`, or
    the source dpkeras's own distributed datasets keep (`dpkeras._input.at_first_use`).
    """
    import tensorflow as tf
    from keras.src.trainers.data_adapters.array_data_adapter import ArrayDataAdapter
    from keras.src.trainers.data_adapters.tf_dataset_adapter import TFDatasetAdapter

    adapter = getattr(epoch_iterator, "data_adapter", None)
    if isinstance(adapter, TFDatasetAdapter):
        return adapter.get_tf_dataset()  # the dataset it holds
    if not isinstance(adapter, ArrayDataAdapter):
        return None
    distributed = distributed_epoch_dataset(epoch_iterator)
    if isinstance(distributed, tf.data.Dataset):
        return distributed
    for name in ("_dpkeras_source", "_original_dataset"):
        found = getattr(distributed, name, None)
        if isinstance(found, tf.data.Dataset):
            return found
    return None


def epoch_stream(epoch_iterator):
    """`(steps_per_epoch or None, batches in the data or None)` of a Keras epoch iterator, as its
    enumeration uses them: `steps_per_epoch` as given to `fit`, and the data adapter's count
    (None for a dataset of infinite or unknown length)."""
    return epoch_iterator.steps_per_epoch, epoch_iterator.data_adapter.num_batches


def initial_epoch_attribute():
    """The attribute in which a model keeps the epoch its next `fit` starts at: Keras 3.15's
    `BackupAndRestore` sets the private `_initial_epoch` when it restores a backup, and `fit`
    reads it. dpkeras sets it one epoch on for a backup found to be at its epoch's end
    (`dpkeras._patches.resume`)."""
    return "_initial_epoch"


def save_backup(callback):
    """Has a `BackupAndRestore` write its backup now (its private `_save_model`, which
    dpkeras replaces for its models: `dpkeras._patches.resume.backup_save_model`). Keras 3.15
    saves only from its batch and epoch hooks; a backup put off from an epoch's last batch to
    its end (after validation) is written from `on_epoch_end`, where Keras would not write
    one for a `save_freq` in batches."""
    callback._save_model()


def backup_batch_count():
    """The names of the attributes in which a `BackupAndRestore` counts batches toward its
    next save: `(last batch seen, batches seen since the last save)`.

    A run resumed at the batch after a mid-epoch backup sets them (`dpkeras._patches.resume`)
    as they were just after that backup, so that it backs up at the batches an uninterrupted
    run backs up at; Keras 3.15 keeps the count in these private attributes, with no setter.
    """
    return "_last_batch_seen", "_batches_seen_since_last_saving"


# -- keras-rs (the table entry of dpkeras/_patches/keras_rs.py)
# ------------------------------------------------------------------------


def keras_rs_distributed_embedding():
    """keras-rs's `DistributedEmbedding` class, whose private `_sparsecore_init` the table of
    dpkeras._patches wraps; None if keras-rs is not imported (dpkeras never imports it).

    keras-rs 0.4.0 reads each table's `TableConfig.placement` in `DistributedEmbedding`'s
    constructor and hands the tables placed on "sparsecore" to that private method, which
    raises off TPU without naming a table. keras-rs has no public hook between reading the
    configs and that error. The entry is skipped when the method no longer has the parameters
    it names (keras-rs's own error stands then; tests/test_keras_rs.py fails on such an
    upgrade).
    """
    import sys

    module = sys.modules.get("keras_rs")
    return None if module is None else module.layers.DistributedEmbedding


# -- dynamic embeddings (used by dpkeras/_dynamic/slots.py)
# ------------------------------------------


def optimizer_slots(optimizer, variable):
    """`{slot name: slot variable}` of the variables `optimizer` made for `variable`.

    A `DynamicEmbedding` resets the slots of a row it hands to a new id. Keras 3.15 has no
    public map from a variable to its slots: `add_variable_from_reference` names a slot
    `<variable path with _ for />_<slot name>` (and gives it the variable's shape), and the
    optimizer lists it in `optimizer.variables`; the slot is found by that name.
    """
    prefix = f"{variable.path.replace('/', '_')}_"
    return {
        v.name[len(prefix) :]: v
        for v in optimizer.variables
        if v.name.startswith(prefix) and tuple(v.shape) == tuple(variable.shape)
    }


def adagrad_accumulator(optimizer, variable):
    """The accumulator `optimizer` (a `keras.optimizers.Adagrad`) keeps for `variable`.

    dpkeras's rows-only Adagrad update (dpkeras/_extended/sparse_rows.py) does what Keras's
    `Adagrad.update_step` does, and finds the accumulator as it does: `_accumulators`, indexed
    by `_get_variable_index` (Keras 3.15 has no public map from a variable to its slots).
    """
    return optimizer._accumulators[optimizer._get_variable_index(variable)]


def training_model():
    """The Keras model whose `train_step` is running in this thread's calls, or None.

    A `DynamicEmbedding` that hands a row to a new id must reset the optimizer's slots of that
    row, but a Keras layer never learns which model (and so which optimizer) trains it. Keras
    3.15's `fit` calls `model.train_step(data)` (in each replica's thread under a strategy),
    which calls the layer: the innermost frame of a function named `train_step` whose `self`
    is a `keras.Model` is the model being trained. Neither the frame walk nor Keras's call
    chain is a public API.
    """
    import inspect

    frame = inspect.currentframe()
    try:
        while frame is not None:
            owner = frame.f_locals.get("self") if frame.f_code.co_name == "train_step" else None
            if isinstance(owner, keras.Model):
                return owner
            frame = frame.f_back
        return None
    finally:
        del frame


# ---- What `dpkeras._patches.step_loop` reuses of Keras's TF trainer ----
# It runs Keras's loop over `steps_per_execution` steps with each worker's batch read on its
# host (Keras's loop carries every replica's next batch through worker 0); a step there must
# be Keras's own step: the same reduction of the replicas' logs and the same conversion of
# optional inputs, which Keras keeps private. tests/test_cluster_loop.py fails if they change.


def reduce_per_replica(outputs, strategy, reduction):
    """Keras's reduction of a step's per-replica logs (`trainer.reduce_per_replica`)."""
    from keras.src.backend.tensorflow.trainer import reduce_per_replica as reduce

    return reduce(outputs, strategy, reduction=reduction)


def autoconvert_optionals(model, step):
    """`step` wrapped as Keras wraps its one-step function: optional inputs given as
    `tf.experimental.Optional` become None (`TensorFlowTrainer._autoconvert_optionals`, Keras
    3.12+). Keras 3.8-3.11 wrap nothing (their trainer has no such method): `step` itself."""
    if keras_minor() < (3, 12):
        return step
    return model._autoconvert_optionals(step)


def unrolled_steps(model):
    """How many steps Keras's loop unrolls per iteration (`unrolled_steps_per_execution`)."""
    return getattr(model, "unrolled_steps_per_execution", 1)


def making_a_keras_variable():
    """Whether a `keras.Variable` is making its `tf.Variable` on this thread's call stack.

    Keras's TensorFlow backend makes every variable's `tf.Variable` in `Variable._initialize`
    (`keras/src/backend/tensorflow/core.py`; a deferred variable's initializer calls it too). A
    creator that sees a variable made while a Keras layer builds, with no `keras.Variable` on
    the stack, sees a plain `tf.Variable` made by the layer's own code, which Keras never
    tracks. No public API tells a creator who called it; the stack does (`sys._getframe`).
    """
    import sys

    from keras.src.backend.tensorflow import core

    code = core.Variable._initialize.__code__
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code is code:
            return True
        frame = frame.f_back
    return False
