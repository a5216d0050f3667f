"""Crash-safe checkpoints and exact resumption for models built under dpkeras.

Keras 3.15 saves in place and restores only part of the training state. For a model built
under a `ParameterDeviceStrategy`, dpkeras closes these gaps, while the user's program stays
unchanged Keras (`model.save`, `ModelCheckpoint`, `BackupAndRestore`); every other model is
saved exactly as Keras saves it.

What Keras 3.15 does, and what dpkeras does instead:

- `model.save` / `save_weights` (and so `ModelCheckpoint` and `BackupAndRestore`) open the
  target file for writing, truncating it, and write it in place: a process killed during the
  write leaves a half-written file where the last good checkpoint was. dpkeras writes a
  temporary file next to the target, flushes it to disk and renames it over the target, so
  the file is at every moment either the old checkpoint or the new one.
- `BackupAndRestore` writes two files, the weights and `training_metadata.json` (the epoch),
  one after the other and in place. A kill between or during them leaves new weights with the
  old epoch (the restart silently trains an epoch twice), or an empty metadata file (the
  restart fails). dpkeras commits a backup by atomically replacing the metadata file, which
  names the weights file of that backup; weights renamed into place after the commit are
  rolled forward at the next start.
- `BackupAndRestore` does not save random-number state: Keras's `.weights.h5` holds no
  `SeedGenerator` state, so after a restart Dropout draws the masks of the first steps again
  and the run diverges from an uninterrupted one. dpkeras stores every seed-generator state of
  the model in the metadata and restores it.
- With an integer `save_freq`, `BackupAndRestore` records the epoch in progress even for a
  save at the epoch's last batch (the restart trains that whole epoch again), and after a
  restart it records epoch 0 until the first epoch ends (a second restart starts over). dpkeras
  records a save at the last batch as the end of its epoch and counts epochs from where the
  restart resumed. A backup taken in the middle of an epoch is restored as Keras restores it
  (the weights, then the epoch from its first batch: Keras has no way to skip batches), with a
  warning that the first batches of that epoch are trained twice.
- A model whose weights went NaN or Inf (`TerminateOnNaN` stops such a run) would be backed up
  anyway, and then `BackupAndRestore` deletes its backup as if training had completed.
  dpkeras keeps the last backup with finite weights, and does not delete it when the run ends
  with non-finite weights; `ModelCheckpoint` does not save for a batch or epoch whose loss is
  NaN or Inf, so the last good checkpoint is not replaced by a diverged model.

`tf.train.CheckpointManager` needs nothing: TensorFlow writes checkpoints to temporary files
and updates its `checkpoint` state file atomically (tests/test_reliability.py checks both).

What still decides whether a resumed run equals an uninterrupted one: the order of the data
(`shuffle=False`, or a dataset whose order depends only on the epoch), and randomness that is
not a Keras `SeedGenerator` (stateful `tf.random` ops).

How: `install()` (called when the first `ParameterDeviceStrategy` is created) wraps the Keras
functions that do the above, each wrapper doing what Keras does for any model not built under
dpkeras. They are Keras-private names, checked against the Keras version pinned in
pyproject.toml by tests/test_reliability.py:
`keras.src.saving.saving_lib.save_model` and `save_weights_only` (every `.keras` and
`.weights.h5` write), `BackupAndRestore.on_train_begin`, `_save_model` and `on_train_end`, and
`ModelCheckpoint._save_model`. Keras offers no public hook to change how a callback writes.
A model is built under dpkeras when the strategy Keras's trainer captured at its construction
(`model._distribute_strategy`) is a `ParameterDeviceStrategy`. Remote paths (`gs://`,
`hf://`), sharded weights and legacy `.h5` files are written as Keras writes them.
"""

import contextlib
import functools
import json
import logging
import math
import os
import threading

import keras
import numpy as np
import tensorflow as tf
from keras.src.saving import saving_lib
from keras.src.utils import file_utils

from dpkeras import _keras_internals
from dpkeras.variables import ParameterVariable

__all__ = ["install", "seed_states", "restore_seed_states"]

_log = logging.getLogger("dpkeras")

_SUFFIXES = (".weights.h5", ".keras")
_TMP_TAG = ".dpkeras-tmp-"
_PENDING_PREFIX = ".pending-"
_KEY = "dpkeras"

_lock = threading.Lock()
_installed = False


# -- which models ---------------------------------------------------------------------------

def _is_dpkeras_model(model):
    """Whether `model` was built under a dpkeras strategy (its variables are ours)."""
    from dpkeras.strategy import ParameterDeviceStrategy  # strategy.py imports this module

    strategy = getattr(model, "_distribute_strategy", None)
    return isinstance(strategy, ParameterDeviceStrategy)


# -- atomic files ---------------------------------------------------------------------------

def _fsync_file(path):
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def _fsync_dir(path):
    try:
        fd = os.open(path or ".", os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _temporary_sibling(path, suffix):
    head, tail = os.path.split(path)
    token = f"{os.getpid()}-{os.urandom(4).hex()}"  # the pid first: see _remove_stale_...
    return os.path.join(head, f".{tail[:-len(suffix)]}{_TMP_TAG}{token}{suffix}")


def _remove_stale_temporaries(path, suffix):
    """Removes temporary siblings of `path` left by processes that no longer run."""
    head, tail = os.path.split(path)
    prefix = f".{tail[:-len(suffix)]}{_TMP_TAG}"
    try:
        names = os.listdir(head or ".")
    except OSError:
        return
    for name in names:
        if not (name.startswith(prefix) and name.endswith(suffix)):
            continue
        pid = name[len(prefix):-len(suffix)].split("-")[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _process_alive(int(pid)):
            with contextlib.suppress(OSError):
                os.remove(os.path.join(head, name))


def _process_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _local_suffix(filepath):
    """The suffix Keras requires of `filepath` if dpkeras can write it atomically, else None."""
    if not isinstance(filepath, (str, os.PathLike)):
        return None
    path = os.fspath(filepath)
    if file_utils.is_remote_path(path) or path.startswith("hf://"):
        return None
    return next((s for s in _SUFFIXES if path.endswith(s)), None)


def _write_atomically(write, path, suffix):
    """Calls `write(temporary_path)`, then renames the temporary file over `path`."""
    if not os.path.isdir(os.path.dirname(path) or "."):
        return write(path)  # Keras's own error names the missing directory
    _remove_stale_temporaries(path, suffix)
    tmp = _temporary_sibling(path, suffix)
    try:
        result = write(tmp)
        _fsync_file(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    _fsync_dir(os.path.dirname(path))
    return result


def _write_json_atomically(path, content):
    tmp = f"{path}{_TMP_TAG}{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(json.dumps(content))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(os.path.dirname(path))


def _copy_atomically(source, target):
    tmp = f"{target}{_TMP_TAG}{os.getpid()}"
    file_utils.copy(source, tmp)
    _fsync_file(tmp)
    os.replace(tmp, target)


# -- random state ---------------------------------------------------------------------------

def _seed_variables(model):
    """`(path, keras.Variable)` of every seed-generator state of `model`, in model order."""
    found = []
    for v in model.variables:
        underlying = _keras_internals.underlying_variable(v)
        if isinstance(underlying, ParameterVariable) and underlying.kind == "seed":
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
    return [{"path": path, "state": [int(x) for x in np.asarray(v.numpy()).ravel()]}
            for path, v in _seed_variables(model)]


def restore_seed_states(model, states):
    """Restores what `seed_states` returned; warns and restores nothing if the models differ."""
    variables = _seed_variables(model)
    if len(states) != len(variables):
        _log.warning(
            "dpkeras: the backup holds %d random-number generator state(s) but model %r has "
            "%d; not restoring them, so random draws (Dropout masks) will differ from an "
            "uninterrupted run.", len(states), model.name, len(variables))
        return
    for entry, (_, v) in zip(states, variables):
        v.assign(np.asarray(entry["state"], dtype=v.dtype).reshape(v.shape))


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

def _atomic_save_model(original, model, filepath, *args, **kwargs):
    suffix = _local_suffix(filepath)
    if suffix != ".keras" or not _is_dpkeras_model(model) or not kwargs.get("zipped", True):
        return original(model, filepath, *args, **kwargs)
    return _write_atomically(lambda tmp: original(model, tmp, *args, **kwargs),
                             os.fspath(filepath), suffix)


def _atomic_save_weights_only(original, model, filepath, *args, **kwargs):
    sharded = (args and args[0] is not None) or kwargs.get("max_shard_size") is not None
    suffix = _local_suffix(filepath)
    if suffix != ".weights.h5" or sharded or not _is_dpkeras_model(model):
        return original(model, filepath, *args, **kwargs)
    return _write_atomically(lambda tmp: original(model, tmp, *args, **kwargs),
                             os.fspath(filepath), suffix)


# -- BackupAndRestore -----------------------------------------------------------------------

def _backup_applies(callback):
    return (_is_dpkeras_model(callback.model) and
            not file_utils.is_remote_path(callback.backup_dir))


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
    metadata = _read_metadata(callback._training_metadata_path) or {}
    ours = metadata.get(_KEY) or {}
    committed = _pending_name(ours["generation"]) if "generation" in ours else None
    names = os.listdir(callback.backup_dir) if os.path.isdir(callback.backup_dir) else []
    for name in names:
        path = os.path.join(callback.backup_dir, name)
        if name == committed:
            os.replace(path, callback._weights_path)  # roll forward
            _fsync_dir(callback.backup_dir)
        elif (name.startswith(_PENDING_PREFIX) and name.endswith(".weights.h5")) or (
                _TMP_TAG in name):
            with contextlib.suppress(OSError):
                os.remove(path)
    return metadata


def _backup_on_train_begin(original, callback, logs=None):
    if not _backup_applies(callback):
        return original(callback, logs)
    metadata = _recover_backup(callback)
    result = original(callback, logs)
    if not os.path.exists(callback._weights_path):
        return result
    # Keras leaves the epoch it records at 0 until an epoch ends: start from the restored one.
    callback._current_epoch = int(metadata.get("epoch", 0))
    ours = metadata.get(_KEY)
    if ours is not None:
        restore_seed_states(callback.model, ours.get("seeds", []))
        if not ours.get("epoch_complete", True):
            done = int(metadata.get("batch", 0)) + 1
            _log.warning(
                "dpkeras: resuming from a backup taken after %d batch(es) of epoch %d. Keras 3 "
                "restarts that epoch from its first batch, so those %d batch(es) are trained "
                "a second time. For an exact resume use BackupAndRestore(save_freq='epoch') "
                "or a multiple of the steps per epoch.", done, callback._current_epoch + 1,
                done)
    return result


def _backup_save_model(original, callback):
    if not _backup_applies(callback):
        return original(callback)
    model = callback.model
    if not _weights_finite(model):
        _log.warning(
            "dpkeras: not backing up model %r to %s: its weights are NaN or Inf. The last "
            "backup with finite weights is kept.", model.name, callback.backup_dir)
        return
    os.makedirs(callback.backup_dir, exist_ok=True)
    epoch, batch, complete = callback._current_epoch, callback._last_batch_seen, True
    if callback.save_freq != "epoch":  # a save after batch `batch` of the running epoch
        steps = (callback.params or {}).get("steps")
        complete = steps is not None and batch + 1 >= steps
        if complete:
            epoch, batch = epoch + 1, 0
    previous = _recover_backup(callback)
    generation = int((previous.get(_KEY) or {}).get("generation", 0)) + 1
    if callback.double_checkpoint and os.path.exists(callback._weights_path):
        _copy_atomically(callback._weights_path, callback._prev_weights_path)
        if os.path.exists(callback._training_metadata_path):
            _copy_atomically(callback._training_metadata_path,
                             callback._prev_training_metadata_path)
    pending = os.path.join(callback.backup_dir, _pending_name(generation))
    _ORIGINALS["save_weights_only"](model, pending)
    _fsync_file(pending)
    metadata = {"epoch": epoch, "batch": batch,
                _KEY: {"generation": generation, "epoch_complete": complete,
                       "seeds": seed_states(model)}}
    _write_json_atomically(callback._training_metadata_path, metadata)  # the commit
    os.replace(pending, callback._weights_path)
    _fsync_dir(callback.backup_dir)


def _backup_on_train_end(original, callback, logs=None):
    if _backup_applies(callback) and callback.delete_checkpoint and not _weights_finite(
            callback.model):
        _log.warning(
            "dpkeras: training of model %r ended with NaN or Inf weights; keeping the last "
            "good backup in %s (delete it to start over).", callback.model.name,
            callback.backup_dir)
        return None
    return original(callback, logs)


# -- ModelCheckpoint ------------------------------------------------------------------------

def _checkpoint_save_model(original, callback, epoch, batch, logs):
    if _is_dpkeras_model(callback.model) and not _finite_loss(logs):
        _log.warning(
            "dpkeras: ModelCheckpoint is not saving model %r in epoch %d: the loss is %s. "
            "The last checkpoint is kept.", callback.model.name, epoch + 1,
            (logs or {}).get("loss"))
        return None
    return original(callback, epoch, batch, logs)


# -- installation ---------------------------------------------------------------------------

_ORIGINALS = {}


def _wrap(owner, name, wrapper):
    original = getattr(owner, name)
    _ORIGINALS[name if owner is saving_lib else f"{owner.__name__}.{name}"] = original

    @functools.wraps(original)
    def wrapped(*args, **kwargs):
        return wrapper(original, *args, **kwargs)

    wrapped.__dpkeras_original__ = original
    setattr(owner, name, wrapped)


def install():
    """Makes saving of models built under dpkeras crash-safe (see the module docstring).

    Called when the first `ParameterDeviceStrategy` is created; calling it again does nothing.
    Models not built under dpkeras are saved exactly as Keras saves them.
    """
    global _installed
    with _lock:
        if _installed:
            return
        _wrap(saving_lib, "save_model", _atomic_save_model)
        _wrap(saving_lib, "save_weights_only", _atomic_save_weights_only)
        backup = keras.callbacks.BackupAndRestore
        _wrap(backup, "on_train_begin", _backup_on_train_begin)
        _wrap(backup, "_save_model", _backup_save_model)
        _wrap(backup, "on_train_end", _backup_on_train_end)
        _wrap(keras.callbacks.ModelCheckpoint, "_save_model", _checkpoint_save_model)
        _installed = True
