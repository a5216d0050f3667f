"""Every change dpkeras makes to Keras, TensorFlow and keras-rs (`ENTRIES`), and its lifecycle.

One table, one lifecycle: a dpkeras scope installs every entry (checked first), and they stay
while a scope is entered or a variable made under one lives; then, or at `uninstall()`, every
original object is put back. The kinds of entry are in `dpkeras._patches.entries`.
"""

import contextlib
import functools
import hashlib
import inspect
import threading
import weakref

import keras
import tensorflow as tf

from dpkeras import _keras_internals, _tf_internals, _version
from dpkeras._extended import optimizer_apply, sparse_rows
from dpkeras._patches import (
    cluster_loop,
    keras_rs,
    lost_tasks,
    outside_the_scope,
    resume,
    symbolic_build,
    task_failures,
    whole_batches,
    xla,
)
from dpkeras._patches.entries import Attribute, Dispatcher, OptionalAttribute
from dpkeras._variables import lookups


def _backup_save_model(original, callback):
    return resume.backup_save_model(
        original, callback, keras_original(entry("saving_lib.save_weights_only"))
    )


def _epoch_iterator_made(original, epoch_iterator, *args, **kwargs):
    whole_batches.reading_whole_batches(original, epoch_iterator, *args, **kwargs)
    resume.note_epoch_iterator(epoch_iterator)


def _backup_and_restore():
    return keras.callbacks.BackupAndRestore


def _model_checkpoint():
    return keras.callbacks.ModelCheckpoint


def _optimizer():
    return keras.optimizers.Optimizer


_FIT = (
    "(self, x=None, y=None, batch_size=None, epochs=1, verbose='auto', callbacks=None, "
    "validation_split=0.0, validation_data=None, shuffle=True, class_weight=None, "
    "sample_weight=None, initial_epoch=0, steps_per_epoch=None, validation_steps=None, "
    "validation_batch_size=None, validation_freq=1)"
)
_EVALUATE = (
    "(self, x=None, y=None, batch_size=None, verbose='auto', sample_weight=None, "
    "steps=None, callbacks=None, return_dict=False, **kwargs)"
)
_PREDICT = "(self, x, batch_size=None, verbose='auto', steps=None, callbacks=None)"


_SAVING = (
    "a public hook for how Keras writes a file (a writer or a file-system argument to "
    "saving_lib), so that a save can go to a temporary file renamed into place"
)
_BACKUP = (
    "BackupAndRestore hooks to add state to a backup (seed generators) and to commit it "
    "atomically, and a public epoch/batch position"
)
_FAILURES = (
    "a public hook for exceptions raised by fit/evaluate/predict (callbacks see none), or "
    "tf.distribute reporting a lost task as a typed error"
)
_LOOP = (
    "a device argument for the step functions (Keras's make_*_function calls them without "
    "one), or a strategy hook around the call of a multi-step function; and a multi-step "
    "loop that reads each batch inside its iteration (Keras's carries the next batch as a "
    "loop variable, on the loop's device)"
)

_JIT = (
    "Keras's TF trainer compiling predict's distributed step whole, as it does fit's and "
    "evaluate's, not each replica's step; and a strategy hook by which a strategy says its "
    "steps cannot be compiled for one device (replicated variables live on every device)"
)


_COMPILE = (
    "(self, optimizer='rmsprop', loss=None, loss_weights=None, metrics=None, "
    "weighted_metrics=None, run_eagerly=False, steps_per_execution=1, jit_compile='auto', "
    "auto_scale_loss=True)"
)
_SCOPES = (
    "Keras's TF trainer checking, in compile and fit, that the model, its optimizer and the "
    "strategy in scope agree (as tf.keras 2 did), or a strategy hook called by compile and fit"
)


def _fit(original, model, *args, **kwargs):
    signature = inspect.signature(original)
    try:
        initial_epoch = signature.bind(model, *args, **kwargs).arguments.get("initial_epoch", 0)
    except TypeError:  # arguments fit does not take: Keras's own error says which
        return original(model, *args, **kwargs)

    def each_call(model, *args, **kwargs):  # its first epoch iterator is the one resumed
        with resume.fitting(model, initial_epoch):
            return original(model, *args, **kwargs)

    named = functools.partial(task_failures.naming_failed_tasks, each_call)
    going_on = functools.partial(lost_tasks.going_on_after_a_lost_task, named, signature)
    return outside_the_scope.refusing_an_idle_cluster(going_on, model, *args, **kwargs)


def _step_function(step):
    on_the_cluster = cluster_loop.running_on_the_cluster(f"{step}_function")
    if step != "predict":

        def make_function(original, model, *args, **kwargs):
            compiled = functools.partial(xla.without_xla_if_it_cannot, original)
            return on_the_cluster(compiled, model, *args, **kwargs)

        return make_function

    def make_predict_function(original, model, *args, **kwargs):
        compiled = functools.partial(xla.whole_step_compiled, original)
        return on_the_cluster(compiled, model, *args, **kwargs)

    return make_predict_function


ENTRIES = (
    Attribute(
        _keras_internals.saving_module,
        "save_model",
        "saving_lib.save_model",
        "(model, filepath, weights_format='h5', zipped=True)",
        resume.save_model,
        retire=_SAVING,
    ),
    Attribute(
        _keras_internals.saving_module,
        "save_weights_only",
        "saving_lib.save_weights_only",
        "(model, filepath, max_shard_size=None, objects_to_skip=None)",
        resume.save_weights_only,
        retire=_SAVING,
        older_signatures=(("(model, filepath, objects_to_skip=None)", "Keras 3.8-3.9"),),
    ),
    Attribute(
        _backup_and_restore,
        "on_train_begin",
        "BackupAndRestore.on_train_begin",
        "(self, logs=None)",
        resume.backup_on_train_begin,
        retire=_BACKUP,
    ),
    Attribute(
        _backup_and_restore,
        "_save_model",
        "BackupAndRestore._save_model",
        "(self)",
        _backup_save_model,
        retire=_BACKUP,
        source_sha256="5eb7b53ca13ad33d97bdb44f3208f772d2fe030f5d3b3f3fcced5322821f32b7",
    ),
    Attribute(
        _backup_and_restore,
        "on_epoch_end",
        "BackupAndRestore.on_epoch_end",
        "(self, epoch, logs=None)",
        resume.backup_on_epoch_end,
        retire=_BACKUP,
    ),
    Attribute(
        _backup_and_restore,
        "on_train_end",
        "BackupAndRestore.on_train_end",
        "(self, logs=None)",
        resume.backup_on_train_end,
        retire=_BACKUP,
    ),
    Attribute(
        _model_checkpoint,
        "_save_model",
        "ModelCheckpoint._save_model",
        "(self, epoch, batch, logs)",
        resume.checkpoint_save_model,
        retire="a ModelCheckpoint option to skip a save whose monitored loss is not finite",
    ),
    # Build an unbuilt model from the data's spec, not its first batch (symbolic_build).
    Attribute(
        _keras_internals.tensorflow_trainer,
        "_maybe_symbolic_build",
        "TensorFlowTrainer._maybe_symbolic_build",
        "(self, iterator=None, data_batch=None)",
        symbolic_build.maybe_symbolic_build,
        retire="Keras's TF trainer building from the dataset's element_spec, as it can",
    ),
    # On one machine of CPU replicas, the epoch loop reads whole batches and each replica's
    # step cuts its share (dpkeras._patches.whole_batches); the first epoch iterator of a fit
    # is the one a backup resumes (dpkeras._patches.resume).
    Attribute(
        _keras_internals.tf_epoch_iterator,
        "__init__",
        "TFEpochIterator.__init__",
        "(self, distribute_strategy=None, *args, **kwargs)",
        _epoch_iterator_made,
        retire=(
            "a strategy hook for how Keras's epoch loop reads a dataset (Keras makes "
            "TensorFlow's distributed iterator each epoch, for training and validation)"
        ),
    ),
    # A run restored from a backup taken mid-epoch resumes at the batch after it
    # (dpkeras._patches.resume, dpkeras._input.resumption).
    Attribute(
        _keras_internals.epoch_iterator_class,
        "_enumerate_iterator",
        "EpochIterator._enumerate_iterator",
        "(self)",
        resume.resuming_the_epoch,
        retire=(
            "a BackupAndRestore (or EpochIterator) way to start an epoch at a given batch, and "
            "the metrics' states in a backup"
        ),
    ),
    # A model of a dpkeras strategy compiles in its scope (dpkeras._patches.outside_the_scope).
    Attribute(
        _keras_internals.base_trainer,
        "compile",
        "Trainer.compile",
        _COMPILE,
        outside_the_scope.compiling_in_the_model_scope,
        retire=_SCOPES,
    ),
    # On a cluster, name the task that failed (dpkeras._patches.task_failures); fit refuses a
    # model without a strategy beside a cluster strategy never entered (outside_the_scope).
    Attribute(
        _keras_internals.tensorflow_trainer,
        "fit",
        "TensorFlowTrainer.fit",
        _FIT,
        _fit,
        retire=(
            f"{_FAILURES}; and {_SCOPES}; and a strategy hook around fit to make a restarted "
            f"task's resources again and call it again"
        ),
    ),
    Attribute(
        _keras_internals.tensorflow_trainer,
        "evaluate",
        "TensorFlowTrainer.evaluate",
        _EVALUATE,
        task_failures.naming_failed_tasks,
        retire=_FAILURES,
    ),
    Attribute(
        _keras_internals.tensorflow_trainer,
        "predict",
        "TensorFlowTrainer.predict",
        _PREDICT,
        task_failures.naming_failed_tasks,
        retire=_FAILURES,
    ),
    # On a cluster, the step functions run on a task, so the client is out of the per-step
    # path (dpkeras._patches.cluster_loop).
    # With jit_compile=True, a model whose variables XLA cannot read from one device (replicated,
    # or on other tasks) runs its steps without XLA, and predict's whole step is compiled
    # (dpkeras._patches.xla).
    *(
        Attribute(
            _keras_internals.tensorflow_trainer,
            f"make_{step}_function",
            f"TensorFlowTrainer.make_{step}_function",
            "(self, force=False)",
            _step_function(step),
            retire=f"{_LOOP}; and for jit_compile, {_JIT}",
        )
        for step in ("train", "test", "predict")
    ),
    # An optimizer of a dpkeras strategy sums its replicas' gradients before it clips, decays
    # and accumulates (dpkeras._extended.optimizer_apply); every other optimizer is Keras's.
    Attribute(
        _optimizer,
        "apply",
        "Optimizer.apply",
        "(self, grads, trainable_variables=None)",
        optimizer_apply.summing_first,
        retire=(
            "an optimizer hook between receiving the replicas' gradients and clipping them "
            "(Keras clips, decays and accumulates per replica, then sums)"
        ),
    ),
    # An Adagrad dpkeras sums for updates a table's sparse gradient on its rows only, with
    # Keras's numbers (dpkeras._extended.sparse_rows); every other update is Keras's.
    Attribute(
        lambda: keras.optimizers.Adagrad,
        "update_step",
        "Adagrad.update_step",
        "(self, gradient, variable, learning_rate)",
        sparse_rows.rows_only,
        retire=(
            "Keras's Adagrad dividing a sparse gradient by its rows of sqrt(accumulator + "
            "epsilon), not by the whole table's (as tf.keras's fused sparse Adagrad does)"
        ),
        source_sha256="4c2b46cf41b77f7a113289dfb5986b4f4ab4c06baf03822d5f954e16f79a5de3",
    ),
    # keras-rs tables placed on "sparsecore" are refused by name (dpkeras._patches.keras_rs).
    OptionalAttribute(
        _keras_internals.keras_rs_distributed_embedding,
        "_sparsecore_init",
        "DistributedEmbedding._sparsecore_init",
        "(self, feature_configs, table_stacking)",
        keras_rs.refuse_under_dpkeras,
        retire="keras-rs validating a table's placement against the strategy, naming it",
        module="keras_rs",
    ),
    # tf.gather of a Keras variable gathers where the table lives (dpkeras._variables.lookups).
    Dispatcher(
        lambda: tf.gather,
        lambda: {"params": keras.Variable},
        lookups.gather,
        "tf.gather",
        retire=(
            "keras.Variable dispatchable by TensorFlow (registered once per process: "
            "TensorFlow cannot unregister a type), or Keras's ops.take on a variable "
            "calling the variable's own sparse_read"
        ),
        before_first_install=lambda: _tf_internals.register_dispatchable_type(keras.Variable),
    ),
)

_lock = threading.RLock()
_saved = {}  # qualname -> what the entry's install returned
_scopes = set()  # one token per entered scope
# id(object) -> weakref.finalize: each variable made under a scope, and each cluster strategy not
# yet entered, holds the entries installed while it lives.
_holds = {}


def entry(qualname):
    """The entry of `ENTRIES` named `qualname`."""
    return next(e for e in ENTRIES if e.qualname == qualname)


def keras_original(attribute):
    """Returns Keras's own object for an `Attribute` entry, whether or not it is installed."""
    with _lock:
        if attribute.qualname in _saved:
            return _saved[attribute.qualname][1]
    return attribute.current()


def source_sha256(function):
    """The SHA-256 (hex) of `inspect.getsource(function)`."""
    return hashlib.sha256(inspect.getsource(function).encode()).hexdigest()


def installed():
    """Whether dpkeras's entries are in place now."""
    with _lock:
        return bool(_saved)


def install():
    """Checks every entry, then installs each one not installed yet.

    Checked first: the TensorFlow and Keras imported are within the supported span
    (`dpkeras._version`); then each Keras function's signature is compared with those it has
    within the span, and a difference raises, naming the function and the signatures, before
    anything is installed. Where dpkeras replaces what a Keras
    function does rather than wrapping it (`BackupAndRestore._save_model`), the table pins a
    hash of the original's source, and tests/test_keras_patches.py fails when Keras changes
    it. An optional entry (keras-rs) is installed once its module is imported: each scope
    entered installs what became available since.

    Normally called by entering a dpkeras scope.

    Raises:
        RuntimeError: if TensorFlow or Keras is outside the span (one line naming both
            versions found and the span), or a Keras function is missing or its signature
            is none of those accepted; nothing is installed then.
    """
    _version.check_supported()
    with _lock:
        pending = [e for e in ENTRIES if e.qualname not in _saved and e.available()]
        for e in pending:
            e.check()
        for e in pending:
            _saved[e.qualname] = e.install()


def uninstall():
    """Puts back every object dpkeras changed in Keras, TensorFlow and keras-rs.

    Every entry of dpkeras's one table (`dpkeras/_patches/table.py`): Keras's and keras-rs's
    functions are their original objects again and the `tf.gather` dispatcher is unregistered,
    even while models built under dpkeras live (training them then is Keras's own, without
    dpkeras's semantics, until a dpkeras scope is entered again). The next dpkeras scope
    entered installs every entry again. Normally not needed: the entries are put back by
    themselves when no dpkeras scope is entered and no dpkeras variable lives.

    ```python
    dpkeras.uninstall()
    ```
    """
    with _lock:
        for finalizer in list(_holds.values()):
            finalizer.detach()
        _holds.clear()
        _scopes.clear()
        _restore()


def _restore():
    for e in reversed(ENTRIES):
        if e.qualname in _saved:
            e.restore(_saved.pop(e.qualname))


def _release_if_unused():
    if not _scopes and not _holds:
        _restore()


def _holder_died(key):
    with _lock:
        _holds.pop(key, None)
        _release_if_unused()


def _hold_while_alive(objects):
    for o in objects:
        key = id(o)
        if key not in _holds:
            _holds[key] = weakref.finalize(o, _holder_died, key)


def hold_until_entered(strategy):
    """Installs the entries for a strategy on a cluster, made and not yet entered.

    Its first entry, or its garbage collection, lets them go (as a scope left does). Meanwhile
    `fit` can refuse a model trained without it (dpkeras._patches.outside_the_scope): a script
    that made the strategy and forgot `with strategy.scope():` would train on the client alone.

    Raises:
        RuntimeError: see `install`.
    """
    with _lock:
        install()
        _hold_while_alive([strategy])
    outside_the_scope.awaiting_entry(strategy)


@contextlib.contextmanager
def installed_during(scope, live_variables, strategy=None):
    """Enters `scope` with the patches installed; keeps them while its variables live.

    A scope alone cannot bound the patches' lifetime: Keras 3.15's TF trainer enters the
    strategy's scope only inside its own machinery (the symbolic build, `strategy.run`,
    distributing the dataset); callbacks run outside it (`ModelCheckpoint` and
    `BackupAndRestore` save from callbacks), `model.save` enters no scope, and users call `fit`
    and `save` outside `dpkeras.scope()`. So the patches are installed while either holds:

    - a `ParameterDeviceStrategy` scope is entered (counted across nesting and threads), or
    - a variable created under such a scope is alive (weak references, taken when the scope
      is left): a model built under dpkeras may still be saved.

    When the last scope is left with no dpkeras variable alive, or the last such variable is
    garbage-collected, or `uninstall()` is called, Keras's original function objects are put
    back. Creating a strategy patches nothing, except on a cluster (`hold_until_entered`).

    ```python
    with dpkeras.scope():
        assert dpkeras._patches.table.installed()
    ```

    Args:
        scope: the context manager of a `ParameterDeviceStrategy`'s scope.
        live_variables: callable returning the strategy's live variables; each keeps the
            patches installed until it is garbage-collected.
        strategy: the strategy entered, or None; its hold (`hold_until_entered`) ends here.

    Yields:
        What entering `scope` gives (the strategy).

    Raises:
        RuntimeError: see `install`.
    """
    token = object()
    with _lock:
        install()
        _scopes.add(token)
        held = None if strategy is None else _holds.pop(id(strategy), None)
        if held is not None:
            held.detach()
    if strategy is not None:
        outside_the_scope.entered(strategy)
    try:
        with scope as entered:
            yield entered
    finally:
        with _lock:
            if token in _scopes:  # else uninstall() was called inside the scope
                _hold_while_alive(live_variables())
                _scopes.discard(token)
            _release_if_unused()
