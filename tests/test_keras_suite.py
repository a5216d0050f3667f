"""A subset of Keras's own unit tests, without a strategy and under dpkeras, in CI.

The whole contract is `make keras-suite` (tests/keras_suite.py: Keras's trainers, layers,
models, optimizers, saving, callbacks, metrics, variables and export tests, and keras-rs's, in
three modes). Here the same harness runs the modules below, chosen to exercise what dpkeras
changes (a step on each replica, gradients summed where each variable lives, the optimizer's
apply, variable creation and assignment) within about a minute of added wall time, and asserts
that every difference is pinned in tests/keras_suite_differences.py and every pin of these
modules still differs.
"""

from tests import keras_suite

MODULES = (
    "keras/src/optimizers/sgd_test.py",
    "keras/src/optimizers/adam_test.py",
    "keras/src/trainers/epoch_iterator_test.py",
)


def test_keras_own_tests_differ_under_dpkeras_only_as_pinned(tmp_path):
    c, report = keras_suite.run(
        "keras", MODULES, modes=("none", "dpkeras"), out=str(tmp_path), concurrent=True
    )
    ran = {test_id.split("::")[0] for test_id in c.results["none"]}
    assert ran == set(MODULES) and not c.broken, (ran, c.broken)
    passed = sum(outcome == "passed" for outcome in c.results["dpkeras"].values())
    assert passed >= 20, open(report).read()  # the tests ran, not only imported
    assert not c.unexplained and not c.stale and not c.crashed, open(report).read()
