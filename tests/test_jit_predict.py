"""`predict` and `predict_on_batch` of a model compiled with `jit_compile=True`
(`dpkeras._patches.xla`): Keras compiles predict's step per replica, where XLA cannot
read variables that live on the parameter device; dpkeras compiles the whole step, as Keras
does for `fit`. 2 replicas on simulated CPU devices against one device."""

import keras
import numpy as np
import pytest

from dpkeras import placement
from dpkeras.testing import cpu_strategy


def _model(jit, k=1):
    keras.utils.set_random_seed(3)
    model = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(3)]
    )
    model.compile(optimizer="sgd", loss="mse", jit_compile=jit, steps_per_execution=k)
    return model


@pytest.mark.parametrize("k", [1, 3])
def test_jit_predict_equals_one_device(k):
    """10 rows in batches of 4 (the last one uneven), K steps per execution; then a fit, and
    predict again: the compiled step reads the trained variables."""
    x = np.random.RandomState(0).rand(10, 4).astype("float32")
    y = np.random.RandomState(1).rand(10, 3).astype("float32")
    reference = _model(True, k)
    with cpu_strategy(2).scope():
        model = _model(True, k)
    for _ in range(2):
        expected = reference.predict(x, batch_size=4, verbose=0)
        np.testing.assert_allclose(model.predict(x, batch_size=4, verbose=0), expected, atol=1e-6)
        reference.fit(x, y, batch_size=4, verbose=0, shuffle=False)
        model.fit(x, y, batch_size=4, verbose=0, shuffle=False)


def test_jit_predict_on_batch_gives_what_it_gives_without_jit():
    """Under any strategy Keras's `predict_on_batch` gives each replica the whole batch (a
    difference pinned in tests, MirroredStrategy's too); with jit it runs and gives the same."""
    x = np.random.RandomState(0).rand(6, 4).astype("float32")
    with cpu_strategy(2).scope():
        plain, compiled = _model(False), _model(True)
    np.testing.assert_allclose(compiled.predict_on_batch(x), plain.predict_on_batch(x), atol=1e-6)


def _built_in_its_first_step(jit):
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.layers.Dense(8, activation="relu"), keras.layers.Dense(3)])
    model.compile(optimizer="sgd", loss="mse", jit_compile=jit)
    return model


# A policy replicating the dense layers: placement.hybrid(), or by_path answering REPLICATED.
POLICIES = {
    "/cpu:0": lambda: "/cpu:0",
    "hybrid": placement.hybrid,
    "by_path": lambda: placement.by_path({r"embedding": "/cpu:0"}, default=placement.REPLICATED),
}


@pytest.mark.parametrize("policy", list(POLICIES))
def test_jit_predict_of_a_model_built_in_its_first_step(policy):
    """No `Input`: Keras builds the model in predict's first step, after the step is made. Under
    hybrid placement its variables will be replicated, which XLA cannot read from one device:
    the step is made without XLA, decided by the policy. Equal to one device; predict_on_batch
    gives what it gives without jit."""
    strategy = cpu_strategy(2, POLICIES[policy]())
    x = np.random.RandomState(0).rand(10, 4).astype("float32")
    expected = _built_in_its_first_step(True).predict(x, batch_size=4, verbose=0)
    with strategy.scope():
        model = _built_in_its_first_step(True)
        on_batch, plain = _built_in_its_first_step(True), _built_in_its_first_step(False)
    assert not model.built
    np.testing.assert_allclose(model.predict(x, batch_size=4, verbose=0), expected, atol=1e-6)
    assert model.jit_compile is True  # the user's setting
    np.testing.assert_allclose(on_batch.predict_on_batch(x), plain.predict_on_batch(x), atol=1e-6)


def test_one_replicated_variable_after_others_decides_for_the_whole_model(caplog):
    """The decision asks every variable, not the first: a model whose first weights (its
    embedding table) live on the parameter device and whose dense layer is replicated runs
    fit, evaluate and predict without XLA, with one warning, and equals one device."""
    policy = placement.by_path({r"embedding": "/cpu:0"}, default=placement.REPLICATED)

    def model_of():
        keras.utils.set_random_seed(5)
        model = keras.Sequential(
            [
                keras.Input((3,), dtype="int32"),
                keras.layers.Embedding(10, 4),
                keras.layers.Flatten(),
                keras.layers.Dense(2),
            ]
        )
        model.compile(optimizer="sgd", loss="mse", jit_compile=True)
        return model

    x = np.random.RandomState(0).randint(0, 10, (8, 3)).astype("int32")
    y = np.random.RandomState(1).rand(8, 2).astype("float32")
    reference = model_of()
    reference.fit(x, y, batch_size=4, verbose=0, shuffle=False)
    with cpu_strategy(2, policy).scope():
        model = model_of()
    assert "embedding" in model.variables[0].path  # on /cpu:0; the dense layer replicated
    with caplog.at_level("WARNING", logger="dpkeras"):
        model.fit(x, y, batch_size=4, verbose=0, shuffle=False)
        model.evaluate(x, y, batch_size=4, verbose=0)
        predicted = model.predict(x, batch_size=4, verbose=0)
    np.testing.assert_allclose(predicted, reference.predict(x, verbose=0), atol=1e-5)
    said = [r.getMessage() for r in caplog.records if "without XLA" in r.getMessage()]
    assert len(said) == 1 and "replicated variable" in said[0], said
    assert model.jit_compile is True
