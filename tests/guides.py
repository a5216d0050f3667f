"""The Python code blocks of the README and the docs, for the test that runs them
(tests/test_docs_examples.py)."""

import dataclasses
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PYTHON = ("python", "py", "python3")  # info strings that open a block of Python


def pages():
    """README.md, then every docs/*.md, in name order."""
    return [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


@dataclasses.dataclass(frozen=True)
class Block:
    """One fenced block of Python: ```python, or ```python needs-gpu (tags after the name)."""

    page: pathlib.Path
    index: int  # among the page's Python blocks, from 0
    line: int  # of the opening fence, from 1
    language: str  # the info string's first word: python (or py, python3)
    tags: tuple  # the info string's other words
    code: str

    @property
    def name(self):
        """`README-3`, `migrating-from-tf1-12`: the page's stem and the block's index."""
        return f"{self.page.stem}-{self.index}"

    @property
    def where(self):
        """`docs/sharding.md:18`."""
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page):
    """Every fenced block of Python in the Markdown file `page`, in order.

    A fence is a line that starts, after any indentation (a block in a list item is indented),
    with three backquotes; the block ends at the next one. Its code is dedented by the opening
    fence's indentation.
    """
    found, code, opening, indent = [], None, None, 0
    inside = False
    for number, line in enumerate(pathlib.Path(page).read_text().splitlines(keepends=True), 1):
        stripped = line.strip()
        if not stripped.startswith("```"):
            if code is not None:
                code.append(line[indent:] if not line[:indent].strip() else line)
            continue
        if inside:  # a closing fence
            if code is not None:
                found.append(Block(page, len(found), *opening, "".join(code)))
            inside, code = False, None
            continue
        inside = True
        words = stripped[3:].split()
        if words and words[0] in PYTHON:
            indent = len(line) - len(line.lstrip())
            opening = (number, words[0], tuple(words[1:]))
            code = []
    return found
