"""The DLRM benchmark (`--models=dlrm`): its tables, ids, lookup counts, the dedup baseline
and the memory check. The run itself is smoke-run by hand (a full run is minutes)."""

import os
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks import compare, models, results, worker  # noqa: E402
from tests.test_benchmark import _flags  # noqa: E402


def test_the_tables_are_criteo_kaggles_capped_at_200k_rows_times_size():
    assert len(models.CRITEO_KAGGLE_CARDINALITIES) == 26
    assert sum(models.CRITEO_KAGGLE_CARDINALITIES) == 33_762_577
    rows = models.dlrm_rows(1.0)
    assert max(rows) == 200_000 and sum(rows) == 1_483_115
    assert models.table_bytes("dlrm", 1.0) == 1_483_115 * 16 * 4  # 90.5 MiB
    assert models.dlrm_rows(51.0) == list(models.CRITEO_KAGGLE_CARDINALITIES)  # uncapped


def test_ids_are_zipf_shaped_within_each_table():
    x, y = models.synthetic_data("dlrm", 4000, size=0.05, seed=0)
    assert x["dense_features"].shape == (4000, 13) and y.shape == (4000, 1)
    assert 0.3 < float(y.mean()) < 0.7
    rows = models.dlrm_rows(0.05)
    for i in (2, 9):  # 10000 rows each at this size
        ids = x[f"cat_{i}"][:, 0]
        assert ids.min() >= 0 and ids.max() < rows[i]
        counts = np.sort(np.bincount(ids, minlength=rows[i]))[::-1]
        # Zipf(1.1) over 10k ids: the most popular id takes about 10% of the draws, and
        # well under half the table is ever drawn in 4000 examples.
        assert 0.05 < counts[0] / 4000 < 0.2 and (counts > 0).sum() < rows[i] / 2
        assert np.argmax(np.bincount(ids)) != 0  # popular ids scattered, not id 0


def test_lookup_rows_counts_every_id_distinct_per_replica_and_per_step():
    x = {
        "item": np.array([[1], [1], [2], [3], [3], [3]]),
        "user": np.array([[0], [0], [0], [0], [5], [6]]),
    }
    got = models.lookup_rows("recommender", x, batch_size=6, replicas=2)
    # replica 0: items 1,1,2 (2 distinct), users 0,0,0 (1); replica 1: items 3,3,3 (1), users
    # 0,5,6 (3). Per step: items 1,2,3 and users 0,5,6.
    assert got["ids_per_replica_per_step"] == 6
    assert got["distinct_ids_per_replica_per_step"] == (3 + 4) / 2
    assert got["distinct_ids_per_step"] == 6
    assert got["id_row_bytes_per_replica_per_step"] == 6 * 32 * 4
    assert models.lookup_rows("mlp", {}, 6, 2) == {}


def test_dlrm_adds_the_no_dedup_baseline_beside_dpkeras_unless_told_not_to():
    config = compare.config_from_flags(
        _flags(models=["dlrm"], dedup_baseline=None, batch_size=96), gpus=[]
    )
    assert config.strategies[:2] == ["dpkeras", "dpkeras_no_dedup"]
    config = compare.config_from_flags(
        _flags(models=["dlrm"], dedup_baseline=False, batch_size=96), gpus=[]
    )
    assert "dpkeras_no_dedup" not in config.strategies
    config = compare.config_from_flags(_flags(models=["mlp"], dedup_baseline=None), gpus=[])
    assert "dpkeras_no_dedup" not in config.strategies


def test_mirrored_that_cannot_hold_every_table_on_every_replica_is_refused_before_building():
    spec = worker.PairSpec(strategy="mirrored", model="dlrm", replicas=3, batch_size=96)
    one_copy = models.table_bytes("dlrm") * 2  # Adagrad's accumulator doubles it
    with pytest.raises(MemoryError, match=r"mirrored does not fit: it keeps 3 copies") as e:
        worker.memory_check(spec, available=2 * one_copy)
    assert "GiB available" in str(e.value) and "--size" in str(e.value)
    fields = worker.memory_check(spec, available=100 * one_copy)
    assert fields == {"table_bytes_with_slots": one_copy, "table_copies": 3}
    dpkeras_spec = worker.PairSpec(strategy="dpkeras", model="dlrm", replicas=3, batch_size=96)
    assert worker.memory_check(dpkeras_spec, available=2 * one_copy)["table_copies"] == 1


def test_the_no_dedup_pair_turns_deduplication_off_in_its_own_process(monkeypatch):
    monkeypatch.setenv("DPKERAS_DEDUPLICATE", "1")  # restored after the test
    spec = worker.PairSpec(
        strategy="dpkeras_no_dedup", model="dlrm", replicas=3, size=0.002, batch_size=18,
        steps=1, check_steps=1, warmup_steps=0, repeats=1, data_examples=36,
    )  # fmt: skip
    record = worker.run(spec)
    assert record["status"] == "ok", record["error"]
    assert os.environ["DPKERAS_DEDUPLICATE"] == "0" and record["deduplicate"] == "0"
    assert record["distinct_ids_per_replica_per_step"] <= record["ids_per_replica_per_step"]
    assert record["table_copies"] == 1
    assert set(record["variable_bytes_by_device"]) == {"/cpu:0"}
    lines = results.lookup_tables([record])
    assert (
        lines[2].startswith("| model | strategy")
        and "| dlrm | dpkeras_no_dedup | 3 | 0 |" in (lines[4])
    )


def test_without_keras_rs_the_dlrm_is_built_from_keras_layers(monkeypatch):
    import keras

    monkeypatch.setitem(sys.modules, "keras_rs", None)  # import keras_rs raises ImportError
    model = models.build("dlrm", 0.002)
    kinds = {type(layer).__name__ for layer in model.layers}
    assert "Embedding" in kinds and "FeatureCross" in kinds and "DistributedEmbedding" not in kinds
    x, _ = models.synthetic_data("dlrm", 4, 0.002)
    assert keras.ops.convert_to_numpy(model(x)).shape == (4, 1)
