"""One map of the package, held against the tree: each subpackage's `__init__` docstring names
its modules (a bullet each, `- `module`: what it holds`), `dpkeras/__init__.py` names every
subpackage and top-level module, and README.md's table of packages names each of them once.

Parsed from the source; nothing is imported. A renamed, added or removed module fails here
until the map says so.
"""

import ast
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "dpkeras")
_BULLET = re.compile(r"^- `([\w.]+)`", re.M)
_NAMED = re.compile(r"`([\w.]+/?)`")


def _docstring(path):
    with open(path, encoding="utf-8") as f:
        return ast.get_docstring(ast.parse(f.read())) or ""


def _subpackages(root=PACKAGE):
    return sorted(
        name for name in os.listdir(root) if os.path.isfile(os.path.join(root, name, "__init__.py"))
    )


def _modules_of(package, root=PACKAGE):
    folder = os.path.join(root, package)
    return sorted(f[:-3] for f in os.listdir(folder) if f.endswith(".py") and f != "__init__.py")


def _subpackage_map_errors(root=PACKAGE):
    wrong = []
    for package in _subpackages(root):
        text = _docstring(os.path.join(root, package, "__init__.py"))
        modules = set(_modules_of(package, root))
        named = set(_NAMED.findall(text))
        missing = sorted(m for m in modules if m not in named)
        bullets = [b for b in _BULLET.findall(text) if b not in modules]
        if missing:
            wrong.append(f"{package}/__init__.py does not name {missing}")
        if bullets:
            wrong.append(f"{package}/__init__.py lists {bullets}, not modules of it")
    return wrong


def _top_level_modules():
    return sorted(
        f[:-3]
        for f in os.listdir(PACKAGE)
        if f.endswith(".py") and f not in ("__init__.py", "__main__.py")
    )


def test_each_subpackage_names_its_modules_and_only_them():
    assert _subpackage_map_errors() == []


def test_the_package_docstring_names_every_subpackage_and_module():
    text = _docstring(os.path.join(PACKAGE, "__init__.py"))
    named = {n.rstrip("/") for n in _NAMED.findall(text)}
    missing = [n for n in _subpackages() + _top_level_modules() if n not in named]
    stale = [
        n for n in _NAMED.findall(text) if n.endswith("/") and n.rstrip("/") not in _subpackages()
    ]
    assert missing == [] and stale == []


def _readme_table():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        lines = f.read().splitlines()
    start = lines.index("| package | what it holds |")
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append(line.split("|")[1])
    return rows


def test_the_readme_table_names_each_package_and_module_once_and_nothing_else():
    named = [n for row in _readme_table() for n in _NAMED.findall(row)]
    names = [n[:-1] if n.endswith("/") else n.removesuffix(".py") for n in named]
    expected = _subpackages() + _top_level_modules()
    assert sorted(names) == sorted(expected), (
        sorted(set(expected) - set(names)),
        sorted(set(names) - set(expected)),
    )


def test_the_map_check_sees_a_missing_module_and_a_stale_one(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text('"""A package.\n\n- `a`: one.\n- `c`: gone.\n"""\n')
    (package / "a.py").write_text("")
    (package / "b.py").write_text("")
    assert _subpackage_map_errors(str(tmp_path)) == [
        "pkg/__init__.py does not name ['b']",
        "pkg/__init__.py lists ['c'], not modules of it",
    ]
