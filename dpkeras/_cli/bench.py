"""`dpkeras bench`: the benchmark of the source checkout (benchmarks/compare.py).

The benchmark is not part of the installed package (the wheel holds `dpkeras/` only): in a
source checkout (`pip install -e .`), `dpkeras bench [flags]` runs
`python <checkout>/benchmarks/compare.py [flags]` in a process of its own, from the current
directory (so `--out` is relative to it) with the checkout first on `PYTHONPATH`, and exits
with its status; anywhere else it refuses in one line.
"""

import os
import subprocess
import sys


def _checkout_root():
    """The source checkout whose `benchmarks/compare.py` `dpkeras bench` runs, or None."""
    import dpkeras

    root = os.path.dirname(os.path.dirname(os.path.abspath(dpkeras.__file__)))
    return root if os.path.isfile(os.path.join(root, "benchmarks", "compare.py")) else None


def bench(argv=None):
    """`dpkeras bench [flags]`: benchmarks/compare.py with these flags, in a subprocess."""
    root = _checkout_root()
    if root is None:
        print(
            "dpkeras bench needs a dpkeras source checkout (the benchmark, benchmarks/, is not "
            "in the installed package): clone the repository, `pip install -e .` there, and "
            "run `dpkeras bench` or `python -m benchmarks.compare`.",
            file=sys.stderr,
        )
        return 2
    path = os.environ.get("PYTHONPATH")
    env = dict(os.environ, PYTHONPATH=root + (os.pathsep + path if path else ""))
    script = os.path.join(root, "benchmarks", "compare.py")
    return subprocess.call([sys.executable, script, *(argv or [])], env=env)
