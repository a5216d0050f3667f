"""Long runs: many epochs trace each step function once and keep the same variables.

`benchmarks/soak.py` runs thousands of steps and records memory and step time (its own test is
in tests/test_benchmark.py); these tests are the fast check that nothing grows per epoch:
traces, variables, and the per-graph caches dpkeras keeps (replica reads, reductions).
"""

import gc
import time

import keras
import numpy as np
import pytest
import tensorflow as tf

import dpkeras
from dpkeras import _tf_internals
from dpkeras.testing import cpu_strategy
from tests.models import make_data

EPOCHS = 15


def tf_functions(fn, seen=None):
    """The `tf.function`s a Keras step function (a closure) calls, found through closures."""
    seen = set() if seen is None else seen
    if id(fn) in seen:
        return []
    seen.add(id(fn))
    if isinstance(fn, tf.types.experimental.PolymorphicFunction):
        return [fn] + tf_functions(fn.python_function, seen)
    found = []
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            content = cell.cell_contents
        except ValueError:
            continue
        if callable(content):
            found += tf_functions(content, seen)
    return found


class CountCalls(keras.layers.Layer):
    """Counts Python executions of `call`: inside a `tf.function` these happen only when it
    traces (once per replica, as each replica runs the Python step)."""

    calls = 0

    def call(self, x):
        CountCalls.calls += 1
        return x


def test_many_epochs_trace_once_and_keep_their_variables():
    # A strategy of its own: the cached ones hold other tests' variables and traced steps.
    strategy = dpkeras.ParameterDeviceStrategy(["/cpu:1", "/cpu:2", "/cpu:3"], "/cpu:0")
    x, y = make_data("dense", 58)  # batches of 24, 24 and a short 10 (4/3/3 over 3 replicas)
    with strategy.scope():
        keras.utils.set_random_seed(3)
        model = keras.Sequential(
            [
                keras.Input((12,)),
                CountCalls(),
                keras.layers.Dense(16),
                keras.layers.Dropout(0.2),
                keras.layers.BatchNormalization(),
                keras.layers.Dense(4),
            ]
        )
        model.compile(
            optimizer="adam",
            metrics=["accuracy"],
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    counts = []

    class Census(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            counts.append(
                (
                    len(model.variables),
                    len(model.optimizer.variables),
                    len(strategy.extended.variables()),
                    len(strategy.extended.reductions),
                    sum(len(v._replica_reads) for v in strategy.extended.variables()),
                )
            )

    CountCalls.calls = 0
    model.fit(
        x,
        y,
        batch_size=24,
        epochs=EPOCHS,
        validation_data=(x[:20], y[:20]),
        validation_freq=[1, 8, EPOCHS],
        shuffle=False,
        verbose=0,
        callbacks=[Census()],
    )
    train = tf_functions(model.train_function)
    test = tf_functions(model.test_function)
    # Keras's two functions per step (the iterator loop and the step), each traced once, for
    # 15 epochs with a short last batch (its batch dimension is None from the start: Keras's
    # dataset does not drop the remainder).
    assert [f.experimental_get_tracing_count() for f in train] == [1, 1]
    assert [f.experimental_get_tracing_count() for f in test] == [1, 1]
    # The model's call ran in Python: once when Keras built the model symbolically, and once
    # per replica in each of the two traced steps (train and test).
    assert CountCalls.calls == 1 + 3 + 3
    # Nothing grows from epoch to epoch. (After the first epoch, the reads cached for the graph
    # in which Keras built the model symbolically are gone with that graph.)
    assert len(set(counts[1:])) == 1, counts
    variables, optimizer_variables, placed, graphs, cached_reads = counts[-1]
    assert counts[0][:4] == counts[-1][:4] and counts[0][4] >= cached_reads
    assert placed == variables + optimizer_variables + 4  # + the loss and accuracy metrics
    assert graphs == 2  # the traced train and test steps hold reductions
    assert model.optimizer.iterations.numpy() == 3 * EPOCHS
    assert np.isfinite(model.evaluate(x, y, verbose=0)).all()
    assert tf.distribute.get_strategy() is not strategy
    assert isinstance(strategy, dpkeras.ParameterDeviceStrategy)


def test_epochs_of_unknown_size_do_not_drift():
    """Keras finds the end of a dataset of unknown size by calling its step once more. The
    optimizer's iteration count and Dropout's seed state were written without waiting for the
    data, so TensorFlow could run those writes before the missing batch stopped the step: the
    count ran ahead, the random stream shifted, and runs differed. (Plain Keras is always one
    ahead per epoch.) Under dpkeras they count exactly the steps trained."""
    x, y = make_data("dense", 58)
    strategy = cpu_strategy(3)
    data = tf.data.Dataset.from_tensor_slices((x, y)).filter(lambda a, b: True).batch(24)
    with strategy.scope():
        keras.utils.set_random_seed(5)
        model = keras.Sequential(
            [
                keras.Input((12,)),
                keras.layers.Dense(8),
                keras.layers.Dropout(0.3),
                keras.layers.Dense(4),
            ]
        )
        model.compile(
            optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        )
    model.fit(data, epochs=2, verbose=0)
    seed = next(v for v in model.variables if "seed_generator" in v.path)
    assert model.optimizer.iterations.numpy() == seed.numpy()[1] == 2 * 3

    # The race made certain: the step's data is found missing only after 0.5 s, long after
    # any write that does not wait for it.
    def late_end(flag):
        time.sleep(0.5)
        return False

    exhausted = (
        data.unbatch()
        .take(1)
        .filter(lambda a, b: tf.py_function(late_end, [a[0]], tf.bool))
        .batch(24)
    )
    iterator = iter(strategy.experimental_distribute_dataset(exhausted))
    with pytest.raises((StopIteration, tf.errors.OutOfRangeError)):
        model.train_function(iterator)
    assert model.optimizer.iterations.numpy() == seed.numpy()[1] == 2 * 3


def test_models_fitted_and_dropped_leave_nothing_behind():
    """A hyper-parameter search fits many fresh models in one process (issue 40): once a model
    is dropped, nothing of it stays in the strategy, nor in the TensorFlow context. The
    strategy's per-graph caches held tensors of each traced step, which kept its graph (and
    the functions TensorFlow makes from it) alive as long as the strategy: ~4 MB a model."""
    strategy = dpkeras.ParameterDeviceStrategy(["/cpu:1", "/cpu:2"], "/cpu:0")
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 50, (32, 4)).astype("int32"), rng.integers(0, 2, (32, 1))
    counts = []
    for _ in range(3):
        with strategy.scope():
            model = keras.Sequential(
                [
                    keras.Input((4,), dtype="int32"),
                    keras.layers.Embedding(50, 4),
                    keras.layers.GlobalAveragePooling1D(),
                    keras.layers.BatchNormalization(),
                    keras.layers.Dense(1, activation="sigmoid"),
                ]
            )
            model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["auc"])
        model.fit(x, y, batch_size=8, epochs=2, validation_data=(x, y), verbose=0)
        model.evaluate(x, y, batch_size=8, verbose=0)
        model.predict(x, batch_size=8, verbose=0)
        assert len(strategy.extended.reductions) == 2  # the train and test steps, while alive
        del model
        gc.collect()
        counts.append(
            (
                len(strategy.extended.reductions),
                len(strategy.extended.variables()),
                sum(isinstance(o, tf.Graph) for o in gc.get_objects()),
                len(_tf_internals.function_names()),
            )
        )
    reductions, variables, _, _ = counts[-1]
    assert reductions == 0 and variables == 0, counts
    assert counts[1] == counts[2], counts  # graphs and functions: none kept per model
