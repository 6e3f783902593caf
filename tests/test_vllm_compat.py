"""The compatibility layer: which vLLM releases bind, found by feature detection.

These run without vLLM: the APIs probed are stand-in modules, the installed
version is patched. What the real releases offer is measured by the release
sweep (``benchmarks/releases.py``), not here.
"""

from __future__ import annotations

import contextlib
import json
import sys
import types
from pathlib import Path
from unittest import mock

import pytest
from attnfuzz.adapters import vllm
from attnfuzz.adapters.vllm import compat
from attnfuzz.harness.cli import main
from attnfuzz.harness.registry import get_target
from attnfuzz.harness.testing import hand_case

FAKE = "attnfuzz_fake_vllm"


@pytest.fixture
def fake_release(monkeypatch):
    """A stand-in for vLLM's modules: ``FAKE.builder`` with a builder class whose
    ``__init__`` takes ``block_table_width``, and ``FAKE.broken``, whose import fails
    as a partially installed package's does."""
    pkg = types.ModuleType(FAKE)
    pkg.__path__ = []
    builder = types.ModuleType(f"{FAKE}.builder")

    class Builder:
        def __init__(self, spec: object, *, block_table_width: int) -> None: ...

    builder.Builder = Builder  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, FAKE, pkg)
    monkeypatch.setitem(sys.modules, f"{FAKE}.builder", builder)
    monkeypatch.setitem(sys.modules, f"{FAKE}.broken", None)  # import raises ImportError
    compat._missing.cache_clear()
    yield
    compat._missing.cache_clear()


@pytest.mark.parametrize(
    "version, key",
    [("0.33.0", (0, 33, 0)), ("0.34.0.dev12+gabc1234", (0, 34, 0)), ("0.22.1+cpu", (0, 22, 1)),
     ("1.0", (1, 0, 0)), ("0.27.1rc1", (0, 27, 1))],
)  # fmt: skip
def test_release_keys(version, key):
    assert compat.release_key(version) == key


@pytest.mark.parametrize("version", ["0.21.0", "0.22.1", "0.33.0", "0.33.2", "0.33.1.dev3"])
def test_releases_in_the_range_are_accepted(version, monkeypatch):
    monkeypatch.delenv(compat.ANY_RELEASE, raising=False)
    assert compat.range_problem(version) is None


@pytest.mark.parametrize("version", ["0.20.2", "0.19.1", "0.34.0", "0.34.0.dev5+g1", "1.0.0"])
def test_releases_outside_the_range_are_refused_naming_it(version, monkeypatch):
    monkeypatch.delenv(compat.ANY_RELEASE, raising=False)
    why = compat.range_problem(version)
    assert why is not None and version in why
    assert f"{compat.OLDEST} to {compat.NEWEST}" in why and compat.ANY_RELEASE in why
    monkeypatch.setenv(compat.ANY_RELEASE, "1")
    assert compat.range_problem(version) is None


def test_an_api_is_found_by_module_attribute_and_keyword(fake_release):
    assert compat.Api(f"{FAKE}.builder").missing() is None
    assert compat.Api(f"{FAKE}.builder", "Builder.__init__").missing() is None
    width = compat.Api(f"{FAKE}.builder", "Builder.__init__", keyword="block_table_width")
    assert compat.has(width)
    why = compat.Api(f"{FAKE}.builder", "Builder.__init__", keyword="num_reqs").missing()
    assert why == f"{FAKE}.builder.Builder.__init__(num_reqs=) is missing (no num_reqs= parameter)"
    why = compat.Api(f"{FAKE}.builder", "Builder._load_ptr").missing()
    assert why == f"{FAKE}.builder.Builder._load_ptr is missing"
    assert not compat.has(compat.Api(f"{FAKE}.absent"))


_VENDOR = f"{FAKE}_vendor"  # a vendor package this machine lacks


@contextlib.contextmanager
def vendor_standin():
    """``_VENDOR`` importable for the block, as an adapter's stand-in makes it."""
    with mock.patch.dict(sys.modules, {_VENDOR: types.ModuleType(_VENDOR)}):
        yield


def test_an_api_whose_module_the_adapter_imports_within_a_standin_is_found(
    fake_release, tmp_path, monkeypatch
):
    """A module that imports a vendor package at its top is missing by itself (the
    import error says so) and found within the stand-in the adapter imports it in."""
    (tmp_path / f"{FAKE}_needs_vendor.py").write_text(f"import {_VENDOR}\nclass Backend: ...\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, f"{FAKE}_needs_vendor", raising=False)
    plain = compat.Api(f"{FAKE}_needs_vendor", "Backend")
    assert f"No module named '{_VENDOR}'" in plain.missing()
    within = compat.Api(f"{FAKE}_needs_vendor", "Backend", within=f"{__name__}:vendor_standin")
    assert within.missing() is None
    assert _VENDOR not in sys.modules  # the stand-in is gone after the probe


def test_a_partially_installed_module_is_its_import_error_in_one_line(fake_release):
    why = compat.Api(f"{FAKE}.broken", "anything").missing()
    assert why is not None and "\n" not in why
    assert why.startswith(f"importing {FAKE}.broken failed: ModuleNotFoundError: ")


def test_an_adapter_missing_an_api_names_it_and_a_release_that_has_all(fake_release, monkeypatch):
    old = compat.Api(f"{FAKE}.builder", "Builder", since="0.22.0")
    new = compat.Api(f"{FAKE}.builder", "Builder.rebuild", since="0.28.0")
    monkeypatch.setitem(compat.REQUIRES, "fake_adapter", (old,))
    monkeypatch.setitem(compat.REQUIRES, "fake_adapter.upstream", (new,))
    monkeypatch.delenv(compat.ANY_RELEASE, raising=False)
    assert compat.binding_problem("fake_adapter", "run", "0.25.0") is None
    why = compat.binding_problem("fake_adapter", "upstream", "0.25.0")
    assert why == (
        f"vLLM 0.25.0: {FAKE}.builder.Builder.rebuild is missing; it binds from vLLM 0.28.0: "
        f"ATTNFUZZ_VLLM=0.28.0 ./setup.sh (or {compat.INSTALL_SCRIPT} VENV 0.28.0)"
    )
    assert "0.34.0" in compat.binding_problem("fake_adapter", "run", "0.34.0")


def test_every_required_api_names_a_module_of_vllm():
    for name, apis in compat.REQUIRES.items():
        module = name.split(".")[0]
        assert (Path(vllm.__file__).parent / f"{module}.py").is_file(), name
        for api in apis:
            assert api.module.startswith("vllm."), api
            assert not api.since or compat.release_key(api.since) <= compat.release_key(
                compat.NEWEST
            ), api


@pytest.fixture
def release_outside_the_range(monkeypatch):
    monkeypatch.setattr(vllm, "installed_version", lambda: "0.19.1")
    monkeypatch.delenv(compat.ANY_RELEASE, raising=False)


def test_list_says_a_release_is_outside_the_range(release_outside_the_range, capsys):
    assert main(["list"]) == 0
    text = capsys.readouterr().out
    assert text.splitlines()[0] == (
        f"vLLM: vLLM 0.19.1 is installed; attnfuzz's vLLM adapters support releases "
        f"{compat.OLDEST} to {compat.NEWEST} ({compat.ANY_RELEASE}=1 binds any release by "
        "feature detection)"
    )
    assert main(["list", "--json"]) == 0
    for row in json.loads(capsys.readouterr().out):
        for impl in row["implementations"]:
            if impl["engine"] == "vllm":
                assert impl["engine_version"] == "0.19.1" and "0.19.1" in impl["unavailable"]


def test_choosing_an_unbound_implementation_is_one_usage_line(
    release_outside_the_range, tmp_path, capsys
):
    code = main(["run", "--target", "mtp-seq-lens", "--impl", "vllm", "--max-examples", "1",
                 "--out", str(tmp_path / "cases"), "--db", str(tmp_path / "db")])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "cannot run" in err[0] and "0.19.1" in err[0] and compat.OLDEST in err[0]
    assert not (tmp_path / "cases").exists()


def test_list_names_the_implementations_a_missing_api_leaves_unbound(
    fake_release, monkeypatch, capsys
):
    monkeypatch.setattr(vllm, "installed_version", lambda: "0.25.0")
    monkeypatch.delenv(compat.ANY_RELEASE, raising=False)
    gone = compat.Api(f"{FAKE}.builder", "Builder.rebuild", since="0.28.0")
    for name in list(compat.REQUIRES):
        monkeypatch.setitem(compat.REQUIRES, name, ())
    monkeypatch.setitem(compat.REQUIRES, "mtp_seq_lens", (gone,))
    assert main(["list"]) == 0
    text = capsys.readouterr().out
    assert text.splitlines()[0].startswith("vLLM 0.25.0 installed")
    impls = get_target("mtp-seq-lens").implementations.values()
    names = ", ".join(f"mtp-seq-lens/{i.name}" for i in impls if i.engine == "vllm")
    assert names.count("/") == 3
    assert f"unavailable ({names}): vLLM 0.25.0: {FAKE}.builder.Builder.rebuild" in text


def test_reachability_says_why_a_release_planner_cannot_be_driven(fake_release, monkeypatch):
    """Where the installed release lacks what attnfuzz's planner adapter calls, the
    reachability of a finding is unknown, naming the missing API: the reference's
    rules are another release's."""
    from attnfuzz.harness.reachability import UNKNOWN, finding_reachability

    monkeypatch.setattr(vllm, "installed_version", lambda: "0.25.0")
    monkeypatch.delenv(compat.ANY_RELEASE, raising=False)
    gone = compat.Api(f"{FAKE}.builder", "Builder.plan", since="0.30.0")
    monkeypatch.setitem(compat.REQUIRES, "runner_modes", (gone,))
    target = get_target("decode-split")
    impl = target.implementations["vllm"]
    case = hand_case((1, 1), (3, 4))
    reach = finding_reachability(target, impl, case, lambda c: pytest.fail("judged"))
    assert reach is not None and reach.status == UNKNOWN and reach.pairs == ()
    assert reach.reason.startswith("not computed: the installed engine's step planning")
    assert f"{FAKE}.builder.Builder.plan is missing" in reach.reason and "0.30.0" in reach.reason


def test_the_install_script_installs_only_supported_releases(tmp_path):
    """adapters/vllm/install.sh, which the install hints name, refuses a release
    outside the range before it installs anything."""
    import subprocess

    for release in ("0.20.2", "0.34.0", "main"):
        out = subprocess.run(
            ["bash", str(compat.INSTALL_SCRIPT), str(tmp_path / "venv"), release],
            capture_output=True, text=True,
        )  # fmt: skip
        assert out.returncode == 2 and "outside the supported releases" in out.stderr
        assert f"{compat.OLDEST} to {compat.NEWEST}" in out.stderr
    assert not (tmp_path / "venv").exists()
