"""A task process (`dpkeras serve`) starts without importing Keras.

`import tensorflow` imports Keras when it is installed: TensorFlow's `__init__` imports
`keras.src.optimizers` (for SavedModel registrations) inside `try: ... except ImportError`, and
Keras imports `matplotlib.pyplot` when matplotlib is installed. That is about 2.4 s of a task's
5 s start on a 2-core machine (TF 2.21, Keras 3.15). A ps or worker task runs the graphs its
client sends and never Keras, so `dpkeras serve` refuses Keras's import before it imports
TensorFlow: a task answers sooner, at its first start and when it is restarted after a loss.

Only the import is refused: `importlib.util.find_spec("keras")` still finds Keras's directory,
which TensorFlow reads for `tf.keras`'s lazy loader. `tests/test_serve.py` fails if a task
imports Keras again (say, a TensorFlow that no longer catches the ImportError) or cannot start.
"""

import importlib.abc
import importlib.machinery
import sys

_REFUSED = ("keras", "tf_keras")


class _RefusingLoader(importlib.abc.Loader):
    def create_module(self, spec):
        return None

    def exec_module(self, module):
        raise ImportError(f"{module.__name__} is not imported in a dpkeras serve task")


class _Finder(importlib.abc.MetaPathFinder):
    """Finds Keras where Python would, with a loader that refuses to run it."""

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] not in _REFUSED:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None:
            spec.loader = _RefusingLoader()
        return spec


def refuse_keras():
    """In a process that has not imported TensorFlow or Keras yet, makes importing Keras an
    ImportError; elsewhere (a process that already has them, such as a test's) does nothing.
    Returns whether it did."""
    if any(name in sys.modules for name in ("tensorflow", *_REFUSED)):
        return False
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
    return True
