"""Files of dpkeras's classes load after `import dpkeras` alone (dpkeras/_serializable.py).

`import dpkeras` imports no Keras, no TensorFlow and none of the classes' modules; it registers
each class's name with Keras, at once or when Keras is imported. Each registered class is saved
in a model in one process and loaded in another that imports only `dpkeras` and `keras`, in
either order.
"""

import importlib
import json
import pkgutil
import textwrap

import keras
import pytest

import dpkeras
from dpkeras import _serializable
from dpkeras.testing import run_python

# For each name dpkeras registers, a program that makes `model` holding the class (trained, so
# that its state is not its initial one) and `x`, an input to predict on.
MODELS = {
    "dpkeras>DynamicEmbedding": """
        from dpkeras.layers import DynamicEmbedding

        keras.utils.set_random_seed(1)
        ids = keras.Input((3,), dtype="int64")
        layer = DynamicEmbedding(4, capacity=8, min_count=2, eviction="lru", name="de")
        model = keras.Model(ids, keras.layers.Dense(1)(keras.layers.Flatten()(layer(ids))))
        model.compile(optimizer="adam", loss="mse")
        train = np.array([[2**40 + 7, 5, 5], [2**40 + 7, 9, 11], [3, 3, 9]], dtype="int64")
        model.fit(train, np.ones((3, 1)), epochs=1, verbose=0)
        assert layer.size == 4  # 11, seen once, waits: zeros, as 10**14, never seen
        x = np.concatenate([train, [[10**14, 5, 3]]])
    """,
}


def _every_dpkeras_module():
    for info in pkgutil.walk_packages(dpkeras.__path__, "dpkeras."):
        if not info.name.endswith("__main__"):
            importlib.import_module(info.name)


def test_the_table_names_every_class_dpkeras_registers_with_keras():
    _every_dpkeras_module()
    registered = {
        name: (obj.__module__, obj.__name__)
        for name, obj in keras.saving.get_custom_objects().items()
        if getattr(obj, "__module__", "").startswith("dpkeras")
    }
    assert registered == _serializable.CLASSES
    assert set(MODELS) == set(_serializable.CLASSES)
    for name, (module, cls) in _serializable.CLASSES.items():
        real = getattr(importlib.import_module(module), cls)
        assert keras.saving.get_registered_object(name) is real
        assert keras.saving.get_registered_name(real) == name


def test_import_dpkeras_imports_no_keras_and_registers_when_keras_is_imported():
    out = run_python(
        """
        import json, sys
        import dpkeras

        heavy = [m for m in ("tensorflow", "keras", "dpkeras.layers") if m in sys.modules]
        import keras

        registry = keras.saving.get_custom_objects()
        print(json.dumps({
            "imported": heavy,
            "registered": sorted(n for n in registry if n.startswith("dpkeras>")),
            "stand-ins": sorted(registry[n].__module__ for n in registry if ">" in n),
            "modules": sorted(m for m in sys.modules if m.startswith("dpkeras._dynamic")),
            "keras's loader": keras.__spec__.loader is keras.__loader__
            and type(keras.__loader__).__module__ != "dpkeras._serializable",
        }))
        """
    )
    found = json.loads(out.strip().splitlines()[-1])
    assert found == {
        "imported": [],
        "registered": sorted(_serializable.CLASSES),
        "stand-ins": ["dpkeras._serializable"] * len(_serializable.CLASSES),
        "modules": [],  # the classes' modules are imported by the first file that names them
        "keras's loader": True,
    }


def test_a_name_the_user_registered_before_import_dpkeras_is_left_as_it_is():
    """A class the user registered under a name of `CLASSES` (with Keras imported before
    dpkeras) stays registered: dpkeras registers a stand-in only under a free name."""
    out = run_python(
        f"""
        import json
        import keras

        class Mine(keras.layers.Layer):
            pass

        names = {sorted(_serializable.CLASSES)!r}
        registry = keras.saving.get_custom_objects()
        for name in names:
            registry[name] = Mine
        import dpkeras

        print(json.dumps([n for n in names if registry[n] is not Mine]))
        """
    )
    assert json.loads(out.strip().splitlines()[-1]) == []


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """`{name: directory}`: the model of each registered class, saved by a fresh process with its
    input and its predictions."""
    root = tmp_path_factory.mktemp("saved")
    found = {}
    for i, (name, program) in enumerate(sorted(MODELS.items())):
        folder = root / str(i)
        folder.mkdir()
        run_python(
            "import keras\nimport numpy as np\n"
            + textwrap.dedent(program).lstrip("\n")
            + f"model.save({str(folder / 'model.keras')!r})\n"
            + f"np.save({str(folder / 'x.npy')!r}, x)\n"
            + f"np.save({str(folder / 'expected.npy')!r}, model.predict(x, verbose=0))\n"
        )
        found[name] = folder
    return found


@pytest.mark.parametrize(
    "imports",
    ["import dpkeras\nimport keras", "import keras\nimport dpkeras"],
    ids=["dpkeras-first", "keras-first"],
)
def test_each_registered_class_loads_in_a_process_that_imports_only_dpkeras(saved, imports):
    for name, folder in saved.items():
        out = run_python(
            imports
            + f"""
import numpy as np

model = keras.models.load_model({str(folder / "model.keras")!r})
x = np.load({str(folder / "x.npy")!r})
got = model.predict(x, verbose=0)
np.testing.assert_allclose(got, np.load({str(folder / "expected.npy")!r}), rtol=1e-6, atol=1e-7)
real = keras.saving.get_custom_objects()[{name!r}]
assert any(type(layer) is real for layer in model.layers), [type(l) for l in model.layers]
print(real.__module__, real.__name__)
"""
        )
        assert out.split()[-2:] == list(_serializable.CLASSES[name]), name
