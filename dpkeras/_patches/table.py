"""The table of Keras functions dpkeras wraps, and installing it: checked and reversible."""

import contextlib
import dataclasses
import functools
import hashlib
import inspect
import threading
import weakref
from collections.abc import Callable

import keras

from dpkeras import _keras_internals
from dpkeras._patches import cluster_loop, resume, symbolic_build, task_failures
from dpkeras._variables import lookups

SUPPORTED_KERAS = "3.15"


def _backup_save_model(original, callback):
    return resume.backup_save_model(
        original, callback, keras_original(_by_name("saving_lib.save_weights_only"))
    )


@dataclasses.dataclass(frozen=True)
class Patch:
    """One Keras function dpkeras replaces by a wrapper.

    Args:
        owner: callable returning the module or class that holds the function.
        name: str, the attribute name on `owner`.
        qualname: str, how errors and the README name it.
        signature: str, `str(inspect.signature(...))` of the function in Keras 3.15.
        wrapper: callable `(original, *args, **kwargs)` standing in for the function.
        source_sha256: str or None, the SHA-256 of `inspect.getsource` of the Keras 3.15
            original when the wrapper re-implements it for dpkeras models instead of calling
            it (tests/test_keras_patches.py checks it).
    """

    owner: Callable[[], object]
    name: str
    qualname: str
    signature: str
    wrapper: Callable
    source_sha256: str | None = None


def _backup_and_restore():
    return keras.callbacks.BackupAndRestore


def _model_checkpoint():
    return keras.callbacks.ModelCheckpoint


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


PATCHES = (
    Patch(
        _keras_internals.saving_module,
        "save_model",
        "saving_lib.save_model",
        "(model, filepath, weights_format='h5', zipped=True)",
        resume.save_model,
    ),
    Patch(
        _keras_internals.saving_module,
        "save_weights_only",
        "saving_lib.save_weights_only",
        "(model, filepath, max_shard_size=None, objects_to_skip=None)",
        resume.save_weights_only,
    ),
    Patch(
        _backup_and_restore,
        "on_train_begin",
        "BackupAndRestore.on_train_begin",
        "(self, logs=None)",
        resume.backup_on_train_begin,
    ),
    Patch(
        _backup_and_restore,
        "_save_model",
        "BackupAndRestore._save_model",
        "(self)",
        _backup_save_model,
        source_sha256="5eb7b53ca13ad33d97bdb44f3208f772d2fe030f5d3b3f3fcced5322821f32b7",
    ),
    Patch(
        _backup_and_restore,
        "on_train_end",
        "BackupAndRestore.on_train_end",
        "(self, logs=None)",
        resume.backup_on_train_end,
    ),
    Patch(
        _model_checkpoint,
        "_save_model",
        "ModelCheckpoint._save_model",
        "(self, epoch, batch, logs)",
        resume.checkpoint_save_model,
    ),
    # Build an unbuilt model from the data's spec, not its first batch (symbolic_build).
    Patch(
        _keras_internals.tensorflow_trainer,
        "_maybe_symbolic_build",
        "TensorFlowTrainer._maybe_symbolic_build",
        "(self, iterator=None, data_batch=None)",
        symbolic_build.maybe_symbolic_build,
    ),
    # On a cluster, name the task that failed (dpkeras._patches.task_failures).
    Patch(
        _keras_internals.tensorflow_trainer,
        "fit",
        "TensorFlowTrainer.fit",
        _FIT,
        task_failures.naming_failed_tasks,
    ),
    Patch(
        _keras_internals.tensorflow_trainer,
        "evaluate",
        "TensorFlowTrainer.evaluate",
        _EVALUATE,
        task_failures.naming_failed_tasks,
    ),
    Patch(
        _keras_internals.tensorflow_trainer,
        "predict",
        "TensorFlowTrainer.predict",
        _PREDICT,
        task_failures.naming_failed_tasks,
    ),
    # On a cluster, the step functions run on a task, so the client is out of the per-step
    # path (dpkeras._patches.cluster_loop).
    *(
        Patch(
            _keras_internals.tensorflow_trainer,
            f"make_{step}_function",
            f"TensorFlowTrainer.make_{step}_function",
            "(self, force=False)",
            cluster_loop.running_on_the_cluster(f"{step}_function"),
        )
        for step in ("train", "test", "predict")
    ),
)

_lock = threading.RLock()
_saved = {}  # qualname -> (owner, Keras's original object, whether owner defined it itself)
_scopes = set()  # one token per entered scope
_leases = {}  # id(variable) -> weakref.finalize


def _by_name(qualname):
    return next(p for p in PATCHES if p.qualname == qualname)


def keras_original(patch):
    """Returns Keras's own object for `patch`, whether or not the patches are installed."""
    with _lock:
        if patch.qualname in _saved:
            return _saved[patch.qualname][1]
    return getattr(patch.owner(), patch.name)


def check(patch):
    """Raises RuntimeError if Keras's function for `patch` is missing or has changed signature.

    Args:
        patch: a `Patch`.
    """
    owner = patch.owner()
    original = getattr(owner, patch.name, None)
    if original is None:
        raise RuntimeError(
            f"dpkeras cannot patch Keras {keras.__version__}: {patch.qualname} does not exist "
            f"(expected a function with signature {patch.signature}, as in Keras "
            f"{SUPPORTED_KERAS}). Use the Keras version pinned in dpkeras's pyproject.toml."
        )
    found = str(inspect.signature(original))
    if found != patch.signature:
        raise RuntimeError(
            f"dpkeras cannot patch Keras {keras.__version__}: {patch.qualname} has signature "
            f"{found}, expected {patch.signature} (as in Keras {SUPPORTED_KERAS}). Use the "
            f"Keras version pinned in dpkeras's pyproject.toml."
        )


def source_sha256(function):
    """The SHA-256 (hex) of `inspect.getsource(function)`."""
    return hashlib.sha256(inspect.getsource(function).encode()).hexdigest()


def _wrap(patch, original):
    @functools.wraps(original)
    def wrapped(*args, **kwargs):
        return patch.wrapper(original, *args, **kwargs)

    wrapped.__dpkeras_original__ = original
    return wrapped


def installed():
    """Whether dpkeras's wrappers are in place of Keras's functions now."""
    with _lock:
        return bool(_saved)


def install():
    """Checks every function in `PATCHES`, then replaces each by its wrapper.

    Checked: each function's signature is compared with the one it has in Keras 3.15 (the
    version pinned in pyproject.toml), and a difference raises, naming the function and both
    signatures, before anything is patched. Where dpkeras replaces what a Keras function does
    rather than wrapping it (`BackupAndRestore._save_model`), the table pins a hash of the
    original's source, and tests/test_keras_patches.py fails when Keras changes it.

    Does nothing if already installed. Normally called by entering a dpkeras scope.

    Raises:
        RuntimeError: if a Keras function is missing or its signature differs from Keras
            3.15's; nothing is patched then.
    """
    with _lock:
        if _saved:
            return
        for patch in PATCHES:
            check(patch)
        for patch in PATCHES:
            owner = patch.owner()
            original = getattr(owner, patch.name)
            _saved[patch.qualname] = (owner, original, patch.name in vars(owner))
            setattr(owner, patch.name, _wrap(patch, original))
        lookups.register()


def uninstall():
    """Puts Keras's original function objects back and forgets every scope and variable.

    The next dpkeras scope entered installs the patches again.
    """
    with _lock:
        for finalizer in list(_leases.values()):
            finalizer.detach()
        _leases.clear()
        _scopes.clear()
        _restore()


def _restore():
    if _saved:
        lookups.unregister()
    for patch in PATCHES:
        owner, original, own = _saved.pop(patch.qualname, (None, None, False))
        if owner is None:
            continue
        if own:
            setattr(owner, patch.name, original)
        else:
            delattr(owner, patch.name)


def _release_if_unused():
    if not _scopes and not _leases:
        _restore()


def _variable_died(key):
    with _lock:
        _leases.pop(key, None)
        _release_if_unused()


def _lease(variables):
    for v in variables:
        key = id(v)
        if key not in _leases:
            _leases[key] = weakref.finalize(v, _variable_died, key)


@contextlib.contextmanager
def installed_during(scope, live_variables):
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
    back. Creating a strategy patches nothing.

    ```python
    with dpkeras.scope():
        assert dpkeras._patches.table.installed()
    ```

    Args:
        scope: the context manager of a `ParameterDeviceStrategy`'s scope.
        live_variables: callable returning the strategy's live variables; each keeps the
            patches installed until it is garbage-collected.

    Yields:
        What entering `scope` gives (the strategy).

    Raises:
        RuntimeError: see `install`.
    """
    token = object()
    with _lock:
        install()
        _scopes.add(token)
    try:
        with scope as entered:
            yield entered
    finally:
        with _lock:
            if token in _scopes:  # else uninstall() was called inside the scope
                _lease(live_variables())
                _scopes.discard(token)
            _release_if_unused()
