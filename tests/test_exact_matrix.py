"""The README's "What is exact" table: each Keras feature, dpkeras and MirroredStrategy side by
side, 3 replicas against one device from the same initial weights (tests/exact_features.py).

dpkeras runs in this process; MirroredStrategy in one fresh process (mixing strategies in one
process is unstable), sharing one strategy object across features. Mirrored's verdicts are
pinned, so a TensorFlow or Keras change to them fails here and the README is updated.
"""

import json

import pytest

from dpkeras.testing import cpu_strategy, run_python
from tests import exact_features

# Measured on TF 2.21 / Keras 3.15, 3 replicas on logical CPU devices.
MIRRORED = {
    "steps_per_execution": "fails",
    "jit_compile": "fails",
    "sample_weight": "exact",
    "class_weight": "exact",
    "add_loss_and_regularizers": "exact",
    "multi_input_output": "exact",
    "auc_metric": "exact",
    "ema": "fails",
    "weight_decay": "exact",
    "clipnorm": "differs",
    "gradient_accumulation": "fails",
    "masking": "exact",
    "validation": "exact",
    "callbacks": "exact",
    "mixed_precision": "exact",
    "uneven_batches": "fails",
    "generator": "differs",
}


def test_the_table_covers_every_feature():
    assert sorted(MIRRORED) == sorted(exact_features.FEATURES)


@pytest.mark.parametrize("feature", sorted(exact_features.FEATURES))
def test_dpkeras_is_exact(feature):
    expected = exact_features.run(feature)
    actual = exact_features.run(feature, cpu_strategy(3))
    verdict, worst = exact_features.compare(feature, expected, actual)
    assert verdict == "exact", (feature, worst)


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
            except Exception as e:  # the verdict "fails", with its type
                verdicts[feature] = "fails"
        print(json.dumps(verdicts))
        """,
        cpus=4,
    )
    assert json.loads(out.strip().splitlines()[-1]) == MIRRORED
