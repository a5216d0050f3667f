"""What the client does per epoch on a cluster does not grow with the workers (issue 31).

Counted, not timed, during each epoch of `fit(x, y)` on NumPy arrays with validation data:
- the functions the client registers in its TensorFlow context (each one is Python tracing and
  a function definition, the client's largest per-epoch cost when it grew with the workers: a
  `MultiDeviceIterator` per worker per iterator, six functions each);
- the workers' iterators the client makes (two remote ops each): one per worker for the
  epoch's training data and one for its validation data. Keras also makes an iterator at the
  end of each epoch, which the next epoch throws away; it makes no worker's iterator.
Real clusters of 1 ps and 1 or 2 workers (`dpkeras serve` on loopback), one client process
each.
"""

import json
import subprocess
import sys
import textwrap

import pytest
import tensorflow as tf

from dpkeras import _tf_internals
from dpkeras._input import at_first_use
from dpkeras.testing import LocalCluster, server_env

CLIENT_TIMEOUT = 300

_CLIENT = """
import json
import numpy as np
import dpkeras, keras, tensorflow as tf
from dpkeras import _tf_internals
from dpkeras._input import at_first_use

SPEC = json.loads({spec!r})
strategy = dpkeras.get_strategy(cluster=SPEC)
keras.utils.set_random_seed(1)
with strategy.scope():
    model = keras.Sequential([
        keras.Input((4,), dtype="int32"), keras.layers.Embedding(100, 4),
        keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse", steps_per_execution=2)
rng = np.random.RandomState(0)
x, y = rng.randint(0, 100, (40, 4)).astype("int32"), rng.randn(40, 1).astype("float32")


class Count(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.at_begin = []

    def mark(self):
        self.at_begin.append(
            (_tf_internals.function_names(), at_first_use.host_iterators_made_at_first_use()))

    def on_epoch_begin(self, epoch, logs=None):
        self.mark()

    def on_train_end(self, logs=None):
        self.mark()


count = Count()
model.fit(x, y, batch_size=8, epochs=3, verbose=0, validation_data=(x[:16], y[:16]),
          callbacks=[count])
per_epoch = [len(b[0] - a[0]) for a, b in zip(count.at_begin, count.at_begin[1:])]
iterators = [b[1] - a[1] for a, b in zip(count.at_begin, count.at_begin[1:])]
dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
kinds = _tf_internals.host_iterator_kinds(iter(strategy.experimental_distribute_dataset(dataset)))
print(json.dumps({{"per_epoch": per_epoch, "iterators": iterators, "kinds": kinds}}))
"""


def _clients(specs):
    """Runs the client against each spec at once; returns their outputs in order."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(_CLIENT.format(spec=json.dumps(spec)))],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=server_env(),
        )
        for spec in specs
    ]
    outputs = []
    try:
        for proc in procs:
            try:
                out, err = proc.communicate(timeout=CLIENT_TIMEOUT)
            except subprocess.TimeoutExpired:
                pytest.fail(f"a client hung: no exit within {CLIENT_TIMEOUT} s")
            assert proc.returncode == 0, err[-4000:]
            outputs.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
    return outputs


@pytest.fixture(scope="module")
def seen():
    """Each client's counts, by the number of workers (1 and 2)."""
    with LocalCluster(ps=1, workers=1, cpus=1) as one, LocalCluster(ps=1, workers=2, cpus=1) as two:
        return dict(zip((1, 2), _clients([one.spec, two.spec])))


def test_functions_made_per_epoch_do_not_grow_with_the_workers(seen):
    """After the first epoch (which traces the train and test steps), an epoch registers the
    same number of functions at 1 and at 2 workers: none. Before, each epoch's training and
    validation iterators made a `MultiDeviceIterator` per worker, six functions each (24 an
    epoch at 1 worker, 48 at 2; 18-21 and 36-42 new names)."""
    assert seen[1]["kinds"] == ["plain"]
    assert seen[2]["kinds"] == ["plain", "plain"]
    later = {w: out["per_epoch"][1:] for w, out in seen.items()}
    assert later[1] == later[2] == [0, 0], seen


def test_each_epoch_makes_one_iterator_per_worker_for_training_and_one_for_validation(seen):
    """Each epoch makes each worker's iterator once for its training data and once for its
    validation data: 2 at 1 worker, 4 at 2, in every epoch. Keras's extra iterator at each
    epoch's end (thrown away by the next epoch) makes none: before, 4 and 8."""
    assert seen[1]["iterators"] == [2, 2, 2], seen
    assert seen[2]["iterators"] == [4, 4, 4], seen


def test_the_plain_iterator_options_give_a_plain_iterator():
    """Fails loudly if TensorFlow stops making a plain iterator (not a `MultiDeviceIterator`)
    for an input host under `_tf_internals.plain_iterator_options`, or stops reading
    per-host iterators where `host_iterator_kinds` looks."""
    device = "/job:localhost/replica:0/task:0/device:CPU:0"
    workers = _tf_internals.InputWorkers([(device, (device,))])
    strategy = tf.distribute.OneDeviceStrategy(device)
    contexts = [_tf_internals.InputContext(1, 0, 1)]

    def kinds(options):
        distributed = at_first_use.distributed_datasets_from_function(
            lambda _: tf.data.Dataset.range(6).batch(2), workers, contexts, strategy, options
        )
        iterator = iter(distributed)
        return _tf_internals.host_iterator_kinds(iterator), next(iterator)

    assert kinds(None)[0] == ["multi_device"]
    plain, first = kinds(_tf_internals.plain_iterator_options(None))
    assert plain == ["plain"]
    assert first.numpy().tolist() == [0, 1]
