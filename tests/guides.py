"""The `python` code blocks of a Markdown guide, for tests that run them."""

import pathlib

DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs"


def python_blocks(path):
    """The text of every ```python block of the Markdown file `path`, in order."""
    blocks, block = [], None
    for line in pathlib.Path(path).read_text().splitlines(keepends=True):
        if block is not None:
            if line.startswith("```"):
                blocks.append("".join(block))
                block = None
            else:
                block.append(line)
        elif line.strip() == "```python":
            block = []
    return blocks
