"""The README's "What is exact" table: each Keras feature, dpkeras and MirroredStrategy side by
side, 3 replicas against one device from the same initial weights (tests/exact_features.py).

dpkeras runs in this process; MirroredStrategy in one fresh process (mixing strategies in one
process is unstable), sharing one strategy object across features. Mirrored's verdicts are
pinned, so a TensorFlow or Keras change to them fails here and the README is updated.
"""

import json
import pathlib

import pytest

from dpkeras import placement
from dpkeras.testing import cpu_strategy, run_python
from tests import exact_features
from tests.models import assert_copies_identical

# Measured on TF 2.21 / Keras 3.15, 3 replicas on logical CPU devices. A failure is pinned
# with the exception's type and a part of its message: the reason the README states.
_MERGE_CALL_IN_COND = ("RuntimeError", "Cond.call()", "`merge_call` called while defining")
MIRRORED = {
    "steps_per_execution": ("fails", "InvalidArgumentError", "Detected at node while/"),
    "jit_compile": ("fails", "InvalidArgumentError", "Graph execution error"),
    "sample_weight": "exact",
    "class_weight": "exact",
    "add_loss_and_regularizers": "exact",
    "multi_input_output": "exact",
    "auc_metric": "exact",
    "ema": ("fails", *_MERGE_CALL_IN_COND),
    "weight_decay": "exact",
    "clipnorm": "differs",
    "gradient_accumulation": ("fails", *_MERGE_CALL_IN_COND),
    "masking": "exact",
    "synchronized_batchnorm": "exact",
    "validation": "exact",
    "callbacks": "exact",
    "mixed_precision": "exact",
    "uneven_batches": (
        "fails",
        "InvalidArgumentError",
        "Inputs to operation AddN of type AddN must have the same size and shape",
    ),
    "generator": "differs",
}


def test_the_table_covers_every_feature():
    assert sorted(MIRRORED) == sorted(exact_features.FEATURES)


def test_the_readme_table_says_synchronized_batchnorm_is_exact():
    """Issue 42 item 3: `BatchNormalization(synchronized=True)` is a row of the README's "What
    is exact" table, exact under dpkeras and as MirroredStrategy's pinned verdict says."""
    readme = (pathlib.Path(__file__).parent.parent / "README.md").read_text(encoding="utf-8")
    table = readme.split("\n## What is exact\n", 1)[1].split("\n## ", 1)[0]
    rows = [
        r for r in table.splitlines() if r.startswith("| `BatchNormalization(synchronized=True)`")
    ]
    assert len(rows) == 1, rows
    cells = [cell.strip() for cell in rows[0].strip().strip("|").split("|")]
    assert cells[1:] == ["exact", MIRRORED["synchronized_batchnorm"]], cells


@pytest.mark.parametrize("feature", sorted(exact_features.FEATURES))
def test_dpkeras_is_exact(feature):
    """Every variable on the parameter device; then with `placement.hybrid()`, the dense layers
    replicated on the replicas' devices and all-reduced (clipping, accumulation, EMA, jit, ...
    on the all-reduced sum), their copies bit-identical after training."""
    expected = exact_features.run(feature)
    actual = exact_features.run(feature, cpu_strategy(3))
    verdict, worst = exact_features.compare(feature, expected, actual)
    assert verdict == "exact", (feature, worst)
    kept = []
    hybrid = exact_features.run(feature, cpu_strategy(3, placement.hybrid()), keep=kept)
    verdict, worst = exact_features.compare(feature, expected, hybrid)
    assert verdict == "exact", ("hybrid", feature, worst)
    assert_copies_identical(kept[0])


def test_mirrored_strategy_verdicts():
    out = run_python(
        """
        import json
        import tensorflow as tf
        from tests import exact_features as F
        mirrored = tf.distribute.MirroredStrategy(["/cpu:1", "/cpu:2", "/cpu:3"])
        verdicts = {}
        for feature in F.FEATURES:
            expected = F.run(feature)
            try:
                verdicts[feature] = F.compare(feature, expected, F.run(feature, mirrored))[0]
            except Exception as e:  # the verdict "fails", with its type and message
                verdicts[feature] = ["fails", type(e).__name__, str(e)]
        print(json.dumps(verdicts))
        """,
        cpus=4,
    )
    verdicts = json.loads(out.strip().splitlines()[-1])
    assert sorted(verdicts) == sorted(MIRRORED)
    for feature, pinned in MIRRORED.items():
        verdict = verdicts[feature]
        if isinstance(pinned, str):
            assert verdict == pinned, (feature, verdict)
        else:
            assert verdict[:2] == list(pinned[:2]), (feature, verdict[:2], verdict[2][:2000])
            for part in pinned[2:]:
                assert part in verdict[2], (feature, part, verdict[2][:2000])
