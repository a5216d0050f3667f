"""An epoch's iterator makes its input hosts' iterators when first read
(`dpkeras._input.at_first_use`).

Keras makes an iterator at each epoch's start and another at its end that the next epoch throws
away, for training and for validation. On a cluster, each worker's iterator is two remote ops
the client sends; made at first use, the thrown-away one costs nothing
(tests/test_cluster_costs.py counts them on real clusters). These tests pin the behaviour on
one machine (4 logical CPUs, 2 replicas): nothing is made before the first read, what is read
equals TensorFlow's own distributed iterator, `tf.function` takes it as TensorFlow's (no
retrace), and a pipeline whose iterators share state (a `shuffle` that reshuffles each
iteration) keeps TensorFlow's iterators made at once. They fail loudly if TensorFlow changes the
private classes this relies on.
"""

import numpy as np
import pytest
import tensorflow as tf

from dpkeras import _tf_internals
from dpkeras._input import at_first_use
from dpkeras.testing import cpu_strategy

DEVICES = [f"/job:localhost/replica:0/task:0/device:CPU:{i}" for i in (1, 2)]


def _dataset():
    x = np.arange(48, dtype="float32").reshape(12, 4)
    return tf.data.Dataset.from_tensor_slices((x, x[:, :1])).batch(4)


def _values(element):
    return [
        [np.asarray(t).tolist() for t in tf.nest.flatten(per)]
        for per in tf.nest.map_structure(
            lambda v: v.values if hasattr(v, "values") else (v,), element
        )
    ]


def test_nothing_is_made_before_the_first_read_and_the_elements_are_tensorflows():
    strategy = cpu_strategy(2)
    distributed = strategy.experimental_distribute_dataset(_dataset())
    before = at_first_use.host_iterators_made_at_first_use()
    thrown_away = iter(distributed)  # as Keras's end-of-epoch iterator
    iterator = iter(distributed)
    assert not at_first_use.host_iterators_made(thrown_away)
    assert not at_first_use.host_iterators_made(iterator)
    assert at_first_use.host_iterators_made_at_first_use() == before

    mirrored = tf.distribute.MirroredStrategy(DEVICES)
    reference = iter(mirrored.experimental_distribute_dataset(_dataset()))
    for _ in range(3):
        assert _values(next(iterator)) == _values(next(reference))
    assert at_first_use.host_iterators_made(iterator)
    assert not at_first_use.host_iterators_made(thrown_away)
    assert at_first_use.host_iterators_made_at_first_use() == before + 1  # one input host
    with pytest.raises(StopIteration):
        next(iterator)


def test_a_tf_function_takes_it_as_tensorflows_iterator_without_retracing():
    """The iterator's type spec is TensorFlow's: a traced function reads it, and an iterator
    TensorFlow made (a stateful pipeline's, below) calls the same trace."""
    strategy = cpu_strategy(2)
    traces = []

    @tf.function
    def step(iterator):
        traces.append(1)
        x, y = next(iterator)
        return strategy.run(lambda a, b: tf.reduce_sum(a) + tf.reduce_sum(b), (x, y))

    def total(iterator):
        return sum(float(v) for v in strategy.experimental_local_results(step(iterator)))

    iterator = iter(strategy.experimental_distribute_dataset(_dataset()))
    assert not at_first_use.host_iterators_made(iterator)
    first, second = total(iterator), total(iterator)
    assert at_first_use.host_iterators_made(iterator)
    x = np.arange(48, dtype="float32").reshape(12, 4)
    assert (first, second) == (x[:4].sum() + x[:4, 0].sum(), x[4:8].sum() + x[4:8, 0].sum())

    once = _dataset().shuffle(12, seed=1, reshuffle_each_iteration=True)
    made_at_once = iter(strategy.experimental_distribute_dataset(once))
    assert at_first_use.host_iterators_made(made_at_once)
    total(made_at_once)
    assert len(traces) == 1


@pytest.mark.parametrize(
    "dataset, shared",
    [
        (lambda: _dataset(), []),
        (lambda: _dataset().shuffle(8), ["ShuffleDataset"]),
        (lambda: _dataset().shuffle(8, seed=3), ["ShuffleDataset"]),
        (lambda: _dataset().shuffle(8, reshuffle_each_iteration=False), []),
        (lambda: tf.data.Dataset.random(seed=2).take(4), []),
        (
            lambda: tf.data.Dataset.random(seed=2, rerandomize_each_iteration=True).take(4),
            ["RandomDataset"],
        ),
        (lambda: _dataset().map(lambda x, y: (x + tf.random.uniform([]), y)).prefetch(2), []),
    ],
    ids=["batch", "shuffle", "seeded-shuffle", "shuffle-once", "random", "rerandomized", "map"],
)
def test_state_shared_by_iterators(dataset, shared):
    """What makes an iterator change what the next yields: seeds drawn from a generator the
    dataset's iterators share. A stateful op inside a map (its state is the map function's,
    made again for each iterator) does not."""
    assert _tf_internals.state_shared_by_iterators(dataset()) == shared


def test_a_reshuffling_pipeline_keeps_each_epochs_order():
    """A dataset that reshuffles each iteration draws its seeds when an iterator is made, so a
    thrown-away iterator changes the next epoch's order; its iterators are made at once, as
    TensorFlow makes them, and each epoch's order equals that of the same iterators made without
    a strategy."""

    def rows(distributed_or_dataset, strategy=None):
        epochs = []
        for _ in range(3):
            iterator = iter(distributed_or_dataset)
            iter(distributed_or_dataset)  # thrown away, as Keras does at each epoch's end
            seen = []
            for element in iterator:
                x = element[0]
                parts = strategy.experimental_local_results(x) if strategy else (x,)
                seen.extend(int(v) for part in parts for v in np.asarray(part)[:, 0])
            epochs.append(seen)
        return epochs

    def shuffled():
        return _dataset().unbatch().shuffle(12, seed=7).batch(4)

    tf.random.set_seed(1)
    expected = rows(shuffled())
    strategy = cpu_strategy(2)
    tf.random.set_seed(1)
    got = rows(strategy.experimental_distribute_dataset(shuffled()), strategy)
    assert got == expected
    assert expected[0] != expected[1]  # it does reshuffle
