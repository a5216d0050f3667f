"""`tests/mutations.py` stays runnable: each mutant's text is in the tree once, and each test it
names is one pytest collects (a renamed test or parameter made two mutants run no test at all,
reported as ERROR by `make mutants` long after the rename)."""

import collections
import os
import subprocess
import sys

from tests.mutations import MUTANTS, ROOT


def test_every_mutant_has_a_unique_name_and_its_text_once_in_its_file():
    names = collections.Counter(m.name for m in MUTANTS)
    assert [n for n, count in names.items() if count > 1] == []
    misplaced = []
    for mutant in MUTANTS:
        path = os.path.join(ROOT, mutant.path)
        found = open(path).read().count(mutant.old) if os.path.exists(path) else None
        if found != 1:
            misplaced.append((mutant.name, mutant.path, found))
    assert misplaced == []


def test_every_test_a_mutant_names_is_collected():
    files = sorted({t.split("::")[0] for m in MUTANTS for t in m.tests})
    collected = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *files],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert collected.returncode == 0, collected.stdout[-3000:] + collected.stderr[-3000:]
    ids = {line.strip() for line in collected.stdout.splitlines() if "::" in line}

    def found(test):
        if "::" not in test:
            return any(i.startswith(test + "::") for i in ids)
        return test in ids or any(i.startswith(test + "[") for i in ids)

    missing = [(m.name, t) for m in MUTANTS for t in m.tests if not found(t)]
    assert missing == [], missing
