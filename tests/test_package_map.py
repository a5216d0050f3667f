"""One map of the package, held against the tree: each subpackage's `__init__` docstring names
its modules (a bullet each, `- `module`: what it holds`), `dpkeras/__init__.py` names every
subpackage and top-level module, and README.md's table of packages names each of them once.

The floors: `dpkeras/__init__.py`'s docstring lists the rooms (each subpackage, each top-level
module) floor by floor from the top, and every `import dpkeras...` of every module (at its top,
in a function, or for type checkers alone) stays in its own room or goes down.

Parsed from the source; nothing is imported. A renamed, added or removed module, or an import
that climbs, fails here until the map says so.
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


# The floors of `dpkeras/__init__.py`'s docstring: one bullet a floor, from the top; each room
# is `name`: or `name/`: at the bullet's start or after a semicolon.
_FLOORS_START = "The package, floor by floor from the top."
_ROOM = re.compile(r"(?:^- |; )`(\w+)/?`:")

# Imports that climb, each with why it is still there; a fixed one must leave this list.
CLIMBS_BACK_UP = {
    ("dpkeras._serializable", "dpkeras._dynamic.layer"): (
        "the stand-in registered for `DynamicEmbedding` imports its class by name when a file "
        "that names it is loaded: `import dpkeras` registers it without importing TensorFlow"
    ),
    ("dpkeras", "dpkeras.testing"): (
        "`dpkeras.testing`, a public module, is reached as an attribute of `dpkeras` and imported "
        "when first used (`_EXPORTS`): `import dpkeras` does not import it"
    ),
}


def _floors(root=PACKAGE):
    """The rooms of each floor of the map, from the top: `[["__main__"], ["_cli", ...], ...]`."""
    text = _docstring(os.path.join(root, "__init__.py"))
    lines = text[text.index(_FLOORS_START) :].splitlines()[1:]
    bullets = []
    for line in lines:
        if line.startswith("- "):
            bullets.append(line)
        elif line.startswith("  ") and bullets:
            bullets[-1] += " " + line.strip()
        elif bullets and not line.strip():
            break
    return [_ROOM.findall(" ".join(b.split())) for b in bullets]


def _room_of(dotted, package):
    """The room of a module `package.a.b` (`a`); `package` itself is `__init__`."""
    parts = dotted.split(".")
    return "__init__" if len(parts) == 1 else parts[1]


def _imports(tree, dotted, package, root):
    """`(line, module imported)` of every import of `package` in `tree`, wherever it stands;
    `from package import name` is `package.name` for a room, else `package` (its public face)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == package]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:  # relative: from the importing module's package
                base = dotted.split(".")[: -node.level] if dotted != package else [package]
                module = ".".join(base + ([module] if module else []))
            if module.split(".")[0] != package:
                continue
            for alias in node.names:
                target = f"{module}.{alias.name}"
                if module == package and not (
                    os.path.isfile(os.path.join(root, f"{alias.name}.py"))
                    or os.path.isdir(os.path.join(root, alias.name))
                ):
                    target = package
                found.append((node.lineno, target))
    return found + _imports_by_name(tree, package, root)


def _imports_by_name(tree, package, root):
    """`(line, module)` of every module of `package` named by a string that imports it when
    first used: a lazy export table's value (`"scope": "dpkeras._strategy.scope"`, `_lazy`),
    an argument of a call (`importlib.import_module`, `dict.fromkeys`), an item of a tuple
    (`_serializable`'s stand-ins)."""
    named = re.compile(rf"{package}(\.\w+)+")
    strings = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            strings += node.values
        elif isinstance(node, ast.Call):
            strings += node.args
        elif isinstance(node, (ast.Tuple, ast.List)):
            strings += node.elts
    found = []
    for node in strings:
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
            continue
        if not named.fullmatch(node.value):
            continue
        path = os.path.join(os.path.dirname(root), *node.value.split("."))
        if os.path.isfile(path + ".py") or os.path.isdir(path):
            found.append((node.lineno, node.value))
    return found


def _map_errors(root=PACKAGE):
    """Rooms the map misplaces and imports that climb, as sentences (empty: the map holds)."""
    package = os.path.basename(root)
    floors = _floors(root)
    floor_of = {}
    wrong = []
    for number, rooms in enumerate(floors):
        for room in rooms:
            if room in floor_of:
                wrong.append(f"the map places {room} on two floors")
            floor_of[room] = number
    rooms = set(_subpackages(root)) | {
        f[:-3] for f in os.listdir(root) if f.endswith(".py") and f != "__init__.py"
    }
    rooms.add("__init__")
    wrong += [f"the map has no floor for {r}" for r in sorted(rooms - set(floor_of))]
    wrong += [f"the map names {r}, no room of {package}" for r in sorted(set(floor_of) - rooms)]
    climbing = set()
    for folder, folders, files in os.walk(root):
        folders.sort()
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            relative = os.path.relpath(path, os.path.dirname(root))[:-3]
            dotted = relative.replace(os.sep, ".").removesuffix(".__init__")
            source = _room_of(dotted, package)
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read())
            for line, target in _imports(tree, dotted, package, root):
                room = _room_of(target, package)
                if room == source or source not in floor_of or room not in floor_of:
                    continue
                if floor_of[room] > floor_of[source]:
                    continue
                known = [k for k in CLIMBS_BACK_UP if k[0] == dotted and target.startswith(k[1])]
                if known:
                    climbing.update(known)
                    continue
                wrong.append(
                    f"{relative}.py:{line} imports {target}: {room} stands on floor "
                    f"{floor_of[room] + 1}, not below {source} (floor {floor_of[source] + 1})"
                )
    return wrong, climbing


def test_the_package_map_places_every_room_on_one_floor_and_no_import_climbs():
    wrong, _ = _map_errors()
    assert wrong == [], "\n".join(wrong)


def test_every_import_listed_as_climbing_still_climbs():
    """A climbing import that was fixed leaves CLIMBS_BACK_UP."""
    _, climbing = _map_errors()
    assert climbing == set(CLIMBS_BACK_UP)


def test_the_floors_of_the_map_are_read_as_written():
    floors = _floors()
    assert floors[0] == ["__main__"] and floors[2] == ["__init__"]
    assert all(floors), floors
    assert "_tf_internals" in floors[-1] and "_version" in floors[-1]


def test_the_floor_check_sees_an_import_that_climbs_and_a_room_off_the_map(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text(
        '"""A package.\n\n' + _FLOORS_START + "\n\n"
        "- `__init__`: the face;\n- `top`: up; `sub/`: beside it;\n- `low`: down.\n"
        '"""\nfrom pkg import top\n'
    )
    (package / "top.py").write_text("import pkg.low\nfrom pkg.sub import a\n")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "a.py").write_text("from pkg.sub import b\n")
    (package / "low.py").write_text(
        "def f():\n    from pkg import top\n\nLAZY = {'up': 'pkg.sub.a', 'no': 'pkg.gone'}\n"
    )
    (package / "stray.py").write_text("")
    wrong, _ = _map_errors(str(package))
    assert wrong == [
        "the map has no floor for stray",
        "pkg/low.py:2 imports pkg.top: top stands on floor 2, not below low (floor 3)",
        "pkg/low.py:4 imports pkg.sub.a: sub stands on floor 2, not below low (floor 3)",
        "pkg/top.py:2 imports pkg.sub.a: sub stands on floor 2, not below top (floor 2)",
    ]


# A top-level document (`README.md`) or a page of docs/ (`docs/cluster.md`), as cited.
_CITED = re.compile(r"(?<![\w/.-])((?:docs/[\w-]+|[A-Z][A-Z_]+)\.md)\b")


def test_every_document_the_tree_cites_is_in_it():
    """Code, tests and docs cite only documents of the repository: a fact they rest on is
    stated where they are, or in a page of docs/ with its evidence."""
    missing = []
    for top in ("dpkeras", "tests", "benchmarks", "docs", "README.md", "BENCHMARKS.md"):
        path = os.path.join(ROOT, top)
        files = [path] if os.path.isfile(path) else []
        for folder, _, names in os.walk(path):
            files += [os.path.join(folder, n) for n in names if n.endswith((".py", ".md"))]
        for file in files:
            with open(file, encoding="utf-8") as f:
                for cited in set(_CITED.findall(f.read())):
                    if not os.path.isfile(os.path.join(ROOT, cited)):
                        missing.append(f"{os.path.relpath(file, ROOT)} cites {cited}")
    assert missing == [], missing
