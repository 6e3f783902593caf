"""The public contracts are versioned: CHANGELOG.md has an entry for the version installed,
and every field a reference dataclass lost reads with the history the changelog gives."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import attnfuzz
import pytest
from attnfuzz.reference.history import FieldHistory

ROOT = Path(__file__).resolve().parent.parent
CHANGELOG = (ROOT / "CHANGELOG.md").read_text()


def test_the_installed_version_has_an_entry():
    assert re.search(rf"^## \[{re.escape(attnfuzz.__version__)}\] - \d{{4}}-\d\d-\d\d$",
                     CHANGELOG, re.M)  # fmt: skip


def _histories() -> list[tuple[type, str, str]]:
    out = []
    for path in sorted((ROOT / "reference").glob("*.py")):
        module = importlib.import_module(f"attnfuzz.reference.{path.stem}")
        for obj in vars(module).values():
            if isinstance(obj, type) and issubclass(obj, FieldHistory) and obj is not FieldHistory:
                out += [(obj, name, note) for name, note in obj.removed.items()]
    return out


@pytest.mark.parametrize("cls, name, note", _histories(), ids=lambda v: getattr(v, "__name__", v))
def test_every_removed_field_is_in_the_changelog_under_its_version(cls, name, note):
    version = re.search(r"in (\d+\.\d+\.\d+)", note)
    assert version, f"{cls.__name__}.{name}: its history names no version"
    entry = CHANGELOG.split(f"## [{version.group(1)}]")[1].split("\n## [")[0]
    assert f"{cls.__name__}.{name}" in entry
