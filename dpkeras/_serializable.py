"""The classes dpkeras registers with Keras's serialization, registered by `import dpkeras` alone.

A `.keras` file names a dpkeras layer by its registered name (`dpkeras>DynamicEmbedding`), and
`keras.models.load_model` looks the name up in Keras's registry of custom objects (the dict
`keras.saving.get_custom_objects()` returns; Keras copies it at the start of each load). The
class registers itself when its module is imported (`@keras.saving.register_keras_serializable`),
but `import dpkeras` imports that module only when the name is first used (`dpkeras._lazy`), and
imports neither Keras nor TensorFlow (`import keras` imports TensorFlow). So `import dpkeras`
registers, under each name of `CLASSES`, a stand-in: a class whose `from_config` imports the
module (the real class then registers itself in the stand-in's place, for every later save and
load) and builds the object with the real class's `from_config`. It is registered:

- at once, if Keras is imported by then;
- otherwise when Keras is imported: a finder on `sys.meta_path` sees the `keras` package
  imported (and imports nothing itself), and registers once Keras has run its `__init__`.

A name registered already (the real class, or an object of the user's) is left as it is. This
is no entry of `dpkeras._patches`: it is Keras's public way to name a custom class, as the
decorator is, and `uninstall()` leaves it, so that files keep loading.

Standard library only.
"""

import importlib
import importlib.abc
import sys

# Each name dpkeras registers with Keras and the (module, class) that registers itself under it
# (tests/test_serializable.py: every class dpkeras registers is here).
CLASSES = {"dpkeras>DynamicEmbedding": ("dpkeras._dynamic.layer", "DynamicEmbedding")}


def _stand_in(module, name):
    """A class whose `from_config` builds a `module.name` from its config."""

    def from_config(cls, config):
        del cls
        return getattr(importlib.import_module(module), name).from_config(config)

    return type(
        name,
        (),
        {
            "__doc__": f"Stands in for `{module}.{name}` until a file that names it is loaded.",
            "__module__": __name__,
            "from_config": classmethod(from_config),
        },
    )


def _register(keras):
    registry = keras.saving.get_custom_objects()
    for registered, (module, name) in CLASSES.items():
        if registered not in registry:
            registry[registered] = _stand_in(module, name)


class _RegisteringLoader(importlib.abc.Loader):
    """Keras's own loader, then `_register`; the module keeps Keras's loader as its own."""

    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        module.__loader__ = module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        _register(module)


class _WhenKerasIsImported(importlib.abc.MetaPathFinder):
    """Finds `keras` with the finders after it, and has it registered once it has run."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "keras":
            return None
        finders = list(sys.meta_path)
        after = finders[finders.index(self) + 1 :] if self in finders else finders
        for finder in after:
            find = getattr(finder, "find_spec", None)
            spec = None if find is None else find(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _RegisteringLoader(spec.loader)
        return spec


def register():
    """Registers every name of `CLASSES` with Keras now, or when Keras is imported.

    Called by `import dpkeras`; imports neither Keras nor TensorFlow.
    """
    if not any(isinstance(finder, _WhenKerasIsImported) for finder in sys.meta_path):
        sys.meta_path.insert(0, _WhenKerasIsImported())
    keras = sys.modules.get("keras")
    if keras is not None and hasattr(keras, "saving"):  # imported (else being imported)
        _register(keras)
