"""The version of dpkeras, in one place: pyproject.toml reads it (setuptools' dynamic version),
`dpkeras.__version__` re-exports it, and CHANGELOG.md's newest released heading must match it
(tests/test_version.py).

Semantic versioning (README, "Versions"): the public API is `dpkeras.__all__`, the public
modules, the `dpkeras` command and the files dpkeras reads and writes.
"""

__version__ = "0.4.0"
