"""Runs every `python` block of docs/dynamic-embeddings.md, so the guide stays true."""

import pytest

from tests.guides import DOCS, python_blocks

GUIDE = DOCS / "dynamic-embeddings.md"


BLOCKS = python_blocks(GUIDE)


def test_the_guide_has_its_examples():
    assert len(BLOCKS) == 2


@pytest.mark.parametrize("code", BLOCKS, ids=[f"block-{i}" for i in range(len(BLOCKS))])
def test_guide_block_runs(code):
    exec(compile(code, str(GUIDE), "exec"), {"__name__": "guide"})
