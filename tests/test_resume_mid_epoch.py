"""A backup taken in the middle of an epoch resumes at the batch after it (issue 44, item 3).

Keras 3.15 restarts that epoch from its first batch, training the batches before the backup a
second time. Under dpkeras, where the input's order is deterministic, the restarted `fit`
reads those batches without training on them, restores the metrics' running states, and goes
on: weights, optimizer state, iteration count and history equal an uninterrupted run's, bit
for bit (one process, the same devices). Elsewhere it resumes as Keras does, with a warning
naming why. Each run here is interrupted by a callback raising in `on_train_batch_begin`, a
new model is built (as after a restart) and `fit` is called again with the same
`BackupAndRestore` directory; a killed process resuming is tests/test_reliability.py's.
"""

import json
import logging
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from dpkeras import placement
from dpkeras._input import resumption
from dpkeras._patches import resume
from dpkeras.testing import cpu_strategy
from tests import resume_worker as worker

BATCH = 12  # 96 rows: 8 steps per epoch
EPOCHS = 3


class Interrupt(keras.callbacks.Callback):
    """Raises at the start of batch `batch` of epoch `epoch` (0-based)."""

    def __init__(self, epoch, batch):
        super().__init__()
        self.at = (epoch, batch)

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if (self.epoch, batch) == self.at:
            raise RuntimeError("interrupted")


def build(strategy, steps_per_execution=1):
    with strategy.scope():
        model = worker.build_model()
        model.compile(
            optimizer=keras.optimizers.Adam(0.01),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
            steps_per_execution=steps_per_execution,
        )
    return model


def arrays(shuffle):
    x, y = worker.make_data()
    return dict(x=x, y=y, batch_size=BATCH, shuffle=shuffle)


def augmented_dataset():
    """A dataset with a seeded random map and a shuffle that keeps its order each epoch."""
    x, y = worker.make_data()
    keras.utils.set_random_seed(3)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(
        96, seed=5, reshuffle_each_iteration=False
    )
    noisy = dataset.map(lambda a, b: (a + tf.random.uniform(tf.shape(a), seed=9) * 0.1, b))
    return dict(x=noisy.batch(BATCH))


def repeated_dataset():
    """An infinite dataset with steps_per_epoch=5: each epoch reads on where the last stopped
    (the stream does not restart at each epoch)."""
    x, y = worker.make_data()
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH).repeat()
    return dict(x=dataset, steps_per_epoch=5)


def run(strategy, data, interrupts, save_freq=2, steps=(1,), directory=None):
    """Fits once per interrupt (each interrupted) and once more to the end, each time on a new
    model with the same backup directory; `steps[i]` is run i's steps_per_execution. Returns
    the last model and history."""
    for i, at in enumerate([*interrupts, None]):
        model = build(strategy, steps[min(i, len(steps) - 1)])
        callbacks = [keras.callbacks.BackupAndRestore(directory, save_freq=save_freq)]
        if at is not None:
            callbacks.append(Interrupt(*at))
        try:
            history = model.fit(**data(), epochs=EPOCHS, verbose=0, callbacks=callbacks)
        except RuntimeError as e:
            assert at is not None and str(e) == "interrupted"
    return model, history


def uninterrupted(strategy, data, steps_per_execution=1):
    model = build(strategy, steps_per_execution)
    history = model.fit(**data(), epochs=EPOCHS, verbose=0)
    return worker.state_arrays(model), history.history


def assert_resumed_exactly(model, history, expected, resumed_at):
    state, logs = expected
    got = worker.state_arrays(model)
    assert len(got) == len(state)
    for i, (e, a) in enumerate(zip(state, got)):
        np.testing.assert_array_equal(a, e, err_msg=f"variable {i}")
    # The restarted fit logs the epochs from the one it resumed in, each as uninterrupted.
    assert history.history == {key: values[resumed_at:] for key, values in logs.items()}


CASES = {
    "arrays-seeded-shuffle": (lambda: arrays(True), [(1, 5)], (1,)),
    "arrays-in-order-k2": (lambda: arrays(False), [(1, 6)], (2,)),
    # Backed up every 2 batches with K=2, resumed with K=4: the call over batches 4-7
    # straddles the resume point (6) and runs its batches 6 and 7 only.
    "arrays-k2-then-k4": (lambda: arrays(True), [(1, 6)], (2, 4)),
    "dataset-seeded-map": (augmented_dataset, [(2, 3)], (1,)),
    "repeated-steps-per-epoch": (repeated_dataset, [(2, 3)], (1,)),
    "interrupted-twice": (lambda: arrays(True), [(0, 3), (1, 7)], (1,)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_mid_epoch_backup_resumes_at_the_next_batch_exactly(case, tmp_path, caplog):
    data, interrupts, steps = CASES[case]
    strategy = cpu_strategy(2)
    expected = uninterrupted(strategy, data, steps[0])
    with caplog.at_level(logging.INFO, logger="dpkeras"):
        model, history = run(strategy, data, interrupts, steps=steps, directory=str(tmp_path))
    epoch, batch = interrupts[-1]
    done = batch - batch % 2  # backed up every 2 batches
    assert f"resuming epoch {epoch + 1} at batch {done + 1}" in caplog.text
    assert "trained a second time" not in caplog.text
    assert_resumed_exactly(model, history, expected, epoch)


class InterruptValidation(keras.callbacks.Callback):
    """Raises in the validation of epoch `epoch` (0-based), once."""

    def __init__(self, epoch):
        super().__init__()
        self.at, self.epoch = epoch, None

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_test_batch_end(self, batch, logs=None):
        if self.epoch == self.at:
            raise RuntimeError("interrupted")


def test_a_run_lost_in_the_validation_after_a_backup_at_the_last_batch_logs_that_epoch(tmp_path):
    """`save_freq=2` over 8-batch epochs backs up at each epoch's last batch; lost during
    epoch 1's validation, the restarted fit runs that epoch's end (its validation,
    `on_epoch_end`, its History entry) before going on: the backup at the last batch is written
    at the epoch's end, after validation, so the restart resumes from the one before it.
    Weights and every epoch's history equal an uninterrupted run's."""
    strategy = cpu_strategy(2)
    x, y = worker.make_data()
    data = dict(x=x, y=y, batch_size=BATCH, shuffle=False, validation_data=(x[:24], y[:24]))
    model = build(strategy)
    expected = model.fit(**data, epochs=EPOCHS, verbose=0).history
    state = worker.state_arrays(model)
    model = build(strategy)
    backup = keras.callbacks.BackupAndRestore(str(tmp_path), save_freq=2)
    with pytest.raises(RuntimeError, match="interrupted"):
        model.fit(**data, epochs=EPOCHS, verbose=0, callbacks=[backup, InterruptValidation(1)])
    model = build(strategy)
    backup = keras.callbacks.BackupAndRestore(str(tmp_path), save_freq=2)
    history = model.fit(**data, epochs=EPOCHS, verbose=0, callbacks=[backup])
    assert history.epoch == [1, 2]  # epoch 1 resumed (at its last batch), its end run
    assert history.history == {key: values[1:] for key, values in expected.items()}
    for i, (e, a) in enumerate(zip(state, worker.state_arrays(model))):
        np.testing.assert_array_equal(a, e, err_msg=f"variable {i}")


def test_hybrid_placement_resumes_exactly(tmp_path):
    """Replicated copies (placement.hybrid()) resume as variables on the parameter device."""
    strategy = cpu_strategy(2, placement.hybrid())
    data = lambda: arrays(True)  # noqa: E731
    expected = uninterrupted(strategy, data)
    model, history = run(strategy, data, [(1, 3)], directory=str(tmp_path))
    assert_resumed_exactly(model, history, expected, 1)


def test_the_resumed_run_backs_up_at_the_batches_an_uninterrupted_one_does(tmp_path):
    """With save_freq=3 over epochs of 8 batches, an uninterrupted run backs up after batches
    (epoch, batch) (0, 2), (0, 5), (1, 0), (1, 3), (1, 6), ... (Keras counts batches across
    epochs). Interrupted at (1, 6), the run resumes after (1, 3); interrupted again at (2, 0),
    its last backup must be the one after (1, 6), as uninterrupted: counting from the restart
    instead, it would back up after (1, 4) and (1, 7)."""
    directory = str(tmp_path)
    data = lambda: arrays(True)  # noqa: E731
    strategy = cpu_strategy(2)
    for at in [(1, 6), (2, 0)]:
        model = build(strategy)
        callbacks = [keras.callbacks.BackupAndRestore(directory, save_freq=3), Interrupt(*at)]
        with pytest.raises(RuntimeError):
            model.fit(**data(), epochs=EPOCHS, verbose=0, callbacks=callbacks)
    with open(os.path.join(directory, "training_metadata.json")) as f:
        metadata = json.load(f)
    assert (metadata["epoch"], metadata["batch"]) == (1, 6)
    assert metadata["dpkeras"]["epoch_complete"] is False


def unseeded_shuffle():
    tf.random.set_seed(None)  # build_model set a global seed, which shuffle would take
    return dict(x=tf.data.Dataset.from_tensor_slices(worker.make_data()).shuffle(96).batch(BATCH))


def unseeded_arrays():
    tf.random.set_seed(None)  # Keras shuffles the arrays with tf.random.shuffle, then unseeded
    return arrays(True)


class _Batches(keras.utils.PyDataset):
    def __init__(self):
        super().__init__()
        self.x, self.y = worker.make_data()

    def __len__(self):
        return len(self.x) // BATCH

    def __getitem__(self, i):
        return self.x[i * BATCH : (i + 1) * BATCH], self.y[i * BATCH : (i + 1) * BATCH]


@pytest.mark.parametrize(
    "data, why",
    [
        (unseeded_shuffle, "its random ops have no seed (ShuffleDataset)"),
        (unseeded_arrays, "its random ops have no seed (RandomShuffle)"),
        (
            lambda: dict(
                x=tf.data.Dataset.from_tensor_slices(worker.make_data())
                .shuffle(96, seed=1)
                .batch(BATCH)
            ),
            "it draws a new order each time it is iterated (ShuffleDataset",
        ),
        (
            lambda: dict(x=_Batches()),
            "it is a Python generator or a PyDataset",
        ),
    ],
    ids=["unseeded-shuffle", "unseeded-arrays", "reshuffled-each-epoch", "py-dataset"],
)
def test_input_of_unknown_order_resumes_as_keras_does_with_a_warning(data, why, tmp_path, caplog):
    strategy = cpu_strategy(2)
    directory = str(tmp_path)
    model = build(strategy)
    callbacks = [keras.callbacks.BackupAndRestore(directory, save_freq=2), Interrupt(1, 3)]
    with pytest.raises(RuntimeError):
        model.fit(**data(), epochs=2, verbose=0, callbacks=callbacks)
    model = build(strategy)
    callbacks = [keras.callbacks.BackupAndRestore(directory, save_freq=2)]
    with caplog.at_level(logging.INFO, logger="dpkeras"):
        history = model.fit(**data(), epochs=2, verbose=0, callbacks=callbacks)
    assert "after 2 batch(es) of epoch 2" in caplog.text
    assert "trained a second time" in caplog.text
    assert why in caplog.text
    # As Keras: the epoch from its first batch, the 2 batches before the backup trained again.
    assert int(model.optimizer.iterations.numpy()) == 8 + 2 + 8
    assert len(history.history["loss"]) == 1


@pytest.mark.parametrize(
    "steps_per_epoch, steps_per_execution, num_batches",
    [(None, 1, 8), (None, 3, 8), (5, 1, None), (5, 2, None), (3, 1, 8), (3, 2, 8), (4, 3, 8)],
)
def test_stream_position_is_where_keras_epoch_loop_is(
    steps_per_epoch, steps_per_execution, num_batches
):
    """`stream_position` against Keras's own `EpochIterator`, reading a dataset of batch
    indices as its step function would (K batches per call, fewer where the data ends)."""
    from keras.src.trainers.epoch_iterator import EpochIterator

    dataset = tf.data.Dataset.range(8 if num_batches else 1000).batch(1)
    if num_batches is None:
        dataset = dataset.repeat()
    loop = EpochIterator(
        dataset, steps_per_epoch=steps_per_epoch, steps_per_execution=steps_per_execution
    )
    firsts = []
    for _ in range(5):
        first = None
        for _, _, batches in loop:
            if first is None:
                first = int(batches[0][0])
        firsts.append(first % (num_batches or 1000))
    expected = [
        resumption.stream_position(e, steps_per_epoch, steps_per_execution, num_batches)
        % (num_batches or 1000)
        for e in range(5)
    ]
    assert firsts == expected


def test_an_epoch_end_backup_in_the_middle_of_a_pass_says_the_input_restarts(tmp_path, caplog):
    """steps_per_epoch=3 over 8 batches of arrays: Keras reads on from one epoch to the next
    (epoch 2 begins at batch 4 of the data), and a restarted run reads the data from its first
    batch. dpkeras cannot start Keras's loop in the middle of a pass, and says so, even for a
    backup at an epoch's end (Keras says nothing)."""
    directory = str(tmp_path)
    strategy = cpu_strategy(2)
    data = dict(**arrays(False), steps_per_epoch=3)
    model = build(strategy)
    callbacks = [keras.callbacks.BackupAndRestore(directory), Interrupt(1, 1)]
    with pytest.raises(RuntimeError):
        model.fit(**data, epochs=2, verbose=0, callbacks=callbacks)
    model = build(strategy)
    with caplog.at_level(logging.INFO, logger="dpkeras"):
        model.fit(
            **data, epochs=2, verbose=0, callbacks=[keras.callbacks.BackupAndRestore(directory)]
        )
    assert "resuming at epoch 2 with the input read from its first batch" in caplog.text
    assert "steps_per_epoch=3 over 8 batches, epoch 2 begins in the middle of a pass" in caplog.text


def test_a_dynamic_embedding_resumes_mid_epoch_with_its_index(tmp_path):
    """A DynamicEmbedding (ids admitted after 2 sightings, Adam) resumed after batch 2 of
    epoch 2: its rows, the ids it admitted and those still pending, and the head equal an
    uninterrupted run's (the index tables are in the backup's weights file)."""
    from tests.test_dynamic_embedding import _model, _same_state, _stream

    x, y = _stream(n=48)
    strategy = cpu_strategy(2)

    def fit(model, callbacks=()):
        return model.fit(
            x, y, batch_size=6, epochs=2, shuffle=False, verbose=0, callbacks=list(callbacks)
        )

    keras.utils.set_random_seed(5)  # the head's initial weights
    with strategy.scope():
        reference, _ = _model(optimizer="adam", min_count=2)
    fit(reference)
    directory = str(tmp_path)
    for interrupt in (Interrupt(1, 3), None):
        keras.utils.set_random_seed(5)
        with strategy.scope():
            model, _ = _model(optimizer="adam", min_count=2)
        callbacks = [keras.callbacks.BackupAndRestore(directory, save_freq=2)]
        if interrupt is None:
            history = fit(model, callbacks)
        else:
            with pytest.raises(RuntimeError):
                fit(model, [*callbacks, interrupt])
    assert len(history.history["loss"]) == 1
    assert int(model.optimizer.iterations.numpy()) == 16
    _same_state(reference, model)


# -- from the review of issue 44 item 3 (each test fails under one break of tests/mutations.py)


class Steps(keras.callbacks.Callback):
    """Records `(epoch, step)` of each `on_train_batch_begin`."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        self.seen.append((self.epoch, batch))


def test_a_straddling_group_reports_its_true_first_step_to_callbacks(tmp_path):
    """Backed up every 2 batches with K=2, resumed with K=4 at batch 6: the group 4-7 runs
    batches 6 and 7, and callbacks are told it begins at step 6 (not 4)."""
    directory, strategy = str(tmp_path), cpu_strategy(2)
    model = build(strategy, 2)
    callbacks = [keras.callbacks.BackupAndRestore(directory, save_freq=2), Interrupt(1, 6)]
    with pytest.raises(RuntimeError):
        model.fit(**arrays(True), epochs=EPOCHS, verbose=0, callbacks=callbacks)
    model, steps = build(strategy, 4), Steps()
    callbacks = [keras.callbacks.BackupAndRestore(directory, save_freq=2), steps]
    model.fit(**arrays(True), epochs=EPOCHS, verbose=0, callbacks=callbacks)
    assert steps.seen == [(1, 6), (2, 0), (2, 4)]


def test_an_epoch_end_backup_of_a_repeated_stream_resumes_exactly(tmp_path):
    """steps_per_epoch=5 over an infinite stream, backed up at each epoch's end: the restart
    passes over the 10 batches epochs 0 and 1 read, and epoch 2's metrics start from zero."""
    strategy = cpu_strategy(2)
    expected = uninterrupted(strategy, repeated_dataset)
    model, history = run(strategy, repeated_dataset, [(2, 2)], save_freq=5, directory=str(tmp_path))
    assert_resumed_exactly(model, history, expected, 2)


def test_an_evaluate_in_on_train_begin_does_not_take_the_resumption(tmp_path):
    """A callback listed before BackupAndRestore evaluates in on_train_begin: the epoch
    iterator resumed is still the training data's."""
    x, y = worker.make_data()

    class Evaluate(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.model.evaluate(x[:24], y[:24], verbose=0)

    strategy, directory = cpu_strategy(2), str(tmp_path)
    model = build(strategy)
    history = model.fit(**arrays(True), epochs=EPOCHS, verbose=0, callbacks=[Evaluate()])
    expected = (worker.state_arrays(model), history.history)
    for at in [(1, 5), None]:
        model = build(strategy)
        callbacks = [Evaluate(), keras.callbacks.BackupAndRestore(directory, save_freq=2)]
        if at is not None:
            callbacks.append(Interrupt(*at))
        try:
            history = model.fit(**arrays(True), epochs=EPOCHS, verbose=0, callbacks=callbacks)
        except RuntimeError:
            pass
    assert_resumed_exactly(model, history, expected, 1)


def test_a_reused_callback_object_backs_up_where_an_uninterrupted_run_does(tmp_path):
    """As test_the_resumed_run_backs_up_at_the_batches_an_uninterrupted_one_does, with one
    BackupAndRestore object for every fit: its count since the last save restarts at 0."""
    directory, strategy = str(tmp_path), cpu_strategy(2)
    backup = keras.callbacks.BackupAndRestore(directory, save_freq=3)
    for at in [(1, 6), (2, 0)]:
        model = build(strategy)
        with pytest.raises(RuntimeError):
            model.fit(**arrays(True), epochs=EPOCHS, verbose=0, callbacks=[backup, Interrupt(*at)])
    with open(os.path.join(directory, "training_metadata.json")) as f:
        metadata = json.load(f)
    assert (metadata["epoch"], metadata["batch"]) == (1, 6)


@pytest.mark.parametrize(
    "make, why",
    [
        (
            lambda: tf.data.Dataset.random(seed=1, rerandomize_each_iteration=True).take(8),
            "it draws a new order each time it is iterated (RandomDataset",
        ),
        (
            lambda: tf.data.Dataset.range(8).map(
                lambda i: tf.py_function(lambda v: v + 1, [i], tf.int64)
            ),
            "its pipeline calls Python",
        ),
        (
            lambda: tf.data.Dataset.range(8).map(
                lambda i: tf.cond(
                    i > 3,
                    lambda: tf.cast(i, tf.float32) + tf.random.uniform([]),
                    lambda: tf.cast(i, tf.float32),
                )
            ),
            "its random ops have no seed (RandomUniform)",
        ),
    ],
    ids=["rerandomized", "py-function", "unseeded-in-cond"],
)
def test_why_order_may_differ_sees(make, why):
    tf.random.set_seed(None)
    found = resumption.why_order_may_differ(make())
    assert found is not None and why in found


def _fallback(data, interrupt, tmp_path, caplog, epochs=2):
    strategy, directory = cpu_strategy(2), str(tmp_path)
    model = build(strategy)
    callbacks = [keras.callbacks.BackupAndRestore(directory, save_freq=2), Interrupt(*interrupt)]
    with pytest.raises(RuntimeError):
        model.fit(**data(), epochs=epochs, verbose=0, callbacks=callbacks)
    model = build(strategy)
    callbacks = [keras.callbacks.BackupAndRestore(directory, save_freq=2)]
    with caplog.at_level(logging.INFO, logger="dpkeras"):
        model.fit(**data(), epochs=epochs, verbose=0, callbacks=callbacks)
    assert "trained a second time" in caplog.text
    return caplog.text


def test_steps_per_epoch_in_the_middle_of_a_pass_resumes_as_keras_does(tmp_path, caplog):
    """steps_per_epoch=3 over 8 batches: epoch 1 begins at batch 3 of a pass."""
    text = _fallback(lambda: arrays(True) | dict(steps_per_epoch=3), (1, 2), tmp_path, caplog)
    assert "epoch 2 begins in the middle of a pass over the data" in text


def test_a_stream_of_unknown_length_with_steps_per_epoch_resumes_as_keras_does(tmp_path, caplog):
    x, y = worker.make_data()

    def data():
        dataset = tf.data.Dataset.from_tensor_slices((x, y)).filter(lambda a, b: True)
        return dict(x=dataset.batch(BATCH), steps_per_epoch=3)

    text = _fallback(data, (1, 2), tmp_path, caplog)
    assert "its length is unknown" in text


def test_a_backup_restored_outside_fit_says_why(tmp_path, caplog):
    directory, strategy = str(tmp_path), cpu_strategy(2)
    model = build(strategy)
    callbacks = [keras.callbacks.BackupAndRestore(directory, save_freq=2), Interrupt(0, 3)]
    with pytest.raises(RuntimeError):
        model.fit(**arrays(True), epochs=1, verbose=0, callbacks=callbacks)
    model = build(strategy)
    backup = keras.callbacks.BackupAndRestore(directory, save_freq=2)
    backup.set_model(model)
    with strategy.scope(), caplog.at_level(logging.WARNING, logger="dpkeras"):
        backup.on_train_begin()
    assert "because the backup was not restored by model.fit" in caplog.text


def test_an_interrupted_fit_leaves_no_fit_on_the_stack(tmp_path):
    model = build(cpu_strategy(2))
    callbacks = [keras.callbacks.BackupAndRestore(str(tmp_path), save_freq=2), Interrupt(0, 3)]
    with pytest.raises(RuntimeError):
        model.fit(**arrays(True), epochs=1, verbose=0, callbacks=callbacks)
    assert not getattr(resume._fits, "stack", [])


def test_a_reused_callback_starting_over_counts_epochs_from_zero(tmp_path):
    """A callback that restored a backup at epoch 2 (and was interrupted before that epoch
    ended), reused after its directory was removed, backs up epoch 0 as epoch 0."""
    import shutil

    directory, strategy = str(tmp_path / "backup"), cpu_strategy(2)
    model = build(strategy)
    callbacks = [keras.callbacks.BackupAndRestore(directory, save_freq=2), Interrupt(2, 3)]
    with pytest.raises(RuntimeError):
        model.fit(**arrays(True), epochs=EPOCHS, verbose=0, callbacks=callbacks)
    backup = keras.callbacks.BackupAndRestore(directory, save_freq=2)
    for at, remove in [((2, 5), False), ((0, 5), True)]:
        if remove:
            shutil.rmtree(directory)
        model = build(strategy)
        with pytest.raises(RuntimeError):
            model.fit(**arrays(True), epochs=EPOCHS, verbose=0, callbacks=[backup, Interrupt(*at)])
    with open(os.path.join(directory, "training_metadata.json")) as f:
        metadata = json.load(f)
    assert metadata["epoch"] == 0  # (its batch count is Keras's, stale from the earlier fit)


def test_a_backup_at_an_epochs_last_batch_is_an_epoch_end(tmp_path, caplog):
    """save_freq=8 over epochs of 8 batches: the backup after batch 7 of epoch 1 is the end of
    epoch 1; the restart begins epoch 2 at its first batch (and does not go through an empty
    epoch 1 again, which would call on_epoch_end(1) with no logs)."""
    directory, strategy = str(tmp_path), cpu_strategy(2)
    model = build(strategy)
    callbacks = [keras.callbacks.BackupAndRestore(directory, save_freq=8), Interrupt(2, 3)]
    with pytest.raises(RuntimeError):
        model.fit(**arrays(True), epochs=EPOCHS, verbose=0, callbacks=callbacks)
    with open(os.path.join(directory, "training_metadata.json")) as f:
        metadata = json.load(f)
    assert (metadata["epoch"], metadata["dpkeras"]["epoch_complete"]) == (2, True)
    model, steps = build(strategy), Steps()
    callbacks = [keras.callbacks.BackupAndRestore(directory, save_freq=8), steps]
    with caplog.at_level(logging.INFO, logger="dpkeras"):
        model.fit(**arrays(True), epochs=EPOCHS, verbose=0, callbacks=callbacks)
    assert steps.seen[0] == (2, 0)
    assert "resuming epoch" not in caplog.text


# -- the review's scenarios, each different from an uninterrupted run before its fix


def _unknown_length():
    x, y = worker.make_data()
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).filter(lambda a, b: True)
    return dict(x=dataset.batch(BATCH))


def test_a_backup_at_the_last_batch_of_data_of_unknown_length_is_an_epoch_end(tmp_path, caplog):
    """Data of unknown length: Keras gives no step count, so the backup after batch 8 of 8
    could not know it ended its epoch. Resumed, the epoch is found to have no batch after it:
    the next epoch begins, and history holds every epoch (not an empty entry)."""
    strategy = cpu_strategy(2)
    expected = uninterrupted(strategy, _unknown_length)
    with caplog.at_level(logging.INFO, logger="dpkeras"):
        model, history = run(strategy, _unknown_length, [(2, 0)], directory=str(tmp_path))
    assert "the backup was taken after the last batch of epoch 2: resuming at epoch 3" in (
        caplog.text
    )
    assert_resumed_exactly(model, history, expected, 2)


def test_a_repeated_stream_fit_from_a_later_initial_epoch_resumes_exactly(tmp_path):
    """fit(initial_epoch=1) over a repeated dataset with steps_per_epoch: the stream starts at
    epoch 1, so epoch 3 begins 5 batches into it, not 10."""
    strategy = cpu_strategy(2)
    model = build(strategy)
    history = model.fit(**repeated_dataset(), initial_epoch=1, epochs=EPOCHS, verbose=0)
    expected = (worker.state_arrays(model), history.history)
    directory = str(tmp_path)
    for at in [(2, 3), None]:
        model = build(strategy)
        callbacks = [keras.callbacks.BackupAndRestore(directory, save_freq=2)]
        if at is not None:
            callbacks.append(Interrupt(*at))
        try:
            history = model.fit(
                **repeated_dataset(), initial_epoch=1, epochs=EPOCHS, verbose=0, callbacks=callbacks
            )
        except RuntimeError:
            pass
    state, logs = expected
    for e, a in zip(state, worker.state_arrays(model)):
        np.testing.assert_array_equal(a, e)
    assert history.history == {key: values[1:] for key, values in logs.items()}


@pytest.mark.parametrize("kind", ["generator", "keras-layer"])
def test_a_pipeline_whose_random_state_lives_on_resumes_as_keras_does(kind, tmp_path, caplog):
    """A tf.random.Generator, or a Keras random layer (its seed generator's state), in the
    pipeline draws on from epoch to epoch: a restarted run cannot repeat its epochs."""
    x, y = worker.make_data()

    def data():
        dataset = tf.data.Dataset.from_tensor_slices((x, y))
        if kind == "generator":
            generator = tf.random.Generator.from_seed(7)
            dataset = dataset.map(lambda a, b: (a + generator.normal(tf.shape(a)) * 0.1, b))
        else:
            noise = keras.layers.GaussianNoise(0.1, seed=11)
            dataset = dataset.map(lambda a, b: (noise(a, training=True), b))
        return dict(x=dataset.batch(BATCH))

    text = _fallback(data, (1, 3), tmp_path, caplog)
    assert "it changes state that lives on from one epoch to the next" in text
