"""A job restarted into another layout resumes exactly from its `BackupAndRestore` backup.

A backup holds each variable whole (a `.weights.h5` file, written by the client), not as the
shards or copies it lived in, so a job killed after an epoch can restart on more or fewer ps
tasks, more or fewer workers, with its tables cut into another number of shards, and go on
from the backup as if nothing had happened. Here, for every kind of variable:

- plain (a Dense layer on a ps, all-on-ps), replicated (the same Dense under
  `placement.hybrid()`: a copy on every worker's replica),
- sharded (an `Embedding` cut by a `MinSizePartitioner` into 2 or 3 shards over the ps tasks),
- a `DynamicEmbedding` (its hash index and rows, cut the same way),
- the optimizer's state (Adam's slots of each, and its step count),

a client trains 2 of 4 epochs on one cluster and is killed (`os._exit`) right after the
backup of epoch 2; a second client on another cluster, with another number of ps tasks,
workers and shards, runs the same `fit(epochs=4)` and resumes at epoch 3. Its weights,
optimizer state and the history of epochs 3-4 equal a run of 4 epochs uninterrupted, in one
process. Both directions: ps 1 -> 2 and workers 2 -> 1 (shards 2 -> 3), and back.

Two clusters, shared by the module: 1 ps + 2 workers and 2 ps + 1 worker, one CPU each.
"""

import json
import textwrap

import pytest

from dpkeras.testing import LocalCluster
from tests.test_cluster_training import _client, _run_client, server_env

TOLERANCE = 1e-5

_MODEL = """
from dpkeras import placement
from dpkeras.layers import DynamicEmbedding
partitioners = tf.distribute.experimental.partitioners

def build():
    keras.utils.set_random_seed(1)
    ids = keras.Input((4,), dtype="int32", name="ids")
    keys = keras.Input((3,), dtype="int64", name="keys")
    a = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(600, 8, name="table")(ids))
    b = keras.layers.GlobalAveragePooling1D()(DynamicEmbedding(8, 256, name="de", seed=5)(keys))
    h = keras.layers.Dense(16, activation="relu", name="dense")(keras.layers.Concatenate()([a, b]))
    model = keras.Model([ids, keys], keras.layers.Dense(3, name="head")(h))
    model.compile(optimizer=keras.optimizers.Adam(0.01),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model

rng = np.random.RandomState(0)
x = {"ids": rng.randint(0, 600, (64, 4)).astype("int32"),
     "keys": rng.choice(rng.randint(0, 2**62, 50), (64, 3)).astype("int64")}
y = rng.randint(0, 3, 64)
FIT = dict(batch_size=16, shuffle=False, verbose=0)

def strategy_scope():
    # Tables (19 KB and 8 KB of rows) are cut into SHARDS; the dense layers (1 KB) are not.
    partitioner = partitioners.MinSizePartitioner(min_shard_bytes=2048, max_shards=SHARDS)
    where = placement.hybrid() if PLACEMENT == "hybrid" else None
    return dpkeras.scope(cluster=SPEC, parameter_device=where, partitioner=partitioner)

def kinds(model):
    # What each variable is on this cluster: the test must cover every kind.
    out = {}
    for v in model.weights + model.optimizer.variables:
        value = v.value
        if isinstance(value, dpkeras.ReplicatedVariable):
            kind = "replicated"
        elif hasattr(value, "shards"):
            kind = f"sharded {len(value.shards)}"
        else:
            kind = "plain"
        out[v.path] = kind
    return out
"""

_FIRST = """
class Die(keras.callbacks.Callback):  # after BackupAndRestore's backup of epoch 2
    def on_epoch_end(self, epoch, logs=None):
        if epoch == 1:
            print(json.dumps({"kinds": kinds(self.model)}), flush=True)
            os._exit(17)

with strategy_scope():
    model = build()
model.fit(x, y, epochs=4, callbacks=[keras.callbacks.BackupAndRestore(BACKUP), Die()], **FIT)
"""

_SECOND = """
dpkeras.cluster.connect(SPEC)
reference = build()  # this process's own variables: one device, uninterrupted
expected = reference.fit(x, y, epochs=4, **FIT).history
with strategy_scope():
    model = build()
history = model.fit(x, y, epochs=4, callbacks=[keras.callbacks.BackupAndRestore(BACKUP)], **FIT)

def diff(a, b):
    return float(np.abs(np.asarray(a, "float64") - np.asarray(b, "float64")).max())

print(json.dumps({
    "kinds": kinds(model),
    "epochs": history.epoch,
    "weights": {v.path: diff(v.numpy(), w.numpy())
                for v, w in zip(model.weights, reference.weights)},
    "optimizer": {v.path: diff(v.numpy(), w.numpy())
                  for v, w in zip(model.optimizer.variables, reference.optimizer.variables)},
    "history": {k: diff(history.history[k], expected[k][2:]) for k in expected},
    "size": [model.get_layer("de").size, reference.get_layer("de").size],
}))
"""


@pytest.fixture(scope="module")
def clusters():
    with (
        LocalCluster(ps=1, workers=2, cpus=1) as small,
        LocalCluster(ps=2, workers=1, cpus=1) as wide,
    ):
        yield {"1ps-2workers": small, "2ps-1worker": wide}


def _program(body, spec, placement, shards, backup):
    settings = f"PLACEMENT = {placement!r}\nSHARDS = {shards}\nBACKUP = {backup!r}\n"
    return settings + textwrap.dedent(_MODEL) + textwrap.dedent(body)


@pytest.mark.parametrize("placement", ["ps", "hybrid"])
@pytest.mark.parametrize(
    "before, after",
    [(("1ps-2workers", 2), ("2ps-1worker", 3)), (("2ps-1worker", 3), ("1ps-2workers", 2))],
    ids=["ps-up-workers-down", "ps-down-workers-up"],
)
def test_a_backup_resumes_exactly_on_another_layout(clusters, placement, before, after, tmp_path):
    backup = str(tmp_path / "backup")
    (first, first_shards), (second, second_shards) = before, after
    spec = clusters[first].spec
    proc = _run_client(_program(_FIRST, spec, placement, first_shards, backup), spec, server_env())
    assert proc.returncode == 17, proc.stderr[-4000:]  # killed after epoch 2's backup
    killed_kinds = json.loads(proc.stdout.strip().splitlines()[-1])["kinds"]
    spec = clusters[second].spec
    out = _client(_program(_SECOND, spec, placement, second_shards, backup), spec)

    assert out["epochs"] == [2, 3], out["epochs"]  # resumed at epoch 3, not from the start
    for kinds, shards in ((killed_kinds, first_shards), (out["kinds"], second_shards)):
        found = set(kinds.values())
        dense = "replicated" if placement == "hybrid" else "plain"
        assert {dense, f"sharded {shards}"} <= found, kinds
        assert kinds["dense/kernel"] == dense and kinds["table/embeddings"] == f"sharded {shards}"
    for group in ("weights", "optimizer", "history"):
        worst = max(out[group].items(), key=lambda item: item[1])
        assert worst[1] < TOLERANCE, (group, worst, out[group])
    assert any(path.startswith("de/") for path in out["weights"]), out["weights"]
    assert len(out["optimizer"]) >= len(out["weights"]), out["optimizer"]  # slots, iterations
    assert out["size"][0] == out["size"][1] > 0


_KILLED = """
with dpkeras.scope(cluster=SPEC):
    model = build()
model.fit(x, y, epochs=1, **FIT)
print(json.dumps({"size": model.get_layer("de").size}), flush=True)
os._exit(17)
"""

_NEXT = """
with dpkeras.scope(cluster=SPEC):  # as the killed client began: the same tables, in order
    model = build()
size = model.get_layer("de").size
model.fit(x, y, epochs=1, **FIT)
reference = build()
reference.fit(x, y, epochs=1, **FIT)
print(json.dumps({"size_before": size,
                  "diff": max(float(np.abs(a - b).max())
                              for a, b in zip(model.get_weights(), reference.get_weights()))}))
"""


def test_a_client_after_a_killed_one_starts_with_its_own_tables(clusters):
    """TensorFlow names an eager hash table "table_<n>", n counted per process, and tables of
    one name on one task are one table: a client that made its DynamicEmbedding after a killed
    client had made its own, on the same ps, was given the dead client's ids, counts and rows
    (its fit then differed from one process's by 0.2). Tables are now anonymous."""
    spec = clusters["1ps-2workers"].spec
    program = "PLACEMENT, SHARDS, BACKUP = 'ps', 1, None\n" + textwrap.dedent(_MODEL)
    proc = _run_client(program + textwrap.dedent(_KILLED), spec, server_env())
    assert proc.returncode == 17, proc.stderr[-4000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1])["size"] == 50
    out = _client(program + textwrap.dedent(_NEXT), spec)
    assert out["size_before"] == 0 and out["diff"] < TOLERANCE, out
