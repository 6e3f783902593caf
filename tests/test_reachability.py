"""Reachability of a finding per (model runner, cudagraph mode): where the engine runs the
faulting code on such metadata, from the runner's decisions (attnfuzz.reference.runner)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
from attnfuzz.harness import schemas
from attnfuzz.harness.reachability import LATENT, LIVE, reachability
from attnfuzz.reference.batch import Batch, Case, EngineConfig, build_common_metadata

try:
    from attnfuzz.adapters.vllm.testing import requires_vllm
except ImportError:  # attnfuzz without its vLLM plugin: its one test of vLLM's planning skips
    requires_vllm = [pytest.mark.vllm, pytest.mark.skip(reason="no vLLM plugin in this install")]

# The minimized case of vLLM's ROCm indexer glue (bug A's write-back): one request of
# 2 tokens, next_n = 2, a graph of 4 tokens.
ROCM_CASE = {
    "config": {
        "max_model_len": 8, "max_num_seqs": 2, "max_num_batched_tokens": 4, "block_size": 1,
        "num_spec": 1, "decode_threshold": None, "cudagraph_capture_sizes": [4], "topk": 1,
        "num_heads": 1, "head_dim": 1,
    },
    "batch": {"num_computed_tokens": [0], "q_lens": [2], "seed": 0, "use_cudagraph": True},
}  # fmt: skip


def has_padding_requests(case: Case) -> bool:
    """The write-back's fault, as a judge: it trips on zero-length padding requests."""
    meta = build_common_metadata(case.config, case.batch)
    return meta.num_reqs > meta.num_real_reqs


def never_refused(case: Case) -> bool:
    return False


def test_the_rocm_case_is_latent_for_forward_code_and_says_so_per_mode():
    case = Case.from_dict(ROCM_CASE)
    r = reachability(case, "forward", has_padding_requests, never_refused)
    assert r.status == LATENT
    rows = {(p.runner, p.cudagraph_mode, p.step): (p.python_runs, p.fails) for p in r.pairs}
    for runner in ("v1", "v2"):
        # Eager and PIECEWISE steps run the Python on the unpadded step: it passes.
        assert rows[(runner, "NONE", "NONE")] == (True, False)
        assert rows[(runner, "PIECEWISE", "PIECEWISE")] == (True, False)
        for mode in ("FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"):
            # The padded step (d = [2, 0]) only replays; the capture's dummy step
            # (two requests of 2, no padding request) runs the Python and passes.
            assert rows[(runner, mode, "FULL replay")] == (False, None)
            assert rows[(runner, mode, "FULL capture")] == (True, False)
        # UNIFORM_BATCH (the case's default) never keeps FULL graphs of mixed steps.
        assert not any(m == "FULL" for (_, m, _) in rows)
    assert "FULL graph replay" in r.reason
    assert any("pad_attn" in d or "prepare_attn" in d for d in r.decided_by)


def test_the_same_fault_in_builder_code_is_live_on_full_steps():
    case = Case.from_dict(ROCM_CASE)
    r = reachability(case, "builder", has_padding_requests, never_refused)
    assert r.status == LIVE
    failing = {(p.runner, p.cudagraph_mode) for p in r.pairs if p.fails}
    assert failing == {
        (runner, mode)
        for runner in ("v1", "v2")
        for mode in ("FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
    }


def test_an_always_backend_adds_full_graphs_of_mixed_steps():
    config = dataclasses.replace(Case.from_dict(ROCM_CASE).config, cg_support="ALWAYS")
    case = Case(config, Batch((0,), (1,)))  # one token: not a uniform decode of next_n = 2
    r = reachability(case, "forward", has_padding_requests, never_refused)
    steps = {(p.runner, p.cudagraph_mode): p.step for p in r.pairs if p.step != "FULL capture"}
    assert steps[("v1", "FULL")] == steps[("v2", "FULL")] == "FULL replay"
    assert steps[("v2", "FULL_AND_PIECEWISE")] == "PIECEWISE"  # mixed part: PIECEWISE
    assert steps[("v2", "FULL_DECODE_ONLY")] == "NONE"  # no mixed graphs at all


def test_each_pair_is_planned_on_the_step_as_its_engine_runs_it():
    """A ``runner-step`` engine's runner dispatches the step itself, beside the peer its
    adapter puts there: a case's ``use_cudagraph = False`` forces nothing, so the pairs
    name the graph the runner replayed, not an eager step (seed 1's case of
    ``vllm-v1-deepseek-v41``: 4 tokens, sizes 3 and 54, an idle peer)."""
    from attnfuzz.adapters.vllm.runner_step import never_eager, with_peer

    config = EngineConfig(
        max_model_len=38, max_num_seqs=1, max_num_batched_tokens=96, block_size=32,
        num_spec=2, cudagraph_capture_sizes=(3, 54), cudagraph_mode="FULL",
        cg_support="ALWAYS", runner="v1",
    )  # fmt: skip
    case = Case(config, Batch((0,), (4,), 0, False))

    def step(as_run):
        r = reachability(case, "runner", lambda c: True, never_refused, as_run=as_run)
        return {(p.runner, p.cudagraph_mode): p.step for p in r.pairs}[("v1", "FULL")]

    assert step(None) == "NONE"  # the case read as given: forced eager
    assert step(never_eager) == step(with_peer) == "FULL"


def _engine_serving(monkeypatch, how: dict[str, str]) -> None:
    """An installed engine ``fake`` (release 1.0) whose runners are served as ``how`` says."""
    from attnfuzz.harness import engines

    fake = engines.Engine(
        name="fake", install="", installed_version=lambda: "1.0", unavailable=lambda: None,
        status=lambda: "", runners=lambda: how,
    )  # fmt: skip
    monkeypatch.setattr(engines, "get", lambda name: fake if name == "fake" else None)


def test_a_finding_live_only_on_a_runner_served_when_configured_names_the_configuration(
    monkeypatch,
):
    """:attr:`Engine.runners`: live on V1 alone, where the release serves V2 unless told
    otherwise, the finding is live with V1's configuration, and the reason says so (it
    is no finding of the release's default deployment)."""
    from attnfuzz.harness.engines import DEFAULT_RUNNER

    _engine_serving(monkeypatch, {"v1": "SOME_SWITCH=0", "v2": DEFAULT_RUNNER})
    case = Case.from_dict(ROCM_CASE)

    def on_v1_full(c: Case) -> bool:
        return c.config.runner == "v1" and has_padding_requests(c)

    r = reachability(case, "builder", on_v1_full, never_refused, engine="fake")
    assert r.status == LIVE
    assert "fake 1.0 serves v1 only with SOME_SWITCH=0 (v2 unless told otherwise)" in r.reason
    assert any("<lambda>" in d for d in r.decided_by)
    # Live on the default runner too: nothing to add.
    r = reachability(case, "builder", has_padding_requests, never_refused, engine="fake")
    assert r.status == LIVE and "serves" not in r.reason


def test_a_release_that_serves_v1_by_default_adds_nothing_to_a_v1_finding(monkeypatch):
    from attnfuzz.harness.engines import DEFAULT_RUNNER

    _engine_serving(monkeypatch, {"v1": DEFAULT_RUNNER, "v2": "SOME_SWITCH=1"})
    case = Case.from_dict(ROCM_CASE)
    r = reachability(
        case, "builder", lambda c: c.config.runner == "v1" and has_padding_requests(c),
        never_refused, engine="fake",
    )  # fmt: skip
    assert r.status == LIVE and "serves" not in r.reason


def test_a_case_file_with_reachability_conforms_and_one_without_still_reads():
    case = Case.from_dict(ROCM_CASE)
    r = reachability(case, "forward", has_padding_requests, never_refused)
    doc = {
        "schema": "attnfuzz.case/1",
        "target": "indexer-decode",
        "implementation": "vllm-rocm",
        "case": ROCM_CASE,
        "reachability": r.to_dict(),
    }
    assert schemas.errors(doc, "case") == []
    assert schemas.errors({k: v for k, v in doc.items() if k != "reachability"}, "case") == []
    doc["reachability"]["status"] = "maybe"
    assert schemas.errors(doc, "case")


def test_a_mode_the_backend_cannot_have_is_refused_naming_the_rule():
    from attnfuzz.reference.invariants import config_violations

    config = EngineConfig.from_dict({**ROCM_CASE["config"], "cudagraph_mode": "FULL"})
    (problem,) = config_violations(config)
    assert "cg_support ALWAYS" in problem and "resolve_cudagraph_mode_and_sizes" in problem


@requires_vllm[0]
@requires_vllm[1]
def test_repro_of_the_readme_rocm_case_prints_latent(tmp_path):
    path = tmp_path / "rocm.json"
    doc = {"schema": "attnfuzz.case/1", "target": "indexer-decode",
           "implementation": "vllm-rocm", "case": ROCM_CASE}  # fmt: skip
    path.write_text(json.dumps(doc))
    out = subprocess.run(
        [sys.executable, "-m", "attnfuzz", "repro", str(path)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.returncode == 5, out.stdout + out.stderr
    assert "indexer-decode / vllm-rocm: LATENT" in out.stdout
    assert "reachability: LATENT" in out.stdout and "FULL replay" in out.stdout


@pytest.mark.parametrize("runs_in", ["builder", "runner"])
def test_every_step_code_is_judged_on_every_pair(runs_in):
    """Builders and the runner run on FULL steps too (before the replay): their pairs
    say ``FULL``, and a case file holding them conforms, so that it replays."""
    case = Case.from_dict(ROCM_CASE)
    r = reachability(case, runs_in, has_padding_requests, never_refused)
    assert all(p.python_runs and p.fails is not None for p in r.pairs)
    assert "FULL" in {p.step for p in r.pairs}
    doc = {"schema": "attnfuzz.case/1", "target": "indexer-decode", "implementation": "x",
           "case": ROCM_CASE, "reachability": r.to_dict()}  # fmt: skip
    assert schemas.errors(doc, "case") == []


def test_a_fault_while_computing_reachability_leaves_the_finding_and_says_unknown(monkeypatch):
    """attnfuzz's own error here never changes the finding's verdict or blames the engine."""
    from attnfuzz.harness import reachability as module
    from attnfuzz.harness.reachability import finding_reachability
    from attnfuzz.harness.registry import get_target

    def broken(*args, **kwargs):
        raise AttributeError("an adapter's missing attribute")

    monkeypatch.setattr(module, "reachability", broken)
    target = get_target("indexer-decode")
    impl = dataclasses.replace(target.resolve("triton"), engine="vllm")
    r = finding_reachability(target, impl, Case.from_dict(ROCM_CASE), lambda c: None)
    assert r.status == "unknown" and "attnfuzz error: AttributeError" in r.reason
    doc = {"schema": "attnfuzz.case/1", "target": "indexer-decode", "implementation": "vllm-rocm",
           "case": ROCM_CASE, "reachability": r.to_dict()}  # fmt: skip
    assert schemas.errors(doc, "case") == []


def test_a_budget_that_ends_first_leaves_reachability_unknown_saying_so():
    from attnfuzz.harness.isolation import OutOfTime
    from attnfuzz.harness.reachability import finding_reachability
    from attnfuzz.harness.registry import get_target

    def out_of_time(case):
        raise OutOfTime("the campaign's deadline")

    target = get_target("indexer-decode")
    impl = dataclasses.replace(target.resolve("triton"), engine="vllm")
    r = finding_reachability(target, impl, Case.from_dict(ROCM_CASE), out_of_time)
    assert r.status == "unknown" and "time budget ended first" in r.reason
    assert finding_reachability(target, target.resolve("triton"), Case.from_dict(ROCM_CASE),
                                out_of_time) is None  # attnfuzz's own code: none  # fmt: skip


# -- campaigns: every report carries it ----------------------------------------------


def _campaign(tmp_path, monkeypatch, *impls: str) -> tuple[int, dict, object]:
    from pathlib import Path

    from attnfuzz.harness.cli import main

    monkeypatch.syspath_prepend(str(Path(__file__).parent))  # campaign_impls, for the workers
    out = tmp_path / "out"
    code = main(["campaign", "--out", str(out), "--db", str(tmp_path / "db"), "--targets",
                 "indexer-decode", "--impls", *impls, "--max-examples", "200", "--seed", "0",
                 "-n", "1", "--quiet"])  # fmt: skip
    return code, json.loads((out / "campaign.json").read_text()), out


def test_a_campaign_with_a_latent_engine_finding_says_latent_everywhere_and_exits_5(
    tmp_path, monkeypatch, capsys
):
    """Forward code of an engine that trips on padding requests only: the campaign's
    run, case file, summary.md, JUnit and HTML call it LATENT, with the pairs; exit 5."""
    import xml.etree.ElementTree as ET

    from attnfuzz.reports.document import campaign_verdict, run_verdict

    code, doc, out = _campaign(tmp_path, monkeypatch, "campaign_impls:engine_latent")
    (run,) = doc["runs"]
    (finding,) = doc["findings"]
    assert code == 5, capsys.readouterr().out
    assert run_verdict(run) == "LATENT" and run["latent"] and campaign_verdict(doc) == "LATENT"
    reach = finding["reachability"]
    assert reach["status"] == LATENT and reach["runs_in"] == "forward"
    assert any(p["step"] == "FULL replay" for p in reach["pairs"])
    case_doc = json.loads((out / finding["case_file"]).read_text())
    assert case_doc["reachability"] == reach
    assert schemas.errors(case_doc, "case") == []
    summary = (out / "summary.md").read_text()
    assert "## attnfuzz campaign: LATENT" in summary and "Reachability: **LATENT**" in summary
    assert "FULL replay" in summary
    (failure,) = ET.parse(out / "junit.xml").getroot().iter("failure")
    assert failure.get("type") == "latent" and failure.get("message").startswith("LATENT: ")
    assert "reachability: LATENT" in failure.text
    page = (out / "report.html").read_text()
    assert "LATENT: " in page and 'class="reachability"' in page
    assert "LATENT   indexer-decode / campaign_impls:engine_latent" in capsys.readouterr().out


def test_a_live_engine_finding_fails_the_campaign_beside_a_latent_one(tmp_path, monkeypatch):
    from attnfuzz.reports.document import campaign_verdict, run_verdict

    code, doc, _ = _campaign(
        tmp_path, monkeypatch, "campaign_impls:engine_live", "campaign_impls:engine_latent"
    )
    verdicts = {r["implementation"]: run_verdict(r) for r in doc["runs"]}
    assert verdicts == {"campaign_impls:engine_live": "FAIL",
                        "campaign_impls:engine_latent": "LATENT"}  # fmt: skip
    assert code == 1 and campaign_verdict(doc) == "FAIL"
    live = [f for f in doc["findings"] if f["implementation"] == "campaign_impls:engine_live"]
    assert live and all(f["reachability"]["status"] == LIVE for f in live)


def test_the_campaign_schema_holds_the_case_files_reachability():
    """One shape in both documents: a finding's reachability is its case file's."""
    import json as j
    from pathlib import Path

    root = Path(schemas.__file__).parent
    case = j.loads((root / "case.schema.json").read_text())["properties"]["reachability"]
    campaign = j.loads((root / "campaign.schema.json").read_text())
    held = campaign["$defs"]["finding"]["properties"]["reachability"]
    assert {k: v for k, v in held.items() if k != "description"} == {
        k: v for k, v in case.items() if k != "description"
    }


ENGINE_BUILDER = """
from attnfuzz.harness.target import Implementation
from attnfuzz.kernels.decode_split import mutant_padded_as_decode_graph


IMPL = Implementation("builder", mutant_padded_as_decode_graph, "engine", "a builder",
                      engine="vllm")
"""


def test_a_builder_finding_replays_from_its_case_file_with_its_reachability(tmp_path):
    """Builder code runs on FULL steps too: its case file says so in a form ``repro``
    reads back, and the replay prints the same reachability (live)."""
    import os

    (tmp_path / "engine_builder.py").write_text(ENGINE_BUILDER)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "attnfuzz", *args], capture_output=True,
                              text=True, timeout=600, env=env, cwd=tmp_path)  # fmt: skip

    run = cli("run", "--target", "decode-split", "--impl", "engine_builder:IMPL", "--seed", "0",
              "--max-examples", "1000", "--db", "db", "--out", "cases")  # fmt: skip
    assert run.returncode == 1, run.stdout + run.stderr
    (path,) = (tmp_path / "cases").glob("*.json")
    doc = json.loads(path.read_text())
    assert doc["reachability"]["status"] == LIVE and doc["reachability"]["runs_in"] == "builder"
    assert schemas.errors(doc, "case") == []
    replay = cli("repro", str(path), "--impl", "engine_builder:IMPL")
    assert replay.returncode == 1, replay.stdout + replay.stderr
    assert "reachability: LIVE" in replay.stdout


def test_an_engine_that_declares_sites_is_judged_where_its_callers_still_call_it():
    """:attr:`Engine.sites`: a site holds where the caller's source names the callee
    (read from the installed code); the finding is live at a site that holds, and
    unknown where none does, each reason naming the caller."""
    from attnfuzz.harness.engines import Site
    from attnfuzz.harness.reachability import LIVE, UNKNOWN, site_reachability
    from attnfuzz.harness.testing import hand_case

    case = hand_case((3,), (2,))
    holds = Site("decoder", "replay", "json:dumps", "JSONEncoder")
    gone = Site("decoder", "capture", "json:dumps", "no_such_call")
    reach = site_reachability(case, "runner", lambda c: True, [holds, gone])
    assert reach.status == LIVE and [p.step for p in reach.pairs] == ["replay"]
    assert reach.decided_by == ("json:dumps calls JSONEncoder",)
    assert "json:dumps no longer calls no_such_call" in reach.reason
    missing = Site("decoder", "replay", "json:no_such_function", "x")
    reach = site_reachability(case, "runner", lambda c: True, [gone, missing])
    assert reach.status == UNKNOWN and "no_such_function" in reach.reason


def test_a_site_finding_s_case_file_conforms_and_says_graph_or_eager():
    """A finding at an engine's sites writes its runner, graph or eager, and the step
    into the case file, which the case schema takes (it once refused all but vLLM's)."""
    import json

    from attnfuzz.harness import schemas
    from attnfuzz.harness.casefile import case_document
    from attnfuzz.harness.engines import Site
    from attnfuzz.harness.oracle import Verdict
    from attnfuzz.harness.reachability import site_reachability
    from attnfuzz.harness.testing import hand_case

    case = hand_case((3,), (2,))
    sites = [
        Site("decoder", "replay", "json:dumps", "JSONEncoder", graph=True),
        Site("eager runner", "eager decode", "json:dumps", "JSONEncoder", graph=False),
    ]
    reach = site_reachability(case, "runner", lambda c: c.batch.use_cudagraph, sites)
    assert [(p.runner, p.cudagraph_mode, p.fails) for p in reach.pairs] == [
        ("decoder", "graph", True),
        ("eager runner", "eager", False),
    ]
    verdict = Verdict([])
    doc = json.loads(json.dumps(case_document("mtp-seq-lens", "triton", case, verdict)))
    doc["reachability"] = reach.to_dict()
    assert schemas.errors(doc, "case") == []
