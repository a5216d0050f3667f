"""A training job that tests/test_reliability.py kills and restarts, one process per run.

It trains a small Dense-BatchNormalization-Dropout model with unchanged Keras code, under
`dpkeras.scope()` (or under no strategy, with `--strategy=none`), with the checkpointing
callbacks named by `--save`. With `--kill`, it SIGKILLs itself at a chosen point: as abrupt as a
preemption (no `finally`, no flush of open files, no atexit). Without it, it trains to the end
and writes every model and optimizer variable to `--out` (a `.npz`).

Checkpointing (`--save`, comma-separated):
    backup       keras.callbacks.BackupAndRestore(DIR/backup, save_freq=--save-freq)
    checkpoint   keras.callbacks.ModelCheckpoint(DIR/model.keras), every epoch
    manager      tf.train.CheckpointManager(tf.train.Checkpoint(model, optimizer), DIR/manager),
                 saved at the end of every epoch

Kill points (`--kill`, comma-separated; each is `kind:epoch[:n]`, epochs 0-based):
    batch:E:B     at the start of batch B of epoch E (mid-epoch, outside any checkpoint write)
    h5:E:N        inside the checkpoints written at the end of epoch E, when Keras creates its
                  N-th HDF5 group (the weights file is then half-written)
    replace:E:N   inside them, at the N-th `os.replace` (a file about to be renamed into place)
    merge:E       inside the CheckpointManager save: data shards written, not yet merged
    rename:E      inside it: the `checkpoint` state file written to a temporary name, not
                  yet renamed into place

Usage: python resume_worker.py --dir DIR [--save backup] [--kill SPEC] [--out FILE]
"""

import argparse
import contextlib
import os
import signal
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

STEPS_PER_EPOCH = 4
BATCH_SIZE = 24
EPOCHS = 5
SEED = 7


def make_data():
    rng = np.random.RandomState(0)
    x = rng.rand(STEPS_PER_EPOCH * BATCH_SIZE, 12).astype("float32")
    return x, rng.randint(0, 4, len(x))


def build_model(dropout=True):
    """The compiled model; the same initial weights and seeds for every call in a process."""
    keras.utils.set_random_seed(SEED)
    layers = keras.layers
    model = keras.Sequential(
        [keras.Input((12,)), layers.Dense(16), layers.BatchNormalization()]
        + ([layers.Dropout(0.5)] if dropout else [])
        + [layers.Dense(4)]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


def state_arrays(model):
    """Every model variable (weights, BatchNormalization statistics, seed states) and every
    optimizer variable (iteration count, learning rate, slots), as numpy arrays."""
    return [v.numpy() for v in model.variables] + [v.numpy() for v in model.optimizer.variables]


def _die():
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def _parse_kills(spec):
    kills = []
    for item in filter(None, spec.split(",")):
        kind, *numbers = item.split(":")
        kills.append((kind, *map(int, numbers)))
    return kills


def _install_traps(kills):
    """Patches the write paths so that a kill point inside a checkpoint write can fire.

    Returns the dict a callback uses to arm the traps for the writes of one epoch's end.
    """
    from keras.src.saving import saving_lib
    from tensorflow.python.checkpoint import checkpoint_management
    from tensorflow.python.lib.io import file_io
    from tensorflow.python.ops import gen_io_ops

    armed = {"epoch": None}

    def trap(kind):
        if armed["epoch"] is None:
            return
        armed[kind] = armed.get(kind, 0) + 1
        for k in kills:
            if k[0] == kind and k[1] == armed["epoch"] and (len(k) < 3 or k[2] == armed[kind]):
                _die()

    def before(owner, name, kind):
        original = getattr(owner, name)

        def wrapped(*args, **kwargs):
            trap(kind)
            return original(*args, **kwargs)

        setattr(owner, name, wrapped)

    before(saving_lib.H5IOStore, "make", "h5")
    before(os, "replace", "replace")
    before(gen_io_ops, "merge_v2_checkpoints", "merge")
    before(file_io, "rename", "rename")
    assert checkpoint_management.file_io is file_io  # what CheckpointManager renames with
    return armed


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", required=True)
    parser.add_argument("--save", default="backup")
    parser.add_argument("--save-freq", default="epoch")
    parser.add_argument("--kill", default="")
    parser.add_argument("--out")
    parser.add_argument("--strategy", choices=["dpkeras", "none"], default="dpkeras")
    parser.add_argument("--epochs", type=int, default=EPOCHS)
    args = parser.parse_args(argv)
    kills = _parse_kills(args.kill)
    saves = set(args.save.split(","))

    import dpkeras

    dpkeras.simulate_cpu_devices(4)
    import tensorflow as tf

    armed = _install_traps(kills)

    class Killer(keras.callbacks.Callback):
        """Listed first: kills mid-epoch, or arms the traps for the writes that follow."""

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch
            armed.clear()
            armed["epoch"] = None

        def on_train_batch_begin(self, batch, logs=None):
            if ("batch", self.epoch, batch) in kills:
                _die()

        def on_train_batch_end(self, batch, logs=None):
            if batch == STEPS_PER_EPOCH - 1:
                armed["epoch"] = self.epoch  # an integer save_freq may save now

        def on_epoch_end(self, epoch, logs=None):
            armed["epoch"] = epoch

    scope = dpkeras.scope() if args.strategy == "dpkeras" else contextlib.nullcontext()
    with scope:
        model = build_model()
        if "manager" in saves:
            model.optimizer.build(model.trainable_variables)

    callbacks = [Killer()]
    if "backup" in saves:
        freq = args.save_freq if args.save_freq == "epoch" else int(args.save_freq)
        callbacks.append(
            keras.callbacks.BackupAndRestore(os.path.join(args.dir, "backup"), save_freq=freq)
        )
    if "checkpoint" in saves:
        callbacks.append(keras.callbacks.ModelCheckpoint(os.path.join(args.dir, "model.keras")))
    if "manager" in saves:
        checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer)
        manager = tf.train.CheckpointManager(
            checkpoint, os.path.join(args.dir, "manager"), max_to_keep=1
        )
        callbacks.append(
            keras.callbacks.LambdaCallback(
                on_epoch_end=lambda epoch, logs: manager.save(checkpoint_number=epoch + 1)
            )
        )

    x, y = make_data()
    history = model.fit(
        x,
        y,
        batch_size=BATCH_SIZE,
        epochs=args.epochs,
        shuffle=False,
        verbose=0,
        callbacks=callbacks,
    )
    print(f"epochs run: {len(history.history['loss'])}")
    if args.out:
        np.savez(args.out, *state_arrays(model))


if __name__ == "__main__":
    main()
