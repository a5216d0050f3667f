"""The TF1 layer's stores and thread-local scopes; the docstring examples of its modules."""

import importlib
import re
import threading

import pytest

from dpkeras.tf1 import (
    VariableStore,
    get_variable,
    get_variable_store,
    variable_scope,
)
from tests.tf1_models import (
    L,
    _fresh_store,  # noqa: F401 (an autouse fixture)
)

# ---------------------------------------------------------------------------------------------
# Stores and state.


def test_stores_isolate_top_level_code_and_restore_on_exit(_fresh_store):  # noqa: F811
    get_variable("w", (1,))
    with VariableStore() as inner:
        assert get_variable_store() is inner
        get_variable("w", (1,))  # no clash: another store
    assert get_variable_store() is _fresh_store
    assert _fresh_store.paths() == ["w"]
    _fresh_store.clear()
    assert len(_fresh_store) == 0


def test_scope_state_is_thread_local():
    seen = {}

    def worker():
        with VariableStore() as store:  # the main thread's `with VariableStore()` is not here
            seen["store"] = store
            with variable_scope("thread"):  # nor is its variable scope
                seen["w"] = get_variable("w", (1,))

    with variable_scope("main", reuse=True):
        thread = threading.Thread(target=worker)
        thread.start()
        thread.join()
    assert seen["w"].path == "thread/w"
    assert seen["store"].paths() == ["thread/w"] and len(get_variable_store()) == 0


def test_a_failing_scope_body_leaves_no_scope_entered():
    with pytest.raises(RuntimeError, match="boom"):
        with variable_scope("boom"):
            raise RuntimeError("boom")
    assert get_variable("w", (1,)).path == "w"
    dense = L.Dense(1, name="plain")
    dense.build((None, 1))
    assert dense.kernel.path == "plain/kernel"
    assert get_variable_store().paths() == ["w"]


def _docstring_examples():
    names = ("store", "errors", "state", "sharing", "scopes", "get_variable", "collections")
    for module in [importlib.import_module(f"dpkeras.tf1._{name}") for name in names]:
        objects = [module] + [
            obj
            for obj in vars(module).values()
            if getattr(obj, "__module__", None) == module.__name__
        ]
        objects += [
            member
            for obj in objects
            if isinstance(obj, type)
            for member in vars(obj).values()
            if callable(member) or isinstance(member, property)
        ]
        for obj in objects:
            for index, code in enumerate(
                re.findall(r"```python\n(.*?)```", obj.__doc__ or "", re.S)
            ):
                name = getattr(obj, "__qualname__", getattr(obj, "__name__", "?"))
                yield pytest.param(code, id=f"{module.__name__}.{name}-{index}")


@pytest.mark.parametrize("code", list(_docstring_examples()))
def test_docstring_examples_run(code):
    import textwrap

    exec(compile(textwrap.dedent(code), "docstring", "exec"), {"__name__": "docstring"})
