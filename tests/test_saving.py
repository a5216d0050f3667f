"""Saving and loading are strategy-independent under dpkeras.

A model trained under dpkeras (2 replicas) round-trips through `.keras` files, `.weights.h5`
files, `tf.train.Checkpoint` and `model.export` (SavedModel), and moves to no strategy and to
`MirroredStrategy` (and back) with identical weights and optimizer state.

The model for exact round trips has Dense + BatchNormalization + Adam, so it has non-trainable
weights (moving statistics) and optimizer slots. Continuing training is compared to one device
with a Dense-only model: BatchNormalization normalises with each replica's own batch statistics,
so with it even a correct data-parallel step differs from one device.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import dpkeras
from dpkeras.testing import assert_weights_close, cpu_strategy, run_python
from tests.models import LOGS_AS_ONE_DEVICE

L = keras.layers

PARAMETER_DEVICE = "/cpu:0"
BATCH = 16  # even over 2 replicas
DPKERAS_STEPS = 4
PLAIN_STEPS = 3

TWO_REPLICAS = ["/cpu:1", "/cpu:2"]


def make_data(n=64, seed=0):
    rng = np.random.RandomState(seed)
    return rng.rand(n, 6).astype("float32"), rng.randint(0, 3, n)


def build_model(kind="bn", seed=7):
    """A compiled model: `"bn"` is Dense + BatchNormalization + Dense, `"dense"` two Denses."""
    keras.utils.set_random_seed(seed)
    if kind == "bn":
        layers = [keras.Input((6,)), L.Dense(8), L.BatchNormalization(), L.Dense(3)]
    else:
        layers = [keras.Input((6,)), L.Dense(8, activation="relu"), L.Dense(3)]
    model = keras.Sequential(layers)
    model.compile(
        optimizer=keras.optimizers.Adam(0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def train_under_dpkeras(kind="bn", steps=DPKERAS_STEPS):
    """A model built and trained `steps` steps under dpkeras with 2 replicas."""
    x, y = make_data()
    with cpu_strategy(2).scope():
        model = build_model(kind)
    model.fit(x, y, batch_size=BATCH, epochs=1, steps_per_epoch=steps, shuffle=False, verbose=0)
    return model


def train_without_strategy(kind="bn", steps=PLAIN_STEPS):
    x, y = make_data(seed=1)
    model = build_model(kind, seed=11)
    model.fit(x, y, batch_size=BATCH, epochs=1, steps_per_epoch=steps, shuffle=False, verbose=0)
    return model


def snapshot(model):
    """`(weights, optimizer_variables)`: dicts `{path: array}` of a model's state."""
    weights = {w.path: w.numpy() for w in model.weights}
    opt = {v.path: v.numpy() for v in model.optimizer.variables}
    return weights, opt


def _short_name(path):
    """The kind of a variable from its path: `kernel`, `variance`, `momentum`, `iteration`..."""
    return path.rsplit("/", 1)[-1].rsplit("_", 1)[-1]


def assert_same_state(expected, actual):
    """Asserts two `snapshot`s are bit-identical, variable by variable in order.

    Paths are compared by their last component's kind only: a loaded or freshly built model's
    auto-generated layer names (and so its optimizer slots' names) differ from the original's.
    """
    for kind, e, a in zip(("weight", "optimizer variable"), expected, actual):
        assert [_short_name(p) for p in e] == [_short_name(p) for p in a], (
            f"{kind}s differ: {list(e)} vs {list(a)}"
        )
        for (path, ev), av in zip(e.items(), a.values()):
            np.testing.assert_array_equal(av, ev, err_msg=f"{kind} {path}")


def assert_nontrivial(state, steps):
    """The state is that of a trained model: statistics moved, Adam slots filled, steps counted."""
    weights, opt = state
    for path, value in weights.items():
        if path.endswith("moving_mean"):
            assert np.any(value != 0), path
        if path.endswith("moving_variance"):
            assert np.any(value != 1), path
    iterations = [v for p, v in opt.items() if p.endswith("/iteration")]
    assert len(iterations) == 1 and int(iterations[0]) == steps
    slots = [v for p, v in opt.items() if "momentum" in p or "velocity" in p]
    assert slots and all(np.any(v != 0) for v in slots)


def on_parameter_device(variable):
    v = getattr(variable, "value", variable)
    return isinstance(v, dpkeras.ParameterVariable) and v.device.endswith("CPU:0")


def assert_all_on_parameter_device(model):
    variables = (
        list(model.variables)
        + list(model.optimizer.variables)
        + [v for m in model.metrics for v in m.variables]
    )
    assert variables
    off = [v.path for v in variables if not on_parameter_device(v)]
    assert not off, f"not ParameterVariables on /cpu:0: {off}"


# -- trained models, saved once per module ----------------------------------------------------


class Saved:
    """A trained model's state and the files it was saved to (the model itself is dropped:
    each test starts from a clean Keras session and loads what it needs)."""

    def __init__(self, directory, model, steps, strategy=None):
        self.steps = steps
        self.state = snapshot(model)
        assert_nontrivial(self.state, steps)
        self.keras = str(directory / "model.keras")
        self.weights = str(directory / "model.weights.h5")
        model.save(self.keras)
        model.save_weights(self.weights)
        ckpt = tf.train.Checkpoint(model=model, optimizer=model.optimizer)
        self.checkpoint = ckpt.save(str(directory / "ckpt"))
        if strategy is not None:
            # As a custom training loop would: saved with the scope entered.
            with strategy.scope():
                self.checkpoint_in_scope = ckpt.save(str(directory / "ckpt_in_scope"))
            self.x = make_data(n=40, seed=8)[0]
            self.predictions = model.predict(self.x, batch_size=BATCH, verbose=0)
            self.export = str(directory / "exported")
            model.export(self.export, verbose=False)
            self.export_in_scope = str(directory / "exported_in_scope")
            with strategy.scope():
                model.export(self.export_in_scope, verbose=False)
            bn = next(layer for layer in model.layers if isinstance(layer, L.BatchNormalization))
            self.moving_mean = bn.moving_mean.numpy()


@pytest.fixture(scope="module")
def dpkeras_bn(tmp_path_factory):
    """Dense + BatchNormalization + Adam trained 4 steps under dpkeras (2 replicas), saved."""
    keras.backend.clear_session()
    model = train_under_dpkeras("bn")
    assert_all_on_parameter_device(model)
    saved = Saved(tmp_path_factory.mktemp("dpkeras_bn"), model, DPKERAS_STEPS, cpu_strategy(2))
    keras.backend.clear_session()
    return saved


@pytest.fixture(scope="module")
def plain_bn(tmp_path_factory):
    """The same architecture trained 3 steps without a strategy (other data and seed), saved."""
    keras.backend.clear_session()
    saved = Saved(tmp_path_factory.mktemp("plain_bn"), train_without_strategy("bn"), PLAIN_STEPS)
    keras.backend.clear_session()
    return saved


def build_in_scope(kind="bn"):
    """A fresh compiled model with its optimizer built, under dpkeras (2 replicas)."""
    with dpkeras.scope(TWO_REPLICAS, PARAMETER_DEVICE):
        model = build_model(kind, seed=99)
        model.optimizer.build(model.trainable_variables)
    return model


def build_plain(kind="bn"):
    model = build_model(kind, seed=99)
    model.optimizer.build(model.trainable_variables)
    return model


def assert_differs(saved, model):
    """The target starts from other weights, so an identical result proves the load."""
    assert not np.array_equal(model.weights[0].numpy(), next(iter(saved.state[0].values())))


# -- .keras ------------------------------------------------------------------------------------


def test_keras_file_loads_without_strategy_with_identical_state(dpkeras_bn):
    loaded = keras.models.load_model(dpkeras_bn.keras)
    assert not any(
        isinstance(getattr(v, "value", v), dpkeras.ParameterVariable)
        for v in loaded.variables + loaded.optimizer.variables
    )
    assert_same_state(dpkeras_bn.state, snapshot(loaded))
    assert int(loaded.optimizer.iterations.numpy()) == DPKERAS_STEPS
    np.testing.assert_allclose(
        loaded.predict(dpkeras_bn.x, verbose=0), dpkeras_bn.predictions, rtol=1e-5, atol=1e-6
    )


def test_keras_file_loads_inside_scope_on_parameter_device(dpkeras_bn):
    with dpkeras.scope(TWO_REPLICAS, PARAMETER_DEVICE) as strategy:
        loaded = keras.models.load_model(dpkeras_bn.keras)
    assert strategy is cpu_strategy(2)
    assert_same_state(dpkeras_bn.state, snapshot(loaded))
    assert_all_on_parameter_device(loaded)
    x, y = make_data(seed=3)
    loaded.fit(x, y, batch_size=BATCH, epochs=1, steps_per_epoch=2, shuffle=False, verbose=0)
    assert int(loaded.optimizer.iterations.numpy()) == DPKERAS_STEPS + 2
    assert_all_on_parameter_device(loaded)  # incl. anything created lazily in the step


def test_keras_file_moves_between_replica_counts(dpkeras_bn):
    """Saved with 2 replicas, loaded into a 3-replica dpkeras strategy: identical state."""
    with cpu_strategy(3).scope():
        loaded = keras.models.load_model(dpkeras_bn.keras)
    assert_same_state(dpkeras_bn.state, snapshot(loaded))
    assert_all_on_parameter_device(loaded)
    x, y = make_data(n=48, seed=6)
    loaded.fit(x, y, batch_size=24, epochs=1, steps_per_epoch=1, shuffle=False, verbose=0)
    assert int(loaded.optimizer.iterations.numpy()) == DPKERAS_STEPS + 1


def test_continued_training_after_load_matches_one_device(tmp_path):
    """A dpkeras-trained Dense+Adam model, saved and reloaded, trains on as one device would.

    With global batches that split evenly, a dpkeras step equals a one-device step on the whole
    batch (up to float summation order), so the copy loaded inside `dpkeras.scope()` and the
    copy loaded without a strategy must stay together. (Not with BatchNormalization: in
    training it normalises by each replica's own batch statistics.)
    """
    model = train_under_dpkeras("dense")
    before = snapshot(model)
    path = str(tmp_path / "dense.keras")
    model.save(path)

    single = keras.models.load_model(path)
    with dpkeras.scope(TWO_REPLICAS, PARAMETER_DEVICE):
        parallel = keras.models.load_model(path)
    assert_same_state(before, snapshot(single))
    assert_same_state(before, snapshot(parallel))

    x, y = make_data(n=96, seed=5)
    h1 = single.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0).history
    h2 = parallel.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0).history
    (w1, o1), (w2, o2) = snapshot(single), snapshot(parallel)
    assert_weights_close(list(w1.values()), list(w2.values()))
    assert_weights_close(list(o1.values()), list(o2.values()))
    assert int(parallel.optimizer.iterations.numpy()) == DPKERAS_STEPS + 6
    # The weights moved: the comparison is not between two untouched copies.
    assert not np.allclose(next(iter(w2.values())), next(iter(before[0].values())))
    if LOGS_AS_ONE_DEVICE:  # Keras 3.8-3.9 log otherwise under any strategy (tests/models.py)
        np.testing.assert_allclose(h2["loss"], h1["loss"], rtol=1e-5)
        np.testing.assert_allclose(h2["accuracy"], h1["accuracy"], rtol=1e-6)
    assert_all_on_parameter_device(parallel)


# -- .weights.h5 -------------------------------------------------------------------------------


def test_weights_file_dpkeras_to_no_strategy(dpkeras_bn):
    fresh = build_plain()
    assert_differs(dpkeras_bn, fresh)
    fresh.load_weights(dpkeras_bn.weights)
    assert_same_state(dpkeras_bn.state, snapshot(fresh))
    assert int(fresh.optimizer.iterations.numpy()) == DPKERAS_STEPS


def test_weights_file_no_strategy_to_dpkeras(plain_bn):
    fresh = build_in_scope()
    assert_differs(plain_bn, fresh)
    fresh.load_weights(plain_bn.weights)
    assert_same_state(plain_bn.state, snapshot(fresh))
    assert_all_on_parameter_device(fresh)
    # It trains on under dpkeras from the loaded state.
    x, y = make_data(seed=3)
    fresh.fit(x, y, batch_size=BATCH, epochs=1, steps_per_epoch=1, verbose=0)
    assert int(fresh.optimizer.iterations.numpy()) == PLAIN_STEPS + 1


# -- tf.train.Checkpoint -----------------------------------------------------------------------


def _restore(checkpoint, model):
    status = tf.train.Checkpoint(model=model, optimizer=model.optimizer).restore(checkpoint)
    status.assert_existing_objects_matched()


def test_checkpoint_dpkeras_to_no_strategy(dpkeras_bn):
    target = build_plain()
    assert_differs(dpkeras_bn, target)
    _restore(dpkeras_bn.checkpoint, target)
    assert_same_state(dpkeras_bn.state, snapshot(target))
    assert int(target.optimizer.iterations.numpy()) == DPKERAS_STEPS


def test_checkpoint_no_strategy_to_dpkeras(plain_bn):
    target = build_in_scope()
    assert_differs(plain_bn, target)
    _restore(plain_bn.checkpoint, target)
    assert_same_state(plain_bn.state, snapshot(target))
    assert_all_on_parameter_device(target)
    assert int(target.optimizer.iterations.numpy()) == PLAIN_STEPS


def test_checkpoint_saved_and_restored_inside_scope(dpkeras_bn):
    """Saved with the scope entered (as a custom training loop would), restored inside it."""
    target = build_in_scope()
    assert_differs(dpkeras_bn, target)
    with cpu_strategy(2).scope():
        _restore(dpkeras_bn.checkpoint_in_scope, target)
    assert_same_state(dpkeras_bn.state, snapshot(target))
    assert_all_on_parameter_device(target)


# -- model.export (SavedModel) -----------------------------------------------------------------


def test_export_serves_same_predictions(dpkeras_bn):
    served = tf.saved_model.load(dpkeras_bn.export)
    got = served.serve(tf.constant(dpkeras_bn.x)).numpy()
    np.testing.assert_allclose(got, dpkeras_bn.predictions, rtol=1e-5, atol=1e-6)
    # The serving graph holds the trained variables, moving statistics included.
    assert np.any(dpkeras_bn.moving_mean != 0)
    assert any(np.array_equal(dpkeras_bn.moving_mean, v.numpy()) for v in served.variables)


def test_export_and_serve_inside_scope(dpkeras_bn):
    """Exported and loaded with the scope entered (MirroredStrategy cannot serve a SavedModel
    loaded inside its scope; dpkeras can)."""
    with cpu_strategy(2).scope():
        served = tf.saved_model.load(dpkeras_bn.export_in_scope)
        got = served.serve(tf.constant(dpkeras_bn.x)).numpy()
    np.testing.assert_allclose(got, dpkeras_bn.predictions, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        served.serve(tf.constant(dpkeras_bn.x)).numpy(),
        dpkeras_bn.predictions,
        rtol=1e-5,
        atol=1e-6,
    )


# -- MirroredStrategy round trip ---------------------------------------------------------------

_MIRRORED_CODE = """
import keras, numpy as np, tensorflow as tf
tf.get_logger().setLevel("ERROR")
src, out, data = {src!r}, {out!r}, {data!r}
strategy = tf.distribute.MirroredStrategy(["/cpu:1", "/cpu:2"])
with strategy.scope():
    model = keras.models.load_model(src)
def dump(path):
    np.savez(path,
             **{{"w/" + w.path: w.numpy() for w in model.weights}},
             **{{"o/" + v.path: v.numpy() for v in model.optimizer.variables}})
dump(out + "/loaded.npz")
kinds = {{type(getattr(v, "value", v)).__name__ for v in model.weights}}
print("KINDS", sorted(kinds))
d = np.load(data)
model.fit(d["x"], d["y"], batch_size=16, epochs=1, steps_per_epoch=2, shuffle=False, verbose=0)
dump(out + "/trained.npz")
model.save(out + "/mirrored.keras")
print("DONE", int(model.optimizer.iterations.numpy()))
# dpkeras's other formats, read under Mirrored: each restores the state over the trained one.
model.load_weights({weights!r})
dump(out + "/weights_file.npz")
model.fit(d["x"], d["y"], batch_size=16, epochs=1, steps_per_epoch=1, shuffle=False, verbose=0)
status = tf.train.Checkpoint(model=model, optimizer=model.optimizer).restore({checkpoint!r})
status.assert_existing_objects_matched()
dump(out + "/checkpoint.npz")
served = tf.saved_model.load({export!r})  # referenced: its variables must stay alive
np.save(out + "/served.npy", served.serve(tf.constant(d["x"])).numpy())
try:  # MirroredStrategy cannot serve a SavedModel loaded inside its scope
    with strategy.scope():
        in_scope = tf.saved_model.load({export!r})
        in_scope.serve(tf.constant(d["x"]))
    print("SERVED IN SCOPE")
except Exception as e:
    print("NOT SERVED IN SCOPE", type(e).__name__)
"""


def _npz_state(path):
    with np.load(path) as f:
        weights = {k[2:]: f[k] for k in f.files if k.startswith("w/")}
        opt = {k[2:]: f[k] for k in f.files if k.startswith("o/")}
    return weights, opt


def test_mirrored_round_trip(dpkeras_bn, tmp_path):
    """dpkeras -> `.keras` -> MirroredStrategy (fresh process) -> `.keras` -> dpkeras."""
    x, y = make_data(seed=4)
    np.savez(tmp_path / "data.npz", x=x, y=y)
    out = run_python(
        _MIRRORED_CODE.format(
            src=dpkeras_bn.keras,
            out=str(tmp_path),
            data=str(tmp_path / "data.npz"),
            weights=dpkeras_bn.weights,
            checkpoint=dpkeras_bn.checkpoint,
            export=dpkeras_bn.export,
        ),
        cpus=3,
    )
    assert "MirroredVariable" in out, out
    assert f"DONE {DPKERAS_STEPS + 2}" in out, out

    # Loaded under Mirrored: identical weights and optimizer state, from `.keras`, from
    # `.weights.h5` and from a `tf.train.Checkpoint` (each over a state trained further).
    assert_same_state(dpkeras_bn.state, _npz_state(tmp_path / "loaded.npz"))
    assert_same_state(dpkeras_bn.state, _npz_state(tmp_path / "weights_file.npz"))
    assert_same_state(dpkeras_bn.state, _npz_state(tmp_path / "checkpoint.npz"))
    # The exported SavedModel serves the same predictions in Mirrored's process; loaded inside
    # Mirrored's scope it cannot serve (dpkeras can: test_export_and_serve_inside_scope).
    with dpkeras.scope(TWO_REPLICAS, PARAMETER_DEVICE):
        reference = keras.models.load_model(dpkeras_bn.keras)
    np.testing.assert_allclose(
        np.load(tmp_path / "served.npy"), reference.predict(x, verbose=0), rtol=1e-5, atol=1e-6
    )
    assert "NOT SERVED IN SCOPE" in out, out

    # Trained two steps under Mirrored, saved, loaded back under dpkeras: identical.
    mirrored_state = _npz_state(tmp_path / "trained.npz")
    assert_nontrivial(mirrored_state, steps=DPKERAS_STEPS + 2)
    assert any(
        not np.array_equal(m, d)
        for m, d in zip(mirrored_state[0].values(), dpkeras_bn.state[0].values())
    )
    with dpkeras.scope(TWO_REPLICAS, PARAMETER_DEVICE):
        back = keras.models.load_model(str(tmp_path / "mirrored.keras"))
    assert_same_state(mirrored_state, snapshot(back))
    assert_all_on_parameter_device(back)
    back.fit(x, y, batch_size=BATCH, epochs=1, steps_per_epoch=1, shuffle=False, verbose=0)
    assert int(back.optimizer.iterations.numpy()) == DPKERAS_STEPS + 3
