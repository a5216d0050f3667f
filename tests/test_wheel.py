"""The wheel holds every module of dpkeras and nothing else: built from a copy of the checkout
with the standard `build` frontend (without isolation: the dev environment's setuptools), its
contents listed. `make wheel-test` installs such a wheel in a fresh environment and runs it."""

import email
import os
import shutil
import subprocess
import sys
import zipfile

import pytest

import dpkeras

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD_TIMEOUT = 300
# .nox/: the version matrix's virtual environments (noxfile.py), several GB.
_NOT_SOURCE = (".venv", ".nox", ".git", "__pycache__", "build", "dist", "*.egg-info", "results")
_NOT_SOURCE += (".*cache",)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """The wheel of this checkout, as `python -m build --wheel` makes it."""
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "source"  # a copy: building writes build/ and *.egg-info beside the sources
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(*_NOT_SOURCE))
    proc = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(tmp), "."],
        cwd=source,
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    path = tmp / f"dpkeras-{dpkeras.__version__}-py3-none-any.whl"
    assert path.is_file(), sorted(os.listdir(tmp))
    with zipfile.ZipFile(path) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def _modules_on_disk():
    found = set()
    for folder, dirs, files in os.walk(os.path.join(ROOT, "dpkeras")):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        found |= {
            os.path.relpath(os.path.join(folder, f), ROOT).replace(os.sep, "/")
            for f in files
            if f.endswith(".py")
        }
    return found


def test_the_wheel_holds_every_module_of_dpkeras_and_nothing_else(wheel):
    info = f"dpkeras-{dpkeras.__version__}.dist-info/"
    modules = {name for name in wheel if not name.startswith(info)}
    assert modules == _modules_on_disk()
    packages = {os.path.dirname(name) for name in modules if name.endswith("/__init__.py")}
    assert {"dpkeras/_cli", "dpkeras/cluster", "dpkeras/testing", "dpkeras/tf1"} <= packages
    assert not [n for n in wheel if n.startswith(("tests/", "benchmarks/", "docs/"))]
    assert f"{info}licenses/LICENSE" in wheel


def test_the_wheel_declares_the_command_version_and_supported_versions(wheel):
    info = f"dpkeras-{dpkeras.__version__}.dist-info/"
    assert "dpkeras = dpkeras._cli:main" in wheel[f"{info}entry_points.txt"].decode()
    metadata = email.message_from_bytes(wheel[f"{info}METADATA"])
    assert metadata["Version"] == dpkeras.__version__
    assert metadata["License-Expression"] == "Apache-2.0"
    assert metadata["Requires-Python"] == ">=3.10"
    requires = {r.split(";")[0].replace(" ", "") for r in metadata.get_all("Requires-Dist")}
    assert {"tensorflow<2.22,>=2.16", "keras<3.16,>=3.8"} <= requires  # the span, _version.py


def test_tf_keras_is_only_the_benchmark_peers_extra_never_a_dependency(wheel):
    """tf-keras (the cluster benchmark's ParameterServerStrategy and tf-keras MWMS peers) is
    the `peers` extra alone: not a dependency of dpkeras, and not in `dev` (issue 43)."""
    info = f"dpkeras-{dpkeras.__version__}.dist-info/"
    metadata = email.message_from_bytes(wheel[f"{info}METADATA"])
    plain, by_extra = set(), {}
    for requirement in metadata.get_all("Requires-Dist"):
        name, _, marker = requirement.partition(";")
        name = name.replace(" ", "")
        if "extra" in marker:
            by_extra.setdefault(marker.split("==")[-1].strip(" \"'"), set()).add(name)
        else:
            plain.add(name)
    assert {r.split("<")[0].split(">")[0] for r in plain} == {"tensorflow", "keras", "absl-py"}
    assert [extra for extra, names in by_extra.items() if any("tf-keras" in n for n in names)] == [
        "peers"
    ]
    assert not [n for n in by_extra["dev"] if "peers" in n], by_extra["dev"]
