"""The pieces of going on after a lost task (`dpkeras._patches.lost_tasks`) that need no
cluster: what a restarted task's resources count (a layer held twice, a variable listed
twice), each loss's own wait, and the calls tried again while a connection to a restarted task
is not back yet. The whole path, on
a real cluster whose tasks are killed and restarted, is tests/test_cluster_training.py's
`test_a_task_lost_mid_fit_is_waited_for_and_the_same_fit_goes_on_exactly` and
`test_a_ps_lost_twice_in_one_fit_is_waited_for_twice_and_the_fit_ends_exactly`."""

import inspect
import types

import keras
import pytest
import tensorflow as tf

import dpkeras
from dpkeras._patches import lost_tasks, resume
from dpkeras.cluster import _connect, _health
from dpkeras.layers import DynamicEmbedding

# The one task of this process: every device of a one-machine strategy is on it.
LOCAL = "/job:localhost/replica:0/task:0"


def test_what_a_restarted_task_makes_again_counts_a_layer_held_twice_once():
    """A DynamicEmbedding called by two submodels appears twice among the model's layers: its
    tables are made again, and counted, once. On one machine every device is on this process's
    task, so remaking on it is what a restarted ps gets: each variable of the strategy (each
    shard) once and each hash table once, all of them new resources."""
    partitioner = tf.distribute.experimental.partitioners.FixedShardsPartitioner(2)
    strategy = dpkeras.ParameterDeviceStrategy(
        ["/cpu:1", "/cpu:2"], ["/cpu:0", "/cpu:3"], partitioner=partitioner
    )
    with strategy.scope():
        layer = DynamicEmbedding(4, 32, min_count=2, seed=7, name="de")

        def tower(name):
            ids = keras.Input((3,), dtype="int64")
            return keras.Model(ids, keras.layers.Flatten()(layer(ids)), name=name)

        ids = keras.Input((3,), dtype="int64")
        both = keras.layers.Concatenate()([tower("a")(ids), tower("b")(ids)])
        model = keras.Model(ids, keras.layers.Dense(1, name="head")(both))
    assert [held for held in resume.all_layers(model) if held is layer] == [layer, layer]
    # Rows, row_ids, counts, last_seen and the head's kernel cut in 2; step, used, bias whole.
    extended = strategy.extended
    assert len(extended.variables()) == 5 * 2 + 3
    # The index and the ids waiting for admission (min_count=2), each cut over both devices.
    tables = [layer.index_table, layer.index_table_1, layer.pending_table, layer.pending_table_1]
    handles = [table.resource_handle for table in tables]
    assert lost_tasks.remake_lost_resources(model, extended, LOCAL) == 13 + 4
    assert all(t.resource_handle is not h for t, h in zip(tables, handles))


def test_a_second_lost_task_in_one_fit_gets_its_own_full_wait(monkeypatch, tmp_path):
    """Ps 1 lost at t=100 and, once it answers again and fit goes on, ps 0 at t=250, with
    `$DPKERAS_TASK_RESTART_TIMEOUT` 120: each is waited for until 120 s after its own loss (220,
    then 370), not the second until the first's deadline (220, past at its loss). Faked: the
    clock, the cluster (its spec, a strategy whose replicas stay as they are, the restarted task
    answering 5 s into the wait, the reconnection), the backup's presence, and Keras's fit,
    which raises what dpkeras raises for a lost task."""
    clock = types.SimpleNamespace(now=0.0)
    faked = _faked_cluster(monkeypatch, clock)
    spec = faked.spec
    losses = [(100.0, 1), (250.0, 0)]

    def fit(model, x, callbacks):
        if losses:
            clock.now, index = losses.pop(0)
            task = f"/job:ps/replica:0/task:{index}"
            raise _health.TaskFailedError(task, spec.task_address("ps", index), "gone")
        history = keras.callbacks.History()
        history.epoch, history.history = [0], {"loss": [0.5]}
        return history

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    backup = keras.callbacks.BackupAndRestore(str(tmp_path))
    signature = inspect.signature(keras.Model.fit)
    history = lost_tasks.going_on_after_a_lost_task(fit, signature, model, "x", callbacks=[backup])
    assert faked.waits == [("ps1:1", 100.0 + 120), ("ps0:1", 250.0 + 120)]
    assert faked.reconnected == ["/job:ps/replica:0/task:1", "/job:ps/replica:0/task:0"]
    assert (history.epoch, history.history) == ([0], {"loss": [0.5]})
    assert faked.sleeps == []  # each wait answered: no connection was tried again


def test_a_variable_listed_twice_is_made_again_once():
    """`remake_lost_resources` makes each part of each variable again once, however many times
    the strategy's list holds it (a shard once, whoever lists it)."""
    strategy = dpkeras.ParameterDeviceStrategy(["/cpu:1"], ["/cpu:0"])
    with strategy.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    variables = strategy.extended.variables()
    assert len(variables) == 2
    twice = types.SimpleNamespace(variables=lambda: variables + variables)
    before = [v.handle for v in model.weights]
    assert lost_tasks.remake_lost_resources(model, twice, LOCAL) == 2
    assert all(v.handle is not h for v, h in zip(model.weights, before))


def _faked_cluster(monkeypatch, clock):
    """Fakes `clock` as the module's clock and a cluster of 2 ps whose lost task answers 5 s
    into the wait; returns its spec and what was asked of it: the sleeps, the waits (address,
    deadline) and the reconnections."""
    spec = tf.train.ClusterSpec({"ps": ["ps0:1", "ps1:1"], "worker": ["w0:1", "w1:1"]})
    faked = types.SimpleNamespace(spec=spec, sleeps=[], waits=[], reconnected=[])

    def sleep(seconds):
        faked.sleeps.append(seconds)
        clock.now += seconds

    monkeypatch.setattr(
        lost_tasks, "time", types.SimpleNamespace(monotonic=lambda: clock.now, sleep=sleep)
    )
    monkeypatch.setenv("DPKERAS_TASK_RESTART_TIMEOUT", "120")
    extended = types.SimpleNamespace(
        cluster_spec=spec, compute_without=lambda tasks: False, variables=lambda: []
    )
    monkeypatch.setattr(lost_tasks, "extended_of", lambda model: extended)
    monkeypatch.setattr(resume, "has_backup", lambda callback: True)

    def wait_until_it_answers(address, deadline):
        faked.waits.append((address, deadline))
        clock.now += 5.0

    monkeypatch.setattr(_health, "wait_until_it_answers", wait_until_it_answers)
    monkeypatch.setattr(_connect, "reconnect_to_restarted", faked.reconnected.append)
    return faked


@pytest.mark.parametrize("unavailable, lost", [(3, True), (200, True), (1, False)])
def test_a_connection_not_back_yet_after_a_recovery_is_tried_again_until_the_deadline(
    monkeypatch, tmp_path, unavailable, lost
):
    """Just after a recovery a task's connection to the restarted one may still be waiting to
    connect again: the next call fails with UnavailableError, changing nothing, and is made
    again 1 s later, until the loss's deadline (120 s after it). Past the deadline, or with no
    task lost in this fit, the error is raised as it is."""
    clock = types.SimpleNamespace(now=0.0)
    sleeps = _faked_cluster(monkeypatch, clock).sleeps
    calls = []

    def fit(model, x, callbacks):
        calls.append(clock.now)
        if lost and len(calls) == 1:
            clock.now = 100.0
            raise _health.TaskFailedError("/job:ps/replica:0/task:1", "ps1:1", "gone")
        if len(calls) <= unavailable + lost:
            raise tf.errors.UnavailableError(None, None, "connection not back yet")
        history = keras.callbacks.History()
        history.epoch, history.history = [0], {"loss": [0.5]}
        return history

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    backup = keras.callbacks.BackupAndRestore(str(tmp_path))
    signature = inspect.signature(keras.Model.fit)
    going_on = lambda: lost_tasks.going_on_after_a_lost_task(  # noqa: E731
        fit, signature, model, "x", callbacks=[backup]
    )
    if not lost or unavailable == 200:
        with pytest.raises(tf.errors.UnavailableError, match="connection not back yet"):
            going_on()
        assert clock.now >= 220.0 if lost else sleeps == []
        return
    history = going_on()
    assert sleeps == [1.0] * unavailable
    assert (history.epoch, history.history) == ([0], {"loss": [0.5]})
