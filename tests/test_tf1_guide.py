"""Runs every `python` block of docs/migrating-from-tf1.md, so the guide stays true.

Blocks marked `python tf1` show TF1 code for reference and are not run. Each block runs in a
fresh variable store, as a reader pasting it into a new program would.
"""

import pathlib
import re

import pytest

from dpkeras.tf1 import VariableStore

GUIDE = pathlib.Path(__file__).resolve().parent.parent / "docs" / "migrating-from-tf1.md"


def guide_blocks():
    """Yields (section heading, index in section, code) for each runnable block."""
    heading = "intro"
    index = 0
    block = None
    for line in GUIDE.read_text().splitlines(keepends=True):
        if block is not None:
            if line.startswith("```"):
                yield heading, index, "".join(block)
                index += 1
                block = None
            else:
                block.append(line)
        elif line.startswith("## "):
            heading = line[3:].strip()
            index = 0
        elif line.strip() == "```python":
            block = []


def _slug(heading):
    return re.sub(r"[^a-z0-9]+", "-", heading.lower()).strip("-")[:40]


BLOCKS = list(guide_blocks())


@pytest.mark.parametrize(
    "code", [pytest.param(code, id=f"{_slug(h)}-{i}") for h, i, code in BLOCKS]
)
def test_guide_block_runs(code):
    with VariableStore():
        exec(compile(code, str(GUIDE), "exec"), {"__name__": "guide"})


def test_guide_has_a_runnable_block_for_each_idiom_2_to_10():
    covered = {
        int(match.group(1))
        for heading, _, _ in BLOCKS
        if (match := re.match(r"Idiom (\d+)", heading))
    }
    assert covered == set(range(2, 11))
