"""On a cluster, a task lost in the middle of `fit` is left out or waited for, and `fit` goes on.

A ps task that dies takes every variable it held with it (this client's resources there: the
weights, optimizer slots, metric and seed states, its shards of a table); a worker that dies
takes its input pipelines and the step functions instantiated there. The step that needed it
fails, and `dpkeras._health.name_failures` names the task (`TaskFailedError`). Where the `fit`
has a `keras.callbacks.BackupAndRestore` with a backup in its directory, `fit` does not end
there:

1. it waits, bounded (`$DPKERAS_TASK_RESTART_TIMEOUT`, 300 s by default), for the task to
   answer at its address again (restarted by its scheduler: a TFJob's `restartPolicy:
   OnFailure`);
2. connects again to that task alone, keeping this client's state on every other task
   (`dpkeras.cluster._connect.reconnect_to_restarted`), and makes again, on it, every resource
   of the strategy's variables that lived there (`PlacedVariable.remake_on`);
3. calls Keras's `fit` again with the same arguments: `BackupAndRestore` restores every
   variable from the backup (all of them, not only the lost ones, so that the state is one
   backup's) and resumes at the batch after it (`dpkeras._patches.resume`), so the run ends
   as an uninterrupted one would, exactly; Keras traces the step functions again (they held
   the lost resources) and makes the epoch's input pipelines again on every worker.

A worker whose loss takes no variable with it (every variable on the ps tasks) and that does
not run the step loop (worker 0 does) is not waited for, unless `$DPKERAS_ELASTIC_WORKERS` is
0: it is left out of this client's connection
(`_connect.leave_out`), the strategy runs the replicas on the other workers' devices
(`compute_without`), and `fit` is called again at once, as in 3, on fewer replicas at the same
global batch: the result equals an uninterrupted run's within float tolerance, as N replicas
equal one device. At the start of each later epoch, a left-out worker that answers again at its
address (restarted) ends that call (`_Rejoining`, before the epoch's first step); it is
connected again (`_connect.take_back`), its replicas run again, and `fit` is called again from
the backup. A worker still left out when a `fit` ends is taken back at the start of a later
`fit` if it answers by then.

The `History` returned holds the epochs of the calls, each epoch once (a resumed epoch's
entry is the resumed call's). Callbacks see a second `on_train_begin`, as after a restart of
the client. Without a backup, or with the wait set to 0, the `TaskFailedError` ends `fit` as
before, saying what to add. Under `placement.hybrid()` a lost worker's copies of the replicated
variables are left out with its replicas (the other copies carry on) and made again when it
is taken back, before the backup is restored into every copy. From the first loss of any task
on (a worker or a ps), the workers' all-reduce exchanges the copies' gradients among the
devices instead of using TensorFlow's collectives (`dpkeras._extended.all_reduce`): these keep
the incarnation of every worker they met and refuse a restarted one, and after this client
connected again to a restarted ps a worker crashed (SIGSEGV) in its next collectives
(measured on TF 2.21: `benchmarks.recovery`'s `ps-waited-hybrid`, in the middle of the fit at
steps_per_execution=1, and as the client ended at 2).
"""

import logging
import time

import keras
import tensorflow as tf

from dpkeras import _config
from dpkeras._dynamic.layer import DynamicEmbedding
from dpkeras._extended import all_reduce
from dpkeras._extended.extended import extended_of
from dpkeras._patches import resume
from dpkeras._variables import placed
from dpkeras.cluster import _connect, _health, _loop

_log = logging.getLogger("dpkeras")


def _backup_of(callbacks):
    """The `BackupAndRestore` among `callbacks` that dpkeras restores (local), or None."""
    for callback in callbacks or ():
        if isinstance(callback, keras.callbacks.BackupAndRestore):
            return callback
    return None


def remake_lost_resources(model, extended, task):
    """Makes again, on `task`, every resource of `extended`'s variables that lived there, and
    the hash tables of `model`'s `DynamicEmbedding`s; returns how many."""
    made, seen = 0, set()
    for variable in extended.variables():
        ours = placed.of(variable)
        for part in () if ours is None else ours.parts:  # a shard once, whoever lists it
            if id(part) not in seen:
                seen.add(id(part))
                made += part.remake_on(task)
    layers = {id(layer): layer for layer in resume.all_layers(model)}
    for layer in layers.values():
        if isinstance(layer, DynamicEmbedding):
            made += layer.remake_on(task)
    return made


def _refusal(error, why):
    """`error` (a `TaskFailedError` for a lost task) again, saying why `fit` did not go on."""
    return _health.TaskFailedError(
        error.task, error.address, error.reason, error.tensorflow_error, advice=why
    )


def _merged(histories):
    """One `History` of the calls' histories (None for a call that trained no epoch): each
    epoch once, from the latest call that logged it (a resumed epoch's entry is the resumed
    call's)."""
    final = histories[-1]
    kept = [h for h in histories if h is not None]
    epochs, logs = [], {}
    for i, history in enumerate(kept):
        later = next((h.epoch[0] for h in kept[i + 1 :] if h.epoch), None)
        for j, epoch in enumerate(history.epoch):
            if later is not None and epoch >= later:
                break
            epochs.append(epoch)
            for key, values in history.history.items():
                logs.setdefault(key, []).append(values[j])
    final.epoch, final.history = epochs, logs
    return final


class _Rejoin(Exception):
    """Raised by `_Rejoining` at an epoch's start: a left-out worker answers again."""

    def __init__(self, task):
        super().__init__(f"{task} answers again")
        self.task = task


class _Rejoining(keras.callbacks.Callback):
    """Added to a `fit` with a backup that goes on without lost workers: at the start of each
    epoch after its first, a left-out worker that answers again at its address (`cluster`'s)
    ends the call (`_Rejoin`, before any step of the epoch), so that it is taken back and the
    next call goes on from the backup."""

    def __init__(self, cluster):
        super().__init__()
        self._cluster = cluster
        self._first = True

    def on_train_begin(self, logs=None):
        self._first = True

    def on_epoch_begin(self, epoch, logs=None):
        if self._first:
            self._first = False
            return
        task = _answering_again(self._cluster)
        if task is not None:
            raise _Rejoin(task)


def _answering_again(cluster):
    """A left-out task of `cluster` that answers again at its address, or None."""
    for task in _health.left_out():
        if _health.probe(cluster.tasks[task], timeout=0.5) is None:
            return task
    return None


def _with_callback(bound, callback):
    """`(args, kwargs)` of the call of `fit` bound in `bound` (a `BoundArguments` of its
    signature, the model first, its callbacks a list or tuple) with `callback` after its
    callbacks; `bound` is left as it is."""
    arguments = dict(bound.arguments, callbacks=[*bound.arguments["callbacks"], callback])
    call = type(bound)(bound.signature, arguments)
    return call.args[1:], call.kwargs


def going_on_after_a_lost_task(fit, signature, model, *args, **kwargs):
    """Stands in for Keras's `fit` (`fit`: it, with `task_failures.naming_failed_tasks`'s
    naming; `signature`: Keras's `fit`'s, to find its callbacks): see the module."""
    extended = extended_of(model)
    spec = None if extended is None else extended.cluster_spec
    if spec is None:
        return fit(model, *args, **kwargs)
    bound = signature.bind(model, *args, **kwargs)
    callbacks = bound.arguments.get("callbacks")
    backup = _backup_of(callbacks)
    histories, deadline, lost = [], None, None
    # A worker left out by an earlier fit that answers again: taken back before this one; one
    # still out (perhaps by another model's fit) runs no replica of this one.
    while (task := _answering_again(spec)) is not None:
        _take_back(model, extended, task)
    if extended.compute_without(_health.left_out()):
        _forget_step_functions(model)
    while True:
        try:
            call_args, call_kwargs = args, kwargs
            if _health.left_out() and backup is not None and isinstance(callbacks, (list, tuple)):
                rejoining = _Rejoining(spec)  # without a backup, the next fit takes it back
                call_args, call_kwargs = _with_callback(bound, rejoining)
            history = fit(model, *call_args, **call_kwargs)
            histories.append(history)
            return _merged(histories) if len(histories) > 1 else history
        except _Rejoin as back:
            histories.append(getattr(model, "history", None))
            _take_back(model, extended, back.task)
            lost = back
            deadline = time.monotonic() + _config.setting("task_restart_timeout").value
        except _health.TaskFailedError as error:
            if not error.task.startswith(("/job:ps/", "/job:worker/")):
                raise
            timeout = _config.setting("task_restart_timeout").value
            if timeout == 0:
                raise _refusal(
                    error, "($DPKERAS_TASK_RESTART_TIMEOUT is 0: fit does not wait for it.)"
                ) from None
            if backup is None or not resume.has_backup(backup):
                raise _refusal(
                    error,
                    "To have fit wait for a lost task, restore every variable and go on, give "
                    "fit a keras.callbacks.BackupAndRestore(backup_dir) (with save_freq "
                    "set to a number of batches, it resumes at the batch after the last "
                    "backup).",
                ) from None
            histories.append(getattr(model, "history", None))
            lost = error
            deadline = time.monotonic() + timeout
            # placement.hybrid()'s all-reduce: exchanged from now on, for a worker left out
            # or waited for and for a ps (a worker's collectives crashed after a ps's restart).
            all_reduce.lost(error.task)
            if _went_on_without(model, extended, error, backup):
                continue
            _recover(model, extended, error, backup, timeout, deadline)
        except tf.errors.UnavailableError:
            # Just after a recovery, a task's connection to the restarted one may still be
            # waiting to connect again (gRPC backs off after failed attempts): the next call
            # fails at its first step, changing nothing, and is made again, bounded.
            if lost is None or time.monotonic() >= deadline:
                raise
            histories.append(None)
            time.sleep(1.0)


def _forget_step_functions(model):
    """Keras makes `model`'s step functions again at its next call: they captured the lost
    resources, or ran on other replicas."""
    model.train_function = model.test_function = model.predict_function = None


def _went_on_without(model, extended, error, backup):
    """For a worker lost under `$DPKERAS_ELASTIC_WORKERS` (on by default): leaves it out and
    runs the replicas on the other workers' devices (`compute_without`), so that the next call
    of `fit` restores the backup and goes on at the same global batch. Returns False (nothing
    changed) for a ps, with the setting off, or where it cannot: a variable's values live on
    the worker (a parameter device there), no replica is left, or the worker runs the step
    loop (worker 0, `_loop.loop_device`: waited for). `placement.hybrid()`'s copies on it are
    left out with its replicas; the workers' all-reduce is exchanged from then on
    (`all_reduce.lost`)."""
    task = error.task
    if not task.startswith("/job:worker/") or not _config.setting("elastic_workers").value:
        return False
    if _loop.loop_device(extended.cluster_spec).startswith(f"{task}/"):
        return False
    before = len(extended.worker_devices)
    try:
        extended.compute_without([*_health.left_out(), task])
    except ValueError:
        return False
    try:
        _connect.leave_out(task)
    except BaseException:
        extended.compute_without(_health.left_out())
        raise
    _forget_step_functions(model)
    _log.warning(
        "dpkeras: %s at %s was lost; fit goes on without it on %d replica(s) (was %d) at the "
        "same global batch, from the backup in %s; it rejoins at the start of an epoch once "
        "it answers again at its address.",
        task,
        error.address,
        len(extended.worker_devices),
        before,
        backup.backup_dir,
    )
    return True


def _take_back(model, extended, task):
    """Connects again to `task`, a left-out worker that answers again (restarted), and runs
    replicas on its devices again: the next call of `fit` restores the backup of the epoch's
    end and goes on with it."""
    before = len(extended.worker_devices)
    _connect.take_back(task)
    remake_lost_resources(model, extended, task)  # placement.hybrid()'s copies there
    extended.compute_without(_health.left_out())
    _forget_step_functions(model)
    _log.warning(
        "dpkeras: %s answers again and rejoins: fit runs on %d replica(s) (was %d).",
        task,
        len(extended.worker_devices),
        before,
    )


def _recover(model, extended, error, backup, timeout, deadline):
    task, address = error.task, error.address
    _log.warning(
        "dpkeras: %s at %s was lost; waiting up to %g s for it to answer again, then every "
        "variable is restored from the backup in %s and fit goes on.",
        task,
        address,
        timeout,
        backup.backup_dir,
    )
    started = time.monotonic()
    with _health.paused():
        why = _health.wait_until_it_answers(address, deadline)
        if why is not None:
            raise _refusal(
                error,
                f"It did not answer again within {timeout:g} s ($DPKERAS_TASK_RESTART_TIMEOUT): "
                f"{why}.",
            ) from None
        _connect.reconnect_to_restarted(task)
        try:
            made = remake_lost_resources(model, extended, task)
        except NotImplementedError as e:
            raise _refusal(error, f"{e} Restart the client.") from None
    _forget_step_functions(model)
    _log.warning(
        "dpkeras: %s answers again after %.1f s; %d variable(s) and table(s) made again on it; "
        "restoring the backup and going on.",
        task,
        time.monotonic() - started,
        made,
    )
