"""dpkeras/_patches/atomic_files.py: the target is always its old or its new content.

The module imports only the standard library, so it is loaded here by path (importing it as
`dpkeras._patches.atomic_files` would run dpkeras/__init__.py, which imports TensorFlow), and the
kill test runs it in a fresh Python that imports neither TensorFlow nor Keras nor dpkeras.
"""

import importlib.util
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

MODULE = Path(__file__).resolve().parent.parent / "dpkeras" / "_patches" / "atomic_files.py"


def _load():
    spec = importlib.util.spec_from_file_location("atomic_files_under_test", MODULE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


atomic_files = _load()


def run_stdlib_python(code):
    """Runs `code` in a fresh Python with `atomic_files` loaded by path; returns the process."""
    prefix = textwrap.dedent(f"""
        import importlib.util, sys
        spec = importlib.util.spec_from_file_location("atomic_files", {str(MODULE)!r})
        atomic_files = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(atomic_files)
    """)
    return subprocess.run(
        [sys.executable, "-c", prefix + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def dead_pid():
    return int(
        subprocess.run(
            [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
        ).stdout
    )


def test_imports_only_the_standard_library():
    proc = run_stdlib_python("""
        heavy = sorted(m for m in sys.modules
                       if m.split(".")[0] in ("tensorflow", "keras", "dpkeras", "numpy"))
        print(heavy)
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_the_target_is_old_content_during_the_write_and_new_content_after(tmp_path):
    target = tmp_path / "model.keras"
    target.write_bytes(b"old")
    seen = []

    def write_to(tmp):
        Path(tmp).write_bytes(b"new")
        seen.append((Path(tmp).parent, Path(tmp).name.endswith(".keras"), target.read_bytes()))
        return "result"

    assert atomic_files.write(write_to, target, ".keras") == "result"
    assert seen == [(tmp_path, True, b"old")]
    assert target.read_bytes() == b"new"
    assert [p.name for p in tmp_path.iterdir()] == ["model.keras"]


def test_a_failing_write_keeps_the_old_file_and_leaves_nothing(tmp_path):
    target = tmp_path / "w.weights.h5"
    target.write_bytes(b"old")

    def write_to(tmp):
        Path(tmp).write_bytes(b"half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_files.write(write_to, target, ".weights.h5")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["w.weights.h5"]


def test_a_killed_write_keeps_the_old_file_and_the_next_write_cleans_up(tmp_path):
    target = tmp_path / "m.keras"
    target.write_bytes(b"old")
    proc = run_stdlib_python(f"""
        import os, signal
        def write_to(tmp):
            with open(tmp, "wb") as f:
                f.write(b"half")
            os.kill(os.getpid(), signal.SIGKILL)
        atomic_files.write(write_to, {str(target)!r}, ".keras")
    """)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    left = sorted(p.name for p in tmp_path.iterdir())
    assert target.read_bytes() == b"old" and len(left) == 2
    assert atomic_files.TMP_TAG in left[0] and left[0].endswith(".keras")
    atomic_files.write(lambda tmp: Path(tmp).write_bytes(b"new"), target, ".keras")
    assert target.read_bytes() == b"new"
    assert [p.name for p in tmp_path.iterdir()] == ["m.keras"]


def test_only_temporaries_of_dead_processes_are_removed(tmp_path):
    target = tmp_path / "m.keras"
    dead = tmp_path / f".m{atomic_files.TMP_TAG}{dead_pid()}-00000000.keras"
    alive = tmp_path / f".m{atomic_files.TMP_TAG}{os.getppid()}-00000000.keras"
    other = tmp_path / f".n{atomic_files.TMP_TAG}{dead_pid()}-00000000.keras"
    for path in (dead, alive, other):
        path.write_bytes(b"half")
    atomic_files.remove_stale_temporaries(target, ".keras")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([alive.name, other.name])


def test_write_json_and_copy(tmp_path):
    metadata = tmp_path / "training_metadata.json"
    atomic_files.write_json(metadata, {"epoch": 1})
    atomic_files.write_json(metadata, {"epoch": 2})
    assert json.loads(metadata.read_text()) == {"epoch": 2}
    atomic_files.copy(metadata, tmp_path / "training_metadata.json.bkp")
    assert json.loads((tmp_path / "training_metadata.json.bkp").read_text()) == {"epoch": 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "training_metadata.json",
        "training_metadata.json.bkp",
    ]


def test_a_copy_of_a_missing_file_keeps_the_target(tmp_path):
    target = tmp_path / "b.bkp"
    target.write_bytes(b"old")
    with pytest.raises(FileNotFoundError):
        atomic_files.copy(tmp_path / "missing", target)
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["b.bkp"]


def test_a_name_without_the_suffix_is_refused(tmp_path):
    with pytest.raises(
        ValueError,
        match=r"must end with the suffix '\.keras'\. Received: "
        r"path='.*model\.h5'",
    ):
        atomic_files.temporary_sibling(tmp_path / "model.h5", ".keras")
