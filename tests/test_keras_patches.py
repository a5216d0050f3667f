"""dpkeras/_patches: every change to Keras, TensorFlow and keras-rs is an entry of one table,
checked, installed by a scope, and reversible.

Each test starts from `uninstall()` (every original in place, nothing held) and uses
strategies made here, on devices no other test file uses, so no variable of another test keeps
the entries installed.
"""

import ast
import dataclasses
import gc
import importlib.util
import inspect
import pathlib
import re
import threading
import warnings

import keras
import pytest
import tensorflow as tf

import dpkeras
from dpkeras import _keras_internals
from dpkeras._patches import entries, resume
from dpkeras._patches import table as keras_patches
from dpkeras.testing import run_python

COMPUTE = ["/cpu:2", "/cpu:3"]
PARAMETERS = "/cpu:1"
ATTRIBUTES = [e for e in keras_patches.ENTRIES if isinstance(e, entries.Attribute)]
GATHER = keras_patches.entry("tf.gather")


@pytest.fixture(autouse=True)
def keras_as_shipped():
    keras_patches.uninstall()
    yield
    keras_patches.uninstall()


def current():
    return {e.qualname: e.current() for e in ATTRIBUTES if e.available()}


def originals():
    return {e.qualname: keras_patches.keras_original(e) for e in ATTRIBUTES if e.available()}


def assert_keras_as_shipped(expected):
    assert not keras_patches.installed()
    assert not GATHER.registered()
    found = current()
    assert set(found) == set(expected)
    for name, original in expected.items():
        assert found[name] is original, name
        assert not hasattr(found[name], "__dpkeras_original__"), name


def assert_patched(expected):
    assert keras_patches.installed()
    assert GATHER.registered()
    found = current()
    for name, original in expected.items():
        assert found[name] is not original, name
        assert found[name].__dpkeras_original__ is original, name


def new_strategy():
    return dpkeras.ParameterDeviceStrategy(COMPUTE, PARAMETERS)


def small_model():
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])


def test_the_table_holds_twenty_entries_of_three_kinds():
    """The table grows only on purpose: a new change to Keras, TF or keras-rs changes this."""
    kinds = {}
    for e in keras_patches.ENTRIES:
        kinds.setdefault(e.kind, []).append(e.qualname)
    assert {k: len(v) for k, v in kinds.items()} == {
        "attribute": 19,
        "optional attribute": 1,
        "dispatcher": 1,
    }
    names = [e.qualname for e in keras_patches.ENTRIES]
    assert len(names) == len(set(names)) == 21
    assert len({id(o) for o in originals().values()}) == len(originals())


def test_every_entry_names_the_hook_that_would_retire_it():
    for e in keras_patches.ENTRIES:
        assert len(e.retire) > 20, e.qualname


def test_the_readme_counts_the_table_right():
    readme = (pathlib.Path(__file__).parent.parent / "README.md").read_text()
    counts = re.findall(r"names, in one table, the (\d+) changes dpkeras makes", readme)
    assert counts == [str(len(keras_patches.ENTRIES))], counts


def test_nothing_outside_dpkeras_patches_registers_with_tensorflow():
    """The one seam: no other module registers with TensorFlow's dispatch registries (the
    `tf.gather` dispatcher is an entry of the table)."""
    root = pathlib.Path(dpkeras.__file__).parent
    registries = ("dispatch_for_api", "register_dispatchable_type", "unregister_dispatch_for")
    found = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root).as_posix()
        if relative.startswith("_patches/"):
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "attr", getattr(node.func, "id", ""))
                if name in registries:
                    found.append(f"{relative}:{node.lineno} {name}")
    assert found == [], found


_LIBRARIES = {"keras", "tf", "tensorflow", "keras_rs"}
# dpkeras's modules that hand out Keras's and TensorFlow's own objects (a trainer class, a
# module): what one of their functions returns is the library's.
_INTERNALS = {"_keras_internals", "_tf_internals"}


def _of_a_library(expression, names):
    """Whether `expression` (a write's target, or a value) is rooted at a library: a name of
    `names`, or what a function of an internals module returns (`_keras_internals.f()`)."""
    while isinstance(expression, (ast.Attribute, ast.Subscript, ast.Call)):
        if isinstance(expression, ast.Call):
            function = expression.func
            if (
                isinstance(function, ast.Attribute)
                and isinstance(function.value, ast.Name)
                and function.value.id in _INTERNALS
            ):
                return True
            expression = function
        else:
            expression = expression.value
    return isinstance(expression, ast.Name) and expression.id in names


def _library_names(tree):
    """The names that stand for a library in `tree`: the libraries, what is imported from
    them (`from keras import Model`), and names bound to what an internals module hands out
    (`trainer = _keras_internals.tensorflow_trainer()`)."""
    names = set(_LIBRARIES)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(
                (a.asname or a.name).split(".")[0]
                for a in node.names
                if a.name.split(".")[0] in _LIBRARIES
            )
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in _LIBRARIES:
            names.update(a.asname or a.name for a in node.names)
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and _of_a_library(node.value, set())
        ):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def _library_writes(tree):
    """Assignments to an attribute or item of `keras`, `tf`, `tensorflow` or `keras_rs`
    (`keras.layers.Layer.call = f`), of a name imported from one, or of what an internals
    module hands out (`_keras_internals.tensorflow_trainer().fit = f`), and `setattr`/`delattr`
    on one, unparsed."""
    names = _library_names(tree)
    found = []
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, ast.Delete) else [node.target]
        elif isinstance(node, ast.Call) and ast.unparse(node.func) in ("setattr", "delattr"):
            targets = node.args[:1]
        for target in targets:
            called = isinstance(node, ast.Call)
            if (called or not isinstance(target, ast.Name)) and _of_a_library(target, names):
                found.append(ast.unparse(target))
    return found


def test_nothing_outside_dpkeras_patches_assigns_to_keras_or_tensorflow():
    """The rule (`dpkeras._patches`): a change to Keras, TensorFlow or keras-rs themselves is an
    entry of the table. A user's own model is not Keras (setting `layer.name` is not a change
    to Keras), so only the libraries' own objects are looked for."""
    root = pathlib.Path(dpkeras.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root).as_posix()
        if not relative.startswith("_patches/"):
            found += [f"{relative}: {w}" for w in _library_writes(ast.parse(path.read_text()))]
    assert found == [], found


def test_the_library_write_check_sees_one():
    tree = ast.parse(
        "keras.layers.Layer.call = f\nsetattr(tf.Variable, 'x', 1)\ndel keras_rs.a\n"
        "layer.name = 'conv_1'\nmodel.train_function = None\n"
        "from keras import Model\nModel.fit = f\n"
        "trainer = _keras_internals.tensorflow_trainer()\ntrainer.fit = f\n"
        "setattr(_tf_internals.iterator_class(), 'x', 1)\nmodel = None\n"
    )
    assert sorted(_library_writes(tree)) == [
        "Model.fit",
        "_tf_internals.iterator_class()",
        "keras.layers.Layer.call",
        "keras_rs.a",
        "tf.Variable",
        "trainer.fit",
    ]


def test_creating_a_strategy_patches_nothing():
    shipped = originals()
    new_strategy()
    dpkeras.get_strategy(COMPUTE, PARAMETERS)
    assert_keras_as_shipped(shipped)


@pytest.mark.parametrize("enter", ["strategy.scope", "dpkeras.scope"])
def test_a_scope_installs_and_leaving_it_restores_the_originals(enter):
    shipped = originals()
    strategy = dpkeras.get_strategy(COMPUTE, PARAMETERS)
    scope = strategy.scope() if enter == "strategy.scope" else dpkeras.scope(COMPUTE, PARAMETERS)
    with scope as entered:
        assert entered is strategy
        assert tf.distribute.get_strategy() is strategy
        assert_patched(shipped)
    assert_keras_as_shipped(shipped)


def test_nested_scopes_restore_when_the_last_one_is_left():
    shipped = originals()
    strategy = new_strategy()
    with strategy.scope():
        with strategy.scope():
            assert_patched(shipped)
        assert_patched(shipped)
    assert_keras_as_shipped(shipped)


def test_scopes_in_two_threads_restore_when_the_last_one_is_left():
    shipped = originals()
    strategy = new_strategy()
    entered, leave = threading.Event(), threading.Event()

    def other_thread():
        with strategy.scope():
            entered.set()
            leave.wait(60)

    thread = threading.Thread(target=other_thread)
    thread.start()
    assert entered.wait(60)
    with strategy.scope():
        assert_patched(shipped)
    assert_patched(shipped)  # the other thread is still inside its scope
    leave.set()
    thread.join(60)
    assert_keras_as_shipped(shipped)


def test_explicit_uninstall_restores_and_the_next_scope_installs_again():
    shipped = originals()
    strategy = new_strategy()
    with strategy.scope():
        keras_patches.uninstall()
        assert_keras_as_shipped(shipped)
    assert_keras_as_shipped(shipped)
    with strategy.scope():
        assert_patched(shipped)
    assert_keras_as_shipped(shipped)


def test_a_model_built_under_dpkeras_keeps_the_patches_until_it_is_gone():
    """`fit` and `save` run outside the scope (Keras's trainer does not enter it for them)."""
    shipped = originals()
    with new_strategy().scope():
        model = small_model()
    assert resume.built_under_dpkeras(model)
    assert not resume.built_under_dpkeras(small_model())
    assert_patched(shipped)
    del model
    gc.collect()
    assert_keras_as_shipped(shipped)


def test_every_entry_fits_the_keras_it_runs_with():
    for e in keras_patches.ENTRIES:
        e.check()  # raises, naming the function, if Keras changed it


def test_a_changed_signature_is_refused_by_name_before_anything_is_patched(monkeypatch):
    shipped = originals()
    index = next(
        i
        for i, e in enumerate(keras_patches.ENTRIES)
        if e.qualname == "saving_lib.save_weights_only"
    )
    wrong = dataclasses.replace(
        keras_patches.ENTRIES[index], signature="(model, filepath)", older_signatures=()
    )
    message = (
        r"^dpkeras cannot patch Keras 3\.\S+: saving_lib\.save_weights_only has signature "
        r"\(model, filepath, (max_shard_size=None, )?objects_to_skip=None\), expected "
        r"\(model, filepath\) \(dpkeras supports Keras 3\.8-3\.15\)\.$"
    )
    with pytest.raises(RuntimeError, match=message):
        wrong.check()
    table = list(keras_patches.ENTRIES)
    table[index] = wrong
    monkeypatch.setattr(keras_patches, "ENTRIES", tuple(table))
    with pytest.raises(RuntimeError, match=message):
        with new_strategy().scope():
            pass
    assert_keras_as_shipped(shipped)


def _saving_module_with(signature):
    """A stand-in for Keras's saving_lib whose save_weights_only has `signature`."""
    namespace = {}
    exec(f"def save_weights_only{signature}:\n    return locals()", namespace)
    return type(
        "saving_lib", (), {"save_weights_only": staticmethod(namespace["save_weights_only"])}
    )


@pytest.mark.parametrize(
    "signature, accepted",
    [
        ("(model, filepath, max_shard_size=None, objects_to_skip=None)", True),  # Keras 3.10+
        ("(model, filepath, objects_to_skip=None)", True),  # Keras 3.8-3.9
        ("(model, filepath, objects_to_skip=None, max_shard_size=None)", False),
        ("(model, filepath)", False),
    ],
)
def test_each_signature_of_the_span_is_accepted_and_no_other(signature, accepted):
    fake = dataclasses.replace(
        keras_patches.entry("saving_lib.save_weights_only"),
        owner=lambda: _saving_module_with(signature),
    )
    if accepted:
        fake.check()
        return
    with pytest.raises(
        RuntimeError,
        match=r"saving_lib\.save_weights_only has signature " + re.escape(signature) + r", "
        r"expected \(model, filepath, max_shard_size=None, objects_to_skip=None\) or "
        r"\(model, filepath, objects_to_skip=None\) \(dpkeras supports Keras 3\.8-3\.15\)",
    ):
        fake.check()


@pytest.mark.parametrize(
    "signature",
    [
        "(model, filepath, max_shard_size=None, objects_to_skip=None)",
        "(model, filepath, objects_to_skip=None)",
    ],
)
def test_the_weights_wrapper_takes_either_signature_and_passes_a_shard_size_through(signature):
    original = _saving_module_with(signature).save_weights_only
    model = keras.Sequential([keras.layers.Dense(1)])  # not dpkeras's: Keras's own save
    got = resume.save_weights_only(original, model, "w.weights.h5", objects_to_skip=None)
    assert got["filepath"] == "w.weights.h5" and got["objects_to_skip"] is None
    if "max_shard_size" in signature:
        got = resume.save_weights_only(original, model, "w.weights.h5", 5)
        assert got["max_shard_size"] == 5


@pytest.mark.parametrize(
    "module, version, advice",
    [
        (tf, "2.15.1", r"TensorFlow 2\.16-2\.21"),
        (tf, "2.22.0", r"TensorFlow 2\.16-2\.21"),
        (keras, "3.7.0", r"Keras 3\.\d+-3\.15 beside it"),
        (keras, "3.16.0", r"Keras 3\.\d+-3\.15 beside it"),
    ],
)
def test_a_pair_outside_the_span_is_refused_at_scope_in_one_line(
    monkeypatch, module, version, advice
):
    shipped = originals()
    monkeypatch.setattr(module, "__version__", version)
    message = (
        rf"^dpkeras \S+ supports TensorFlow 2\.16-2\.21 with Keras 3\.8-3\.15 \([^)]*\); found "
        rf"TensorFlow {re.escape(tf.__version__)} and Keras {re.escape(keras.__version__)}\. "
        rf"Install {advice} \(README, \"Versions\"\)\.$"
    )
    with pytest.raises(RuntimeError, match=message) as raised:
        with new_strategy().scope():
            pass
    assert "\n" not in str(raised.value)
    assert_keras_as_shipped(shipped)


def test_a_missing_function_is_refused_by_name():
    missing = dataclasses.replace(
        keras_patches.entry("BackupAndRestore.on_train_begin"),
        name="on_train_start",
        qualname="BackupAndRestore.on_train_start",
    )
    with pytest.raises(
        RuntimeError,
        match=r"BackupAndRestore\.on_train_start does not exist "
        r"\(expected a function with signature "
        r"\(self, logs=None\)",
    ):
        missing.check()


def test_the_keras_originals_dpkeras_reimplements_are_unchanged():
    """dpkeras replaces what these Keras functions do for its models; if Keras changes one,
    the change would be silently dropped for dpkeras models."""
    pinned = [e for e in ATTRIBUTES if e.source_sha256 is not None]
    assert [e.qualname for e in pinned] == ["BackupAndRestore._save_model", "Adagrad.update_step"]
    for e in pinned:
        found = keras_patches.source_sha256(keras_patches.keras_original(e))
        assert found == e.source_sha256, (
            f"Keras {keras.__version__} changed {e.qualname} (source SHA-256 {found}, "
            f"pinned {e.source_sha256}). Read the new Keras source, make dpkeras's "
            f"{e.wrapper.__module__}.{e.wrapper.__name__} do everything it now does, then "
            f"update source_sha256 in dpkeras/_patches/table.py."
        )


def test_the_saving_internals_are_where_dpkeras_expects_them():
    saving_lib = _keras_internals.saving_module()
    assert {"save_model", "save_weights_only"} <= set(vars(saving_lib))
    assert _keras_internals.is_remote_path("gs://bucket/model.keras")
    assert not _keras_internals.is_remote_path("/tmp/model.keras")


def test_patches_do_not_import_the_strategy_module():
    for module in (keras_patches, resume):
        imported = {
            alias.name
            for node in ast.walk(ast.parse(inspect.getsource(module)))
            if isinstance(node, ast.ImportFrom)
            for alias in node.names
        }
        assert "strategy" not in imported and "ParameterDeviceStrategy" not in imported


def test_callbacks_run_outside_the_scope_with_the_patches_installed():
    """Why a scope alone cannot bound the patches' lifetime: Keras 3.15 runs callbacks (which
    save: ModelCheckpoint, BackupAndRestore) outside the strategy scope, during a `fit`
    called outside `dpkeras.scope()`; the model's variables keep the patches installed."""
    with new_strategy().scope():
        model = small_model()
        model.compile(optimizer="sgd", loss="mse")
    seen = []
    record = keras.callbacks.LambdaCallback(
        on_epoch_end=lambda epoch, logs: seen.append(
            (tf.distribute.has_strategy(), keras_patches.installed())
        )
    )
    x = tf.zeros((8, 3))
    model.fit(x, tf.zeros((8, 2)), batch_size=4, epochs=2, verbose=0, callbacks=[record])
    assert seen == [(False, True), (False, True)]


def test_after_uninstall_every_changed_object_is_the_original_again():
    """Every entry: Keras's and keras-rs's functions are the very objects they were, the
    gather dispatcher is unregistered, and an optimizer of a dpkeras strategy is back to
    Keras's `apply`, even while a model built under dpkeras lives."""
    pytest.importorskip("keras_rs")  # the optional entry applies once keras-rs is imported

    shipped = originals()
    assert "DistributedEmbedding._sparsecore_init" in shipped
    with new_strategy().scope():
        model = small_model()
        model.compile(optimizer="sgd", loss="mse")
        model.optimizer.build(model.trainable_variables)
        assert_patched(shipped)
    assert_patched(shipped)  # the model keeps them
    keras_patches.uninstall()
    assert_keras_as_shipped(shipped)
    assert type(model.optimizer).apply is keras_patches.keras_original(
        keras_patches.entry("Optimizer.apply")
    )
    assert "apply" not in vars(model.optimizer)


def test_after_uninstall_every_patched_owner_holds_what_it_held_before_dpkeras():
    """In a fresh process, each module and class an entry patches: after `uninstall()`, its
    `__dict__` has the same keys holding the same objects as before dpkeras installed anything
    (a class that inherits the function, as `keras.optimizers.Optimizer` inherits `apply`, holds
    none again, rather than the inherited function set on it). Twice: a scope installs every
    entry again after `uninstall()`, and leaving it with no variable alive restores as well."""
    out = run_python(
        """
        import contextlib
        import gc
        import keras
        import dpkeras
        from dpkeras._patches import entries, table

        with contextlib.suppress(ImportError):
            import keras_rs  # the optional entry applies once keras-rs is imported
        patched = [e for e in table.ENTRIES if isinstance(e, entries.Attribute) and e.available()]
        owners = {id(e.owner()): e.owner() for e in patched}
        shipped = {key: dict(vars(owner)) for key, owner in owners.items()}
        absent = object()

        def changed():
            found = set()
            for key, owner in owners.items():
                now, before = dict(vars(owner)), shipped[key]
                found |= {
                    (key, name)
                    for name in set(now) | set(before)
                    if now.get(name, absent) is not before.get(name, absent)
                }
            return found

        every = {(id(e.owner()), e.name) for e in patched}
        assert changed() == set(), changed()
        for round in (1, 2):
            with dpkeras.scope(["/cpu:1", "/cpu:2"], "/cpu:0"):
                assert table.installed() and changed() == every, (round, changed() ^ every)
                model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
                model.compile(optimizer="sgd", loss="mse")
            assert table.installed() and changed() == every  # the model's variables hold them
            dpkeras.uninstall()
            assert not table.installed() and changed() == set(), (round, changed())
            del model
            gc.collect()
        with dpkeras.scope(["/cpu:1", "/cpu:2"], "/cpu:0"):
            assert changed() == every
        assert not table.installed() and changed() == set(), changed()  # left, nothing alive
        print(sorted(e.qualname for e in patched if e.name not in vars(e.owner())))
        """,
        cpus=3,
    )
    inherited = {"Optimizer.apply"}  # the entries whose class inherits the function
    if importlib.util.find_spec("keras_rs") is not None:
        inherited.add("DistributedEmbedding._sparsecore_init")
    assert out.strip().splitlines()[-1] == str(sorted(inherited))


def test_restore_puts_back_the_object_the_owner_held_not_what_getattr_gave():
    """A class's staticmethod or classmethod is another object than what `getattr` gives (a
    plain or bound function): restoring must put the descriptor itself back in `__dict__`."""

    class Owner:
        @staticmethod
        def plain(x):
            return x

        @classmethod
        def bound(cls, x):
            return (cls, x)

    shipped = dict(vars(Owner))
    for name in ("plain", "bound"):
        entry = entries.Attribute(
            owner=lambda: Owner,
            name=name,
            qualname=f"Owner.{name}",
            signature="(x)",
            wrapper=lambda original, *args, **kwargs: original(*args, **kwargs),
            retire="none",
        )
        saved = entry.install()
        assert vars(Owner)[name] is not shipped[name]
        entry.restore(saved)
        assert vars(Owner)[name] is shipped[name], name
    assert Owner.plain(1) == 1 and Owner().bound(2) == (Owner, 2)


def test_importing_dpkeras_registers_no_dispatcher():
    out = run_python(
        """
        import dpkeras, tensorflow as tf
        from dpkeras._variables import lookups
        try:
            tf.experimental.unregister_dispatch_for(lookups.gather)
            print("registered")
        except ValueError:
            print("not registered")
        """
    )
    assert out.strip() == "not registered"


def test_a_model_loaded_while_compile_is_wrapped_is_compiled(tmp_path):
    """Keras compiles a loaded model only when `model.__class__.compile is Trainer.compile`
    (else it warns that `compile()` is custom and skips it): the wrapper replaces
    `Trainer.compile` itself."""
    path = str(tmp_path / "model.keras")
    with new_strategy().scope():
        model = small_model()
        model.compile(optimizer="adam", loss="mse")
        model.save(path)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loaded = keras.models.load_model(path)
        assert keras_patches.installed()
    assert not [w for w in caught if "compile()` was not called" in str(w.message)]
    assert loaded.compiled and isinstance(loaded.optimizer, keras.optimizers.Adam)


def test_the_strategy_an_optimizer_was_made_under_is_still_where_dpkeras_reads_it():
    """`_keras_internals.optimizer_strategy` reads a private attribute of Keras's TF optimizer;
    None for every optimizer (a renamed attribute) would let a compile with a foreign
    optimizer through without a word."""
    strategy = dpkeras.get_strategy(["/cpu:1", "/cpu:2"], "/cpu:0")
    with strategy.scope():
        inside = keras.optimizers.Adam()
    outside = keras.optimizers.Adam()
    assert _keras_internals.optimizer_strategy(inside) is strategy
    assert _keras_internals.optimizer_strategy(outside) is tf.distribute.get_strategy()


def test_the_strategy_a_model_was_made_under_is_still_where_dpkeras_reads_and_sets_it():
    """`_keras_internals.built_outside_any_strategy` and `strategy_attribute` read and name a
    private attribute of Keras's TF trainer (set by `dpkeras._patches.outside_the_scope`);
    renamed, keras-io's end-to-end wrapper would compile in its strategy's scope and then run
    fit/evaluate/predict under no strategy at all."""
    strategy = dpkeras.get_strategy(["/cpu:1", "/cpu:2"], "/cpu:0")
    with strategy.scope():
        inside = keras.Sequential([keras.layers.Dense(2)])
    outside = keras.Sequential([keras.layers.Dense(2)])
    assert not _keras_internals.built_outside_any_strategy(inside)
    assert _keras_internals.built_outside_any_strategy(outside)
    assert outside.distribute_strategy is tf.distribute.get_strategy()
    setattr(outside, _keras_internals.strategy_attribute(), strategy)
    assert outside.distribute_strategy is strategy
    assert not _keras_internals.built_outside_any_strategy(outside)


# -- Keras internals that differ within the span (dpkeras/_keras_internals.py) -----------------


def test_keras_wraps_its_steps_to_convert_optionals_from_3_12_on_and_dpkeras_as_it_does():
    trainer = _keras_internals.tensorflow_trainer()
    assert hasattr(trainer, "_autoconvert_optionals") == (_keras_internals.keras_minor() >= (3, 12))

    def step(data):
        return data

    model = small_model()
    converted = _keras_internals.autoconvert_optionals(model, step)
    if _keras_internals.keras_minor() < (3, 12):
        assert converted is step
    else:
        optional = tf.experimental.Optional.empty(tf.TensorSpec([], tf.float32))
        assert converted({"x": 1.0, "mask": optional}) == {"x": 1.0, "mask": None}


def test_an_epoch_enumeration_reads_as_step_spans_and_back_in_this_keras():
    """Keras 3.11+ enumerates an epoch as `(begin, end, iterator)`, 3.8-3.10 as `(step,
    iterator)`; dpkeras's resume reads spans and gives Keras back its own form."""
    import numpy as np

    iterator = _keras_internals.epoch_iterator_class()(
        x=np.zeros((10, 3), "float32"), batch_size=2, steps_per_execution=2, shuffle=False
    )
    kerass = [tuple(item[:-1]) for item in iterator._enumerate_iterator()]
    width = 2 if _keras_internals.keras_minor() >= (3, 11) else 1
    assert {len(item) for item in kerass} == {width}
    items = [(i, "it") for i in (0, 2, 4)] if width == 1 else [(i, i + 1, "it") for i in (0, 2, 4)]
    spans = list(_keras_internals.step_spans(iterator, iter(items)))
    assert spans == [(0, 1, "it"), (2, 3, "it"), (4, 5, "it")]
    assert list(_keras_internals.as_keras_enumeration(iter(spans))) == items


# -- review (breaker): the per-release answers, each release of the span faked ----------------


KERAS_RELEASES = ["3.8.0", "3.9.2", "3.10.0", "3.11.3", "3.12.0", "3.14.0", "3.15.1"]


def _as_keras(monkeypatch, version):
    monkeypatch.setattr(keras, "__version__", version)
    major, minor = (int(n) for n in version.split(".")[:2])
    assert _keras_internals.keras_minor() == (major, minor)
    return major, minor


@pytest.mark.parametrize("version", KERAS_RELEASES)
def test_each_release_of_the_span_gets_its_own_epoch_enumeration(monkeypatch, version):
    """(step, iterator) before Keras 3.11, (begin, end, iterator) from 3.11 on: read as spans
    and given back in the form of the Keras in use, compared as numbers ("3.8" < "3.11")."""
    import types

    release = _as_keras(monkeypatch, version)
    iterator = types.SimpleNamespace(steps_per_execution=3)
    spans = [(0, 2, "it"), (3, 5, "it")]
    kerass = [(0, "it"), (3, "it")] if release < (3, 11) else spans
    assert list(_keras_internals.step_spans(iterator, iter(kerass))) == spans
    assert list(_keras_internals.as_keras_enumeration(iter(spans))) == kerass


@pytest.mark.parametrize("version", KERAS_RELEASES)
def test_each_release_of_the_span_gets_its_own_optional_conversion(monkeypatch, version):
    """Keras 3.12+ wrap the step (`_autoconvert_optionals`); 3.8-3.11 have no such method."""
    import types

    release = _as_keras(monkeypatch, version)

    def step(data):
        return data

    model = types.SimpleNamespace(_autoconvert_optionals=lambda f: ("wrapped", f))
    if release < (3, 12):
        del model._autoconvert_optionals  # as the trainer of 3.8-3.11: absent
        assert _keras_internals.autoconvert_optionals(model, step) is step
    else:
        assert _keras_internals.autoconvert_optionals(model, step) == ("wrapped", step)


@pytest.mark.parametrize("version", KERAS_RELEASES)
def test_each_release_of_the_span_gets_its_own_backup_position(monkeypatch, version):
    """Keras 3.11+ report a call's last batch to `on_train_batch_end`, 3.8-3.10 its first: the
    last batch trained is counted from it there (at most the epoch's last)."""
    import types

    release = _as_keras(monkeypatch, version)
    model = types.SimpleNamespace(steps_per_execution=3)
    for seen, old_keras in ((3, 5), (8, 9)):
        callback = types.SimpleNamespace(
            _current_epoch=1, _last_batch_seen=seen, model=model, params={"steps": 10}
        )
        expected = old_keras if release < (3, 11) else seen
        assert _keras_internals.backup_position(callback) == (1, expected), (version, seen)


def test_the_weights_wrapper_writes_a_dpkeras_model_through_the_3_8_signature(tmp_path):
    """Keras 3.8-3.9's `save_weights_only(model, filepath, objects_to_skip=None)`: dpkeras's
    atomic write of a dpkeras model passes it only what it was given (no `max_shard_size`)."""
    calls = []

    def save_weights_only(model, filepath, objects_to_skip=None):
        calls.append((filepath, objects_to_skip))
        with open(filepath, "wb") as f:
            f.write(b"weights")

    with new_strategy().scope():
        model = small_model()
    assert resume.built_under_dpkeras(model)
    path = str(tmp_path / "m.weights.h5")
    resume.save_weights_only(save_weights_only, model, path)
    resume.save_weights_only(save_weights_only, model, path, objects_to_skip=["x"])
    with open(path, "rb") as f:
        assert f.read() == b"weights"
    assert [skip for _, skip in calls] == [None, ["x"]]
    assert all(written != path for written, _ in calls)  # a temporary file, renamed into place
