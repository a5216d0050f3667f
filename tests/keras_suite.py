"""Keras's own unit tests (and keras-rs's) as dpkeras's contract: `make keras-suite`.

A script, not a test module (tests/test_keras_suite.py runs a subset through it):

    .venv/bin/python -m tests.keras_suite                  # everything, test-only deps installed
    .venv/bin/python -m tests.keras_suite --suite keras --module keras/src/metrics/*_test.py

Each selected test module runs four times, one pytest process per mode
(`tests/keras_suite_plugin.py`): without a strategy, inside dpkeras's strategy with every
variable on the parameter device (`dpkeras`) and with `placement.hybrid()` (`hybrid`), inside
MirroredStrategy, all over the same 2 logical CPUs. Outcomes are compared test by test from the
JUnit XML. A difference is a test that passes without a strategy and not under one of dpkeras's
arms (`ARMS`); each one must be explained in `tests/keras_suite_differences.py`, for that arm.
An unexplained difference, a pinned one that no longer differs (stale), or a pin whose
MirroredStrategy flag is wrong fails the run (exit 1). The report goes to
`results/keras-suite/<suite>-report.md`.

Keras's tests come from the installed wheel, which ships them. keras-rs 0.4.0's wheel and sdist
ship none: they run only with `--keras-rs-source DIR`, a checkout of the v0.4.0 tag, whose test
files (and `keras_rs/src/testing`) are laid over a copy of the installed package, so that the
code under test is the wheel's.
"""

import argparse
import ast
import dataclasses
import fnmatch
import glob
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

from tests.keras_suite_differences import DIFFERENCES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "results", "keras-suite")
DEPS = os.path.join(ROOT, "build", "keras-suite-deps")
MODES = ("none", "dpkeras", "hybrid", "mirrored")
ARMS = ("dpkeras", "hybrid")  # the modes compared with "none": dpkeras's placements
TIMEOUT = 6 * 3600  # seconds per pytest process


@dataclasses.dataclass(frozen=True)
class Suite:
    """Test modules of one installed package, as globs relative to the package's parent."""

    name: str
    package: str
    modules: tuple
    excluded: dict  # glob -> why it does not run here


SUITES = {
    "keras": Suite(
        "keras",
        "keras",
        (
            "keras/src/backend/common/*_test.py",
            "keras/src/layers/layer_test.py",
            "keras/src/layers/core/*_test.py",
            "keras/src/layers/normalization/*_test.py",
            "keras/src/layers/regularization/*_test.py",
            "keras/src/layers/rnn/*_test.py",
            "keras/src/models/*_test.py",
            "keras/src/optimizers/*_test.py",
            "keras/src/optimizers/schedules/*_test.py",
            "keras/src/saving/*_test.py",
            "keras/src/callbacks/*_test.py",
            "keras/src/metrics/*_test.py",
            "keras/src/export/*_test.py",
            "keras/src/trainers/*_test.py",
        ),
        {
            "keras/src/export/torch_test.py": "exports through PyTorch (torch not installed)",
            "keras/src/export/litert_torch_test.py": "needs torch and litert-torch",
            "keras/src/export/onnx_test.py": "needs onnxruntime, tf2onnx and onnxscript",
        },
    ),
    "keras-rs": Suite(
        "keras-rs",
        "keras_rs",
        (
            "keras_rs/src/layers/embedding/*_test.py",
            "keras_rs/src/layers/embedding/tensorflow/*_test.py",
            "keras_rs/src/layers/feature_interaction/*_test.py",
            "keras_rs/src/layers/retrieval/*_test.py",
            "keras_rs/src/losses/*_test.py",
            "keras_rs/src/metrics/*_test.py",
        ),
        {"keras_rs/src/layers/embedding/jax/*": "the JAX backend's embedding (JAX only)"},
    ),
}


def suite_requirements():
    """The test-only requirements: pyproject.toml's `suite` extra (jax for trainer_test's
    top-level import, scipy for correlation_metrics_test)."""
    with open(os.path.join(ROOT, "pyproject.toml")) as f:  # tomllib is Python 3.11+
        line = next(line for line in f if line.startswith("suite = ["))
    return ast.literal_eval(line.split("=", 1)[1].strip())


def install_deps():
    """Installs the `suite` extra into build/keras-suite-deps, outside the venv: only the
    suite's pytest processes see it (PYTHONPATH), never dpkeras's own tests or users."""
    requirements = suite_requirements()
    stamp = os.path.join(DEPS, ".installed")
    if os.path.exists(stamp) and open(stamp).read().split() == requirements:
        return
    shutil.rmtree(DEPS, ignore_errors=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", DEPS]
        + requirements,
        check=True,
    )
    with open(stamp, "w") as f:
        f.write("\n".join(requirements))


def _package_parent(package):
    return os.path.dirname(os.path.dirname(importlib.util.find_spec(package).origin))


def stage_keras_rs(source, scratch):
    """A copy of the installed keras_rs with the files only the source tag has (its tests,
    `keras_rs/src/testing`) added; returns the directory holding it."""
    staged = os.path.join(scratch, "keras-rs")
    installed = os.path.join(_package_parent("keras_rs"), "keras_rs")
    shutil.copytree(installed, os.path.join(staged, "keras_rs"), ignore=_no_cache)
    tests = os.path.join(source, "keras_rs", "src")
    for path in glob.glob(os.path.join(tests, "**", "*.py"), recursive=True):
        target = os.path.join(staged, os.path.relpath(path, source))
        if not os.path.exists(target):
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copy(path, target)
    return staged


_no_cache = shutil.ignore_patterns("__pycache__")


def select(suite, root, patterns):
    """`(modules, not_run)`: test files under `root` (relative paths) matching the suite's
    globs and `patterns` (all when empty), and `{module: why}` for the excluded ones."""
    modules, not_run = [], {}
    for pattern in suite.modules:
        for path in sorted(glob.glob(os.path.join(root, pattern))):
            module = os.path.relpath(path, root)
            if patterns and not any(fnmatch.fnmatch(module, p) for p in patterns):
                continue
            why = next((w for g, w in suite.excluded.items() if fnmatch.fnmatch(module, g)), None)
            if why:
                not_run[module] = why
            elif module not in modules:
                modules.append(module)
    return modules, not_run


def start_mode(mode, root, modules, junit, jobs, deps, cwd):
    """Starts one pytest process running `modules` (relative to `root`) in `mode`."""
    ini = os.path.join(cwd, "pytest.ini")
    with open(ini, "w") as f:
        f.write("[pytest]\n")
    paths = [ROOT] + ([DEPS] if deps else [])
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=os.pathsep.join(paths))
    env.pop("TF_CONFIG", None)
    parallel = ["-n", str(jobs)] if jobs > 1 else ["-p", "no:xdist"]
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    command += ["-p", "tests.keras_suite_plugin", f"--strategy={mode}", "-c", ini]
    command += ["--rootdir", root, "-o", "junit_family=xunit1", f"--junitxml={junit}"]
    # Native tracebacks: pytest's own formatting parses the source and crashed the whole
    # process (INTERNALERROR, SystemError from ast) on a failure deep in TensorFlow.
    command += ["--continue-on-collection-errors", "--tb=native", *parallel]
    command += [os.path.join(root, m) for m in modules]
    with open(junit + ".log", "w") as log:
        return subprocess.Popen(command, cwd=cwd, env=env, stdout=log, stderr=log)


def outcomes(junit):
    """`({test id: "passed" | "failed" | "skipped"}, {module: collection error})`; a test id
    is `path/to/module_test.py::Class::test_name`."""
    tests, broken = {}, {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        module, classname, name = case.get("file"), case.get("classname"), case.get("name")
        failure = case.find("failure")
        error = case.find("error")
        if module is None:  # pytest's internal error: the process's status reports it
            continue
        if not classname:  # a module that did not import, or skipped itself as a whole
            problem = error if error is not None else failure
            if problem is None:
                tests[module] = "skipped"
            else:
                broken[module] = problem.get("message", "")
            continue
        prefix = module[: -len(".py")].replace("/", ".")
        cls = classname[len(prefix) + 1 :] if classname.startswith(prefix + ".") else ""
        test_id = "::".join(filter(None, [module, cls, name]))
        if failure is not None or (error is not None and tests.get(test_id) != "passed"):
            tests[test_id] = "failed"
        elif case.find("skipped") is not None:
            tests[test_id] = "skipped"
        else:
            tests.setdefault(test_id, "passed")
    return tests, broken


@dataclasses.dataclass
class Comparison:
    """Outcomes per mode and what they say against the pins."""

    results: dict  # mode -> {test id: outcome}
    broken: dict  # module -> why it did not import (without a strategy)
    not_run: dict  # module -> why it is excluded
    seconds: dict  # mode -> seconds
    # arm -> {test id: its outcome there}; the lists hold `(arm, test id)`
    differences: dict = dataclasses.field(default_factory=dict)
    unexplained: list = dataclasses.field(default_factory=list)
    stale: list = dataclasses.field(default_factory=list)
    mirrored_wrong: list = dataclasses.field(default_factory=list)
    crashed: dict = dataclasses.field(default_factory=dict)  # group and mode -> pytest status

    @property
    def ok(self):
        return not (self.unexplained or self.stale or self.mirrored_wrong or self.crashed)


def compare(results, broken, not_run, seconds, modules):
    """Sets the differences none-vs-each arm run and checks them against `DIFFERENCES`."""
    c = Comparison(results, broken, not_run, seconds)
    none = results["none"]
    mirrored = results.get("mirrored")
    for arm in (a for a in ARMS if a in results):
        found = c.differences[arm] = {}
        for test_id, outcome in none.items():
            if outcome == "passed" and results[arm].get(test_id, "missing") != "passed":
                found[test_id] = results[arm].get(test_id, "missing")
                if test_id not in DIFFERENCES or arm not in DIFFERENCES[test_id].arms:
                    c.unexplained.append((arm, test_id))
        for test_id, pin in DIFFERENCES.items():
            if test_id.split("::")[0] not in modules or test_id not in none:
                continue  # not run this time (a subset), or gone: reported by check_pins
            if pin.sometimes or arm not in pin.arms:
                continue
            if test_id not in found:
                c.stale.append((arm, test_id))
            elif mirrored is not None and pin.mirrored != (mirrored.get(test_id) != "passed"):
                c.mirrored_wrong.append((arm, test_id))
    return c


def _counts(results, ids):
    """`passed/failed/skipped` among `ids` in one mode's results (missing counts as failed)."""
    outcomes = [results.get(t, "failed") for t in ids]
    return "/".join(str(outcomes.count(o)) for o in ("passed", "failed", "skipped"))


def report(c, title, modules):
    """The markdown report: per module, then every difference with its pin."""
    modes = list(c.results)
    lines = [f"# {title}", "", time.strftime("%Y-%m-%d %H:%M %Z"), ""]
    lines.append("Seconds per mode: " + ", ".join(f"{m} {c.seconds[m]:.0f}" for m in modes))
    lines += ["", "Per mode: passed / failed / skipped.", ""]
    lines += ["| module | ran | " + " | ".join(modes)]
    arms = list(c.differences)
    lines[-1] += "".join(
        f" | differences {a} | pinned {a} | shared with Mirrored {a}" for a in arms
    )
    lines[-1] += " |"
    lines.append("|---" * (2 + len(modes) + 3 * len(arms)) + "|")
    for module in modules:
        ids = [t for t in c.results["none"] if t.split("::")[0] == module]
        if module in c.broken:
            lines.append(f"| {module} | not run: {c.broken[module][:120]} |")
            continue
        passed = [_counts(c.results[m], ids) for m in modes]
        counts = []
        for arm in arms:
            diffs = [t for t in ids if t in c.differences[arm]]
            pinned = [t for t in diffs if t in DIFFERENCES and arm in DIFFERENCES[t].arms]
            counts += [len(diffs), len(pinned), sum(DIFFERENCES[t].mirrored for t in pinned)]
        lines.append(f"| {module} | {len(ids)} | " + " | ".join(map(str, passed + counts)) + " |")
    for module, why in c.not_run.items():
        lines.append(f"| {module} | not run: {why} |")
    lines += ["", f"## pytest processes that did not end normally: {len(c.crashed)}", ""]
    lines += [f"- {group}: {status}" for group, status in c.crashed.items()]
    for heading, ids in (
        ("Unexplained differences", c.unexplained),
        ("Stale pins (no longer differ)", c.stale),
        ("Pins whose MirroredStrategy flag is wrong", c.mirrored_wrong),
    ):
        lines += ["", f"## {heading}: {len(ids)}", ""]
        lines += [f"- `{t}`: under {arm} {c.differences[arm].get(t, 'passed')}" for arm, t in ids]
    lines += ["", "## Pinned differences", ""]
    for arm in arms:
        for test_id in c.differences[arm]:
            pin = DIFFERENCES.get(test_id)
            if pin and arm in pin.arms:
                shared = "shared with MirroredStrategy" if pin.mirrored else "dpkeras only"
                lines.append(f"- {arm}: `{test_id}` ({shared}): {pin.reason}")
    return "\n".join(lines) + "\n"


def run(
    suite_name,
    patterns=(),
    modes=MODES,
    out=RESULTS,
    jobs=1,
    deps=False,
    rs_source=None,
    concurrent=False,
):
    """Runs one suite in `modes`; returns `(Comparison, report path)`."""
    suite = SUITES[suite_name]
    out = os.path.abspath(out)  # the pytest processes run in a scratch directory
    os.makedirs(out, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="keras-suite-stage-") as scratch:
        if suite.package == "keras_rs":
            if rs_source is None:
                return None, None
            root = stage_keras_rs(rs_source, scratch)
        else:
            root = _package_parent(suite.package)
        modules, not_run = select(suite, root, patterns)
        c, path = None, None
        results = {m: {} for m in modes}
        seconds, broken, crashed = dict.fromkeys(modes, 0.0), {}, {}
        groups = [[m for m in modules if fnmatch.fnmatch(m, g)] for g in suite.modules]
        groups = [g for i, g in enumerate(groups) if g and g[0] not in sum(groups[:i], [])]
        # One pytest process per glob and mode, so that a crash loses one group and the report
        # grows as groups end; the modes run one after the other, or at once (`concurrent`).
        for number, group in enumerate(groups):
            batches = [modes] if concurrent else [(m,) for m in modes]
            for batch in batches:
                start, procs = time.monotonic(), {}
                for mode in batch:
                    junit = os.path.join(out, f"{suite.name}-{number:02d}-{mode}.xml")
                    print(f"{suite.name}: {group[0]} ... ({len(group)}), {mode}", flush=True)
                    procs[mode] = start_mode(mode, root, group, junit, jobs, deps, scratch)
                for mode, proc in procs.items():
                    status = proc.wait(timeout=TIMEOUT)
                    seconds[mode] += time.monotonic() - start
                    junit = os.path.join(out, f"{suite.name}-{number:02d}-{mode}.xml")
                    if status not in (0, 1) or not os.path.exists(junit):
                        crashed[f"{group[0]} ... ({mode})"] = f"pytest status {status}"
                    if os.path.exists(junit):
                        tests, mode_broken = outcomes(junit)
                        results[mode].update(tests)
                        if mode == "none":
                            broken.update(mode_broken)
            done = sum(groups[: number + 1], [])
            c = compare(results, broken, not_run, seconds, done)
            c.crashed = crashed
            title = f"{suite.name}: its own tests without a strategy, under " + ", ".join(
                {"dpkeras": "dpkeras (all-on-ps)", "hybrid": "dpkeras (hybrid)"}.get(m, m)
                for m in modes
                if m != "none"
            )
            path = os.path.join(out, f"{suite.name}-report.md")
            with open(path, "w") as f:
                f.write(report(c, title, done))
    return c, path


def check_pins():
    """Pins name modules of a suite (a typo or a module Keras dropped is an error)."""
    known = tuple(p for s in SUITES.values() for p in s.modules)
    bad = [t for t in DIFFERENCES if not any(fnmatch.fnmatch(t.split("::")[0], p) for p in known)]
    if bad:
        sys.exit(f"pins outside every suite's modules: {bad}")


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--suite", action="append", choices=sorted(SUITES))
    parser.add_argument("--module", action="append", default=[], help="glob of modules to run")
    parser.add_argument(
        "--mode", action="append", choices=MODES, help="modes to run besides none (the baseline)"
    )
    parser.add_argument("--jobs", type=int, default=1, help="pytest-xdist workers per mode")
    parser.add_argument("--concurrent", action="store_true", help="run the modes at once")
    parser.add_argument("--deps", action="store_true", help="install the `suite` extra first")
    parser.add_argument("--out", default=RESULTS, help="where reports and JUnit XML go")
    parser.add_argument("--keras-rs-source", help="a checkout of keras-rs's v0.4.0 tag")
    args = parser.parse_args(argv)
    check_pins()
    if args.deps:
        install_deps()
    # "none" always runs: every other mode is compared with it.
    modes = tuple(m for m in MODES if m == "none" or m in (args.mode or MODES))
    ok = True
    for name in args.suite or sorted(SUITES):
        c, path = run(
            name,
            args.module,
            modes,
            args.out,
            args.jobs,
            args.deps,
            args.keras_rs_source,
            args.concurrent,
        )
        if c is None:
            print(f"{name}: not run; its wheel and sdist ship no tests (--keras-rs-source)")
            continue
        differences = ", ".join(f"{len(d)} under {arm}" for arm, d in c.differences.items())
        print(
            f"{name}: {len(c.results['none'])} tests, differences {differences}, "
            f"{len(c.unexplained)} unexplained, {len(c.stale)} stale, "
            f"{len(c.mirrored_wrong)} wrong Mirrored flags; report {path}"
        )
        ok = ok and c.ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
