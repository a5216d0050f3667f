"""`predict` when a replica's share of a batch is empty (more replicas than rows): the model is
not run on an empty batch, whose output TensorFlow does not always shape right (CPU `Conv2D`
hands back its input), so the replicas' outputs concatenate to one device's. 3 replicas on
simulated CPU devices against one device, for every batch size from 1 to 7."""

import keras
import numpy as np
import pytest

from dpkeras.testing import cpu_strategy


def _model():
    keras.utils.set_random_seed(5)
    model = keras.Sequential(
        [
            keras.Input((12, 12, 3)),
            keras.layers.Conv2D(5, 4),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(2),
        ]
    )
    model.compile(optimizer="sgd", loss="mse")
    return model


@pytest.mark.parametrize("rows", range(1, 8))
def test_predict_with_empty_replica_shares_equals_one_device(rows):
    x = np.random.RandomState(rows).rand(rows, 12, 12, 3).astype("float32")
    reference = _model()
    with cpu_strategy(3).scope():
        model = _model()
    expected = reference.predict(x, batch_size=4, verbose=0)
    np.testing.assert_allclose(model.predict(x, batch_size=4, verbose=0), expected, atol=1e-6)
