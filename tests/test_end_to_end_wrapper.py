"""keras-io's end-to-end model: a wrapper made and compiled after training, outside any scope.

text_classification_from_scratch trains a model under the strategy, then wraps it for raw
strings, outside any scope: `keras.Model(inputs, model(vectorize_layer(inputs)))`, compiled
and evaluated there. The wrapper holds only variables of the strategy, so it adopts the
strategy (dpkeras._patches.outside_the_scope): it evaluates and predicts what the inner model
does, and trains as the same wrapper does on one device. 2 replicas on /cpu:1-2, every variable
on /cpu:0 or (hybrid) dense variables replicated.
"""

import contextlib

import keras
import numpy as np
import pytest
import tensorflow as tf

from dpkeras import placement
from dpkeras._extended.extended import extended_of_variable
from dpkeras.testing import assert_weights_close, cpu_strategy

WORDS = "a good bad movie film awful fine great plot dull acting superb boring".split()
BATCH = 8


def _texts():
    rng = np.random.RandomState(3)
    texts = np.array([" ".join(rng.choice(WORDS, rng.randint(2, 7))) for _ in range(32)])
    labels = np.array([float("good" in t or "great" in t) for t in texts], dtype="float32")
    return texts, labels


def _vectorizer(texts):
    vectorize = keras.layers.TextVectorization(max_tokens=16, output_sequence_length=6)
    vectorize.adapt(texts)  # outside any scope, as in keras-io
    return vectorize


def _compile(model):
    model.compile(
        optimizer=keras.optimizers.Adam(0.05),
        loss="binary_crossentropy",
        metrics=["accuracy"],
    )


def _trained_classifier(strategy, ids, labels):
    with strategy.scope() if strategy is not None else contextlib.nullcontext():
        keras.utils.set_random_seed(11)
        model = keras.Sequential(
            [
                keras.Input((6,), dtype="int64"),
                keras.layers.Embedding(16, 4),
                keras.layers.GlobalAveragePooling1D(),
                keras.layers.Dense(1, activation="sigmoid"),
            ]
        )
        _compile(model)
    model.fit(ids, labels, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    return model


def _end_to_end(model, vectorize):
    inputs = keras.Input(shape=(1,), dtype="string")
    outputs = model(vectorize(inputs))
    end_to_end_model = keras.Model(inputs, outputs)
    end_to_end_model.compile(loss="binary_crossentropy", optimizer="adam", metrics=["accuracy"])
    return end_to_end_model


def _run(strategy):
    """Trains under `strategy` (None: one device), wraps outside any scope, evaluates, predicts
    and trains the wrapper: (inner model, wrapper, inner and wrapper's evaluation, both
    predictions, the wrapper's evaluation after its fit)."""
    texts, labels = _texts()
    vectorize = _vectorizer(texts)
    ids = vectorize(texts)
    model = _trained_classifier(strategy, ids, labels)
    assert not tf.distribute.has_strategy()
    end_to_end_model = _end_to_end(model, vectorize)
    raw = tf.data.Dataset.from_tensor_slices((texts[:, None], labels)).batch(BATCH)
    inner = model.evaluate(ids, labels, batch_size=BATCH, verbose=0)
    wrapped = end_to_end_model.evaluate(raw, verbose=0)
    predicted = (
        model.predict(ids, batch_size=BATCH, verbose=0),
        end_to_end_model.predict(raw.map(lambda x, y: x), verbose=0),
    )
    end_to_end_model.fit(raw, epochs=2, shuffle=False, verbose=0)
    after = end_to_end_model.evaluate(raw, verbose=0)
    return model, end_to_end_model, inner, wrapped, predicted, after


@pytest.mark.parametrize("policy", ["/cpu:0", "hybrid"])
def test_an_end_to_end_model_made_after_training_runs_as_written(policy):
    strategy = cpu_strategy(2, placement.hybrid() if policy == "hybrid" else policy)
    model, end_to_end_model, inner, wrapped, (p_inner, p_wrapped), after = _run(strategy)
    # The wrapper evaluates and predicts what the inner model does: the same weights, exactly.
    np.testing.assert_array_equal(wrapped, inner)
    np.testing.assert_array_equal(p_wrapped, p_inner)
    assert end_to_end_model.distribute_strategy is strategy
    made = end_to_end_model.optimizer.variables + end_to_end_model.metrics_variables
    assert made and all(extended_of_variable(v) is strategy.extended for v in made)
    # And all of it is what one device gives: the inner training, the wrapper's training.
    (ref_model, ref_end_to_end, ref_inner, ref_wrapped, (ref_p, _), ref_after) = _run(None)
    np.testing.assert_allclose(inner, ref_inner, rtol=1e-6)
    np.testing.assert_allclose(p_inner, ref_p, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(after, ref_after, rtol=1e-6)
    assert_weights_close(ref_end_to_end.get_weights(), end_to_end_model.get_weights())
    assert_weights_close(ref_model.get_weights(), model.get_weights())  # the same layers
    assert abs(after[0] - wrapped[0]) > 1e-3  # the wrapper's fit trained


def test_the_wrapper_compiles_again_outside_any_scope():
    """Compiled a second time with no scope (to add a metric, another loss), the wrapper adopts
    its strategy again: its first compile set its strategy, which must not make it a model
    "built under" the strategy and compiled outside its scope."""
    strategy = cpu_strategy(2)
    texts, labels = _texts()
    vectorize = _vectorizer(texts)
    model = _trained_classifier(strategy, vectorize(texts), labels)
    end_to_end_model = _end_to_end(model, vectorize)
    raw = tf.data.Dataset.from_tensor_slices((texts[:, None], labels)).batch(BATCH)
    first = end_to_end_model.evaluate(raw, verbose=0)
    end_to_end_model.compile(loss="binary_crossentropy", metrics=["accuracy", "auc"])
    again = end_to_end_model.evaluate(raw, verbose=0)
    np.testing.assert_array_equal(again[:2], first)
    assert end_to_end_model.distribute_strategy is strategy
    made = end_to_end_model.metrics_variables
    assert made and all(extended_of_variable(v) is strategy.extended for v in made)
