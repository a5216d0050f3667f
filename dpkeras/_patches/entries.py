"""The kinds of change dpkeras makes to Keras, TensorFlow and keras-rs, each reversible.

Every change is an entry of one of three kinds, listed in `dpkeras._patches.table.ENTRIES` and
installed and undone together by its lifecycle:

- `Attribute`: a function of a Keras class or module, replaced by a wrapper that calls the
  original (or, where `source_sha256` is set, re-implements it for dpkeras models); its
  signature is checked before anything is installed.
- `OptionalAttribute`: the same, on a module that may not be imported (keras-rs): installed
  when the module is imported by the time the lifecycle installs, skipped otherwise.
- `Dispatcher`: a function registered with TensorFlow's public dispatch API (`tf.gather`).

No object is changed one by one: where dpkeras acts for some objects only (the optimizers a
dpkeras strategy created variables for), a class `Attribute`'s wrapper asks whether the object
is one of them and calls Keras's original for every other.

Each entry names, in `retire`, the Keras or TensorFlow hook that would make it unnecessary: what
to ask upstream for.
"""

import dataclasses
import functools
import inspect
import sys
from collections.abc import Callable
from typing import ClassVar

import keras
import tensorflow as tf

from dpkeras import _version

_INHERITED = object()  # an owner that held no object of its own under the name


def _wrap(entry, original):
    @functools.wraps(original)
    def wrapped(*args, **kwargs):
        return entry.wrapper(original, *args, **kwargs)

    wrapped.__dpkeras_original__ = original
    return wrapped


@dataclasses.dataclass(frozen=True)
class Attribute:
    """One Keras function dpkeras replaces by a wrapper.

    Args:
        owner: callable returning the module or class that holds the function.
        name: str, the attribute name on `owner`.
        qualname: str, how errors and the README name it.
        signature: str, `str(inspect.signature(...))` of the function in Keras 3.15.
        older_signatures: `((signature, "Keras 3.8-3.9"), ...)`, the other signatures the
            function has within the supported span, and where: each accepted too (the
            wrapper must take each).
        wrapper: callable `(original, *args, **kwargs)` standing in for the function.
        retire: str, the public Keras hook that would make this entry unnecessary.
        source_sha256: str or None, the SHA-256 of `inspect.getsource` of the Keras 3.15
            original when the wrapper re-implements it for dpkeras models instead of calling
            it (tests/test_keras_patches.py checks it).
    """

    kind: ClassVar[str] = "attribute"
    owner: Callable[[], object]
    name: str
    qualname: str
    signature: str
    wrapper: Callable
    retire: str
    source_sha256: str | None = None
    older_signatures: tuple[tuple[str, str], ...] = ()

    def accepted_signatures(self):
        """Every signature the function may have within the supported span."""
        return (self.signature, *(found for found, _ in self.older_signatures))

    def available(self):
        """Whether the entry applies in this process (always, for a Keras attribute)."""
        return True

    def check(self):
        """Raises RuntimeError if the function is missing or its signature is none of those
        accepted (`accepted_signatures`)."""
        supported = f"dpkeras supports Keras {_version.span(_version.KERAS)}"
        expected = " or ".join(self.accepted_signatures())
        original = getattr(self.owner(), self.name, None)
        if original is None:
            raise RuntimeError(
                f"dpkeras cannot patch Keras {keras.__version__}: {self.qualname} does not "
                f"exist (expected a function with signature {expected}; {supported})."
            )
        found = str(inspect.signature(original))
        if found not in self.accepted_signatures():
            raise RuntimeError(
                f"dpkeras cannot patch Keras {keras.__version__}: {self.qualname} has signature "
                f"{found}, expected {expected} ({supported})."
            )

    def install(self):
        """Replaces the function; returns what `restore` needs.

        What the owner held itself is read before the wrapper is set: a class that inherits
        the function (`keras.optimizers.Optimizer.apply`, defined on a base class) holds none,
        and `restore` must then delete the wrapper, not set the inherited function on it.
        """
        owner = self.owner()
        original = getattr(owner, self.name)
        own = vars(owner).get(self.name, _INHERITED)
        setattr(owner, self.name, _wrap(self, original))
        return owner, original, own

    def restore(self, saved):
        """Puts back what the owner held (`saved` is what `install` returned): its own object
        as it was in its `__dict__`, or nothing, for an inherited function."""
        owner, _, own = saved
        if own is _INHERITED:
            delattr(owner, self.name)
        else:
            setattr(owner, self.name, own)

    def current(self):
        """The object on the owner now (the original, or dpkeras's wrapper)."""
        return getattr(self.owner(), self.name)


@dataclasses.dataclass(frozen=True)
class OptionalAttribute(Attribute):
    """An `Attribute` of a module that may not be imported (keras-rs, the `rs` extra).

    Applies when `module` is imported and the function still has the parameters `signature`
    names (names only: an optional library's annotations render by its own imports);
    otherwise it is skipped and the library's own behaviour stands (the tests of the `rs`
    extra fail on such an upgrade).

    Args (besides `Attribute`'s):
        module: str, the top-level module, such as `"keras_rs"`.
    """

    kind: ClassVar[str] = "optional attribute"
    module: str = ""

    def available(self):
        if self.module not in sys.modules:
            return False
        original = getattr(self.owner(), self.name, None)
        if original is None:
            return False
        found = f"({', '.join(inspect.signature(original).parameters)})"
        return found == self.signature

    def check(self):
        """Nothing to refuse: an optional entry that does not fit is skipped."""


@dataclasses.dataclass(frozen=True)
class Dispatcher:
    """A function registered with TensorFlow's dispatch API for one API and argument type.

    Args:
        api: callable returning the TensorFlow API, such as `tf.gather`.
        signature: callable returning the dispatch signature, such as
            `{"params": keras.Variable}`.
        target: the function TensorFlow calls instead.
        qualname: str, how errors and the README name it.
        retire: str, the hook that would make this entry unnecessary.
        before_first_install: callable run once per process before the first registration
            (making the argument type dispatchable, which TensorFlow cannot undo: with no
            dispatcher registered for it, it changes nothing), or None.
    """

    kind: ClassVar[str] = "dispatcher"
    api: Callable[[], object]
    signature: Callable[[], dict]
    target: Callable
    qualname: str
    retire: str
    before_first_install: Callable | None = None
    _prepared: list = dataclasses.field(default_factory=list, compare=False, repr=False)

    def available(self):
        return True

    def check(self):
        pass

    def install(self):
        if self.before_first_install is not None and not self._prepared:
            self.before_first_install()
            self._prepared.append(True)
        tf.experimental.dispatch_for_api(self.api(), self.signature())(self.target)
        return None

    def restore(self, saved):
        del saved
        tf.experimental.unregister_dispatch_for(self.target)

    def registered(self):
        """Whether `target` is registered with TensorFlow now (asked without changing it)."""
        try:
            tf.experimental.unregister_dispatch_for(self.target)
        except ValueError:  # TensorFlow: "was not registered"
            return False
        tf.experimental.dispatch_for_api(self.api(), self.signature())(self.target)
        return True
