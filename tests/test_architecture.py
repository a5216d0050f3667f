"""The shape of the package: no import cycles, private TF/Keras only in the internals
modules, small modules and classes, one formatter.

Parsed from the source with `ast`; nothing is imported.
"""

import ast
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
    assert {"dpkeras.tf1.store", "dpkeras.tf1.scopes", "dpkeras.tf1.collections"} <= set(tf1)
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
    tree = ast.parse("from dpkeras.tf1.store import _Blocks, VariableStore\n")
    assert _underscore_imports(tree, {"dpkeras.tf1.store"}) == [("dpkeras.tf1.store", "_Blocks")]


def test_every_package_is_installed_by_pyproject():
    """A non-editable `pip install .` installs only the packages pyproject lists."""
    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as f:
        text = f.read()  # tomllib is Python 3.11+; dpkeras supports 3.10
    section = text.split("[tool.setuptools]", 1)[1].split("\n[", 1)[0]
    listed = set(re.findall(r'"([^"]+)"', re.search(r"packages = \[(.*?)\]", section, re.S)[1]))
    packages = {name for name, path in _modules().items() if path.endswith("__init__.py")}
    assert listed == packages


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
