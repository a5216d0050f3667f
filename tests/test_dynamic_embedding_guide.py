"""Runs every `python` block of docs/dynamic-embeddings.md, so the guide stays true."""

import pathlib

import pytest

GUIDE = pathlib.Path(__file__).resolve().parent.parent / "docs" / "dynamic-embeddings.md"


def _blocks():
    blocks, block = [], None
    for line in GUIDE.read_text().splitlines(keepends=True):
        if block is not None:
            if line.startswith("```"):
                blocks.append("".join(block))
                block = None
            else:
                block.append(line)
        elif line.strip() == "```python":
            block = []
    return blocks


BLOCKS = _blocks()


def test_the_guide_has_its_examples():
    assert len(BLOCKS) == 2


@pytest.mark.parametrize("code", BLOCKS, ids=[f"block-{i}" for i in range(len(BLOCKS))])
def test_guide_block_runs(code):
    exec(compile(code, str(GUIDE), "exec"), {"__name__": "guide"})
