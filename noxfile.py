"""The version matrix: one nox session per supported TensorFlow and Keras pair (`make matrix`).

Each session is a user's environment: a virtual environment under .nox/ where the pair is
installed first (`pip install tensorflow==X keras==Y`), then dpkeras's wheel, built from a
clean copy of the checkout, with pip as a user would; the session fails if installing dpkeras
changed the pair. It then runs the fast representative subset of the suite that
tests/matrix.txt names (one machine exactness, a loopback cluster, TF1 scopes, saving and
loading, hybrid placement, resuming mid-epoch, the patch table's checks) from a directory where
the checkout's dpkeras cannot be imported, so the installed wheel is what is tested.

    make matrix                                  # every pair
    make matrix ARGS="-s 'matrix(tf2.16-keras3.8)'"  # one pair (CI runs this one)
    make matrix ARGS="--force-python 3.10"       # the pairs on another Python (on PATH)
    .venv/bin/nox -l                             # the sessions

The pairs: the oldest, a middle and the newest TensorFlow of the span (dpkeras/_version.py),
each with the oldest Keras it accepts (TensorFlow 2.20 requires Keras 3.10+, 2.21 Keras 3.12+)
and the newest, and TensorFlow 2.18 with Keras 3.10. The newest pair is also the main suite's
(`make test`).
"""

import os
import pathlib
import shutil
import time

import nox

ROOT = pathlib.Path(__file__).resolve().parent
nox.options.envdir = str(ROOT / ".nox")
nox.options.sessions = ["matrix"]
nox.options.reuse_existing_virtualenvs = False

# (TensorFlow, Keras): exact releases, as users have them; the newest patch of each minor.
PAIRS = [
    ("2.16.2", "3.8.0"),
    ("2.16.2", "3.15.1"),
    ("2.18.1", "3.10.0"),
    ("2.19.1", "3.8.0"),
    ("2.19.1", "3.11.3"),
    ("2.19.1", "3.15.1"),
    ("2.20.0", "3.10.0"),
    ("2.21.0", "3.12.4"),
    ("2.21.0", "3.15.1"),
]
_IGNORED = shutil.ignore_patterns(
    ".git", ".venv", ".nox", "build", "dist", "results", "*.egg-info", "__pycache__", ".*cache"
)


def _minor(version):
    return ".".join(version.split(".")[:2])


def _subset():
    """The test ids tests/matrix.txt names (a line each; `#` starts a comment)."""
    lines = (ROOT / "tests" / "matrix.txt").read_text().splitlines()
    return [line.split("#")[0].strip() for line in lines if line.split("#")[0].strip()]


def _wheel(session, where):
    """Builds dpkeras's wheel from a clean copy of the checkout (as .ci/wheel-test does)."""
    source = where / "source"
    shutil.copytree(ROOT, source, ignore=_IGNORED)
    session.run(
        "python", "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(where),
        str(source),
    )  # fmt: skip
    return next(where.glob("dpkeras-*.whl"))


@nox.session
@nox.parametrize(
    "tensorflow,keras",
    [nox.param(tf, k, id=f"tf{_minor(tf)}-keras{_minor(k)}") for tf, k in PAIRS],
)
def matrix(session, tensorflow, keras):
    """The pair installed, dpkeras's wheel installed beside it, the subset run."""
    start = time.monotonic()
    work = pathlib.Path(session.create_tmp()).resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    pair = [f"tensorflow=={tensorflow}", f"keras=={keras}"]
    session.install("--quiet", *pair, "pytest>=8", "pytest-xdist>=3.5")
    session.install("--quiet", str(_wheel(session, work)))
    session.run(
        "python", "-c",
        "import importlib.metadata as m, sys; "
        f"found = [m.version('tensorflow'), m.version('keras')]; "
        f"sys.exit(None if found == {[tensorflow, keras]} else "
        f"f'installing dpkeras changed the pair to {{found}}')",
    )  # fmt: skip
    installed = time.monotonic() - start

    # The tests, and the files they read, where the checkout's dpkeras/ is not importable.
    tests = work / "run"
    shutil.copytree(ROOT / "tests", tests / "tests", ignore=_IGNORED)
    (tests / ".ci").mkdir()
    for name in ("README.md", "CHANGELOG.md", "pyproject.toml", "noxfile.py", ".ci/run"):
        shutil.copy(ROOT / name, tests / name)
    session.chdir(tests)
    env = {"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": ""}
    session.run(
        "python", "-c",
        "import dpkeras, sys; "
        "sys.exit(None if dpkeras.__file__.startswith(sys.prefix) else "
        "f'dpkeras imported from {dpkeras.__file__}, not the installed wheel')",
        env=env,
    )  # fmt: skip
    session.run("dpkeras", "env", env=env)
    workers = os.environ.get("DPKERAS_MATRIX_WORKERS", "2")
    session.run(
        "python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=5", "-n", workers,
        "--dist", "loadfile", *_subset(), *session.posargs,
        env=env,
    )  # fmt: skip
    ran = time.monotonic() - start - installed
    session.log(
        f"matrix: TensorFlow {tensorflow} + Keras {keras}: installed in {installed:.0f} s, "
        f"subset passed in {ran:.0f} s"
    )
