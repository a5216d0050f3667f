"""One version everywhere: `dpkeras.__version__` (from dpkeras/_version.py), the installed
package's metadata, CHANGELOG.md's newest released heading, and `dpkeras env`, which prints
it (the benchmark's header, in benchmarks/, is checked in tests/test_benchmark.py)."""

import importlib.metadata
import io
import os
import re

import dpkeras
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
