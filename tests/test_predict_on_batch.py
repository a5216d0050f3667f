"""`predict_on_batch` gives one device's rows, once. Keras hands the batch itself to
`strategy.run`, so under any strategy each replica predicted the whole batch and the outputs
came back once per replica (Keras's own trainer_test `test_nested_inputs`: 6 rows for 3 on 2
replicas). Each replica now predicts its contiguous share; with more replicas than rows, the
empty shares run as in `predict` (tests/test_empty_share.py)."""

import keras
import numpy as np
import pytest

from dpkeras.testing import cpu_strategy


def _model():
    keras.utils.set_random_seed(7)
    first, second = keras.Input((2,)), keras.Input((3,))
    joined = keras.layers.Concatenate()([keras.layers.Dense(4)(first), second])
    model = keras.Model([first, second], keras.layers.Dense(2)(joined))
    model.compile(optimizer="sgd", loss="mse")
    return model


@pytest.mark.parametrize("replicas", [2, 3])
def test_predict_on_batch_equals_one_device_for_every_batch_size(replicas):
    reference = _model()
    with cpu_strategy(replicas).scope():
        model = _model()
    for rows in range(1, 8):
        rng = np.random.RandomState(rows)
        x = [rng.rand(rows, 2).astype("float32"), rng.rand(rows, 3).astype("float32")]
        expected = reference.predict_on_batch(x)
        got = model.predict_on_batch(x)
        assert got.shape == expected.shape == (rows, 2)
        np.testing.assert_allclose(got, expected, atol=1e-6)
        # predict (a distributed dataset) is unchanged by it
        np.testing.assert_allclose(model.predict(x, batch_size=3, verbose=0), expected, atol=1e-6)
