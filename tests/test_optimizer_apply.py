"""The optimizer applies the summed gradient once (`dpkeras._extended.optimizer_apply`).

One device clips, decays and accumulates the whole batch's gradient; so must N replicas.
Each case: 3 replicas against one device, same initial weights, same global batches.
"""

import inspect

import keras
import numpy as np
import pytest
import tensorflow as tf

import dpkeras
from dpkeras import _keras_internals
from dpkeras._extended import optimizer_apply
from dpkeras._patches import table as keras_patches
from dpkeras.testing import assert_weights_close, cpu_strategy
from tests.models import build_model, make_data

RNG = np.random.RandomState(0)
X = RNG.rand(64, 6).astype("float32")
Y = (RNG.rand(64, 3) * 5).astype("float32")


def _build(optimizer):
    keras.utils.set_random_seed(1)
    model = keras.Sequential(
        [keras.Input((6,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(3)]
    )
    model.compile(optimizer=optimizer(), loss="mse")
    return model


def _compare(optimizer, batch_size=16, epochs=4, x=X, y=Y):
    """Trains one device and 3 replicas; asserts equal weights and history; returns both."""
    reference = _build(optimizer)
    expected = reference.fit(
        x, y, batch_size=batch_size, epochs=epochs, shuffle=False, verbose=0
    ).history
    with cpu_strategy(3).scope():
        model = _build(optimizer)
    history = model.fit(
        x, y, batch_size=batch_size, epochs=epochs, shuffle=False, verbose=0
    ).history
    assert_weights_close(reference.get_weights(), model.get_weights())
    np.testing.assert_allclose(history["loss"], expected["loss"], rtol=1e-5)
    return reference, model


CASES = {
    "clipnorm": lambda: keras.optimizers.SGD(0.05, clipnorm=0.1),
    "global_clipnorm": lambda: keras.optimizers.SGD(0.05, global_clipnorm=0.1),
    "clipvalue": lambda: keras.optimizers.SGD(0.05, clipvalue=0.05),
    "accumulation-2-sgd": lambda: keras.optimizers.SGD(0.05, gradient_accumulation_steps=2),
    "accumulation-4-sgd": lambda: keras.optimizers.SGD(0.05, gradient_accumulation_steps=4),
    "accumulation-2-adam": lambda: keras.optimizers.Adam(0.01, gradient_accumulation_steps=2),
    "accumulation-4-adam": lambda: keras.optimizers.Adam(0.01, gradient_accumulation_steps=4),
    "accumulation-with-clipnorm": lambda: keras.optimizers.Adam(
        0.01, gradient_accumulation_steps=2, clipnorm=0.1
    ),
    # Clipping active on some steps only (test_partial_clipping_clips_some_steps_only): a
    # gradient of the wrong size changes which steps clip, so these see it; the cases above
    # clip every step, which hides a gradient's size.
    "clipnorm-some-steps": lambda: keras.optimizers.SGD(0.05, clipnorm=1.5),
    "global_clipnorm-some-steps": lambda: keras.optimizers.SGD(0.05, global_clipnorm=3.0),
    "weight-decay": lambda: keras.optimizers.AdamW(0.01, weight_decay=0.1),
    "ema": lambda: keras.optimizers.SGD(0.05, use_ema=True, ema_overwrite_frequency=3),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_equals_one_device(name):
    _compare(CASES[name])


def test_clipping_actually_clips_here():
    """The clipped run must differ from the unclipped one, or the cases above prove nothing."""
    clipped = _build(CASES["clipnorm"])
    clipped.fit(X, Y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    plain = _build(lambda: keras.optimizers.SGD(0.05))
    plain.fit(X, Y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    assert (
        max(np.abs(a - b).max() for a, b in zip(clipped.get_weights(), plain.get_weights())) > 1e-3
    )


def _gradient_norms(optimizer):
    """Per step of `_compare`'s one-device run (mse, batches of 16, 4 epochs): the global norm
    and each variable's norm of the gradient, applying `optimizer` as `fit` does."""
    model, norms = _build(optimizer), []
    for _ in range(4):
        for i in range(0, len(X), 16):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(
                    keras.losses.mean_squared_error(Y[i : i + 16], model(X[i : i + 16]))
                )
            grads = tape.gradient(loss, model.trainable_variables)
            norms.append((float(tf.linalg.global_norm(grads)), [float(tf.norm(g)) for g in grads]))
            model.optimizer.apply(grads, model.trainable_variables)
    return norms


def test_partial_clipping_clips_some_steps_only():
    norms = _gradient_norms(CASES["global_clipnorm-some-steps"])
    clipped = sum(total > 3.0 for total, _ in norms)
    assert 0 < clipped < len(norms), [total for total, _ in norms]
    norms = _gradient_norms(CASES["clipnorm-some-steps"])
    clipped = sum(any(n > 1.5 for n in each) for _, each in norms)
    unclipped = sum(all(n <= 1.5 for n in each) for _, each in norms)
    assert clipped > 0 and unclipped > 0, norms


@pytest.mark.parametrize("steps", [2, 4])
def test_accumulation_with_an_uneven_last_batch(steps):
    """58 examples in batches of 16 over 3 replicas: the last batch of 10 splits 4/3/3."""
    reference, model = _compare(
        lambda: keras.optimizers.Adam(0.01, gradient_accumulation_steps=steps, clipnorm=0.5),
        x=X[:58],
        y=Y[:58],
    )
    assert int(model.optimizer.iterations.numpy()) == int(reference.optimizer.iterations.numpy())


def test_loss_scale_optimizer_with_clipping():
    """mixed_float16: as close as float16 allows (the tolerance of the mixed-precision test)."""
    keras.config.set_dtype_policy("mixed_float16")
    try:
        x, y = make_data("dense", 288)
        reference = build_model("dense", keras.optimizers.SGD(0.1, clipnorm=0.05))
        reference.fit(x, y, batch_size=96, epochs=2, shuffle=False, verbose=0)
        with cpu_strategy(3).scope():
            model = build_model("dense", keras.optimizers.SGD(0.1, clipnorm=0.05))
        model.fit(x, y, batch_size=96, epochs=2, shuffle=False, verbose=0)
        assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
        assert_weights_close(reference.get_weights(), model.get_weights(), rtol=1e-3, atol=2e-4)
    finally:
        keras.config.set_dtype_policy("float32")


def test_accumulation_in_a_custom_loop():
    def run(strategy):
        model = _build(lambda: keras.optimizers.SGD(0.05, gradient_accumulation_steps=2))
        model.optimizer.build(model.trainable_variables)

        def replica_step(x, y):
            with tf.GradientTape() as tape:
                loss = tf.nn.compute_average_loss(
                    tf.reduce_mean((model(x) - y) ** 2, axis=-1), global_batch_size=16
                )
            grads = tape.gradient(loss, model.trainable_variables)
            model.optimizer.apply_gradients(zip(grads, model.trainable_variables))

        @tf.function
        def step(x, y):
            if strategy is None:
                return replica_step(x, y)
            return strategy.run(replica_step, args=(x, y))

        dataset = tf.data.Dataset.from_tensor_slices((X, Y)).batch(16)
        if strategy is not None:
            dataset = strategy.experimental_distribute_dataset(dataset)
        for x, y in dataset:
            step(x, y)
        return model

    reference = run(None)
    strategy = cpu_strategy(3)
    with strategy.scope():
        model = run(strategy)
    assert_weights_close(reference.get_weights(), model.get_weights())


def test_keras_apply_gradients_calls_apply():
    """dpkeras routes an optimizer's `apply`; Keras's `apply_gradients` must go through it."""
    source = inspect.getsource(keras.optimizers.Optimizer.apply_gradients)
    assert "self.apply(grads, trainable_variables)" in source, (
        "Keras changed Optimizer.apply_gradients: re-check dpkeras._extended.optimizer_apply"
    )


def test_creating_optimizer_is_found_on_keras_name_scope_stack():
    found = []

    def creator(next_creator, **kwargs):
        found.append(_keras_internals.creating_optimizer())
        return next_creator(**kwargs)

    weight = keras.Variable(np.zeros((2, 2), "float32"))
    with tf.variable_creator_scope(creator):
        optimizer = keras.optimizers.Adam(0.1)  # iterations, learning rate
        optimizer.build([weight])  # two slots
    assert found == [optimizer] * 4


def test_only_the_optimizers_of_a_dpkeras_strategy_sum_first():
    """Keras's `Optimizer.apply` is an entry of dpkeras's table: it sums first for the
    optimizers a dpkeras strategy created variables for, and is Keras's own for every other
    (no optimizer object is changed)."""
    strategy = cpu_strategy(2)
    with strategy.scope():
        model = _build(lambda: keras.optimizers.SGD(0.1))
    assert keras_patches.installed()  # the model's variables keep the table installed
    outside = keras.optimizers.SGD(0.1)
    weight = keras.Variable(np.ones((2,), "float32"))
    outside.apply([tf.constant([1.0, 2.0])], [weight])
    assert optimizer_apply.attached(model.optimizer) is strategy.extended
    assert optimizer_apply.attached(outside) is None
    assert "apply" not in vars(model.optimizer) and "apply" not in vars(outside)
    np.testing.assert_allclose(weight.numpy(), [0.9, 0.8])


@pytest.mark.parametrize("policy", ["all-on-ps", "hybrid"])
def test_every_update_waits_for_the_steps_checks(policy):
    """A layer's check (`tf.debugging.assert_less`) is an ancestor of every variable update of
    the step, in every replica: a failing check then changes no weight (on a cluster the
    replica's check runs on its worker and the updates on the ps tasks, and nothing else
    orders them)."""
    from dpkeras import placement

    graphs = []

    class Check(keras.layers.Layer):
        def call(self, x):
            tf.debugging.assert_less(x, 100.0, name="dpkeras_check")
            return x

    class Probe(keras.Sequential):
        def train_step(self, data):
            logs = super().train_step(data)
            graphs.append(tf.compat.v1.get_default_graph())
            return logs

    strategy = cpu_strategy(2, placement.hybrid() if policy == "hybrid" else "/cpu:0")
    with strategy.scope():
        model = Probe([keras.Input((6,)), Check(), keras.layers.Dense(3)])
        # XLA drops Assert ops (a cluster runs its steps without XLA, where the checks run).
        model.compile(optimizer="sgd", loss="mse", jit_compile=False)
    model.fit(X[:8], Y[:8], batch_size=8, epochs=1, verbose=0)
    (graph,) = set(graphs)
    checks = {op.name for op in graph.get_operations() if "dpkeras_check" in op.name}
    checks = {name for name in checks if name.endswith("AssertGuard")}  # floats: a guarded Assert
    assert len(checks) == 2, checks  # one per replica
    updates = [op for op in graph.get_operations() if op.type == "AssignSubVariableOp"]
    assert updates
    for update in updates:
        ancestors, pending = set(), [update]
        while pending:
            for parent in [t.op for t in pending[-1].inputs] + list(pending.pop().control_inputs):
                if parent.name not in ancestors:
                    ancestors.add(parent.name)
                    pending.append(parent)
        assert checks <= ancestors, update.name


def test_a_pass_for_copy_j_runs_no_update_of_a_variable_on_a_parameter_device():
    """The pass-0 rule, asked of each kind (`PlacedVariable.update`): in the optimizer's pass for
    copy j > 0 a variable that lives once (whole, or in shards) runs no update at all, not
    even one whose writes are then skipped; in pass 0 it runs once (once a shard)."""
    from dpkeras._variables import pieces

    strategy = dpkeras.get_strategy(
        ["/cpu:1", "/cpu:2"],
        "/cpu:0",
        partitioner=tf.distribute.experimental.partitioners.FixedShardsPartitioner(2),
    )
    with strategy.scope():
        whole = tf.Variable(1.0)
        layer = keras.layers.Embedding(4, 2)
        layer.build()
    sharded = layer.embeddings.value
    assert len(sharded.shards) == 2 and not hasattr(whole, "shards")
    for variable, runs in ((whole, 1), (sharded, 2)):
        calls = []

        def fn(v, calls=calls):
            calls.append(v)
            return tf.constant(0.0)

        with pieces.copy(strategy.extended, 1):
            strategy.extended.update(variable, fn)
        assert calls == [], variable
        with pieces.copy(strategy.extended, 0):
            strategy.extended.update(variable, fn)
        assert len(calls) == runs, variable
