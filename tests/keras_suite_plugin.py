"""A pytest plugin that runs Keras's shipped unit tests inside a tf.distribute strategy scope.

Loaded by `tests/keras_suite.py` into one pytest process per mode (`-p keras_suite_plugin
--strategy=none|dpkeras|hybrid|mirrored`) that collects test modules from the installed Keras or
keras-rs. Every mode splits the CPU into the same 2 logical devices before TensorFlow starts,
so that the strategy is the only difference between the modes:

- `none`: no strategy (Keras's own baseline on this machine);
- `dpkeras`: `dpkeras.ParameterDeviceStrategy` computing on `/cpu:0` and `/cpu:1`, every
  variable on the parameter device (all-on-ps);
- `hybrid`: the same with `placement.hybrid()`: dense variables replicated on both compute
  devices (`ReplicatedVariable`, all-reduced), tables on the parameter device;
- `mirrored`: `tf.distribute.MirroredStrategy` over the same two devices, to tell what any
  strategy changes from what dpkeras changes.

The strategy scope is entered around each test's call. Keras's `TestCase.setUp` (and tests
themselves) call `clear_session()`, which resets TensorFlow's default graph and with it the
strategy stack: the plugin wraps `clear_session` so that the scope is entered again right after
it, and at the end of the test the scopes are dropped the same way (a reset of the default
graph), as the earlier ones cannot be exited from a graph that no longer holds them.

It also stands in for Keras's root `conftest.py`, which the wheel does not ship: test modules
`from conftest import skip_if_backend`, and Keras's markers and warning filters (`error`, with
the same exceptions as Keras's pyproject.toml) are registered here.
"""

import contextlib
import os
import sys

import pytest

MODES = ("none", "dpkeras", "hybrid", "mirrored")
DEVICES = ("/cpu:0", "/cpu:1")

# Keras 3.15.1's [tool.pytest.ini_options] filterwarnings.
KERAS_WARNING_FILTERS = (
    "error",
    "ignore::DeprecationWarning",
    "ignore::ImportWarning",
    "ignore::RuntimeWarning",
    "ignore::PendingDeprecationWarning",
    "ignore::FutureWarning",
    "ignore::UserWarning",
    "ignore:Custom mask layers require a config",
)


def skip_if_backend(given_backend, reason):
    """Keras's `conftest.skip_if_backend`: skip where the Keras backend is `given_backend`."""
    from keras.src.backend import backend

    return pytest.mark.skipif(backend() == given_backend, reason=reason)


def pytest_addoption(parser):
    parser.addoption("--strategy", choices=MODES, default="none", help="the strategy scope")


def pytest_configure(config):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # `from conftest import skip_if_backend` in Keras's test modules finds this module.
    sys.modules.setdefault("conftest", sys.modules[__name__])
    for line in KERAS_WARNING_FILTERS:
        config.addinivalue_line("filterwarnings", line)
    config.addinivalue_line("markers", "requires_trainable_backend: Keras's marker")
    config.addinivalue_line("markers", "multi_device: Keras's marker (JAX only)")

    import dpkeras

    dpkeras.simulate_cpu_devices(len(DEVICES))
    config.pluginmanager.register(_StrategyAroundTests(config.getoption("strategy")))


def pytest_collection_modifyitems(config, items):
    # As Keras's conftest on the TensorFlow backend: multi-device tests are for JAX.
    skip = pytest.mark.skip(reason="Requires multiple devices")
    for item in items:
        if "multi_device" in item.keywords:
            item.add_marker(skip)


def _strategy(mode):
    import tensorflow as tf

    import dpkeras

    if mode == "dpkeras":
        return dpkeras.ParameterDeviceStrategy(compute_devices=list(DEVICES))
    if mode == "hybrid":
        from dpkeras import placement

        return dpkeras.ParameterDeviceStrategy(
            compute_devices=list(DEVICES), parameter_device=placement.hybrid()
        )
    if mode == "mirrored":
        return tf.distribute.MirroredStrategy(list(DEVICES))
    return None


class _StrategyAroundTests:
    """Enters the mode's strategy scope around each test call, again after each clear_session."""

    def __init__(self, mode):
        self.strategy = _strategy(mode)
        self.scope = None  # the scope entered last, while a test runs
        if self.strategy is not None:
            self._wrap_clear_session()

    def _wrap_clear_session(self):
        from keras.src.backend.common import global_state
        from keras.src.testing import test_case  # noqa: F401 (binds clear_session by name)

        original = global_state.clear_session

        def clear_session(*args, **kwargs):
            result = original(*args, **kwargs)
            if self.scope is not None:
                self._enter()
            return result

        # Every module that holds the function under some name (keras.backend, TestCase's
        # module, ...), and the test modules imported later (pytest_collection_finish).
        self._replace = lambda: _replace_everywhere(original, clear_session)
        self._replace()

    def _enter(self):
        self.scope = self.strategy.scope()
        self.scope.__enter__()

    @pytest.hookimpl(trylast=True)
    def pytest_collection_finish(self, session):
        if self.strategy is not None:
            self._replace()

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item):
        if self.strategy is None:
            return (yield)
        self._enter()
        try:
            return (yield)
        finally:
            self._leave()

    def _leave(self):
        import tensorflow as tf

        scope, self.scope = self.scope, None
        with contextlib.suppress(Exception):  # the test may have left its own scopes
            scope.__exit__(None, None, None)
        # Scopes entered before a clear_session live on a graph that is gone; drop them all.
        tf.compat.v1.reset_default_graph()


def _replace_everywhere(old, new):
    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None)
        if not namespace:
            continue
        for name, value in list(namespace.items()):
            if value is old:
                setattr(module, name, new)
