"""A worker's replicas pull each distinct id once: lookups merged per task of a cluster.

A real cluster of 1 ps + 1 worker running 2 replicas. Each global batch of 512 is split in two
halves, one per replica. When both halves look up the same 200 ids, the worker pulls 200 rows
a step; when they look up two disjoint sets of 200, it pulls 400: the ps's bytes (its own TCP
counters, marginal per step) show the difference, and training equals one process.
"""

import pytest

from dpkeras.testing import LocalCluster
from tests.test_cluster_loop import _client


@pytest.fixture(scope="module")
def two_replica_worker():
    with LocalCluster(ps=1, workers=1, cpus=2) as running:
        yield running


def test_replicas_of_one_worker_share_one_pull_of_each_distinct_id(two_replica_worker):
    ps_pid = two_replica_worker.pids()["ps:0"]
    out = _client(
        f"""
        from dpkeras.testing import TrafficMeter
        rng = np.random.RandomState(0)
        pool = rng.permutation(20000)
        shared, other = pool[:200], pool[200:400]

        def data(second_half_ids, steps=60):
            halves = [rng.choice(shared, (steps, 256, 8)),
                      rng.choice(second_half_ids, (steps, 256, 8))]
            x = np.concatenate(halves, axis=1).reshape(steps * 512, 8).astype("int32")
            y = rng.normal(size=(steps * 512, 1)).astype("float32")
            return tf.data.Dataset.from_tensor_slices((x, y)).batch(512).repeat()

        dpkeras.cluster.connect(SPEC)
        reference = table_model()
        same = data(shared)
        reference.fit(same, steps_per_epoch=10, epochs=1, verbose=0)
        with dpkeras.scope(cluster=SPEC) as strategy:
            model = table_model()
        model.fit(same, steps_per_epoch=10, epochs=1, verbose=0)
        diff = max(float(np.abs(a - b).max())
                   for a, b in zip(reference.get_weights(), model.get_weights()))
        sent = {{}}
        for name, dataset in (("same", same), ("disjoint", data(other))):
            model.fit(dataset, steps_per_epoch=5, epochs=1, verbose=0)  # warm
            traffic = []
            for steps in (10, 40):
                with TrafficMeter({{"ps": {ps_pid}}}) as meter:
                    model.fit(dataset, steps_per_epoch=steps, epochs=1, verbose=0)
                traffic.append(meter.traffic["ps"].sent)
            sent[name] = (traffic[1] - traffic[0]) / 30
        print(json.dumps({{"diff": diff, "sent": sent,
                          "replicas": strategy.num_replicas_in_sync}}))
        """,
        two_replica_worker.spec,
    )
    assert out["replicas"] == 2
    assert out["diff"] < 1e-5, out
    rows = 200 * 32 * 4  # one pull of 200 rows: 25.6 KB
    assert out["sent"]["same"] < out["sent"]["disjoint"] - 0.6 * rows, out
