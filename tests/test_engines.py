"""Engines as plugins (``harness/engines.py``): the ``attnfuzz.engines`` entry points
add implementations and upstream mutants to the targets; a broken one is reported,
never fatal; the core imports no engine, and runs without the vLLM plugin."""

from __future__ import annotations

import ast
import dataclasses
import importlib.metadata
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from attnfuzz.harness import engines, reachability, registry
from attnfuzz.harness.casefile import engine_versions
from attnfuzz.harness.cli import main
from attnfuzz.harness.engines import ENTRY_POINT_GROUP

ROOT = Path(__file__).resolve().parents[1]
CORE = ("harness", "reference", "kernels", "strategies", "reports")
ENGINE_PACKAGE = "attnfuzz.adapters"

FAKE = """
from attnfuzz.harness.engines import Engine
from attnfuzz.harness.target import Implementation
from attnfuzz.harness.targets import slot_mapping as t
from attnfuzz.kernels import slot_mapping as k
from attnfuzz.reference.runner import step_plan

PLANNED = []


def planner():
    def plan(config, batch):
        PLANNED.append(batch)
        return step_plan(config, batch)
    return plan


def engine(name="fake", implementations=None):
    return Engine(
        name=name,
        install="pip install fake-engine",
        installed_version=lambda: "1.2.3",
        unavailable=lambda: None,
        status=lambda: f"{name} 1.2.3 installed",
        implementations=implementations or {"slot-mapping": [
            Implementation("fake", k.slot_mapping, "engine", "the fake engine's slot mapping"),
            Implementation(
                "upstream-fake-position", k.mutant_position, "mutant", "a fix reverted",
                trigger=t.trigger_position, reach=t.reach_always, smallest=t.smallest_position,
            ),
        ]},
        planner=planner,
    )


FAKE = engine()
OTHER = engine("other", {"slot-mapping": [
    Implementation("triton", k.slot_mapping, "engine", "named like attnfuzz's own"),
    Implementation("other", k.slot_mapping, "engine", "the other engine's"),
]})
NARROWING = engine("narrowing", {"slot-mapping": [
    Implementation("narrow", k.slot_mapping, "engine", "a range of no parameter",
                   params={"no_such": (0, 1)}),
    Implementation("plain", k.slot_mapping, "engine", "the narrowing engine's other"),
]})
UNKNOWN_TARGET = engine("stray", {"no-such-target": []})
NOT_AN_ENGINE = 42
"""


def _clear() -> None:
    for cached in (engines._loaded, registry._plugins, registry.target_names, registry.get_target):
        cached.cache_clear()


@pytest.fixture
def fake_engines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator:
    """``use(name=value, ...)``: the ``attnfuzz.engines`` entry points are these only,
    with a module ``attnfuzz_test_engine`` (:data:`FAKE`) importable."""
    (tmp_path / "attnfuzz_test_engine.py").write_text(FAKE)
    monkeypatch.syspath_prepend(str(tmp_path))
    real = importlib.metadata.entry_points

    def use(*points: tuple[str, str]) -> None:
        eps = [importlib.metadata.EntryPoint(n, v, ENTRY_POINT_GROUP) for n, v in points]
        monkeypatch.setattr(
            importlib.metadata,
            "entry_points",
            lambda **s: (
                importlib.metadata.EntryPoints(eps)
                if s == {"group": ENTRY_POINT_GROUP}
                else real(**s)
            ),
        )
        _clear()

    yield use
    _clear()
    sys.modules.pop("attnfuzz_test_engine", None)


def test_an_engine_plugin_adds_an_implementation_and_an_upstream_mutant(fake_engines, capsys):
    fake_engines(("fake", "attnfuzz_test_engine:FAKE"))
    assert list(engines.engines()) == ["fake"] and engines.unavailable_engines() == {}
    target = registry.get_target("slot-mapping")
    impl, mutant = target.resolve("fake"), target.resolve("upstream-fake-position")
    assert (impl.kind, impl.engine, mutant.kind, mutant.engine) == (
        "engine",
        "fake",
        "mutant",
        "fake",
    )
    assert mutant in target.mutants and impl.why_unavailable() is None
    case = mutant.smallest()
    assert target.judge(impl, case, "cpu").ok
    assert not target.judge(mutant, case, "cpu").ok
    assert list(target.implementations)[-2:] == ["fake", "upstream-fake-position"]
    assert registry.engine_problems() == []
    # The engine's status line, version and reachability model are asked of the plugin.
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "fake 1.2.3 installed" and "left out" not in out
    assert engine_versions() == {"fake": "1.2.3"}
    planned = sys.modules["attnfuzz_test_engine"].PLANNED
    reachability.engine_planner("fake")(case.config, case.batch)
    assert planned == [case.batch]


def test_broken_engine_plugins_are_reported_and_the_rest_still_work(fake_engines, capsys):
    fake_engines(
        ("fake", "attnfuzz_test_engine:FAKE"),
        ("missing", "attnfuzz_test_no_such_module:ENGINE"),
        ("number", "attnfuzz_test_engine:NOT_AN_ENGINE"),
        ("renamed", "attnfuzz_test_engine:OTHER"),
        ("twice", "attnfuzz_test_engine:FAKE"),
        ("twice", "attnfuzz_test_engine:OTHER"),
        ("stray", "attnfuzz_test_engine:UNKNOWN_TARGET"),
    )
    reasons = engines.unavailable_engines()
    assert sorted(reasons) == ["missing", "number", "renamed", "twice"]
    assert "ModuleNotFoundError" in reasons["missing"]
    assert "is a int, not an attnfuzz Engine" in reasons["number"]
    assert "declares engine 'other', not 'renamed'" in reasons["renamed"]
    assert "both name engine 'twice'" in reasons["twice"]
    for name, reason in reasons.items():
        assert "\n" not in reason and f"entry point {name} = " in reason
    assert sorted(engines.engines()) == ["fake", "stray"]
    problems = registry.engine_problems()
    assert "engine stray: implementations of unknown target 'no-such-target'" in problems
    assert len(problems) == 5 and all("\n" not in p for p in problems)
    # The working engine's implementations are there, attnfuzz's own untouched.
    target = registry.get_target("slot-mapping")
    assert target.resolve("fake").engine == "fake" and target.resolve("triton").engine is None
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert sum(line.startswith("left out: engine ") for line in out.splitlines()) == 5
    assert main(["list", "--json"]) == 0
    captured = capsys.readouterr()
    json.loads(captured.out)  # stdout stays the targets' rows; the problems go to stderr
    assert captured.err.count("attnfuzz list: engine ") == 5


def test_an_engine_implementation_named_like_another_is_refused_in_one_line(fake_engines):
    fake_engines(("fake", "attnfuzz_test_engine:FAKE"), ("other", "attnfuzz_test_engine:OTHER"))
    target = registry.get_target("slot-mapping")
    assert target.resolve("triton").engine is None and target.resolve("triton").kind == "fixed"
    assert target.resolve("other").engine == "other"  # the rest of the engine is added
    (problem,) = registry.engine_problems()
    assert problem == (
        "engine other: slot-mapping already has an implementation 'triton' "
        "(fixed: one program per request); rename the engine's"
    )


def test_an_engine_implementation_narrowing_no_parameter_is_refused_in_one_line(fake_engines):
    fake_engines(("narrowing", "attnfuzz_test_engine:NARROWING"))
    target = registry.get_target("slot-mapping")
    assert "narrow" not in target.implementations
    assert target.resolve("plain").engine == "narrowing"  # the rest of the engine is added
    (problem,) = registry.engine_problems()
    assert problem.startswith("engine narrowing: implementation 'narrow': slot-mapping has no ")
    assert "parameter 'no_such'" in problem


# -- No core module imports an engine --------------------------------------------------


def engine_imports(source: str, module: str) -> list[str]:
    """Where ``source`` (of the module ``module``) imports the engine package or a module
    of it: import statements anywhere (module level or in functions), relative ones
    resolved, and ``importlib.import_module``/``__import__`` of a literal or f-string."""
    package = module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([base] if base else [])])
            names = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            called = getattr(func, "attr", getattr(func, "id", ""))
            if called in ("import_module", "__import__"):
                names = [ast.unparse(node.args[0]).strip("\"'f")]
        hits = [n for n in names if n == ENGINE_PACKAGE or n.startswith(f"{ENGINE_PACKAGE}.")]
        if hits:
            found.append(f"{module}:{node.lineno}: {hits[0]}")
    return found


def core_modules() -> Iterator[tuple[str, Path]]:
    for folder in CORE:
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            yield ".".join(["attnfuzz", *parts]), path


def test_no_core_module_imports_an_engine():
    found = [hit for name, path in core_modules() for hit in engine_imports(path.read_text(), name)]
    assert found == [], "engines are plugins (harness.engines), not imports: " + "; ".join(found)
    assert len(list(core_modules())) > 50  # the folders were found


@pytest.mark.parametrize(
    "line",
    [
        "from attnfuzz.adapters.vllm import implementation",
        "from attnfuzz.adapters import vllm",
        "import attnfuzz.adapters.vllm.compat",
        "def f():\n    from attnfuzz.adapters.vllm.mtp_seq_lens import takes_native_path",
        "from ...adapters.vllm import compat",
        "import importlib\nimportlib.import_module(f'attnfuzz.adapters.{engine}.runner_modes')",
    ],
)
def test_the_engine_import_check_finds_each_form(line):
    source = (ROOT / "harness/targets/slot_mapping.py").read_text() + "\n" + line + "\n"
    assert engine_imports(source, "attnfuzz.harness.targets.slot_mapping"), line


# -- Without the engine plugins ----------------------------------------------------------

ENGINES = ("vllm", "sglang")  # the plugins this distribution ships
WITHOUT_ENGINES = f"""
import importlib.abc, importlib.metadata as md, sys

class NoEnginePlugin(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        for engine in {ENGINES!r}:
            plugin = "attnfuzz.adapters." + engine
            if name == plugin or name.startswith(plugin + "."):
                raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)

sys.meta_path.insert(0, NoEnginePlugin())
_real = md.entry_points
md.entry_points = lambda **s: md.EntryPoints([]) if s == {{"group": "{ENTRY_POINT_GROUP}"}} \\
    else _real(**s)
"""


def _without_engines(code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_ENGINES + code, *args],
        capture_output=True, text=True, timeout=240, cwd=ROOT,
    )  # fmt: skip


def test_attnfuzz_runs_and_its_tests_import_without_the_engine_plugins(tmp_path):
    cli = "from attnfuzz.harness.cli import main\nsys.exit(main(sys.argv[1:]))"
    listed = _without_engines(cli, "list", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert rows and all(i["engine"] is None for r in rows for i in r["implementations"])
    run = _without_engines(
        cli, "run", "--target", "slot-mapping", "--impl", "triton", "--max-examples", "5",
        "--out", str(tmp_path / "cases"), "--db", str(tmp_path / "db"),
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    for engine in ENGINES:
        blocked = _without_engines(f"import attnfuzz.adapters.{engine}")
        assert f"No module named 'attnfuzz.adapters.{engine}'" in blocked.stderr  # it holds
    modules = [
        str(p.relative_to(ROOT))
        for p in sorted((ROOT / "tests").glob("test_*.py"))
        if not p.name.startswith(tuple(f"test_{engine}_" for engine in ENGINES))
    ]
    collect = "import pytest\nsys.exit(pytest.main(['--collect-only', '-q', *sys.argv[1:]]))"
    collected = _without_engines(collect, "-p", "no:randomly", *modules)
    assert collected.returncode == 0, collected.stdout[-3000:] + collected.stderr[-3000:]


def test_a_shipped_bug_holds_on_the_releases_that_ship_it_and_makes_the_search_xfail():
    """``Engine.shipped_bug`` names the defect where the installed release is in its
    range, and :func:`attnfuzz.harness.testing.shipped_bug_marks` turns it into an xfail
    on an assertion (a search may meet it; an attnfuzz error still errors)."""
    from dataclasses import replace

    from attnfuzz.harness.engines import Engine, ShippedBug, release_key
    from attnfuzz.harness.target import Implementation
    from attnfuzz.harness.testing import shipped_bug_marks
    from attnfuzz.kernels import slot_mapping as k

    bug = ShippedBug("#1", "slot-mapping", "fake", "0.22.1", "0.23.0", "a bug")
    assert [bug.shipped_in(v) for v in ("0.21.0", "0.22.1", "0.22.1+cpu", "0.23.0")] == [
        True, True, True, False,
    ]  # fmt: skip
    later = dataclasses.replace(bug, first_buggy="0.22.0")
    assert [later.shipped_in(v) for v in ("0.21.0", "0.22.0", "0.22.1")] == [False, True, True]
    assert release_key("0.34.0.dev12+gabc") == (0, 34, 0) and release_key("0.22") == (0, 22, 0)
    engine = Engine(
        name="fake",
        install="pip install fake-engine",
        installed_version=lambda: "0.22.0",
        unavailable=lambda: None,
        status=lambda: "fake 0.22.0 installed",
        shipped_bugs=(bug,),
    )
    assert engine.shipped_bug("slot-mapping", "fake") == bug
    assert engine.shipped_bug("slot-mapping", "other") is None
    assert (
        replace(engine, installed_version=lambda: "0.23.0").shipped_bug("slot-mapping", "fake")
        is None
    )
    assert (
        replace(engine, installed_version=lambda: None).shipped_bug("slot-mapping", "fake") is None
    )

    impl = Implementation("fake", k.slot_mapping, "engine", "the fake", engine="fake")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(engines, "get", lambda name: engine if name == "fake" else None)
        (mark,) = shipped_bug_marks("slot-mapping", impl)
        assert mark.name == "xfail" and mark.kwargs["strict"] is False
        assert mark.kwargs["raises"] is AssertionError and "#1" in mark.kwargs["reason"]
        assert shipped_bug_marks("slot-mapping", replace(impl, name="other")) == []
