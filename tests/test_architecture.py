"""The shape of the package: no import cycles, private TF/Keras only in the internals
modules (imports, attributes and overridden hooks), small modules and classes, one formatter.

Parsed from the source with `ast`, except the checks of TensorFlow and Keras members that
dpkeras's classes override or read, which import dpkeras to see its classes' bases (and parse
the bases' source for the instance attributes they set).
"""

import ast
import inspect
import os
import re
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "dpkeras")
INTERNALS = {"dpkeras._tf_internals", "dpkeras._keras_internals"}
PRIVATE = ("tensorflow.python", "keras.src")


def _modules():
    found = {}
    for folder, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                dotted = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                found[dotted.removesuffix(".__init__")] = path
    return found


def _parse(path):
    with open(path, encoding="utf-8") as f:
        source = f.read()
    return source, ast.parse(source)


def _top_level_imports(tree):
    """Modules imported at module level (not inside functions)."""
    names = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
            names += [f"{node.module}.{a.name}" for a in node.names]
    return names


def test_no_import_cycle_inside_dpkeras():
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        _, tree = _parse(path)
        graph[name] = {
            m for m in _top_level_imports(tree) if m in modules and m != name and m != "dpkeras"
        }
    state = {}

    def visit(node, stack):
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                cycle = stack[stack.index(nxt) :] + [nxt]
                pytest.fail(f"import cycle: {' -> '.join(cycle)}")
            if nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])


def test_private_tensorflow_and_keras_only_in_the_internals_modules():
    offenders = []
    for name, path in _modules().items():
        if name in INTERNALS:
            continue
        _, tree = _parse(path)
        for node in ast.walk(tree):
            imported = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            offenders += [f"{name}: {m}" for m in imported if m.startswith(PRIVATE)]
    assert offenders == []


def _underscore_imports(tree, modules):
    """`(module, name)` of each `from dpkeras.x import _name` of a dpkeras module."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in modules:
            found += [(node.module, a.name) for a in node.names if a.name.startswith("_")]
    return found


def test_the_tf1_modules_use_each_other_through_public_names_only():
    modules = _modules()
    tf1 = [name for name in modules if name.startswith("dpkeras.tf1")]
    assert {"dpkeras.tf1._store", "dpkeras.tf1._scopes", "dpkeras.tf1._collections"} <= set(tf1)
    offenders = []
    for name in tf1:
        _, tree = _parse(modules[name])
        offenders += [
            f"{name} imports {module}.{imported}"
            for module, imported in _underscore_imports(tree, modules)
            if f"{module}.{imported}" not in INTERNALS  # private by design, used as modules
        ]
    assert offenders == []


def test_the_underscore_import_check_sees_one():
    tree = ast.parse("from dpkeras.tf1._store import _Blocks, VariableStore\n")
    assert _underscore_imports(tree, {"dpkeras.tf1._store"}) == [("dpkeras.tf1._store", "_Blocks")]


def test_every_package_is_installed_by_pyproject():
    """A non-editable `pip install .` installs the packages setuptools finds with pyproject's
    `include`: every folder of dpkeras with Python files must be one (an `__init__.py`)."""
    from setuptools import find_packages

    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as f:
        text = f.read()  # tomllib is Python 3.11+; dpkeras supports 3.10
    section = text.split("[tool.setuptools.packages.find]", 1)[1].split("\n[", 1)[0]
    include = re.findall(r'"([^"]+)"', re.search(r"include = \[(.*?)\]", section, re.S)[1])
    folders = {
        os.path.relpath(os.path.dirname(path), ROOT).replace(os.sep, ".")
        for path in _modules().values()
    }
    assert set(find_packages(ROOT, include=include)) == folders


def test_no_module_over_700_lines_and_no_class_over_300():
    too_big = []
    for name, path in _modules().items():
        source, tree = _parse(path)
        if len(source.splitlines()) > 700:
            too_big.append(f"{name}: {len(source.splitlines())} lines")
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > 300:
                too_big.append(f"{name}.{node.name}: {node.end_lineno - node.lineno + 1} lines")
    assert too_big == []


@pytest.mark.skipif(
    shutil.which("ruff") is None and not os.path.exists(os.path.join(ROOT, ".venv", "bin", "ruff")),
    reason="ruff is not installed",
)
def test_the_tree_is_formatted_and_lint_clean():
    ruff = shutil.which("ruff") or os.path.join(ROOT, ".venv", "bin", "ruff")
    for args in (["format", "--check"], ["check"]):
        proc = subprocess.run(
            [ruff, *args, "dpkeras", "tests", "benchmarks"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-1000:]


# `x._name` on an object other than `self`/`cls`/`super()`, outside the internals modules, is
# allowed only here, each with its reason.
PRIVATE_ATTRIBUTES_ALLOWED = {
    ("dpkeras.cluster._task", "os._exit"): "as below: a TensorFlow server cannot be stopped",
    ("dpkeras.cluster._health", "os._exit"): (
        "Python's documented way to end a process at once, without waiting for threads: "
        "TensorFlow's gRPC threads can block a normal exit"
    ),
    ("dpkeras._variables.sharded", "v._dense_var_to_tensor"): (
        "the conversion function registered for dpkeras's own ShardedParameterVariable calls "
        "that class's implementation of TensorFlow's conversion protocol"
    ),
}


def _private_attributes(tree):
    """`x._name` expressions (unparsed) whose object is not `self`, `cls` or `super()`."""
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and node.attr.startswith("_")):
            continue
        if node.attr.startswith("__"):
            continue
        owner = node.value
        if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
            continue
        if isinstance(owner, ast.Call) and getattr(owner.func, "id", None) == "super":
            continue
        if isinstance(owner, ast.Name) and owner.id in ("_tf_internals", "_keras_internals"):
            continue  # dpkeras's own modules of private uses, named for it
        found.append(ast.unparse(node))
    return found


def test_private_attributes_of_other_objects_only_in_the_internals_modules():
    found = set()
    for name, path in _modules().items():
        if name not in INTERNALS:
            _, tree = _parse(path)
            found |= {(name, expression) for expression in _private_attributes(tree)}
    assert found == set(PRIVATE_ATTRIBUTES_ALLOWED), (
        "A private attribute of a TensorFlow or Keras object is used outside "
        "dpkeras/_tf_internals.py and dpkeras/_keras_internals.py (route it through them, with "
        "the reason), or an allowed exception is gone (remove it from the list): "
        f"{sorted(found ^ set(PRIVATE_ATTRIBUTES_ALLOWED))}"
    )


def test_the_private_attribute_check_sees_one():
    tree = ast.parse("v = variable._unique_id\nself._ok = super()._also_ok\n")
    assert _private_attributes(tree) == ["variable._unique_id"]


_EXTENDED_HOOKS = (
    "a tf.distribute extended class is written by overriding these hooks: tf.distribute.Strategy "
    "calls them (TensorFlow's own strategies override the same ones)"
)
_CHECKPOINT_PROTOCOL = (
    "TensorFlow's checkpoint protocol for a Trackable: save and restore the whole value, so "
    "files move across shard counts"
)

# TensorFlow and Keras private members that dpkeras classes override (or define because
# TensorFlow reads them by name), each with its reason. Each must still exist in the installed
# TensorFlow, so that an upgrade that renames one fails here, not silently in training.
PRIVATE_HOOKS_OVERRIDDEN = {
    "ParameterDeviceExtended": (
        {
            "_num_replicas_in_sync",
            "_in_multi_worker_mode",
            "_create_variable",
            "_validate_colocate_with_variable",
            "_call_for_each_replica",
            "_use_merge_call",
            "_reduce_to",
            "_batch_reduce_to",
            "_gather_to_implementation",
            "_broadcast_to",
            "_update",
            "_update_non_slot",
            "_experimental_distribute_dataset",
            "_distribute_datasets_from_function",
            "_experimental_distribute_values_from_function",
        },
        _EXTENDED_HOOKS,
    ),
    "WholeVariable": (
        {"_read_variable_op", "_strided_slice_assign"},
        "every dense read of a resource variable goes through `_read_variable_op` (the replica "
        "read cache hooks in there); slice assignment writes through `_strided_slice_assign`, "
        "which must drop that cache",
    ),
    "ParameterVariable": (
        {"_read_variable_op", "_strided_slice_assign"},
        "a WholeVariable (its reads and slice assignment as there)",
    ),
    "ReplicatedVariable": (
        {
            "_read_variable_op",
            "_strided_slice_assign",
            "_restore_from_tensors",
            "_export_to_saved_model_graph",
        },
        "a WholeVariable (its reads and slice assignment as there); a checkpoint restores "
        "through `_restore_from_tensors`, which must write every copy, not only the current one; "
        "a SavedModel saves through `_export_to_saved_model_graph`, which must map every copy's "
        "handle to the one variable it exports",
    ),
    "ShardedParameterVariable": (
        {"_variable_call", "_shared_name"},
        "tf.Variable's metaclass calls `_variable_call` to construct (a subclass returns None "
        "to be built as itself); saving names a variable by `_shared_name`",
    ),
    "ShardedParameterVariable ": (
        {
            "_serialize_to_tensors",
            "_restore_from_tensors",
            "_copy_trackable_to_cpu",
            "_export_to_saved_model_graph",
        },
        _CHECKPOINT_PROTOCOL,
    ),
    "_IteratorAtFirstUse": (
        {"_iterators", "_element_spec"},
        "TensorFlow's DistributedIterator keeps its input hosts' iterators in the instance "
        "attribute `_iterators` (read by `get_next` and by `tf.function` through its type spec): "
        "a property in its place makes them when first read. `_element_spec` is set after "
        "`__init__`, as TensorFlow's `DistributedDataset.__iter__` sets it on its iterator",
    ),
}

# TensorFlow and Keras private members that dpkeras classes read through `self` without
# overriding them (the state TensorFlow's `__init__` leaves, methods of the base), each with its
# reason; each must still be TensorFlow's.
_AT_FIRST_USE = (
    "`__iter__` makes the iterator TensorFlow's own `__iter__` would make, from what TensorFlow's "
    "`__init__` keeps: the hosts' pipelines, input hosts, options, strategy and spec"
)
PRIVATE_MEMBERS_READ = {
    "ParameterDeviceExtended": (
        {"_container_strategy", "_local_results"},
        "StrategyExtendedV1's own answers: the strategy this extended class belongs to, and a "
        "distributed value's per-replica components",
    ),
    "ReplicatedVariable": (
        {"_handle"},
        "each copy's resource handle, the one TensorFlow's resource variable reads and writes",
    ),
    "_DatasetAtFirstUse": (
        {
            "_built",
            "_cardinality",
            "_cloned_datasets",
            "_element_spec",
            "_enable_get_next_as_optional",
            "_input_workers",
            "_options",
            "_replica_order",
            "_strategy",
        },
        _AT_FIRST_USE,
    ),
    "_DatasetsFromFunctionAtFirstUse": (
        {
            "_built",
            "_cardinality",
            "_datasets",
            "_element_spec",
            "_enable_get_next_as_optional",
            "_input_contexts",
            "_input_workers",
            "_options",
            "_replica_order",
            "_strategy",
        },
        _AT_FIRST_USE,
    ),
}


def _dpkeras_classes_over_tf_and_keras():
    """dpkeras's classes deriving from TensorFlow's or Keras's, from the dpkeras imported (the
    installed wheel's under the version matrix, tests/matrix.txt)."""
    import importlib
    import inspect
    import pkgutil

    import dpkeras

    classes = {}
    names = ["dpkeras"] + [m.name for m in pkgutil.walk_packages(dpkeras.__path__, "dpkeras.")]
    for name in names:
        if name.endswith("__main__"):
            continue
        module = importlib.import_module(name)
        for cls in vars(module).values():
            if inspect.isclass(cls) and cls.__module__ == name:
                bases = [b for b in cls.__mro__[1:] if b.__module__.startswith(PRIVATE_OWNERS)]
                if bases:
                    classes[cls.__name__] = (cls, bases)
    return classes


PRIVATE_OWNERS = ("tensorflow", "keras")


def _on_self(cls, assigned):
    """Names of `self.x` in `cls`'s own source: those assigned (`self._x = ...`, instance
    attributes, which `vars(cls)` does not show) or, with `assigned=False`, all of them. Empty
    when the source cannot be read (a class written in C)."""
    try:
        tree = ast.parse(inspect.cleandoc("\n" + inspect.getsource(cls)))
    except (OSError, TypeError):
        return set()
    nodes = ast.walk(tree)
    if assigned:
        nodes = [
            node
            for statement in ast.walk(tree)
            if isinstance(statement, (ast.Assign, ast.AugAssign, ast.AnnAssign))
            for target in getattr(statement, "targets", [getattr(statement, "target", None)])
            for node in ast.walk(target)
        ]
    return {
        node.attr
        for node in nodes
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    }


def _members(cls):
    """A class's own members: its attributes and the instance attributes its source sets."""
    return set(vars(cls)) | _on_self(cls, assigned=True)


def _private(name):
    return name.startswith("_") and not name.startswith("__") and name != "_abc_impl"


def _listed(table):
    listed = {}
    for owner, (names, _reason) in table.items():
        listed.setdefault(owner.strip(), set()).update(names)
    return listed


def test_overridden_private_hooks_are_listed_and_still_exist():
    overridden = {}
    for class_name, (cls, bases) in _dpkeras_classes_over_tf_and_keras().items():
        own = [k for k in cls.__mro__ if k.__module__.startswith("dpkeras")]  # mixins too
        theirs = {a for b in bases for a in _members(b)}
        for attribute in {a for k in own for a in _members(k)}:
            if _private(attribute) and attribute in theirs:
                overridden.setdefault(class_name, set()).add(attribute)
    listed = _listed(PRIVATE_HOOKS_OVERRIDDEN)
    assert overridden == listed, (
        "dpkeras overrides a private TensorFlow/Keras member that is not listed (list it, with "
        "the reason), or a listed one is no longer overridden or no longer exists in the "
        f"installed TensorFlow/Keras: overridden {overridden}, listed {listed}"
    )


def test_private_members_read_through_self_are_listed_and_still_exist():
    read, gone = {}, {}
    for class_name, (cls, bases) in _dpkeras_classes_over_tf_and_keras().items():
        own = [k for k in cls.__mro__ if k.__module__.startswith("dpkeras")]  # mixins too
        ours = {a for k in own for a in _members(k)}
        theirs = {a for b in bases for a in _members(b)}
        for attribute in {a for k in own for a in _on_self(k, assigned=False)} - ours:
            if _private(attribute):
                read.setdefault(class_name, set()).add(attribute)
                if attribute not in theirs:
                    gone.setdefault(class_name, set()).add(attribute)
    listed = _listed(PRIVATE_MEMBERS_READ)
    assert read == listed and not gone, (
        "a dpkeras class reads a private TensorFlow/Keras member through `self` that is not "
        "listed (list it, with the reason), a listed one is no longer read, or one is no longer "
        f"TensorFlow's: read {read}, listed {listed}, no longer TensorFlow's {gone}"
    )


def test_the_hook_checks_see_instance_attributes():
    """TensorFlow's DistributedIterator sets `_iterators` in `__init__`: not in `vars()`."""
    from dpkeras import _tf_internals

    iterator = _tf_internals.DistributedIterator
    assert "_iterators" not in vars(iterator)
    assert "_iterators" in _members(iterator)
    assert "_iterators" in _on_self(iterator, assigned=False)


# -- the public API: stated once ------------------------------------------------------------

PUBLIC_MODULES = {
    "dpkeras",
    "dpkeras.placement",
    "dpkeras.tf1",
    "dpkeras.cluster",
    "dpkeras.layers",
    "dpkeras.testing",
}


def _declares_all(tree):
    return any(
        isinstance(node, ast.Assign)
        and any(getattr(t, "id", None) == "__all__" for t in node.targets)
        for node in tree.body
    )


def test_public_modules_declare_their_names_and_every_other_module_is_private():
    wrong = []
    for name, path in _modules().items():
        _, tree = _parse(path)
        if name in PUBLIC_MODULES:
            if not _declares_all(tree):
                wrong.append(f"{name} is public but has no __all__")
            continue
        parts = name.split(".")[1:]
        if name != "dpkeras.__main__" and not any(p.startswith("_") for p in parts):
            wrong.append(f"{name} is neither public nor underscore-named")
        if _declares_all(tree):
            wrong.append(f"{name} is private but declares __all__")
    assert wrong == []
    assert PUBLIC_MODULES <= set(_modules())


_DOTTED = re.compile(r"(?<![\w/.])dpkeras(?:\.[A-Za-z_]\w*)+")


def _public_path(dotted):
    """None if `dpkeras.a.b...` names something public, else why not."""
    import importlib

    import dpkeras

    parts = dotted.split(".")[1:]
    obj, where = dpkeras, "dpkeras"
    for part in parts:
        if part.startswith("_") and not part.startswith("__"):
            return f"{dotted}: {part} is private"
        if part in ("__all__", "__version__"):
            return None
        if isinstance(obj, type(dpkeras)) and where in PUBLIC_MODULES:
            if part not in getattr(obj, "__all__", ()) and f"{where}.{part}" not in PUBLIC_MODULES:
                return f"{dotted}: {part} is not in {where}.__all__"
        if f"{where}.{part}" in PUBLIC_MODULES:
            obj = importlib.import_module(f"{where}.{part}")
        elif hasattr(obj, part):
            obj = getattr(obj, part)
        else:
            return f"{dotted}: {where} has no {part}"
        where = f"{where}.{part}"
    return None


def test_the_readme_and_docs_name_only_public_things():
    documents = ["README.md"] + [
        os.path.join("docs", f) for f in sorted(os.listdir(os.path.join(ROOT, "docs")))
    ]
    found = []
    for document in documents:
        if not document.endswith(".md"):
            continue
        with open(os.path.join(ROOT, document), encoding="utf-8") as f:
            text = f.read()
        for dotted in sorted(set(_DOTTED.findall(text))):
            why = _public_path(dotted.rstrip("."))
            if why is not None:
                found.append(f"{document}: {why}")
    assert found == []


def test_the_public_name_check_sees_a_private_one():
    assert _public_path("dpkeras.scope") is None
    assert _public_path("dpkeras.cluster.TaskFailedError") is None
    assert "private" in _public_path("dpkeras._patches.uninstall")
    assert "not in dpkeras.cluster.__all__" in _public_path("dpkeras.cluster.watch")


_MUTATORS = {"add", "discard", "append", "extend", "insert", "remove", "pop", "update", "clear"}
_MUTATORS |= {"lock", "unlock", "setdefault"}


def _writes(tree):
    """Changes to objects a function did not make: `x.a = ...`, `x[i] = ...` (x not `self`),
    `setattr(...)`, `delattr(...)`, and mutating calls on a parameter of the function."""
    found = []
    for function in ast.walk(tree):
        if not isinstance(function, (ast.FunctionDef, ast.Lambda)):
            continue
        params = {a.arg for a in function.args.args + function.args.kwonlyargs} - {"self"}
        for node in ast.walk(function):
            targets = []
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                targets = [node.target]
            for target in targets:
                if isinstance(target, (ast.Attribute, ast.Subscript)):
                    root = target.value
                    while isinstance(root, (ast.Attribute, ast.Subscript)):
                        root = root.value
                    if not (isinstance(root, ast.Name) and root.id == "self"):
                        found.append(ast.unparse(target))
            if isinstance(node, ast.Call):
                name = ast.unparse(node.func)
                if name in ("setattr", "delattr"):
                    found.append(name)
                elif isinstance(node.func, ast.Attribute) and node.func.attr in _MUTATORS:
                    owner = node.func.value
                    while isinstance(owner, (ast.Attribute, ast.Subscript)):
                        owner = owner.value
                    if isinstance(owner, ast.Name) and owner.id in params:
                        found.append(name)
    return found


def test_the_internals_modules_only_answer_questions():
    """`_keras_internals` and `_tf_internals` read TF and Keras; every change is in `_patches/`."""
    modules = _modules()
    found = {(name, w) for name in INTERNALS for w in _writes(_parse(modules[name])[1])}
    assert not found, (
        "An internals module changes a TensorFlow or Keras object; make it an entry of "
        f"dpkeras/_patches/ and leave the internals module the question: {sorted(found)}"
    )


def test_the_write_check_sees_one():
    tree = ast.parse(
        "def f(callback, layer):\n    callback._epoch = 1\n    layer.stores.add(2)\n"
        "    setattr(layer, 'a', 3)\n    self.x = 4\n    seen = set()\n    seen.add(5)\n"
    )
    assert sorted(_writes(tree)) == ["callback._epoch", "layer.stores.add", "setattr"]
