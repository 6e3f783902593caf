"""The documentation: no table of measured numbers typed by hand, no broken link.

Every Markdown table of numbers in ``docs/`` and the README lies between the
markers of the benchmark script that measures it (``<!-- SCRIPT:NAME:begin -->``
... ``<!-- SCRIPT:NAME:end -->``, written by ``benchmarks/SCRIPT.py --markdown
PAGE``), so that a number is never copied into the docs by hand and a table is
refreshed by running its script again. Every relative link of the README and
of the docs names a file (or the page the site generates) and, where it names
an anchor, a heading of that file.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]

MARKER = re.compile(r"<!-- ([\w-]+):([\w-]+):(begin|end) -->")
# A cell that is a measurement: a number with a fraction, a unit or a ratio
# (0.46x, 43.5, 1285 GB/s (43%), 10/10, 3/3 (0, 1, 2), 54s, 0.1%, >5x). A bare
# integer is not one: tables of section numbers, exit codes and ranges hold them.
NUMBER = re.compile(
    r"^[<>~]?[-+]?(\d+\.\d+\s*(x|%|s|ms|us|/s|GB/s)?|\d+\s*(x|%|s|ms|us|/s|GB/s))(\s*\(.*\))?$"
    r"|^\d+/\d+\b.*$"
)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _generated_pages() -> set[str]:
    """The pages the site's hook generates (not files of the checkout)."""
    spec = importlib.util.spec_from_file_location("docs_hook", DOCS / "hooks" / "registry.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return {module.PAGE}


def tables(text: str) -> list[tuple[int, list[str]]]:
    """Each Markdown table of ``text`` (code fences included): its first line
    number and its data rows."""
    lines, out, i = text.splitlines(), [], 0
    while i < len(lines):
        is_table = (
            lines[i].lstrip().startswith("|")
            and i + 1 < len(lines)
            and re.match(r"^\s*\|[\s:|-]+\|\s*$", lines[i + 1])
        )
        if not is_table:
            i += 1
            continue
        start, i = i, i + 2
        rows = []
        while i < len(lines) and lines[i].lstrip().startswith("|"):
            rows.append(lines[i])
            i += 1
        out.append((start + 1, rows))
    return out


def measured(rows: list[str]) -> bool:
    """Whether a table holds measured numbers: some data cell is a number."""
    for row in rows:
        cells = [c.strip().strip("`*") for c in row.strip().strip("|").split("|")]
        if any(NUMBER.match(c) for c in cells):
            return True
    return False


def sections(text: str) -> list[tuple[str, str, int, int]]:
    """The marker blocks of ``text``: (script, name, first line, last line)."""
    out, open_ = [], {}
    for number, line in enumerate(text.splitlines(), 1):
        for script, name, edge in MARKER.findall(line):
            if edge == "begin":
                assert (script, name) not in open_, f"{script}:{name} opened twice"
                open_[script, name] = number
            else:
                assert (script, name) in open_, f"{script}:{name} ends without a begin"
                out.append((script, name, open_.pop((script, name)), number))
    assert not open_, f"markers never closed: {sorted(open_)}"
    return out


def hand_typed(text: str) -> list[int]:
    """The first lines of the tables of numbers outside every marker block."""
    blocks = sections(text)
    return [
        start
        for start, rows in tables(text)
        if measured(rows) and not any(b <= start <= e for _, _, b, e in blocks)
    ]


def slug(heading: str) -> str:
    """A heading's anchor, as Python-Markdown's toc (mkdocs) and GitHub make it
    for the headings these pages use."""
    text = re.sub(r"[`*_]|\[([^]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    text = re.sub(r"[^\w\s-]", "", text)
    return re.sub(r"[-\s]+", "-", text).strip("-")


def anchors(path: Path) -> set[str]:
    text, fence = [], False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence and (m := re.match(r"#{1,6} (.*)", line)):
            text.append(slug(m.group(1)))
    return set(text)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_table_of_numbers_is_written_by_its_script(page: Path) -> None:
    text = page.read_text()
    loose = hand_typed(text)
    assert not loose, (
        f"{page.relative_to(ROOT)}: tables of numbers outside a benchmark's markers at lines "
        f"{loose}: have the script that measures them write them (--markdown)"
    )
    for script, name, _, _ in sections(text):
        source = ROOT / "benchmarks" / f"{script}.py"
        assert source.is_file(), f"{page.name}: marker {script}:{name} names no script {source}"
        assert f'"{name}"' in source.read_text(), f"{source.name} does not write {script}:{name}"


def test_a_hand_typed_table_is_caught() -> None:
    table = "| target | ex/s |\n|---|---|\n| mtp-seq-lens | 288.5 |\n"
    assert hand_typed("Throughput:\n\n" + table) == [3]
    written = "<!-- throughput:judges:begin -->\n" + table + "<!-- throughput:judges:end -->\n"
    assert hand_typed(written) == []
    assert hand_typed("| command | what it does |\n|---|---|\n| `list` | targets |\n") == []


def test_every_relative_link_resolves() -> None:
    generated = _generated_pages()
    broken = []
    for page in PAGES:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            where = page if not path else (page.parent / path).resolve()
            if path and where.relative_to(ROOT).as_posix().removeprefix("docs/") in generated:
                continue
            if not where.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
            elif anchor and where.suffix == ".md" and anchor not in anchors(where):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, broken


def test_the_site_lists_every_page() -> None:
    """Each page of docs/ is in mkdocs.yml's nav (the strict build warns otherwise)."""
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.glob("*.md")}
    missing = sorted(p for p in pages | _generated_pages() if f": {p}" not in nav)
    assert not missing, f"not in mkdocs.yml's nav: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_code_block_is_closed(page: Path) -> None:
    """An unclosed fence swallows the rest of the page (the README is not built
    by mkdocs, so nothing else would say so)."""
    fences = re.findall(r"(?m)^\s*```", page.read_text())
    assert len(fences) % 2 == 0, f"{page.relative_to(ROOT)}: a code block is never closed"


def test_every_test_the_guarantees_name_exists():
    """Each row of docs/guarantees.md names the tests that hold it: they must exist
    (``file.py::name``; a bare ``::name`` is in the file named before it on its line)."""
    text = (Path(__file__).parent.parent / "docs" / "guarantees.md").read_text()
    tests = Path(__file__).parent
    missing, named = [], 0
    for line in text.splitlines():
        current = None
        for m in re.finditer(r"`(test_\w+\.py)?::(\w+)(?:\[[^\]]*\])?`|`(test_\w+\.py)`", line):
            if m.group(3):
                current = m.group(3)
                continue
            current = m.group(1) or current
            named += 1
            path = tests / str(current)
            if current is None or f"def {m.group(2)}(" not in path.read_text():
                missing.append(f"{current}::{m.group(2)}")
    assert named > 50 and not missing, missing


def test_no_bug_upstream_fixed_first_is_credited_to_attnfuzz():
    """Each shipped bug was fixed upstream (its ``first_fixed`` release) before attnfuzz
    ran on the releases that ship it: attnfuzz re-finds it, it did not find it. Its
    declaration and the docs say "fixed upstream in R"; a defect of the newest release
    is "present in the newest release", which says what was observed and no more."""
    from attnfuzz.harness import engines

    declared = [*engines.engines().values()]
    declared += [e for held, _ in engines.held_back().values() for e in held]
    assert declared, "no engine plugin registered"
    for engine in declared:
        for bug in engine.shipped_bugs:
            assert "found by attnfuzz" not in f"{bug.what} {bug.note}".lower(), bug.ref
    for page in sorted(DOCS.glob("*.md")) + [ROOT / "README.md"]:
        assert "found by attnfuzz" not in page.read_text().lower(), page.name


# A count of examples quoted in prose ("first failure after 134, 25 and 21 examples"):
# a measurement, so it belongs in a script's section or nowhere.
PROSE_COUNT = re.compile(r"after \d[\d,\s]*(and \d+\s*)?examples")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_count_of_examples_is_quoted_in_prose(page: Path) -> None:
    """Counts of examples to a failure drift as the strategies change: a page quotes
    them only inside a section its script writes (a command's output shown in a
    code block is a sample of what it prints, not a figure)."""
    text = page.read_text()
    blocks = sections(text)
    prose, fence = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fence = not fence
        elif not fence and not any(b <= number <= e for _, _, b, e in blocks):
            prose.append(line)
    found = PROSE_COUNT.search(" ".join(prose))
    assert found is None, f"{page.name}: '{found.group(0)}' (a count of examples in prose)"
