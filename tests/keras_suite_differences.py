"""Every difference between Keras's own tests without a strategy and under dpkeras, explained.

`tests/keras_suite.py` (`make keras-suite`, and the subset in tests/test_keras_suite.py) runs
Keras's and keras-rs's shipped tests without a strategy and inside dpkeras's strategy. A test
that passes without and not within is a difference; each one is listed here with why, and with
whether it also fails under MirroredStrategy on the same devices (`mirrored`; checked when that
mode runs). A difference missing here fails the run, and so does an entry that no longer
differs: this file stays the true list. A dpkeras bug is fixed, never listed.
"""

import collections

Pin = collections.namedtuple("Pin", "reason mirrored")

_OWN_STRATEGY = (
    "the test enters its own MirroredStrategy scope, inside the scope the harness entered "
    "around it: TensorFlow refuses to nest two strategies (RuntimeError: Mixing different "
    "tf.distribute.Strategy objects)"
)

DIFFERENCES = {
    "keras/src/backend/common/variables_test.py::VariableNumpyValueAndAssignmentTest::"
    "test_variable_numpy_scalar": Pin(_OWN_STRATEGY, mirrored=True),
}
