"""No batch is lost to building the model (`dpkeras._patches.symbolic_build`).

Keras builds an unbuilt model under a strategy from the first batch of the epoch; a generator
or a PyDataset cannot give it back. Under dpkeras the build uses the data's spec, so 8 batches
train on 8 and `evaluate` sees them all, equal to one device, batch for batch.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from dpkeras._patches import symbolic_build
from dpkeras.testing import assert_weights_close, cpu_strategy

RNG = np.random.RandomState(0)
X = RNG.rand(64, 6).astype("float32")
Y = RNG.randint(0, 3, 64)


def _generator():
    for i in range(8):
        yield X[i * 8 : (i + 1) * 8], Y[i * 8 : (i + 1) * 8]


class _Batches(keras.utils.PyDataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return X[i * 8 : (i + 1) * 8], Y[i * 8 : (i + 1) * 8]


DATA = {
    "generator": lambda: _generator(),
    "pydataset": lambda: _Batches(),
    "dataset-of-unknown-size": lambda: (
        tf.data.Dataset.from_tensor_slices((X, Y)).filter(lambda x, y: True).batch(8)
    ),
}


def _build():
    keras.utils.set_random_seed(1)
    model = keras.Sequential(
        [keras.Input((6,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(3)]
    )
    model.compile(
        optimizer=keras.optimizers.SGD(0.1),
        metrics=["accuracy"],
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


@pytest.mark.parametrize("kind", sorted(DATA))
def test_every_batch_trains_and_is_evaluated(kind):
    steps = 8 if kind == "generator" else None
    reference = _build()
    expected = reference.fit(DATA[kind](), steps_per_epoch=steps, verbose=0).history
    expected_evaluate = reference.evaluate(DATA[kind](), verbose=0)
    with cpu_strategy(3).scope():
        model = _build()
    history = model.fit(DATA[kind](), steps_per_epoch=steps, verbose=0).history
    evaluation = model.evaluate(DATA[kind](), verbose=0)
    assert_weights_close(reference.get_weights(), model.get_weights())
    np.testing.assert_allclose(history["loss"], expected["loss"], rtol=1e-5)
    np.testing.assert_allclose(evaluation, expected_evaluate, rtol=1e-5)


def test_batch_from_spec_makes_zeros_of_the_structure():
    spec = ({"ids": tf.TensorSpec([None, 4], tf.int32)}, tf.TensorSpec([None], tf.string))
    batch = symbolic_build.batch_from_spec(spec)
    assert batch[0]["ids"].shape == (1, 4) and batch[0]["ids"].dtype == tf.int32
    assert batch[1].numpy().tolist() == [b""]
    assert symbolic_build.batch_from_spec(tf.RaggedTensorSpec([None, None], tf.int32)) is None
