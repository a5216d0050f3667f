"""A tf.data pipeline made before this process joins its cluster is refused by name, with the
fix; the same pipeline made after joining trains.

Joining replaces TensorFlow's eager context and a dataset belongs to the context it was made
in: used afterwards, TensorFlow fails with "/job:localhost/... unknown device
[Op:DatasetToGraphV2]" (docs/cluster.md, "Datasets after joining"). Scripts often build their
data first, and under TFJob the top of the script runs in every task, so the common pipelines
are each tried both ways, in one program run by `dpkeras launch` on loopback (a chief, one ps,
two workers).
"""

import json
import subprocess
import sys
import textwrap

from dpkeras.testing import server_env

LAUNCH_TIMEOUT = 300

_SCRIPT = """
import json, os, sys
import numpy as np
import tensorflow as tf

HERE = sys.argv[1]
rng = np.random.RandomState(0)
x = rng.rand(64, 4).astype("float32")
y = x.sum(1, keepdims=True)
with tf.io.TFRecordWriter(os.path.join(HERE, "data.tfrecord")) as w:
    for row in np.concatenate([x, y], 1):
        w.write(tf.io.serialize_tensor(row).numpy())
for label in ("a", "b"):
    os.makedirs(os.path.join(HERE, "text", label), exist_ok=True)
    for i in range(32):
        with open(os.path.join(HERE, "text", label, f"{i}.txt"), "w") as f:
            f.write(f"{label} {i}")


def pipelines():
    def generator():
        yield from zip(x, y)

    def record(r):
        t = tf.io.parse_tensor(r, tf.float32)
        return tf.ensure_shape(t[:4], [4]), tf.ensure_shape(t[4:], [1])

    def python_map(a, b):
        return tf.ensure_shape(tf.py_function(lambda t: t * 1.0, [a], tf.float32), [4]), b

    def text_features(text, label):
        n = tf.cast(tf.strings.length(text), tf.float32)
        return tf.stack([n, n, n, n], 1), tf.cast(label, tf.float32)[:, None]

    slices = tf.data.Dataset.from_tensor_slices((x, y))
    spec = (tf.TensorSpec([4]), tf.TensorSpec([1]))
    return {
        "from_tensor_slices": slices.batch(16),
        "from_generator": tf.data.Dataset.from_generator(generator, output_signature=spec)
        .batch(16),
        "py_function map": slices.map(python_map).batch(16),
        "TFRecord": tf.data.TFRecordDataset(os.path.join(HERE, "data.tfrecord"))
        .map(record)
        .batch(16),
        "text_dataset_from_directory": keras.utils.text_dataset_from_directory(
            os.path.join(HERE, "text"), batch_size=16, shuffle=False
        ).map(text_features),
        "cache": slices.cache().batch(16),
        "interleave": tf.data.Dataset.range(2).interleave(
            lambda i: slices.shard(2, i), cycle_length=2
        ).batch(16),
    }


import keras
before = pipelines()
import dpkeras
dpkeras.cluster.join()  # a ps or worker task serves from here, and ends with the client
with dpkeras.scope():
    model = keras.Sequential([keras.Input([4]), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
result = {"before": {}, "after": {}}
for name, ds in before.items():
    try:
        model.fit(ds, epochs=1, verbose=0)
        result["before"][name] = "trained"
    except ValueError as e:
        result["before"][name] = str(e)
del before
for name, ds in pipelines().items():
    loss = model.fit(ds, epochs=1, verbose=0).history["loss"][0]
    result["after"][name] = loss
# A pipeline that calls Python runs in the client and feeds every replica: equal to one device.
def fresh():
    keras.utils.set_random_seed(3)
    m = keras.Sequential([keras.Input([4]), keras.layers.Dense(1)])
    m.compile("sgd", "mse")
    return m
python_fed = pipelines()["py_function map"]
with dpkeras.scope():
    distributed = fresh()
distributed.fit(python_fed, epochs=2, verbose=0)
alone = fresh()
with tf.device("/cpu:0"):
    alone.fit(python_fed, epochs=2, verbose=0)
result["python_fed_difference"] = max(
    float(np.abs(a - b).max()) for a, b in zip(distributed.get_weights(), alone.get_weights())
)
print("RESULT " + json.dumps(result), flush=True)
"""


def test_pipelines_made_before_joining_are_refused_and_made_after_train(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(_SCRIPT))
    proc = subprocess.run(
        [sys.executable, "-m", "dpkeras", "launch", "--ps=1", "--workers=2", "--"]
        + [sys.executable, str(path), str(tmp_path)],
        capture_output=True,
        text=True,
        env=server_env(),
        timeout=LAUNCH_TIMEOUT,
    )
    lines = [line for line in proc.stdout.splitlines() if "RESULT " in line]
    assert proc.returncode == 0 and lines, proc.stdout[-4000:] + proc.stderr[-4000:]
    result = json.loads(lines[0].split("RESULT ", 1)[1])
    names = {
        "from_tensor_slices",
        "from_generator",
        "py_function map",
        "TFRecord",
        "text_dataset_from_directory",
        "cache",
        "interleave",
    }
    assert set(result["before"]) == set(result["after"]) == names
    for name, error in result["before"].items():
        assert "was made before this process joined its cluster" in error, (name, error)
        assert "dpkeras.cluster.join() first" in error, (name, error)
    for name, loss in result["after"].items():
        assert 0 <= loss < 1e3, (name, loss)
    assert result["python_fed_difference"] < 1e-6


def test_the_pipeline_walk_and_its_python_are_seen_on_this_tensorflow():
    """The private parts these rest on (`Dataset._inputs()`, a transformation's traced
    function): fails loudly if a TensorFlow upgrade moves them."""
    import tensorflow as tf

    from dpkeras import _tf_internals

    numbers = tf.data.Dataset.range(4)
    other = tf.data.Dataset.range(3)
    zipped = tf.data.Dataset.zip(numbers.map(lambda x: x + 1), other).batch(2)
    assert {type(d).__name__ for d in _tf_internals.pipeline(zipped)} >= {
        "_BatchDataset",
        "_ZipDataset",
        "_MapDataset",
        "_RangeDataset",
    }
    assert sum(1 for _ in _tf_internals.pipeline(zipped)) == 5  # each dataset once
    assert not _tf_internals.runs_python(zipped)
    python = numbers.map(lambda x: tf.py_function(lambda t: t, [x], tf.int64))
    assert _tf_internals.runs_python(python.batch(2))
    assert _tf_internals.runs_python(tf.data.Dataset.zip(python, other))
    generated = tf.data.Dataset.from_generator(lambda: iter([1, 2]), output_types=tf.int64)
    assert _tf_internals.runs_python(generated)
    assert _tf_internals.runs_python(
        numbers.map(lambda x: tf.numpy_function(lambda t: t, [x], tf.int64))
    )
