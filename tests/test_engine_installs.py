"""Engine installs as users get them: each engine's opt-in install alone, one that
does not import, two distributions declaring one engine.

- Each pinned list of each engine is closed under what its engine's adapters
  import: ``ATTNFUZZ_SGLANG=1 ./setup.sh`` without vLLM must give a venv where
  SGLang imports (SGLang's list once lacked ``idna``, which vLLM's list brought
  when both were installed). Checked statically, without installing anything.
- An engine that is installed but does not import is unavailable, saying why in
  one line (``attnfuzz list``, ``list --json``), and breaks no other command.
- Two distributions naming one engine: asking for its implementations names both
  and what to do, in one line.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from attnfuzz.adapters import binding
from attnfuzz.harness import engines, registry
from attnfuzz.harness.cli import main
from packaging.requirements import Requirement

ADAPTERS = Path(__file__).resolve().parents[1] / "adapters"


# The engine plugins (attnfuzz's, not the engines): imported by the tests that use
# them, so that this module imports without them (tests/test_engines.py checks).
@pytest.fixture
def vllm():
    return pytest.importorskip("attnfuzz.adapters.vllm")


@pytest.fixture
def sglang():
    return pytest.importorskip("attnfuzz.adapters.sglang")


@pytest.fixture
def vllm_compat(vllm):
    return pytest.importorskip("attnfuzz.adapters.vllm.compat")


# -- each pinned list is closed under its engine's imports ----------------------------

INSTALLS = {
    # engine -> the lists each of its install.sh's release ranges installs, together
    "vllm": [
        ("requirements-cpu.txt",),  # 0.24.0 to 0.33.0
        ("requirements-cpu.txt", "requirements-cpu-0.21-0.23.txt"),  # 0.21.0 to 0.23.0
    ],
    "sglang": [
        ("requirements-cpu.txt",),  # 0.5.15 to 0.5.23
        ("requirements-cpu-0.5.9-0.5.14.txt",),  # 0.5.9 to 0.5.14
    ],
}

IMPORTED = {
    # engine -> the distributions its adapters import on the default release (with its
    # default list, the engine alone), but attnfuzz's own install's: measured by setting
    # the engine's environment up, importing every adapter module, probing every API the
    # compatibility layer names and judging each implementation's smallest case, then
    # mapping sys.modules to distributions (importlib.metadata.packages_distributions;
    # setuptools' vendored packages left out).
    "vllm": """
        aiohappyeyeballs aiohttp aiosignal annotated-doc annotated-types anyio
        apache-tvm-ffi cachetools cbor2 certifi charset-normalizer cloudpickle einops
        fastapi frozenlist h11 httpcore2 httpx2 huggingface-hub idna llguidance msgspec
        multidict openai openai-harmony opentelemetry-api packaging partial-json-parser
        pillow prometheus-client propcache psutil py-cpuinfo pybase64 pydantic
        pydantic-core pyyaml pyzmq regex requests safetensors sniffio starlette tokenizers
        tqdm transformers truststore typing-inspection urllib3 uvloop xgrammar yarl
    """,
    "sglang": """
        aiohappyeyeballs aiohttp aiosignal annotated-types anyio apache-tvm-ffi certifi
        charset-normalizer compressed-tensors dill einops frozenlist gguf h11 httpcore2
        httpx2 huggingface-hub idna ipython loguru msgspec multidict openai
        opentelemetry-api orjson packaging partial-json-parser pillow propcache psutil
        pybase64 pydantic pydantic-core pyyaml pyzmq regex requests safetensors
        sentencepiece sniffio starlette tokenizers tqdm traitlets transformers truststore
        typing-inspection urllib3 xgrammar yarl
    """,
}

REQUIRES_DIST = {
    # Each pinned release -> the distributions its metadata requires on Linux (no extra):
    # what importing it may need. A new pin needs its line here (read with
    # importlib.metadata.requires, or a wheel's METADATA).
    "aiohappyeyeballs==2.7.1": "",
    "aiohttp==3.14.5": "aiohappyeyeballs aiosignal attrs frozenlist multidict propcache "
    "typing-extensions yarl",
    "aiosignal==1.4.0": "frozenlist typing-extensions",
    "annotated-doc==0.0.7": "",
    "annotated-types==0.8.0": "",
    "anyio==4.16.0": "idna typing-extensions",
    "apache-tvm-ffi==0.1.15.post2": "typing-extensions",
    "attrs==26.1.0": "",
    "blake3==1.0.11": "typing-extensions",
    "cachetools==8.0.1": "",
    "cbor2==6.3.0": "",
    "certifi==2026.10.18": "",
    "charset-normalizer==3.5.2": "",
    "click==8.5.1": "",
    "cloudpickle==3.1.2": "",
    "compressed-tensors==0.20.0": "loguru psutil pydantic torch transformers",
    "dill==0.4.1": "",
    "einops==0.8.2": "",
    "fastapi==0.165.0": "annotated-doc anyio opentelemetry-api pydantic starlette "
    "typing-extensions typing-inspection",
    "frozenlist==1.8.0": "",
    "gguf==0.19.0": "numpy pyyaml requests tqdm",
    "h11==0.16.0": "",
    "hf-xet==1.8.0": "",
    "httpcore==1.0.9": "certifi h11",
    "httpcore2==2.16.2": "h11 truststore",
    "httpx==0.28.1": "anyio certifi httpcore idna",
    "httpx2==2.16.2": "anyio httpcore2 idna truststore typing-extensions",
    "huggingface-hub==1.33.0": "click filelock fsspec hf-xet httpx packaging pyyaml tqdm "
    "typing-extensions",
    "huggingface-hub==2.4.0": "click filelock fsspec hf-xet httpx2 packaging pyyaml tqdm "
    "typing-extensions",
    "idna==3.20": "",
    "ipython==9.18.1": "ipython-pygments-lexers jedi matplotlib-inline pexpect prompt-toolkit "
    "psutil pygments stack-data traitlets typing-extensions",
    "jiter==0.19.0": "",
    "llguidance==1.9.1": "",
    "loguru==0.7.3": "",
    "msgspec==0.22.0": "",
    "multidict==7.2.1": "",
    "openai==3.54.0": "anyio httpx2 jiter pydantic sniffio typing-extensions",
    "openai-harmony==0.0.8": "pydantic",
    "opentelemetry-api==1.45.2": "typing-extensions",
    "orjson==3.13.0": "",
    "packaging==26.3": "",
    "partial-json-parser==0.2.1.1.post7": "",
    "pillow==13.0.0": "",
    "prometheus-client==0.26.0": "",
    "propcache==0.5.4": "",
    "psutil==7.2.2": "",
    "py-cpuinfo==9.0.0": "",
    "pybase64==1.5.1": "",
    "pydantic==2.14.3": "annotated-types pydantic-core typing-extensions typing-inspection",
    "pydantic-core==2.50.4": "typing-extensions",
    "pyyaml==6.0.3": "",
    "pyzmq==27.3.0": "",
    "regex==2026.11.15": "",
    "requests==2.34.2": "certifi charset-normalizer idna urllib3",
    "safetensors==0.8.0": "",
    "sentencepiece==0.2.3": "",
    "setproctitle==1.3.8": "",
    "shellingham==1.5.4": "",
    "sniffio==1.3.1": "",
    "starlette==1.10.0": "anyio typing-extensions",
    "tokenizers==0.22.2": "huggingface-hub",
    "tokenizers==0.23.3": "huggingface-hub",
    "tqdm==4.70.1": "",
    "traitlets==5.16.1": "",
    "transformers==5.23.0": "huggingface-hub numpy packaging pyyaml regex safetensors "
    "tokenizers tqdm typer",
    "transformers==5.8.1": "huggingface-hub numpy packaging pyyaml regex safetensors "
    "tokenizers tqdm typer",
    "truststore==0.10.5": "",
    "typer==0.29.2": "annotated-doc pydantic rich shellingham",
    "typing-inspection==0.4.5": "typing-extensions",
    "urllib3==2.8.0": "",
    "uvloop==0.23.0": "",
    "xgrammar==0.2.8": "apache-tvm-ffi numpy pydantic torch transformers triton typing-extensions",
    "yarl==1.25.1": "idna multidict propcache",
}

NEVER_IMPORTED = {
    # (distribution, a requirement of it no engine's adapters import) -> why
    ("huggingface-hub", "click"): "huggingface_hub's command line only (huggingface_hub/cli)",
    **{
        ("ipython", shell): "IPython's interactive shell; SGLang imports IPython.display only"
        for shell in (
            "ipython-pygments-lexers",
            "jedi",
            "matplotlib-inline",
            "pexpect",
            "prompt-toolkit",
            "stack-data",
        )
    },
}


def _name(text: str) -> str:
    return re.sub(r"[-_.]+", "-", text).lower()  # PEP 503


def _pins(engine: str, lists: tuple[str, ...]) -> dict[str, str]:
    """``name -> version`` of what ``lists`` pin, the engine's own wheel left out (it goes
    in without its declared dependencies, which are CUDA builds: the lists are its needs)."""
    pins = {}
    for listed in lists:
        for line in (ADAPTERS / engine / listed).read_text().splitlines():
            line = line.split("#")[0].strip()
            if line:
                name, _, version = line.partition("==")
                assert version, f"{engine}/{listed}: {line!r} is not pinned"
                pins[_name(name)] = version
    pins.pop(engine, None)
    return pins


def _attnfuzz_install() -> set[str]:
    """The distributions attnfuzz's own install brings (its requirements, transitively):
    what every engine's list goes in on top of."""
    seen: set[str] = set()
    todo = ["attnfuzz"]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for line in requires:
            requirement = Requirement(line)
            marker = requirement.marker
            if marker is None or marker.evaluate({"extra": ""}):  # none of the extras
                todo.append(_name(requirement.name))
    return seen


def _installs() -> list[tuple[str, tuple[str, ...]]]:
    return [(engine, lists) for engine, ranges in INSTALLS.items() for lists in ranges]


def test_every_pinned_list_is_one_of_an_install():
    for engine, ranges in INSTALLS.items():
        on_disk = {p.name for p in (ADAPTERS / engine).glob("requirements*.txt")}
        assert on_disk == {listed for lists in ranges for listed in lists}, engine


@pytest.mark.parametrize(
    ("engine", "lists"), _installs(), ids=[f"{e}:{'+'.join(ls)}" for e, ls in _installs()]
)
def test_each_pinned_list_holds_what_its_pins_require(engine, lists):
    """Closed under the requirements of what it pins: what an import of one of them may
    need is pinned too (or comes with attnfuzz), but for what no adapter imports."""
    pins = _pins(engine, lists)
    have = set(pins) | _attnfuzz_install()
    missing = []
    for name, version in sorted(pins.items()):
        pinned = f"{name}=={version}"
        assert pinned in REQUIRES_DIST, f"{pinned}: add its requirements to REQUIRES_DIST"
        for needed in REQUIRES_DIST[pinned].split():
            if needed not in have and (name, needed) not in NEVER_IMPORTED:
                missing.append(f"{needed} (required by {pinned})")
    assert not missing, f"{engine} {' + '.join(lists)} lacks: {', '.join(missing)}"


@pytest.mark.parametrize("engine", sorted(IMPORTED))
def test_each_default_list_holds_what_its_engine_s_adapters_import(engine):
    pins = _pins(engine, INSTALLS[engine][0])
    missing = sorted(set(IMPORTED[engine].split()) - set(pins) - _attnfuzz_install())
    assert not missing, f"{engine}'s default list lacks what its adapters import: {missing}"


@pytest.mark.parametrize(
    ("engine", "lists"), _installs(), ids=[f"{e}:{'+'.join(ls)}" for e, ls in _installs()]
)
def test_every_list_holds_what_both_engines_import(engine, lists):
    """What both engines' import chains share (transformers and what it needs, the
    HTTP stack) is in every list of each, whichever release it installs."""
    shared = set(IMPORTED["vllm"].split()) & set(IMPORTED["sglang"].split())
    missing = sorted(shared - set(_pins(engine, lists)) - _attnfuzz_install())
    assert not missing, f"{engine} {' + '.join(lists)} lacks: {missing}"


def test_the_lists_pin_what_they_share_at_one_version():
    """Both engines in one venv (CI's): a package both lists pin is pinned alike."""
    vllm_pins = _pins("vllm", INSTALLS["vllm"][0])
    sglang_pins = _pins("sglang", INSTALLS["sglang"][0])
    differ = {n: (v, sglang_pins[n]) for n, v in vllm_pins.items() if sglang_pins.get(n, v) != v}
    assert not differ


# -- an engine installed that does not import -----------------------------------------


@pytest.fixture
def engines_that_do_not_import(monkeypatch: pytest.MonkeyPatch, vllm, sglang) -> Iterator[None]:
    """Both engines installed at their default release, neither importing: setting their
    environment up raises ModuleNotFoundError of a dependency, as SGLang's did without
    ``idna``."""

    def set_up() -> None:
        raise ModuleNotFoundError("No module named 'idna'", name="idna")

    for plugin in (vllm, sglang):
        importlib.import_module(f"{plugin.__name__}.compat")  # registers its own set-up
        monkeypatch.setitem(binding._BEFORE_IMPORT, plugin.ENGINE, set_up)
        monkeypatch.setattr(plugin, "installed_version", lambda v=plugin.VERSION: v)
    binding._missing.cache_clear()
    yield
    binding._missing.cache_clear()


def test_an_engine_that_does_not_import_is_one_line_in_list(engines_that_do_not_import, capsys):
    assert main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    said = [line for line in lines if "No module named 'idna'" in line]
    assert len(said) == 2, said  # one line per engine, for all its implementations
    for line, engine in zip(sorted(said), ("SGLang", "vLLM"), strict=True):
        assert line.startswith(f"unavailable: {engine} ") and "failed" in line, line
        assert "binds from" not in line and "setup.sh" not in line  # it is installed
    assert main(["list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    impls = [i for row in rows for i in row["implementations"] if i["engine"]]
    assert {i["engine"] for i in impls} == {"vllm", "sglang"}
    assert all("ModuleNotFoundError: No module named 'idna'" in i["unavailable"] for i in impls)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_every_engine_implementation_declares_the_engine_apis_it_calls(engine):
    """An implementation's availability is its adapter's declared APIs (``compat.REQUIRES``):
    one that declares none is listed as runnable however the engine is installed, and its
    engine's broken import stops being one line (the test above)."""
    plugin = pytest.importorskip(f"attnfuzz.adapters.{engine}")
    compat = importlib.import_module(f"{plugin.__name__}.compat")
    undeclared = []
    for name in registry.target_names():
        for impl in registry.get_target(name).implementations.values():
            call = impl.fn
            if impl.engine == plugin.ENGINE and isinstance(call, binding.EngineCall):
                keys = (call.module, f"{call.module}.{call.attr}")
                declared = any(key in compat.REQUIRES for key in keys)
                forms = getattr(compat, "ALTERNATIVES", {}).get(call.module)  # one of several
                if not declared and not forms:
                    undeclared.append(f"{name}/{impl.name} ({call.module}.{call.attr})")
    assert not undeclared, f"no entry in {compat.__name__}.REQUIRES or ALTERNATIVES: {undeclared}"


def test_an_engine_that_does_not_import_breaks_no_other_command(
    engines_that_do_not_import, tmp_path, capsys
):
    out, db = str(tmp_path / "cases"), str(tmp_path / "db")
    # A re-created mutant of a target SGLang adds implementations to: found, reachability
    # and all, where the engines' code cannot run.
    args = ["run", "--target", "spec-indptr", "--impl", "pr27545-draft-extend-stride"]
    assert main([*args, "--seed", "0", "--max-examples", "50", "--out", out, "--db", db]) == 1
    assert "written to" in capsys.readouterr().out
    args = ["run", "--target", "spec-indptr", "--impl", "sglang-triton", "--out", out]
    assert main([*args, "--db", db]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot run" in err[0] and "No module named 'idna'" in err[0], err


def test_a_broken_engine_install_lists_in_a_new_process(tmp_path, sglang):
    """The user's case, in a process of its own: an SGLang distribution whose package
    fails to import (a dependency missing); ``list --json`` still answers."""
    (tmp_path / "sglang").mkdir()
    (tmp_path / "sglang" / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'idna'\", name='idna')\n"
    )
    info = tmp_path / f"sglang-{sglang.VERSION}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: sglang\nVersion: {sglang.VERSION}\n"
    )
    path = os.environ.get("PYTHONPATH")
    done = subprocess.run(
        [sys.executable, "-m", "attnfuzz", "list", "--json"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), path]))},
        timeout=300,
    )
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    rows = json.loads(done.stdout)
    impls = [i for row in rows for i in row["implementations"] if i["engine"] == "sglang"]
    assert impls and all(i["engine_version"] == sglang.VERSION for i in impls)
    for impl in impls:
        assert "failed" in impl["unavailable"] and "Error" in impl["unavailable"], impl
        assert "binds from" not in impl["unavailable"]


def _clear() -> None:
    for cached in (engines._loaded, registry._plugins, registry.target_names, registry.get_target):
        cached.cache_clear()


def _distribution(where: Path, name: str, engine: str) -> None:
    """An installed distribution ``name`` 1.0 in ``where`` whose ``attnfuzz.engines``
    entry point is ``engine`` (``NAME = module:attribute``)."""
    info = where / f"{name.replace('-', '_')}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[{engines.ENTRY_POINT_GROUP}]\n{engine}\n")


RAISING_ENGINE = """
from attnfuzz.harness.engines import Engine
from attnfuzz.harness.target import Implementation
from attnfuzz.kernels import slot_mapping as k


def unavailable():
    import attnfuzz_no_such_dependency  # the engine's own import, failing


ENGINE = Engine(
    name="raising",
    install="pip install raising-engine",
    installed_version=lambda: "1.0",
    unavailable=unavailable,
    status=lambda: "raising 1.0 installed",
    implementations={"slot-mapping": [
        Implementation("raising", k.slot_mapping, "engine", "an engine that cannot say"),
    ]},
)
"""


def test_an_engine_plugin_that_raises_when_asked_is_unavailable_in_one_line(
    tmp_path, monkeypatch, capsys
):
    """Any engine's, not only attnfuzz's own: its question raising is its answer."""
    _distribution(tmp_path, "raising-engine", "raising = attnfuzz_raising_engine:ENGINE")
    (tmp_path / "attnfuzz_raising_engine.py").write_text(RAISING_ENGINE)
    monkeypatch.syspath_prepend(str(tmp_path))
    _clear()
    try:
        assert main(["list"]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert (
            "unavailable: engine raising failed to say whether it can run: "
            "ModuleNotFoundError: No module named 'attnfuzz_no_such_dependency'"
        ) in lines
        args = ["run", "--target", "slot-mapping", "--impl", "raising", "--out", str(tmp_path)]
        assert main(args) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "attnfuzz_no_such_dependency" in err[0], err
    finally:
        _clear()
        sys.modules.pop("attnfuzz_raising_engine", None)


def test_a_release_that_does_not_import_is_never_told_to_install_itself(
    tmp_path, monkeypatch, capsys, vllm, vllm_compat
):
    """A module of the installed vLLM raising at import (a dependency missing) says so;
    no hint names a release to install, least of all the installed one."""
    (tmp_path / "attnfuzz_broken_vllm.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'idna'\", name='idna')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(vllm, "installed_version", lambda: vllm.VERSION)
    monkeypatch.delenv(vllm_compat.ANY_RELEASE, raising=False)
    for name in list(vllm_compat.REQUIRES):
        monkeypatch.setitem(vllm_compat.REQUIRES, name, ())
    api = vllm_compat.Api("attnfuzz_broken_vllm", "Builder", since="0.27.0")
    monkeypatch.setitem(vllm_compat.REQUIRES, "mtp_seq_lens", (api,))
    binding._missing.cache_clear()
    try:
        why = vllm_compat.binding_problem("mtp_seq_lens", "run", vllm.VERSION)
        assert why == (
            f"vLLM {vllm.VERSION}: importing attnfuzz_broken_vllm failed: "
            "ModuleNotFoundError: No module named 'idna'"
        )
        # An older release that does not import: no other release mends that either.
        assert "binds from" not in vllm_compat.binding_problem("mtp_seq_lens", "run", "0.25.0")
        assert main(["list"]) == 0
        text = capsys.readouterr().out
        assert why in text and "binds from" not in text
    finally:
        binding._missing.cache_clear()


def test_an_api_missing_from_a_release_names_a_newer_one_only(monkeypatch, vllm_compat):
    """The install hint names a release that has every API, and only where the
    installed one is older: at that release or newer it would name itself."""
    monkeypatch.delenv(vllm_compat.ANY_RELEASE, raising=False)
    api = vllm_compat.Api("attnfuzz.harness.engines", "Engine.no_such_method", since="0.27.0")
    monkeypatch.setitem(vllm_compat.REQUIRES, "attnfuzz_fake_adapter", (api,))
    older = vllm_compat.binding_problem("attnfuzz_fake_adapter", "run", "0.25.0")
    assert older is not None and older.endswith(vllm_compat.install_line("0.27.0"))
    newer = vllm_compat.binding_problem("attnfuzz_fake_adapter", "run", "0.28.0")
    assert newer == f"vLLM 0.28.0: {api} is missing"


# -- two distributions declaring one engine -------------------------------------------

OTHER_VLLM = """
from attnfuzz.harness.engines import Engine
from attnfuzz.harness.target import Implementation
from attnfuzz.kernels import slot_mapping as k

VLLM = Engine(
    name="vllm",
    install="pip install other-vllm",
    installed_version=lambda: "1.0",
    unavailable=lambda: None,
    status=lambda: "other-vllm 1.0",
    implementations={"slot-mapping": [
        Implementation("vllm", k.slot_mapping, "engine", "another distribution's vllm"),
    ]},
)
"""


@pytest.fixture
def second_vllm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A distribution ``other-vllm`` installed beside attnfuzz, whose entry point in the
    group ``attnfuzz.engines`` is named ``vllm`` too."""
    (tmp_path / "attnfuzz_other_vllm.py").write_text(OTHER_VLLM)
    _distribution(tmp_path, "other-vllm", "vllm = attnfuzz_other_vllm:VLLM")
    monkeypatch.syspath_prepend(str(tmp_path))
    _clear()
    yield
    _clear()
    sys.modules.pop("attnfuzz_other_vllm", None)


def test_an_engine_two_distributions_declare_names_both_and_what_to_do(
    second_vllm, tmp_path, capsys
):
    args = ["run", "--target", "slot-mapping", "--impl", "vllm", "--max-examples", "1"]
    code = main([*args, "--out", str(tmp_path / "cases"), "--db", str(tmp_path / "db")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "unknown implementation" not in err[0]
    for said in (
        "of attnfuzz (group attnfuzz.engines)",
        "of other-vllm (group attnfuzz.engines)",
        "both name engine 'vllm'",
        "uninstall other-vllm (pip uninstall other-vllm)",
    ):
        assert said in err[0], err[0]
    assert not (tmp_path / "cases").exists()
    # attnfuzz list says it once for the engine, and its implementations are unavailable.
    assert main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    (left_out,) = [line for line in lines if line.startswith("left out: engine vllm: ")]
    assert "pip uninstall other-vllm" in left_out
    assert "vllm: engine left out (see 'left out' below)" in lines
