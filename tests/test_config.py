"""``[tool.attnfuzz]`` in a project's pyproject.toml: found, checked, typed."""

from __future__ import annotations

from pathlib import Path

import pytest
from attnfuzz.harness.config import KEYS, defaults, find_pyproject
from attnfuzz.harness.errors import UsageError

FULL = """
[project]
name = "my-engine"

[tool.attnfuzz]
db = ".attnfuzz/db"
out = "campaign"
cases = "/abs/cases"
budget = 120
max_examples = 1000
min_examples = 0
profile = "ci"
targets = ["mtp-seq-lens", "indexer-decode"]
mutants = ["my_engine.bugs", "my_engine.more:MUTANTS"]
scale = "production"
workers = 4
"""


def _project(root: Path, text: str) -> Path:
    (root / "pyproject.toml").write_text(text)
    deep = root / "src" / "pkg"
    deep.mkdir(parents=True)
    return deep


def test_every_key_is_read_from_the_nearest_pyproject_and_typed(tmp_path):
    deep = _project(tmp_path, FULL)
    got = defaults(deep)
    assert set(got) == set(KEYS)
    assert got == {
        "db": str(tmp_path / ".attnfuzz" / "db"),  # relative to the file, not the cwd
        "out": tmp_path / "campaign",
        "cases": Path("/abs/cases"),
        "budget": 120.0,
        "max_examples": 1000,
        "min_examples": 0,  # no floor: 0 is a value, not a missing one
        "profile": "ci",
        "targets": ["mtp-seq-lens", "indexer-decode"],
        "mutants": ["my_engine.bugs", "my_engine.more:MUTANTS"],
        "scale": "production",
        "workers": 4,
    }
    assert isinstance(got["budget"], float)


def test_the_working_directory_is_the_default_start(tmp_path, monkeypatch):
    deep = _project(tmp_path, '[tool.attnfuzz]\nworkers = 2\nout = "o"\n')
    monkeypatch.chdir(deep)
    assert defaults() == {"workers": 2, "out": tmp_path / "o"}


def test_database_urls_are_kept_as_written(tmp_path):
    for db in ("redis://localhost:6379/0", ".attnfuzz/db+github:me/engine"):
        (tmp_path / "pyproject.toml").write_text(f'[tool.attnfuzz]\ndb = "{db}"\n')
        assert defaults(tmp_path) == {"db": db}


def test_the_nearest_pyproject_is_the_projects_even_without_a_table(tmp_path):
    inner = _project(tmp_path, "[tool.attnfuzz]\nworkers = 8\n")
    (inner / "pyproject.toml").write_text('[project]\nname = "inner"\n')
    assert find_pyproject(inner) == inner / "pyproject.toml"
    assert defaults(inner) == {}  # the outer project's settings do not leak in
    assert defaults(inner.parent) == {"workers": 8}


def test_no_pyproject_no_defaults(tmp_path, monkeypatch):
    monkeypatch.setattr(Path, "is_file", lambda self: False)
    assert find_pyproject(tmp_path) is None and defaults(tmp_path) == {}


@pytest.mark.parametrize(
    "body, why",
    [
        ("seed = 3", "unknown key 'seed' \\(known: db, "),
        ('budget = "2m"', "budget must be a finite number of seconds > 0, got '2m'"),
        ("budget = 0", "budget must be a finite number of seconds > 0"),
        ("budget = inf", "budget must be a finite number of seconds > 0, got inf"),
        ("budget = 1e400", "budget must be a finite number of seconds > 0, got inf"),
        ("budget = nan", "budget must be a finite number of seconds > 0, got nan"),
        ("max_examples = 1.5", "max_examples must be an integer >= 1"),
        ("workers = true", "workers must be an integer >= 1, got True"),
        ("workers = 0", "workers must be an integer >= 1, got 0"),
        ('targets = "mtp-seq-lens"', "targets must be a list of target names"),
        ("mutants = [1]", "mutants must be a list of MODULE\\[:ATTRIBUTE\\] specs"),
        ('scale = "huge"', "scale must be one of production, small, got 'huge'"),
        ('db = ""', "db must be a non-empty string"),
        ("profile = 3", "profile must be one of ci, fuzz, dev, got 3"),
        ('profile = "nightly"', "profile must be one of ci, fuzz, dev, got 'nightly'"),
    ],
)
def test_a_wrong_setting_is_a_usage_error_naming_the_file_and_the_key(tmp_path, body, why):
    (tmp_path / "pyproject.toml").write_text(f"[tool.attnfuzz]\n{body}\n")
    with pytest.raises(UsageError, match=why) as err:
        defaults(tmp_path)
    message = str(err.value)
    assert message.startswith(f"{tmp_path / 'pyproject.toml'}: ") and "\n" not in message


def test_a_file_that_is_not_toml_or_a_section_that_is_not_a_table_is_refused(tmp_path):
    (tmp_path / "pyproject.toml").write_text("[tool.attnfuzz\n")
    with pytest.raises(UsageError, match="cannot read it as TOML"):
        defaults(tmp_path)
    (tmp_path / "pyproject.toml").write_bytes(b"[tool.attnfuzz]\nprofile = '\xff'\n")
    with pytest.raises(UsageError, match="cannot read it as TOML"):
        defaults(tmp_path)
    (tmp_path / "pyproject.toml").write_text('[tool]\nattnfuzz = "yes"\n')
    with pytest.raises(UsageError, match="tool.attnfuzz must be a table, got str"):
        defaults(tmp_path)
