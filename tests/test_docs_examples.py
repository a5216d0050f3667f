"""Every ```python block of README.md and docs/*.md runs as written.

The rule for doc writers (also in the README's "Development" section):

- **A block is a whole program.** Each block runs alone, in a fresh Python process (its own
  working directory, no seed and no device split set by the test), as a reader who copies that
  one block into a file would run it. No block continues an earlier one: it has its own
  imports, data and, on a CPU-only machine, its device split (`dpkeras.simulate_cpu_devices(n)`
  first thing, as the README tells users). Blocks of a page never share state, so the TF1
  guide's blocks each start from an empty variable store.
- **Twice.** Each block runs in two fresh processes. What it asserts or prints must hold in
  every run: assert robust properties, or seed in the block itself
  (`keras.utils.set_random_seed`) when that is what a user would write.
- **A block that cannot run here says so** in its fence's info string, after `python`; an
  unknown tag fails this test:
  - `needs-gpu`: needs GPUs; skipped without one (run where there are GPUs);
  - `tf1`: TF1 code shown for comparison; never run;
  - `cluster`: the client of a cluster, run on loopback (127.0.0.1): a block that names
    `cluster.json` is run, twice, as the client of `dpkeras serve` tasks (2 ps, 2 workers)
    whose loopback addresses the test writes to `cluster.json` in the block's directory, as
    docs/cluster.md starts them; any other cluster block is one program for every task
    (`TF_CONFIG`) and runs, twice, under `dpkeras launch --ps 1 --workers 2`, with `--flags`
    when it passes `job_name=` to `join` (TF1's flags instead of `TF_CONFIG`).

Skipped blocks are listed with their tags in pytest's summary (`-ra`). Every wait is bounded.
"""

import json
import re
import subprocess
import sys

import pytest
import tensorflow as tf

from dpkeras.testing import LocalCluster, server_env
from tests.guides import blocks, pages

TAGS = {
    "needs-gpu": "needs a GPU",
    "tf1": "TF1 code shown for comparison",
    "cluster": "runs on a loopback cluster",
}
RUNS = (1, 2)
TIMEOUT = 300  # seconds for one run of one block
ALL = [block for page in pages() for block in blocks(page)]
# How many blocks each page has, by tags: a parser that finds nothing would pass the rest.
EXPECTED = {
    "README": {(): 7, ("needs-gpu",): 1, ("cluster",): 1},
    "cluster": {("cluster",): 5},
    "dynamic-embeddings": {(): 2},
    "from-a-tf1-program": {(): 1, ("tf1",): 2, ("cluster",): 1},
    "keras-rs": {(): 2},
    "migrating-from-tf1": {(): 20, ("tf1",): 12, ("cluster",): 1},
    "reliability": {},
    "sharding": {(): 3},
    "tf1-idioms": {},
}


def _env():
    """The environment of a block: this checkout importable, TF quiet, and nothing of the
    machine's that would choose for the block (no `TF_CONFIG`, no `DPKERAS_*` setting)."""
    env = server_env()
    for name in list(env):
        if name == "TF_CONFIG" or name.startswith("DPKERAS_"):
            del env[name]
    return env


def _run(command, cwd, timeout=TIMEOUT):
    proc = subprocess.run(
        command, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout
    )
    return proc.returncode, proc.stdout + proc.stderr


def _write(block, directory):
    path = directory / "example.py"
    path.write_text(block.code)
    return path


def _check(block, run, status, output):
    assert status == 0, f"{block.where} (run {run}) exited with {status}:\n{output[-6000:]}"


def _params(selected):
    return [
        pytest.param(block, run, id=f"{block.name}-run{run}", marks=_marks(block))
        for block in selected
        for run in RUNS
    ]


def _marks(block):
    if "tf1" in block.tags:
        return [pytest.mark.skip(reason=f"{block.where} python tf1: {TAGS['tf1']}")]
    if "needs-gpu" in block.tags:
        # Run as written, in a process of its own: on physical GPUs, as many as it names.
        wanted = 1 + max([int(i) for i in re.findall(r"/gpu:(\d+)", block.code)] or [0])
        have = len(tf.config.list_physical_devices("GPU"))
        skip = pytest.mark.skipif(
            have < wanted, reason=f"{block.where} python needs-gpu: needs {wanted} GPU(s)"
        )
        return [pytest.mark.gpu, skip]
    if re.search(r"^import keras_rs|^from keras_rs", block.code, re.M) and not _has_keras_rs():
        return [pytest.mark.skip(reason=f"{block.where}: keras-rs is not installed")]
    return []


def _has_keras_rs():
    try:
        import keras_rs  # noqa: F401
    except ImportError:
        return False
    return True


def test_every_block_has_known_tags():
    unknown = [
        f"{block.where}: ```{' '.join((block.language, *block.tags))}"
        for block in ALL
        if block.language != "python" or not set(block.tags) <= set(TAGS)
    ]
    assert not unknown, (
        f"fence info strings must be `python` followed by tags of {sorted(TAGS)}: {unknown}"
    )


def test_every_page_has_its_blocks():
    found = {}
    for page in pages():
        counts = found.setdefault(page.stem, {})
        for block in blocks(page):
            counts[block.tags] = counts.get(block.tags, 0) + 1
    assert found == EXPECTED


# BackupAndRestore's directory, given by position or as backup_dir=.
BACKUP_DIRECTORY = r"BackupAndRestore\(\s*(?:backup_dir\s*=\s*)?[\"']([^\"']+)[\"']"


def test_no_two_blocks_share_a_backup_directory():
    """A backup fits one model: two examples run in one directory must not resume each
    other's (`BackupAndRestore` in a directory of another model's backup is refused)."""
    found = {}
    for block in ALL:
        directories = re.findall(BACKUP_DIRECTORY, block.code)
        calls = len(re.findall(r"BackupAndRestore\(", block.code))
        assert len(directories) == calls, f"{block.where}: a BackupAndRestore directory unread"
        for directory in directories:
            found.setdefault(directory, []).append(block.where)
    assert found, "no BackupAndRestore found: the pattern no longer matches the docs"
    shared = {d: where for d, where in found.items() if len(where) > 1}
    assert not shared, f"blocks sharing a BackupAndRestore directory: {shared}"


def _section(page, title):
    """The text of the `## title` section of `page` (a path), up to the next `## `."""
    text = page.read_text(encoding="utf-8")
    assert f"\n## {title}\n" in text, f"{page.name} has no section {title!r}"
    return text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_the_quick_start_says_it_trains_one_replica_without_gpus():
    """On a machine without GPUs (and without `simulate_cpu_devices`) the Quick start trains
    one replica and TensorFlow says nothing: the Quick start says so, and how to get replicas
    (issue 42 item 5)."""
    readme = next(page for page in pages() if page.name == "README.md")
    quick = " ".join(_section(readme, "Quick start").split())
    assert "without GPUs this trains **one replica**" in quick, quick
    assert "dpkeras.simulate_cpu_devices(n)" in quick, quick


def test_the_tf1_guide_has_a_runnable_block_for_each_idiom_2_to_10():
    page = next(page for page in pages() if page.stem == "migrating-from-tf1")
    headings = [
        (number, match.group(1))
        for number, line in enumerate(page.read_text().splitlines(), 1)
        if (match := re.match(r"## Idiom (\d+)", line))
    ]
    covered = set()
    for block in blocks(page):
        if block.tags:
            continue
        above = [idiom for number, idiom in headings if number < block.line]
        if above:
            covered.add(int(above[-1]))
    assert covered == set(range(2, 11))


@pytest.mark.parametrize("block, run", _params([b for b in ALL if "cluster" not in b.tags]))
def test_block_runs(block, run, tmp_path):
    _check(block, run, *_run([sys.executable, _write(block, tmp_path).name], tmp_path))


SERVED = [b for b in ALL if "cluster" in b.tags and "cluster.json" in b.code]
LAUNCHED = [b for b in ALL if "cluster" in b.tags and "cluster.json" not in b.code]


@pytest.fixture(scope="module")
def served():
    """`dpkeras serve` tasks on loopback, 2 ps and 2 workers of 1 CPU device each."""
    with LocalCluster(ps=2, workers=2, cpus=1) as cluster:
        yield cluster


@pytest.mark.parametrize("block, run", _params(SERVED))
def test_cluster_block_runs_against_served_tasks(block, run, served, tmp_path):
    (tmp_path / "cluster.json").write_text(json.dumps(served.spec))
    _check(block, run, *_run([sys.executable, _write(block, tmp_path).name], tmp_path))


@pytest.mark.parametrize("block, run", _params(LAUNCHED))
def test_cluster_block_runs_under_launch(block, run, tmp_path):
    command = [sys.executable, "-m", "dpkeras", "launch", "--ps", "1", "--workers", "2", "--"]
    if re.search(r"\bjob_name=", block.code):  # TF1's flags, appended to each task's command
        command.insert(4, "--flags")
    _check(block, run, *_run([*command, sys.executable, _write(block, tmp_path).name], tmp_path))
