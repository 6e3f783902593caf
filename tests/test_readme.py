"""CI runs the README's two opening commands exactly as the README writes them, first.

A user's first contact is those two commands on a fresh clone without any
opt-in engine; a CI that ran anything else first (an engine installed before
the tests, say) could pass while they fail.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def readme_commands() -> list[str]:
    """The lines of the README's first ``bash`` block."""
    text = (ROOT / "README.md").read_text()
    block = re.search(r"^```bash\n(.*?)^```", text, re.M | re.S)
    assert block, "the README opens without a bash block"
    return [line for line in block.group(1).splitlines() if line.strip()]


def ci_commands() -> list[str]:
    """``.ci/run``'s command lines: no comments, blank lines, ``set``, ``cd``, ``export``
    or ``trap``."""
    out = []
    for line in (ROOT / ".ci" / "run").read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if re.match(r"(set|cd|export|trap) ", line):
            continue
        out.append(line)
    return out


def test_the_readme_opens_with_two_commands_set_up_included():
    commands = readme_commands()
    assert len(commands) == 2
    assert all(c.startswith("./setup.sh && .venv/bin/") for c in commands)
    assert "attnfuzz campaign" in commands[0] and "pytest" in commands[1]


def test_ci_runs_the_readme_commands_verbatim_before_anything_else():
    assert ci_commands()[:2] == readme_commands()


def test_ci_installs_no_engine_before_the_readme_commands():
    lines = (ROOT / ".ci" / "run").read_text().splitlines()
    first_engine = next(i for i, line in enumerate(lines) if "ATTNFUZZ_VLLM=1" in line)
    last_readme = max(lines.index(c) for c in readme_commands())
    assert last_readme < first_engine
    assert not any("ATTNFUZZ_VLLM" in line for line in lines[:last_readme] if "export" in line)


def test_the_readme_fits_on_a_page_and_leaves_the_rest_to_the_docs():
    """The README is the first page (at most ~250 lines); the rest lives in docs/,
    built as a site (tests/test_docs.py checks the links and the tables)."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    linked = set(re.findall(r"\]\(docs/([\w-]+\.md)", text))
    pages = {p.name for p in (ROOT / "docs").glob("*.md")} - {"index.md"}
    assert pages <= linked, f"docs pages the README does not link: {sorted(pages - linked)}"
