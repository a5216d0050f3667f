"""`dpkeras bench`: the benchmark of the source checkout (benchmarks/compare.py)."""

import os
import sys


def _checkout_root():
    """The source checkout whose `benchmarks/compare.py` `dpkeras bench` runs, or None."""
    import dpkeras

    root = os.path.dirname(os.path.dirname(os.path.abspath(dpkeras.__file__)))
    return root if os.path.isfile(os.path.join(root, "benchmarks", "compare.py")) else None


def bench(argv=None):
    """`dpkeras bench [flags]`: runs benchmarks/compare.py's main with these flags."""
    root = _checkout_root()
    if root is None:
        import dpkeras

        print(
            f"dpkeras bench runs the benchmark of a dpkeras source checkout, but dpkeras is "
            f"installed from {os.path.dirname(os.path.abspath(dpkeras.__file__))}, which has "
            f"no benchmarks/compare.py beside it. Clone the repository, `pip install -e .` "
            f"in it, and run `dpkeras bench` (or `python -m benchmarks.compare` there).",
            file=sys.stderr,
        )
        return 2
    if root not in sys.path:
        sys.path.insert(0, root)
    from absl import app

    from benchmarks import compare

    main_module = sys.modules.get("__main__")
    if main_module is not None:  # absl's --help prints the __main__ module's docstring
        main_module.__doc__ = compare.__doc__
    app.run(compare.main, argv=["dpkeras bench"] + list(argv or []))
    return 0
