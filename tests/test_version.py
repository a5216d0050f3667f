"""One version everywhere: `dpkeras.__version__` (from dpkeras/_version.py), the installed
package's metadata, CHANGELOG.md's newest released heading, and `dpkeras env`, which prints
it (the benchmark's header, in benchmarks/, is checked in tests/test_benchmark.py). One
supported span of TensorFlow and Keras everywhere: dpkeras/_version.py, pyproject.toml's
ranges, the matrix (noxfile.py, tests/matrix.txt, CI's oldest pair), the one-line refusal."""

import ast
import importlib.metadata
import io
import os
import re

import pytest

import dpkeras
from dpkeras import _version
from dpkeras._cli import env as env_command

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEMVER = r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"


def _changelog_headings():
    """`(version, date)` of each `## [version] - date` heading, newest first."""
    with open(os.path.join(ROOT, "CHANGELOG.md"), encoding="utf-8") as f:
        text = f.read()
    return re.findall(r"^## \[([^\]]+)\](?: - (\S+))?$", text, re.M)


def test_the_version_is_semantic():
    assert re.fullmatch(SEMVER, dpkeras.__version__), dpkeras.__version__


def test_the_installed_metadata_has_the_same_version():
    installed = importlib.metadata.version("dpkeras")
    assert installed == dpkeras.__version__, (
        f"the installed metadata says {installed}, dpkeras/_version.py {dpkeras.__version__}: "
        f"reinstall (`make install`)"
    )


def test_the_newest_released_changelog_heading_is_this_version():
    released = [(v, date) for v, date in _changelog_headings() if v != "Unreleased"]
    assert released, "CHANGELOG.md has no released version"
    assert released[0][0] == dpkeras.__version__
    for version, date in released:
        assert re.fullmatch(SEMVER, version), version
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", date or ""), f"{version}: date {date!r}"
    numbers = [tuple(int(n) for n in v.split(".")) for v, _ in released]
    assert numbers == sorted(numbers, reverse=True), "newest first, each version once"
    assert len(set(numbers)) == len(numbers)


def test_dpkeras_env_prints_the_version():
    out = io.StringIO()
    assert env_command.env([], out=out) in (0, None)
    assert out.getvalue().startswith(f"dpkeras {dpkeras.__version__} (")


# -- the supported span (dpkeras/_version.py) --------------------------------------------------


def _requirement_bounds(package):
    """`(oldest, first excluded)` minor releases of `package` in pyproject.toml's dependencies."""
    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as f:
        text = f.read()
    low, high = re.search(rf'"{package}>=(\d+\.\d+),<(\d+\.\d+)"', text).groups()
    return _version.minor(low), _version.minor(high)


def test_pyproject_ranges_are_the_span():
    for package, (oldest, newest) in (
        ("tensorflow", _version.TENSORFLOW),
        ("keras", _version.KERAS),
    ):
        low, high = _requirement_bounds(package)
        assert low == oldest and high == (newest[0], newest[1] + 1), (package, low, high)


@pytest.mark.parametrize(
    "tensorflow, keras, advice",
    [
        ("2.16.2", "3.8.0", None),
        ("2.21.0", "3.15.1", None),
        ("2.20.0", "3.10.0", None),
        ("2.21.0", "3.12.4", None),
        ("2.19.0rc1", "3.11.0.dev2025", None),
        ("2.15.1", "3.15.1", r"TensorFlow 2\.16-2\.21"),
        ("2.22.0", "3.16.0", r"TensorFlow 2\.16-2\.21 and Keras 3\.8-3\.15"),
        ("2.16.2", "3.7.0", r"Keras 3\.8-3\.15 beside it"),
        ("2.20.0", "3.9.2", r"Keras 3\.10-3\.15 beside it"),
        ("2.21.0", "3.8.0", r"Keras 3\.12-3\.15 beside it"),
    ],
)
def test_a_pair_outside_the_span_is_named_in_one_line(tensorflow, keras, advice):
    found = _version.unsupported(tensorflow, keras)
    if advice is None:
        assert found is None
        return
    assert re.fullmatch(
        rf"dpkeras {re.escape(dpkeras.__version__)} supports TensorFlow 2\.16-2\.21 with Keras "
        rf"3\.8-3\.15 \(Keras 3\.10-3\.15 with TensorFlow 2\.20, Keras 3\.12-3\.15 with "
        rf"TensorFlow 2\.21\); found TensorFlow {re.escape(tensorflow)} and Keras "
        rf"{re.escape(keras)}\. Install {advice} \(README, \"Versions\"\)\.",
        found,
    ), found


def test_the_versions_in_use_are_in_the_span():
    import keras
    import tensorflow as tf

    assert _version.unsupported(tf.__version__, keras.__version__) is None
    _version.check_supported()


def test_dpkeras_env_says_whether_the_pair_is_in_the_span():
    out = io.StringIO()
    env_command.env([], out=out)
    assert re.search(
        r"^Supported: TensorFlow 2\.16-2\.21 with Keras 3\.8-3\.15 \(this pair is in the span\)$",
        out.getvalue(),
        re.M,
    ), out.getvalue()
    assert re.fullmatch(
        r"NOT supported: dpkeras \S+ supports .*; found TensorFlow 2\.15\.1 and Keras 3\.15\.1\. "
        r"Install TensorFlow 2\.16-2\.21 \(README, \"Versions\"\)\.",
        env_command._span_line("2.15.1", "3.15.1"),
    )


def _matrix_pairs():
    """noxfile.py's PAIRS, read without importing nox."""
    with open(os.path.join(ROOT, "noxfile.py"), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    node = next(
        n for n in tree.body if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "PAIRS"
    )
    return ast.literal_eval(node.value)


def test_the_matrix_covers_both_ends_of_the_span_and_only_the_span():
    pairs = _matrix_pairs()
    for tensorflow, keras in pairs:
        assert _version.unsupported(tensorflow, keras) is None, (tensorflow, keras)
    by_tensorflow = {}
    for tensorflow, keras in pairs:
        by_tensorflow.setdefault(_version.minor(tensorflow), set()).add(_version.minor(keras))
    oldest, newest = _version.TENSORFLOW
    assert oldest in by_tensorflow and newest in by_tensorflow
    assert len(by_tensorflow) >= 3, "the oldest, a middle and the newest TensorFlow"
    for tensorflow, kerases in by_tensorflow.items():
        if tensorflow in (oldest, newest):
            span = _version.keras_span(f"{tensorflow[0]}.{tensorflow[1]}")
            assert set(span) <= kerases, (tensorflow, kerases)


def test_every_test_the_matrix_runs_exists():
    with open(os.path.join(ROOT, "tests", "matrix.txt"), encoding="utf-8") as f:
        ids = [line.split("#")[0].strip() for line in f]
    ids = [i for i in ids if i]
    assert ids
    for test_id in ids:
        path, _, name = test_id.split("[")[0].partition("::")
        assert os.path.isfile(os.path.join(ROOT, path)), test_id
        if name:
            with open(os.path.join(ROOT, path), encoding="utf-8") as f:
                defined = {
                    n.name for n in ast.walk(ast.parse(f.read())) if isinstance(n, ast.FunctionDef)
                }
            assert name in defined, test_id


def test_ci_runs_the_matrix_session_of_the_oldest_pair():
    oldest = _version.TENSORFLOW[0]
    keras = _version.keras_span(f"{oldest[0]}.{oldest[1]}")[0]
    session = f"matrix(tf{oldest[0]}.{oldest[1]}-keras{keras[0]}.{keras[1]})"
    pairs = {(_version.minor(t), _version.minor(k)) for t, k in _matrix_pairs()}
    assert (oldest, keras) in pairs
    with open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8") as f:
        lines = [line for line in f if line.startswith("make matrix")]
    assert lines and f"-s '{session}'" in lines[0], lines


# -- review (breaker): version promises no test above held -------------------------------------


@pytest.mark.parametrize(
    "tensorflow, keras, supported",
    [
        ("2.21.0", "3.8.0", False),  # TensorFlow in the span, Keras below its floor
        ("2.20.0", "3.9.2", False),
        ("2.16.2", "3.16.0", False),  # Keras past the span
        ("2.16.2", "3.7.0", False),
        ("2.20.0", "3.10.0", True),
        ("2.16.2", "3.15.1", True),
    ],
)
def test_dpkeras_env_judges_the_keras_too_not_only_the_tensorflow(tensorflow, keras, supported):
    line = env_command._span_line(tensorflow, keras)
    if supported:
        assert line.startswith("Supported: ") and "(this pair is in the span)" in line, line
    else:
        assert line == f"NOT supported: {_version.unsupported(tensorflow, keras)}", line


def test_dpkeras_env_runs_and_says_so_outside_the_span(monkeypatch):
    """`dpkeras env` is what a user outside the span runs to learn why: it must not refuse."""
    import tensorflow as tf

    monkeypatch.setattr(tf, "__version__", "2.15.1")
    out = io.StringIO()
    assert env_command.env([], out=out) in (0, None)
    assert re.search(
        r"^NOT supported: dpkeras \S+ supports .*; found TensorFlow 2\.15\.1 and Keras ",
        out.getvalue(),
        re.M,
    ), out.getvalue()


def test_the_extras_ask_for_a_tensorflow_and_keras_within_the_span():
    """An extra naming tensorflow or keras (rs: `tensorflow>=2.17`) narrows the span, never
    leaves it: it admits the newest pair (the suite's) and nothing outside the span."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    from packaging.requirements import Requirement

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        extras = tomllib.load(f)["project"]["optional-dependencies"]
    bounds = {"tensorflow": _version.TENSORFLOW, "keras": _version.KERAS}
    found = []
    for extra, requirements in extras.items():
        for text in requirements:
            requirement = Requirement(text)
            if requirement.name not in bounds:
                continue
            (oldest_major, oldest), (newest_major, newest) = bounds[requirement.name]
            found.append(extra)
            admitted = {
                m for m in range(oldest - 3, newest + 4)
                if requirement.specifier.contains(f"{oldest_major}.{m}.0", prereleases=True)
            }  # fmt: skip
            assert newest in admitted, (extra, text)
            inside = set(range(oldest, newest + 1))
            assert admitted & inside, (extra, text)
    assert "rs" in found


def test_the_ci_session_and_every_pair_are_sessions_nox_lists():
    """`make matrix ARGS="-s 'matrix(tf2.16-keras3.8)'"` selects a session only if noxfile.py
    names its sessions so: `nox -l` lists one per pair, named by the pair's minor releases."""
    import subprocess
    import sys

    pytest.importorskip("nox")
    listed = subprocess.run(
        [sys.executable, "-m", "nox", "-f", os.path.join(ROOT, "noxfile.py"), "-l"],
        capture_output=True, text=True, check=True, cwd=ROOT,
    ).stdout  # fmt: skip
    sessions = set(re.findall(r"^\* (matrix\([^)]*\))", listed, re.M))
    expected = {
        f"matrix(tf{'.'.join(map(str, _version.minor(t)))}-keras"
        f"{'.'.join(map(str, _version.minor(k)))})"
        for t, k in _matrix_pairs()
    }
    assert sessions == expected, (sessions, expected)
    with open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8") as f:
        named = re.findall(r"-s '([^']+)'", f.read())
    assert named and set(named) <= sessions, (named, sessions)


def test_the_matrix_runs_the_tests_of_what_differs_within_the_span():
    """tests/matrix.txt runs, on each pair, the tests of the version checks and of the Keras
    internals that differ within the span: the span's checks, the patch table's signatures,
    and resuming mid-epoch (Keras's epoch enumeration differs before 3.11)."""
    with open(os.path.join(ROOT, "tests", "matrix.txt"), encoding="utf-8") as f:
        ids = {line.split("#")[0].strip() for line in f} - {""}
    assert {"tests/test_version.py", "tests/test_keras_patches.py"} <= ids
    for test in (
        "test_a_mid_epoch_backup_resumes_at_the_next_batch_exactly",
        "test_a_straddling_group_reports_its_true_first_step_to_callbacks",
    ):
        assert f"tests/test_resume_mid_epoch.py::{test}" in ids, test
