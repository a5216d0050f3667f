"""The version of dpkeras and the TensorFlow and Keras releases it supports, in one place:
pyproject.toml reads `__version__` (setuptools' dynamic version), `dpkeras.__version__`
re-exports it, and CHANGELOG.md's newest released heading must match it
(tests/test_version.py).

Semantic versioning (README, "Versions"): the public API is `dpkeras.__all__`, the public
modules, the `dpkeras` command and the files dpkeras reads and writes.

The supported span (`TENSORFLOW`, `KERAS`, `KERAS_REQUIRED_BY`): every TensorFlow minor release
in it with every Keras minor release in it that this TensorFlow itself accepts. The matrix
(noxfile.py, `make matrix`) tests its ends and the releases where an internal changes (Keras
3.10, 3.11, 3.12; README's "Versions" lists the pairs); the internals answer per release
(`dpkeras._keras_internals`), each answer also tested with the version faked. pyproject.toml's
dependency ranges say the same
(tests/test_version.py holds them together). A dpkeras scope refuses any other pair, in one line
(`check_supported`).
"""

__version__ = "0.4.0"

# The oldest and newest minor releases supported, both included. TensorFlow 2.15 and older come
# with Keras 2 (`tf.keras`), not Keras 3; Keras 3.7 and older are not tested.
TENSORFLOW = ((2, 16), (2, 21))
KERAS = ((3, 8), (3, 15))
# The oldest Keras a TensorFlow release requires itself (its own dependency), where that is
# newer than KERAS's oldest: pip installs no older one beside it.
KERAS_REQUIRED_BY = {(2, 20): (3, 10), (2, 21): (3, 12)}


def minor(version):
    """`(major, minor)` of a version string such as `"2.16.2"` or `"3.15.0.dev2025"`."""
    major, minor_number = version.split(".")[:2]
    return int(major), int("".join(c for c in minor_number if c.isdigit()) or 0)


def span(bounds):
    """`"2.16-2.21"` for `((2, 16), (2, 21))`."""
    return "-".join(f"{a}.{b}" for a, b in bounds)


def in_span(version, bounds):
    """Whether `version` (a string) is a minor release within `bounds`."""
    return bounds[0] <= minor(version) <= bounds[1]


def keras_span(tensorflow_version):
    """The Keras minor releases supported beside `tensorflow_version`, as `KERAS`."""
    oldest = KERAS_REQUIRED_BY.get(minor(tensorflow_version), KERAS[0])
    return max(oldest, KERAS[0]), KERAS[1]


def unsupported(tensorflow_version, keras_version):
    """The one-line reason a TensorFlow and Keras pair is outside the span, or None."""
    if not in_span(tensorflow_version, TENSORFLOW):
        advice = f"TensorFlow {span(TENSORFLOW)}"
        if not in_span(keras_version, KERAS):
            advice += f" and Keras {span(KERAS)}"
    elif not in_span(keras_version, keras_span(tensorflow_version)):
        advice = f"Keras {span(keras_span(tensorflow_version))} beside it"
    else:
        return None
    narrower = ", ".join(
        f"Keras {span((floor, KERAS[1]))} with TensorFlow {a}.{b}"
        for (a, b), floor in sorted(KERAS_REQUIRED_BY.items())
    )
    return (
        f"dpkeras {__version__} supports TensorFlow {span(TENSORFLOW)} with Keras "
        f"{span(KERAS)} ({narrower}); found TensorFlow {tensorflow_version} and Keras "
        f'{keras_version}. Install {advice} (README, "Versions").'
    )


def check_supported():
    """Raises RuntimeError (one line, naming the versions found and the span) unless the
    TensorFlow and Keras imported are within the supported span."""
    import keras
    import tensorflow as tf

    reason = unsupported(tf.__version__, keras.__version__)
    if reason is not None:
        raise RuntimeError(reason)
