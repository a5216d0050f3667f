"""Crash-safe checkpoints and exact resumption, for models built under dpkeras.

Each function here stands in for a Keras function: it takes that function (`original`) first
and calls it, unchanged, for every model not built under dpkeras. docs/reliability.md says what
Keras 3.15 does and what dpkeras does instead.
"""

import contextlib
import inspect
import json
import logging
import math
import os
import threading
import warnings
import weakref

import numpy as np
import tensorflow as tf

from dpkeras import _keras_internals
from dpkeras._extended.extended import extended_of
from dpkeras._input import resumption
from dpkeras._patches import atomic_files
from dpkeras._variables import placed
from dpkeras.placement import VariableKind

_log = logging.getLogger("dpkeras")

_SUFFIXES = (".weights.h5", ".keras")
_PENDING_PREFIX = ".pending-"
_KEY = "dpkeras"

# BackupAndRestore -> the epoch its restored backup resumes at. Keras 3.15 records epoch 0
# until the first epoch after a restart ends (its counter is private, with no setter), so a
# backup taken before then would name the wrong epoch; `backup_save_model` counts from here.
_RESUMED_AT = weakref.WeakKeyDictionary()

# Keras epoch iterator -> the `resumption.Resumption` its next epoch starts at.
_RESUMPTIONS = weakref.WeakKeyDictionary()
# BackupAndRestore callbacks whose backup at an epoch's last batch waits for the epoch's end,
# and those writing it there (`backup_on_epoch_end`).
_DEFERRED = weakref.WeakSet()
_AT_EPOCH_END = weakref.WeakSet()
_fits = threading.local()  # the fits running on this thread: [model, its epoch iterator]


def built_under_dpkeras(model):
    """Whether `model` (a Keras model or layer) has variables and they are a dpkeras
    strategy's (`extended_of`); an unbuilt model is saved as Keras saves it."""
    return bool(getattr(model, "variables", None)) and extended_of(model) is not None


# -- random state ---------------------------------------------------------------------------


def _seed_variables(model):
    """`(path, keras.Variable)` of every seed-generator state of `model`, in model order."""
    found = []
    for v in model.variables:
        underlying = _keras_internals.underlying_variable(v)
        if placed.of(underlying) is not None and underlying.kind == VariableKind.SEED:
            found.append((v.path, v))
    return found


def seed_states(model):
    """The random-number state of a model built under dpkeras, as JSON-ready lists.

    Args:
        model: a Keras model built under a dpkeras strategy.

    Returns:
        A list of `{"path": str, "state": [int, int]}`, one per `keras.random.SeedGenerator`
        of the model (Dropout, GaussianNoise, random augmentation layers, ...), in the order of
        `model.variables`. (Keras's global seed generator, used by `keras.random` functions
        called without a seed, cannot be used inside a step under any `tf.distribute`
        strategy: each replica thread would create its own; Keras raises.)
    """
    return [
        {"path": path, "state": [int(x) for x in np.asarray(v.numpy()).ravel()]}
        for path, v in _seed_variables(model)
    ]


def restore_seed_states(model, states):
    """Restores what `seed_states` returned; warns and restores nothing if the models differ.

    Args:
        model: a Keras model built under a dpkeras strategy.
        states: list, what `seed_states` returned for a model of the same architecture.
    """
    variables = _seed_variables(model)
    if len(states) != len(variables):
        _log.warning(
            "dpkeras: the backup holds %d random-number generator state(s) but model %r has "
            "%d; not restoring them, so random draws (Dropout masks) will differ from an "
            "uninterrupted run.",
            len(states),
            model.name,
            len(variables),
        )
        return
    for entry, (_, v) in zip(states, variables):
        v.assign(np.asarray(entry["state"], dtype=v.dtype).reshape(v.shape))


# -- metric states --------------------------------------------------------------------------


def metric_states(model):
    """The states of `model`'s metrics (its loss tracker and compiled metrics), JSON-ready: a
    backup taken in the middle of an epoch holds the running means and counts of the batches
    before it, so that the resumed epoch's logs and history are the uninterrupted run's."""
    return [
        {"path": v.path, "value": np.asarray(v.numpy()).tolist()} for v in model.metrics_variables
    ]


def restore_metric_states(model, states):
    """Restores what `metric_states` returned; warns and restores nothing if they differ."""
    variables = model.metrics_variables
    shapes = [list(np.shape(entry["value"])) for entry in states]
    if shapes != [list(v.shape) for v in variables]:
        _log.warning(
            "dpkeras: the backup holds %d metric state(s) that do not fit model %r's %d; the "
            "resumed epoch's metrics count only the batches trained after the restart.",
            len(states),
            model.name,
            len(variables),
        )
        return
    for entry, v in zip(states, variables):
        v.assign(np.asarray(entry["value"], dtype=v.dtype).reshape(v.shape))


def _weights_finite(model):
    weights = [_keras_internals.underlying_variable(v) for v in model.trainable_variables]
    if not weights:
        return True
    return bool(tf.reduce_all([tf.reduce_all(tf.math.is_finite(w)) for w in weights]))


def _finite_loss(logs):
    loss = (logs or {}).get("loss")
    if loss is None:
        return True
    try:
        return math.isfinite(float(np.asarray(loss)))
    except (TypeError, ValueError):
        return True


# -- saving functions -----------------------------------------------------------------------


def _local_suffix(filepath):
    """The suffix Keras requires of `filepath` if dpkeras can write it atomically, else None."""
    if not isinstance(filepath, (str, os.PathLike)):
        return None
    path = os.fspath(filepath)
    if _keras_internals.is_remote_path(path) or path.startswith("hf://"):
        return None
    return next((s for s in _SUFFIXES if path.endswith(s)), None)


def _write(write_to, path, suffix):
    if not os.path.isdir(os.path.dirname(path) or "."):
        return write_to(path)  # Keras's own error names the missing directory
    return atomic_files.write(write_to, path, suffix)


def layers_sharing_variables(model):
    """Groups of names of distinct layers of `model` that hold the same variables.

    TF1-style towers (`dpkeras.variable_scope` with reuse) give each tower its own layer
    object over one set of variables. A `.keras` file stores a functional model's layers one
    by one, so such layers load as separate layers with equal, no longer shared, variables.
    One layer called in each tower is stored once, with both calls, and stays shared.
    """
    holders = {}
    for layer in all_layers(model):
        for v in layer.weights:
            names = holders.setdefault(id(v), [])
            if layer.name not in names:
                names.append(layer.name)
    groups = {tuple(names) for names in holders.values() if len(names) > 1}
    return sorted(list(g) for g in groups)


def all_layers(model):
    """Every layer of `model`, nested models' layers included (a layer held twice, twice)."""
    for layer in getattr(model, "layers", ()):
        yield layer
        yield from all_layers(layer)


def _warn_if_sharing_is_lost(model):
    if _keras_internals.is_functional(model):
        groups = layers_sharing_variables(model)
        if groups:
            warnings.warn(
                f"Model {model.name!r}: layers {groups} are distinct layers that share their "
                f"variables (towers built in a reusing dpkeras.variable_scope). A .keras file "
                f"stores them as separate layers: loaded, each has its own copy of the "
                f"variables, equal but no longer shared. save_weights and tf.train.Checkpoint "
                f"into a model built the same way keep the sharing; to keep it in .keras, "
                f"call one layer in every tower (see docs/migrating-from-tf1.md, 'Towers').",
                UserWarning,
                stacklevel=4,
            )


def save_model(original, model, filepath, *args, **kwargs):
    """Keras's `saving_lib.save_model`, writing a dpkeras model's `.keras` file atomically.

    Keras 3.15 opens the target for writing, truncating it, and writes in place: a process
    killed during the write leaves a half-written file where the last good one was. Here the
    file is written by `atomic_files`, so it is at every moment the old file or the new one.
    Remote paths (`gs://`, `hf://`) and unzipped saves are written as Keras writes them. It
    warns when the file cannot keep layers' shared variables (`layers_sharing_variables`).
    """
    if built_under_dpkeras(model):
        _warn_if_sharing_is_lost(model)
    suffix = _local_suffix(filepath)
    if suffix != ".keras" or not built_under_dpkeras(model) or not kwargs.get("zipped", True):
        return original(model, filepath, *args, **kwargs)
    return _write(lambda tmp: original(model, tmp, *args, **kwargs), os.fspath(filepath), suffix)


def save_weights_only(original, model, filepath, *args, **kwargs):
    """Keras's `saving_lib.save_weights_only`, writing a dpkeras model's file atomically
    (not a sharded save: Keras 3.10+'s `max_shard_size`, which Keras 3.8-3.9 do not take)."""
    try:
        given = inspect.signature(original).bind(model, filepath, *args, **kwargs).arguments
    except TypeError:  # arguments it does not take: Keras's own error says which
        return original(model, filepath, *args, **kwargs)
    sharded = given.get("max_shard_size") is not None
    suffix = _local_suffix(filepath)
    if suffix != ".weights.h5" or sharded or not built_under_dpkeras(model):
        return original(model, filepath, *args, **kwargs)
    return _write(lambda tmp: original(model, tmp, *args, **kwargs), os.fspath(filepath), suffix)


# -- BackupAndRestore -----------------------------------------------------------------------


def _backup_applies(callback):
    return built_under_dpkeras(callback.model) and not _keras_internals.is_remote_path(
        callback.backup_dir
    )


def has_backup(callback):
    """Whether a `BackupAndRestore` of a dpkeras model has a backup to restore (its weights
    in place, or committed and waiting to be renamed into place)."""
    if not _backup_applies(callback):
        return False
    files = _keras_internals.backup_files(callback)
    metadata = _read_metadata(files.metadata) or {}
    committed = (metadata.get(_KEY) or {}).get("generation")
    pending = committed is not None and os.path.exists(
        os.path.join(callback.backup_dir, _pending_name(committed))
    )
    return os.path.exists(files.weights) or pending


def _read_metadata(path):
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            return json.loads(f.read())
    except ValueError:  # not written by dpkeras (which replaces it atomically): Keras decides
        return None


def _pending_name(generation):
    return f"{_PENDING_PREFIX}{generation}.weights.h5"


def _recover_backup(callback):
    """Finishes a backup committed but not yet renamed into place; drops uncommitted ones."""
    files = _keras_internals.backup_files(callback)
    metadata = _read_metadata(files.metadata) or {}
    ours = metadata.get(_KEY) or {}
    committed = _pending_name(ours["generation"]) if "generation" in ours else None
    names = os.listdir(callback.backup_dir) if os.path.isdir(callback.backup_dir) else []
    for name in names:
        path = os.path.join(callback.backup_dir, name)
        if name == committed:
            os.replace(path, files.weights)  # roll forward
            atomic_files.fsync_dir(callback.backup_dir)
        elif (name.startswith(_PENDING_PREFIX) and name.endswith(".weights.h5")) or (
            atomic_files.TMP_TAG in name
        ):
            with contextlib.suppress(OSError):
                os.remove(path)
    return metadata


def _weight_shapes(model):
    """`[[path, shape], ...]` of `model.weights`, in order: what a backup must fit."""
    return [[v.path, list(v.shape)] for v in model.weights]


def _difference(saved, model):
    """What differs between a backup's `_weight_shapes` and `model`'s, or None.

    Compared by position, as Keras loads a weights file; paths may differ (a model made again
    in one process is `sequential_1`), shapes may not.
    """
    current = _weight_shapes(model)
    if len(saved) != len(current):
        return f"the backup holds {len(saved)} weights and the model {len(current)}"
    for (_, saved_shape), (path, shape) in zip(saved, current):
        if list(saved_shape) != list(shape):
            return (
                f"weight {path!r} is {tuple(saved_shape)} in the backup and {tuple(shape)} "
                f"in the model"
            )
    return None


def _refuse_a_backup_of_another_model(callback, difference):
    if difference is not None:
        raise ValueError(
            f"The backup in {callback.backup_dir!r} does not fit model "
            f"{callback.model.name!r}: {difference}. Remove the directory or point "
            f"BackupAndRestore at another."
        )


def backup_on_train_begin(original, callback, logs=None):
    """`BackupAndRestore.on_train_begin`: rolls a committed backup forward, restores seeds.

    A backup whose metadata was committed (see `backup_save_model`) but whose weights were not
    yet renamed into place is finished; uncommitted files are removed. The model's
    seed-generator states stored with the backup are restored (Keras's `.weights.h5` holds
    none, so Dropout would draw the first steps' masks again), and epochs are counted from the
    restored one (Keras records epoch 0 until an epoch ends, so a second restart would start
    over). A backup taken mid-epoch resumes at the batch after it, with the metrics' running
    states of the batches before it, where the input's order is deterministic (see
    `dpkeras._input.resumption`; `resuming_the_epoch` does it); elsewhere as Keras resumes it,
    from the epoch's first batch, with a warning saying why. A backup of another model (weights
    of other shapes, or another count: a directory shared by two programs) is refused in one
    line naming the directory, instead of Keras's dump of every variable it could not load.
    """
    if not _backup_applies(callback):
        return original(callback, logs)
    _RESUMED_AT.pop(callback, None)  # a callback used for an earlier fit
    metadata = _recover_backup(callback)
    if os.path.exists(_keras_internals.backup_files(callback).weights):
        saved = (metadata.get(_KEY) or {}).get("weights")
        if saved is not None:
            _refuse_a_backup_of_another_model(callback, _difference(saved, callback.model))
        try:
            result = original(callback, logs)
        except ValueError as e:  # a backup without shapes (Keras's, an older dpkeras's)
            if "could not be loaded" not in str(e):
                raise
            first = str(e).strip().splitlines()[0].split(". ")[0]  # "A total of 3 objects ..."
            _refuse_a_backup_of_another_model(callback, f"Keras cannot load it ({first})")
    else:
        result = original(callback, logs)
    if not os.path.exists(_keras_internals.backup_files(callback).weights):
        return result
    # Keras leaves the epoch it records at 0 until an epoch ends: count from the restored one.
    epoch = int(metadata.get("epoch", 0))
    _RESUMED_AT[callback] = epoch
    ours = metadata.get(_KEY)
    if ours is None:
        return result
    restore_seed_states(callback.model, ours.get("seeds", []))
    complete = ours.get("epoch_complete", True)
    done = 0 if complete else int(metadata.get("batch", 0)) + 1
    steps_per_execution = int(ours.get("steps_per_execution", callback.model.steps_per_execution))
    epoch_iterator, where = _resumption_of(callback, epoch, done, steps_per_execution)
    if epoch_iterator is not None and where.epoch_ended:
        # Data of unknown length: a backup at the epoch's last batch could not know it was
        # the last (Keras gives no step count). It is that epoch's end: the next one begins.
        _RESUMED_AT[callback] = epoch + 1
        setattr(callback.model, _keras_internals.initial_epoch_attribute(), epoch + 1)
        last_batch_seen, seen_since_saving = _keras_internals.backup_batch_count()
        setattr(callback, last_batch_seen, 0)  # as at an epoch's end (`on_epoch_end`)
        setattr(callback, seen_since_saving, 0)
        _log.info(
            "dpkeras: the backup was taken after the last batch of epoch %d: resuming at epoch %d",
            epoch + 1,
            epoch + 2,
        )
    elif epoch_iterator is not None:
        if where.first_step or where.before:
            metrics = None if complete else ours.get("metrics")
            _RESUMPTIONS[epoch_iterator] = (where, callback.model, metrics)
        if not complete:  # count toward the next backup as just after this one
            last_batch_seen, seen_since_saving = _keras_internals.backup_batch_count()
            setattr(callback, last_batch_seen, done - 1)
            setattr(callback, seen_since_saving, 0)
            _log.info(
                "dpkeras: resuming epoch %d at batch %d: its first %d batch(es) were "
                "trained before the backup",
                epoch + 1,
                done + 1,
                done,
            )
    elif not complete:
        _log.warning(
            "dpkeras: resuming from a backup taken after %d batch(es) of epoch %d. They are "
            "trained a second time, as Keras 3 restarts the epoch from its first batch: the "
            "input cannot be resumed at the batch after the backup because %s.",
            done,
            epoch + 1,
            where,
        )
    elif where.startswith("with steps_per_epoch"):
        _log.warning(
            "dpkeras: resuming at epoch %d with the input read from its first batch, as Keras "
            "3 restarts it, where an uninterrupted run reads on: %s.",
            epoch + 1,
            where,
        )
    return result


def backup_save_model(original, callback, save_weights):
    """Replaces `BackupAndRestore._save_model` for dpkeras models (Keras's for the others).

    Does what Keras 3.15's `_save_model` does (create the directory, copy the previous backup
    with `double_checkpoint`, write the weights and `training_metadata.json`), but commits
    atomically and adds the seed states; tests/test_keras_patches.py pins Keras's source.
    Keras writes the two files one after the other, in place: a kill between them leaves new
    weights with the old epoch, or an empty metadata file. Here a backup is committed by
    atomically replacing the metadata, which names the weights file of that backup. A save
    at an epoch's last batch counts as the end of that epoch; weights that are NaN or Inf are
    not backed up (the last finite backup is kept).

    Args:
        original: Keras's `BackupAndRestore._save_model`.
        callback: the `BackupAndRestore` instance.
        save_weights: Keras's unpatched `saving_lib.save_weights_only`.
    """
    if not _backup_applies(callback):
        return original(callback)
    model = callback.model
    if not _weights_finite(model):
        _log.warning(
            "dpkeras: not backing up model %r to %s: its weights are NaN or Inf. The last "
            "backup with finite weights is kept.",
            model.name,
            callback.backup_dir,
        )
        return None
    os.makedirs(callback.backup_dir, exist_ok=True)
    (epoch, batch), complete = _keras_internals.backup_position(callback), True
    epoch = max(epoch, _RESUMED_AT.get(callback, 0))  # see _RESUMED_AT
    files = _keras_internals.backup_files(callback)
    if callback in _AT_EPOCH_END:  # `backup_on_epoch_end`: Keras counts the next epoch
        batch = 0
    elif callback.save_freq != "epoch":  # a save after batch `batch` of the running epoch
        steps = (callback.params or {}).get("steps")
        if steps is not None and batch + 1 >= steps:
            # The epoch's last batch: written at its end instead, after its validation and
            # the callbacks before this one (`backup_on_epoch_end`). Written now, as the epoch's
            # end, a run lost during that validation would resume at the next epoch, without
            # this epoch's validation, end and History entry.
            _DEFERRED.add(callback)
            return None
        complete = False
    previous = _recover_backup(callback)
    generation = int((previous.get(_KEY) or {}).get("generation", 0)) + 1
    if callback.double_checkpoint and os.path.exists(files.weights):
        atomic_files.copy(files.weights, files.previous_weights)
        if os.path.exists(files.metadata):
            atomic_files.copy(files.metadata, files.previous_metadata)
    pending = os.path.join(callback.backup_dir, _pending_name(generation))
    save_weights(model, pending)
    atomic_files.fsync_file(pending)
    metadata = {
        "epoch": epoch,
        "batch": batch,
        _KEY: {
            "generation": generation,
            "epoch_complete": complete,
            "seeds": seed_states(model),
            "metrics": metric_states(model),
            "steps_per_execution": int(model.steps_per_execution),
            "weights": _weight_shapes(model),
        },
    }
    atomic_files.write_json(files.metadata, metadata)  # the commit
    os.replace(pending, files.weights)
    atomic_files.fsync_dir(callback.backup_dir)
    return None


def backup_on_epoch_end(original, callback, epoch, logs=None):
    """`BackupAndRestore.on_epoch_end`: writes the backup that a number-of-batches `save_freq`
    called for at the epoch's last batch (`backup_save_model` put it off), now that the
    epoch's validation has run: it is the epoch's end."""
    result = original(callback, epoch, logs)
    if callback in _DEFERRED:
        _DEFERRED.discard(callback)
        _AT_EPOCH_END.add(callback)
        try:
            _keras_internals.save_backup(callback)
        finally:
            _AT_EPOCH_END.discard(callback)
    return result


def backup_on_train_end(original, callback, logs=None):
    """`BackupAndRestore.on_train_end`: keeps the backup if the weights are NaN or Inf."""
    if (
        _backup_applies(callback)
        and callback.delete_checkpoint
        and not _weights_finite(callback.model)
    ):
        _log.warning(
            "dpkeras: training of model %r ended with NaN or Inf weights; keeping the last "
            "good backup in %s (delete it to start over).",
            callback.model.name,
            callback.backup_dir,
        )
        return None
    return original(callback, logs)


# -- resuming an epoch at the batch after its backup -------------------------------------------


@contextlib.contextmanager
def fitting(model, initial_epoch=0):
    """In the block, `model.fit` is running on this thread, called with `initial_epoch`: the
    first Keras epoch iterator made in it is its training data's (`note_epoch_iterator`), which
    a backup resumes."""
    stack = getattr(_fits, "stack", None)
    if stack is None:
        stack = _fits.stack = []
    entry = [model, None, initial_epoch]
    stack.append(entry)
    try:
        yield
    finally:
        del stack[next(i for i, e in enumerate(stack) if e is entry)]
        if entry[1] is not None:
            _RESUMPTIONS.pop(entry[1], None)  # a fit that ended before its first epoch


def note_epoch_iterator(epoch_iterator):
    """Called as each Keras `TFEpochIterator` is made: the first made in a fit is the one its
    epochs train on."""
    stack = getattr(_fits, "stack", None)
    if stack and stack[-1][1] is None:
        stack[-1][1] = epoch_iterator


def _training_fit(model):
    """`(epoch iterator, initial_epoch)` of the innermost `fit` of `model` running here, or
    `(None, 0)`."""
    for fitted, epoch_iterator, initial_epoch in reversed(getattr(_fits, "stack", None) or ()):
        if fitted is model:
            return epoch_iterator, initial_epoch
    return None, 0


def _resumption_of(callback, epoch, done, steps_per_execution):
    """`(epoch iterator, Resumption)` for a run restored to batch `done` of `epoch` (0 for an
    epoch's end), or `(None, why not)`. `why not` starts with "with steps_per_epoch" when the
    input's order is deterministic but where the epoch begins in its stream is not known:
    Keras's restart of the stream then differs from an uninterrupted run even at an epoch's
    end. `steps_per_execution`: the run's that took the backup."""
    epoch_iterator, initial_epoch = _training_fit(callback.model)
    if epoch_iterator is None:
        return None, "the backup was not restored by model.fit"
    dataset = _keras_internals.epoch_dataset(epoch_iterator)
    why = resumption.why_order_may_differ(dataset)
    if why is not None:
        return None, why
    steps_per_epoch, num_batches = _keras_internals.epoch_stream(epoch_iterator)
    if steps_per_epoch and num_batches is None:
        if epoch > 0 and dataset.cardinality() != tf.data.INFINITE_CARDINALITY:
            return None, (
                f"with steps_per_epoch its epochs read on from one another, and its length is "
                f"unknown, so where epoch {epoch + 1} begins in it is unknown"
            )
    # Keras's stream starts at the epoch `fit` started at (`initial_epoch`, as in the run that
    # took the backup: BackupAndRestore needs fit's arguments unchanged).
    before = resumption.stream_position(
        max(epoch - initial_epoch, 0), steps_per_epoch, steps_per_execution, num_batches
    )
    if before and num_batches is not None:
        return None, (
            f"with steps_per_epoch={steps_per_epoch} over {num_batches} batches, epoch "
            f"{epoch + 1} begins in the middle of a pass over the data, where Keras's epoch "
            f"loop cannot be started"
        )
    if done and steps_per_epoch is None and num_batches is None:
        if resumption.ended_at(dataset, done):  # the last batch: not mid-epoch after all
            return epoch_iterator, resumption.Resumption(0, 0, epoch_ended=True)
    return epoch_iterator, resumption.Resumption(done, before)


def resuming_the_epoch(original, epoch_iterator):
    """Wraps Keras's `EpochIterator._enumerate_iterator`: the first epoch of a run restored from
    a backup begins where the backup was taken (`dpkeras._input.resumption.resumed`); every
    other epoch is Keras's."""
    found = _RESUMPTIONS.pop(epoch_iterator, None)
    if found is None:
        return original(epoch_iterator)
    where, model, metrics = found

    def on_resume():
        if metrics is not None:
            restore_metric_states(model, metrics)

    spans = _keras_internals.step_spans(epoch_iterator, original(epoch_iterator))
    return _keras_internals.as_keras_enumeration(resumption.resumed(spans, where, on_resume))


# -- ModelCheckpoint ------------------------------------------------------------------------


def checkpoint_save_model(original, callback, epoch, batch, logs):
    """`ModelCheckpoint._save_model`: does not save when the loss is NaN or Inf."""
    if built_under_dpkeras(callback.model) and not _finite_loss(logs):
        _log.warning(
            "dpkeras: ModelCheckpoint is not saving model %r in epoch %d: the loss is %s. "
            "The last checkpoint is kept.",
            callback.model.name,
            epoch + 1,
            (logs or {}).get("loss"),
        )
        return None
    return original(callback, epoch, batch, logs)
