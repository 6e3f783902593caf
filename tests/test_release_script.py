"""benchmarks/releases.py without installing anything: its table logic and docs page writing.

The script itself installs releases and runs for an hour; here its runs and
venvs are stood in, so that what it concludes from them is what is checked.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import pytest

compat = pytest.importorskip("attnfuzz.adapters.vllm.compat")  # the vLLM plugin's releases

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def releases():
    sys.path.insert(0, str(ROOT / "benchmarks"))  # the scripts' shared modules, as when run
    spec = importlib.util.spec_from_file_location("releases", ROOT / "benchmarks/releases.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["releases"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    yield module
    del sys.modules["releases"]
    sys.path.remove(str(ROOT / "benchmarks"))


def test_the_sweep_covers_the_supported_range_and_the_fixes_lie_in_it(releases):
    assert releases.RELEASES[0] == compat.OLDEST and releases.RELEASES[-1] == compat.NEWEST
    keys = [compat.release_key(r) for r in releases.RELEASES]
    assert keys == sorted(keys) and len(set(keys)) == len(keys)
    for fix in releases.FIXES:
        assert fix.last_buggy in releases.RELEASES and fix.first_fixed in releases.RELEASES
        assert compat.release_key(fix.last_buggy) < compat.release_key(fix.first_fixed)


def test_a_bug_row_says_which_seeds_found_it_and_whether_the_fix_passes(
    releases, monkeypatch, tmp_path
):
    Run = releases.Run
    outcomes = {
        "0.21.0": [Run(1, 12, "q_lens [2]", "live", ("stride",), "", 1.0),
                   Run(1, 9, "q_lens [4]", "live", ("values",), "", 1.0),
                   Run(5, 40, "q_lens [3]", "latent", ("values", "consumer"), "", 1.0)],
        "0.22.0": [Run(0, None, "", "", (), "", 1.0), Run(0, None, "", "", (), "", 1.0),
                   Run(1, 7, "q_lens [1]", "live", ("contiguous",), "FAIL ...", 1.0)],
    }  # fmt: skip
    calls = []

    def run(venv, target, impl, seed, examples):
        calls.append((venv.name, target, impl, seed, examples))
        return outcomes[venv.name][seed]

    fix = next(f for f in releases.FIXES if f.ref == "#42135")
    monkeypatch.setattr(releases, "FIXES", (fix,))
    monkeypatch.setattr(releases, "release_venv", lambda root, release, keep: Path(release))
    monkeypatch.setattr(releases, "attnfuzz_run", run)
    args = argparse.Namespace(venvs=tmp_path, keep=2, seeds=[0, 1, 2], max_examples=1000,
                              target=None, rerun=False)  # fmt: skip
    lines = releases.bugs(args)
    row = next(line for line in lines if "0.21.0 / 0.22.0" in line)
    cells = [c.strip() for c in row.strip("|").split("|")]
    # Seed 1 found another defect (values only), not #42135's checks.
    assert cells[3] == "2/3 (0, 2)" and cells[4] == "12, 40"
    assert cells[5] == "q_lens [2] (live)"
    assert cells[6] == "no: seed 2: found (contiguous)", "a fixed release that fails must say so"
    assert {c[3] for c in calls} == {0, 1, 2} and all(c[4] == 1000 for c in calls)
    # Kept in DIR/bugs.json: the table again without a run; --rerun of another target neither.
    calls.clear()
    assert releases.bugs(args) == lines and calls == []
    args.rerun, args.target = True, ["slot-mapping"]
    assert releases.bugs(args) == lines and calls == []
    args.target = [fix.target]
    assert releases.bugs(args) == lines and len(calls) == 6


def test_the_sglang_bugs_run_in_sglang_venvs_and_table_apart(releases, monkeypatch, tmp_path):
    """``--engine sglang``: SGLang's shipped bugs, each release installed by SGLang's
    install.sh into ``DIR/sglang-<release>``, kept in ``DIR/bugs-sglang.json``."""
    from attnfuzz.adapters.sglang.shipped import SHIPPED_BUGS

    assert releases.ENGINE_FIXES["sglang"] == SHIPPED_BUGS
    assert releases.install_script("sglang") == ROOT / "adapters/sglang/install.sh"
    assert releases.install_script("sglang").is_file()
    Run = releases.Run
    fix = next(f for f in SHIPPED_BUGS if f.ref == "#27545")
    venvs = []

    def release_venv(root, release, keep, engine="vllm"):
        venvs.append((release, engine))
        return Path(release)

    def run(venv, target, impl, seed, examples):
        assert (target, impl) == (fix.target, fix.impl)
        if venv.name == fix.last_buggy:
            return Run(1, 3 + seed, "q_lens [1]", "live", ("values",), "FAIL", 1.0)
        return Run(0, None, "", "", (), "", 1.0)

    monkeypatch.setitem(releases.ENGINE_FIXES, "sglang", (fix,))
    monkeypatch.setattr(releases, "release_venv", release_venv)
    monkeypatch.setattr(releases, "attnfuzz_run", run)
    args = argparse.Namespace(venvs=tmp_path, keep=1, seeds=[0, 1, 2], max_examples=1000,
                              target=None, rerun=False, engine="sglang")  # fmt: skip
    lines = releases.bugs(args)
    assert venvs == [(fix.last_buggy, "sglang"), (fix.first_fixed, "sglang")]
    assert "--engine sglang bugs" in lines[0]
    assert not any("Not in the range" in line for line in lines)
    row = next(line for line in lines if f"{fix.last_buggy} / {fix.first_fixed}" in line)
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[3] == "3/3 (0, 1, 2)" and cells[4] == "3, 4, 5" and cells[6] == "yes"
    assert (tmp_path / "bugs-sglang.json").is_file() and not (tmp_path / "bugs.json").exists()


def test_write_section_replaces_only_between_its_markers(releases, tmp_path):
    page = tmp_path / "releases.md"
    page.write_text("a\n<!-- releases:bugs:begin -->\nold\n<!-- releases:bugs:end -->\nz\n")
    releases.write_section(page, "bugs", ["| new |"])
    assert page.read_text() == (
        "a\n<!-- releases:bugs:begin -->\n| new |\n<!-- releases:bugs:end -->\nz\n"
    )
    with pytest.raises(SystemExit, match="no <!-- releases:sweep:begin -->"):
        releases.write_section(page, "sweep", [])


def test_the_releases_page_has_its_sections(releases):
    text = (ROOT / "docs" / "releases.md").read_text()
    for name in ("bugs", "sweep", "tests", "bugs-sglang"):
        assert f"<!-- releases:{name}:begin -->" in text and f"<!-- releases:{name}:end -->" in text


def test_the_sweep_table_holds_what_was_run_and_marks_the_rest(releases):
    from attnfuzz.harness.definitions import markdown_table

    done = {
        "0.22.1 install": {"seconds": 30.0},
        "0.22.1 decode-split": {"code": 1, "reach": "unknown", "checks": ["values", "values"],
                                "detail": "FAIL", "seconds": 60.0},
        "0.22.1 slot-mapping": {"code": 0, "reach": "", "checks": [], "detail": "",
                                "seconds": 60.0},
    }  # fmt: skip
    lines = releases.sweep_table(done, ["decode-split", "slot-mapping", "max-seq-len"],
                                 markdown_table, 200)  # fmt: skip
    assert "times add up to 2 minutes" in lines[0] and "`-`: not run yet" in lines[0]
    (row,) = [line for line in lines if line.startswith("| 0.22.1")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells == ["0.22.1", "found (values; unknown)", "pass", "-", "30s"]


def test_adapter_tests_count_pytest_s_summary_and_name_the_failures(
    releases, monkeypatch, tmp_path
):
    """The ``tests`` mode reads pytest's own summary line and FAILED lines per release,
    stores them, skips a stored release unless asked again, and tables them."""
    import subprocess
    from types import SimpleNamespace

    calls = []

    def fake_run(cmd, **kwargs):
        calls.append(cmd)
        out = (
            ""
            if "pip" in cmd
            else (
                "FAILED tests/test_vllm_x.py::test_a - AssertionError\n"
                "1 failed, 40 passed, 3 skipped, 2 errors in 61.00s (0:01:01)"
            )
        )
        return subprocess.CompletedProcess(cmd, 1 if out else 0, out, "")

    monkeypatch.setattr(releases, "release_venv", lambda root, release, keep: tmp_path / release)
    monkeypatch.setattr(releases.subprocess, "run", fake_run)
    args = SimpleNamespace(venvs=tmp_path, releases=["0.24.0"], rerun=False, keep=2, jobs=2)
    lines = releases.adapter_tests(args)
    (row,) = [line for line in lines if line.startswith("| 0.24.0")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[:5] == ["0.24.0", "40", "3", "3", "tests/test_vllm_x.py::test_a"]
    assert cells[5].endswith(" min")  # measured around the run, here a stand-in
    assert any("-m" in c and "vllm" in c for c in calls)
    calls.clear()
    releases.adapter_tests(args)  # stored: not run again
    assert calls == []


def test_a_fixed_release_without_a_verdict_never_reads_as_passing(releases):
    """A seed that ran no search on the fixed release (the implementation cannot load
    there) is no verdict: the cell says so, never 'yes, of this bug'."""
    unavailable = releases.Run(releases.USAGE, None, "", "", (), "cannot load sglang", 1.0)
    passed = releases.Run(releases.PASS, None, "", "", (), "", 1.0)
    other = releases.Run(releases.FOUND, 3, "case", "live", ("padding",), "", 1.0)
    cell = releases._fixed_cell([0, 1], [passed, unavailable], passes=False)
    assert cell.startswith("no verdict: ") and "cannot load sglang" in cell
    assert releases._fixed_cell([0, 1], [passed, other], passes=True).startswith("yes, of this bug")
    assert releases._fixed_cell([0, 1], [passed, passed], passes=True) == "yes"


def test_a_bug_row_s_reachability_is_attnfuzz_s_own_computed_by_the_current_declarations(
    releases, monkeypatch, tmp_path
):
    """One source of truth: a stored finding's reachability is what ``attnfuzz run``
    computed; where the declarations reachability reads have changed since (a site
    declared after the run), ``attnfuzz repro --json`` of its case file in the release's
    venv computes it again; stored without its case file it is run again; never asked
    for, it is tabled as computed by earlier declarations, never as current."""
    import json

    from attnfuzz.adapters.sglang.shipped import SHIPPED_BUGS

    fix = next(f for f in SHIPPED_BUGS if f.ref == "#24401")
    monkeypatch.setitem(releases.ENGINE_FIXES, "sglang", (fix,))
    monkeypatch.setattr(releases, "release_venv", lambda root, release, keep, engine: Path(release))
    seeds, examples = [0, 1], 1000
    keys = {(r, s): f"{fix.ref} {fix.impl} {r} {s} {examples}"
            for r in (fix.last_buggy, fix.first_fixed) for s in seeds}  # fmt: skip
    found = {"code": releases.FOUND, "examples": 3, "case": "q_lens [1, 1]",
             "reach": "unknown", "checks": ["padding"], "detail": "FAIL", "seconds": 1.0,
             "reach_by": "earlier"}  # fmt: skip
    passed = {"code": releases.PASS, "examples": None, "case": "", "reach": "", "checks": [],
              "detail": "", "seconds": 1.0}  # fmt: skip
    store = tmp_path / "bugs-sglang.json"
    stored = {keys[fix.last_buggy, 0]: found | {"casefile": {"case": "the finding"}},
              keys[fix.last_buggy, 1]: found,  # no case file: run again
              keys[fix.first_fixed, 0]: passed, keys[fix.first_fixed, 1]: passed}  # fmt: skip
    store.write_text(json.dumps(stored))
    replayed, ran = [], []

    def repro_reach(venv, casefile):
        replayed.append((venv.name, casefile))
        return "live"

    def run(venv, target, impl, seed, examples):
        ran.append((venv.name, seed))
        return releases.Run(releases.FOUND, 3, "q_lens [1, 1]", "live", ("padding",), "", 1.0)

    monkeypatch.setattr(releases, "repro_reach", repro_reach)
    monkeypatch.setattr(releases, "attnfuzz_run", run)
    args = argparse.Namespace(venvs=tmp_path, keep=1, seeds=seeds, max_examples=examples,
                              target=["dsa-metadata"], rerun=False, engine="sglang")  # fmt: skip
    lines = releases.bugs(args)  # another target asked for: nothing replayed, nothing run
    row = next(line for line in lines if f"{fix.last_buggy} / {fix.first_fixed}" in line)
    assert "(unknown by earlier declarations)" in row and not replayed and not ran
    args.target = None
    row = next(line for line in releases.bugs(args) if f"{fix.last_buggy} /" in line)
    assert replayed == [(fix.last_buggy, {"case": "the finding"})]
    assert ran == [(fix.last_buggy, 1)]
    assert "q_lens [1, 1] (live)" in row
    done = json.loads(store.read_text())
    current = releases.reach_fingerprint("sglang")
    assert {done[keys[fix.last_buggy, s]]["reach_by"] for s in seeds} == {current}
    replayed.clear(), ran.clear()
    releases.bugs(args)  # current now: neither replayed nor run again
    assert not replayed and not ran
