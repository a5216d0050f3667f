"""A subset of Keras's own unit tests, without a strategy and under dpkeras, in CI.

The whole contract is `make keras-suite` (tests/keras_suite.py: Keras's trainers, layers,
models, optimizers, saving, callbacks, metrics, variables and export tests, and keras-rs's, in
four modes). Here the same harness runs the modules below, chosen to exercise what dpkeras
changes (a step on each replica, gradients summed where each variable lives, the optimizer's
apply, variable creation and assignment), without a strategy and under both of dpkeras's arms
(every variable on the parameter device; `placement.hybrid()`, whose dense variables are
replicated and all-reduced) within about a minute of added wall time, and asserts that every
difference is pinned in tests/keras_suite_differences.py for its arm and every pin of these
modules still differs.
"""

from tests import keras_suite
from tests.keras_suite_differences import Pin

MODULES = (
    "keras/src/optimizers/sgd_test.py",
    "keras/src/optimizers/adam_test.py",
    "keras/src/trainers/epoch_iterator_test.py",
)


def test_keras_own_tests_differ_under_dpkeras_only_as_pinned(tmp_path):
    c, report = keras_suite.run(
        "keras", MODULES, modes=("none", *keras_suite.ARMS), out=str(tmp_path), concurrent=True
    )
    ran = {test_id.split("::")[0] for test_id in c.results["none"]}
    assert ran == set(MODULES) and not c.broken, (ran, c.broken)
    assert set(c.differences) == {"dpkeras", "hybrid"}
    for arm in keras_suite.ARMS:
        passed = sum(outcome == "passed" for outcome in c.results[arm].values())
        assert passed >= 20, open(report).read()  # the tests ran, not only imported
    assert not c.unexplained and not c.stale and not c.crashed, open(report).read()


def test_the_hybrid_arm_runs_under_hybrid_placement():
    from dpkeras import placement
    from tests import keras_suite_plugin

    hybrid = keras_suite_plugin._strategy("hybrid").extended.placement_policy
    assert placement.is_hybrid(hybrid), hybrid
    on_ps = keras_suite_plugin._strategy("dpkeras").extended.placement_policy
    assert not placement.is_hybrid(on_ps), on_ps


def test_a_difference_is_pinned_for_each_arm_it_shows_in(monkeypatch):
    """A pin names the arms it differs in: a difference in another arm is unexplained, a pin
    for an arm where the test passes is stale."""
    m = "keras/src/x_test.py"
    pins = {
        f"{m}::T::both": Pin("r", mirrored=False),
        f"{m}::T::ps_only": Pin("r", mirrored=False, arms=("dpkeras",)),
    }
    monkeypatch.setattr(keras_suite, "DIFFERENCES", pins)
    tests = ("both", "ps_only", "hybrid_only")
    none = {f"{m}::T::{t}": "passed" for t in tests}
    dpkeras = {**none, f"{m}::T::both": "failed", f"{m}::T::ps_only": "failed"}
    hybrid = {**none, f"{m}::T::ps_only": "failed", f"{m}::T::hybrid_only": "failed"}
    results = {"none": none, "dpkeras": dpkeras, "hybrid": hybrid}
    c = keras_suite.compare(results, {}, {}, dict.fromkeys(results, 0.0), [m])
    assert c.unexplained == [("hybrid", f"{m}::T::ps_only"), ("hybrid", f"{m}::T::hybrid_only")]
    assert c.stale == [("hybrid", f"{m}::T::both")]
    assert set(c.differences["dpkeras"]) == {f"{m}::T::both", f"{m}::T::ps_only"}


def test_the_report_counts_passed_failed_and_skipped_per_mode():
    m = "keras/src/x_test.py"
    none = {f"{m}::T::a": "passed", f"{m}::T::b": "passed", f"{m}::T::c": "skipped"}
    hybrid = {f"{m}::T::a": "passed", f"{m}::T::b": "failed", f"{m}::T::c": "skipped"}
    results = {"none": none, "hybrid": hybrid}
    c = keras_suite.compare(results, {}, {}, dict.fromkeys(results, 0.0), [m])
    lines = keras_suite.report(c, "title", [m]).splitlines()
    assert f"| {m} | 3 | 2/0/1 | 1/1/1 | 1 | 0 | 0 |" in lines, lines
