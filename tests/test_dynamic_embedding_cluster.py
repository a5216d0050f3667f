"""`DynamicEmbedding` on a real cluster (2 ps + 2 workers, 4 replicas): the index and rows on
the ps tasks, training equal to one process; with a partitioner, both cut over the two ps."""

import pytest

from tests.test_cluster_training import _client


@pytest.mark.parametrize("shards", [1, 2])
def test_on_a_cluster_the_index_and_rows_live_on_ps_and_training_equals_one_process(local, shards):
    out = _client(
        f"""
        SHARDS = {shards}
        from dpkeras.layers import DynamicEmbedding
        partitioners = tf.distribute.experimental.partitioners

        def build():
            keras.utils.set_random_seed(1)
            ids = keras.Input((3,), dtype="int64")
            layer = DynamicEmbedding(8, 64, name="de", seed=5, min_count=2, eviction="lru")
            x = keras.layers.Flatten()(layer(ids))
            model = keras.Model(ids, keras.layers.Dense(1)(x))
            model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
            return model, layer

        rng = np.random.RandomState(0)
        x = rng.choice(rng.randint(0, 2**62, 40), (64, 3)).astype("int64")
        y = rng.normal(size=(64, 1)).astype("float32")
        dpkeras.cluster.connect(SPEC)
        reference, reference_layer = build()
        reference.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
        partitioner = partitioners.FixedShardsPartitioner(2) if SHARDS == 2 else None
        with dpkeras.scope(cluster=SPEC, partitioner=partitioner):
            model, layer = build()
        model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
        rows = layer.embeddings.value
        print(json.dumps({{
            "max_diff": max(float(np.abs(a - b).max())
                            for a, b in zip(reference.get_weights(), model.get_weights())),
            "size": [layer.size, reference_layer.size],
            "tables": [getattr(layer, "index_table" + (f"_{{i}}" if i else "")
                               ).resource_handle.device for i in range(SHARDS)],
            "rows": [s.device for s in getattr(rows, "shards", [rows])],
        }}))
        """,
        local.spec,
    )
    assert out["max_diff"] < 1e-5  # rows, row ids, counts, last-seen steps and the head
    assert out["size"][0] == out["size"][1] > 0
    tasks = [device.rsplit("/device:", 1)[0] for device in out["tables"]]
    assert all(task.startswith("/job:ps/replica:0/task:") for task in tasks), out
    assert tasks == [device.rsplit("/device:", 1)[0] for device in out["rows"]], out
    assert len(set(tasks)) == shards, out  # with 2 shards, one table on each ps
