"""vLLM 0.33.0's own splitters as the implementation ``vllm`` of ``decode-split``."""

from __future__ import annotations

import torch
from attnfuzz.adapters.vllm.testing import requires_vllm
from attnfuzz.harness.registry import get_target
from attnfuzz.harness.targets import decode_split as target_module
from attnfuzz.reference import decode_split as ref
from attnfuzz.reference.batch import Batch, Case

pytestmark = requires_vllm

TARGET = "decode-split"
UPSTREAM = "upstream-pr29644-padding-as-prefills"


def case(q_lens, computed, uniform: int = 0) -> Case:
    from attnfuzz.harness.testing import spec_config

    params = (
        ("decode_threshold", 0),
        ("require_uniform", uniform),
        ("short_extends_as_prefills", 0),
    )
    return Case(spec_config(), Batch(computed, q_lens, seed=0), params)


def test_upstream_pr29644_smallest_case():
    """d = [2, 2, 2, 0] under the uniform rule: 0.33.0 (4, 0, 8, 0), before #29644 (3, 1, 6, 2)."""
    from attnfuzz.adapters.vllm import decode_split as adapter

    c = target_module.smallest_padding_as_prefills()
    inputs = ref.make_inputs(c)
    assert adapter.run(inputs).split == (4, 0, 8, 0)
    assert adapter.upstream_padding_as_prefills(inputs).split == (3, 1, 6, 2)
    t = get_target(TARGET)
    assert not t.judge(t.resolve(UPSTREAM), c).ok
    assert not t.judge(t.resolve("padding-as-prefills"), c).ok  # the re-created one too


def test_three_way_split_returns_its_last_two_counts_as_host_tensors_the_oracle_accepts():
    """Fidelity: with extends *and* prefills, vLLM returns ``num_extend_tokens`` and
    ``num_prefill_tokens`` as 0-d CPU int64 tensors (``num_tokens - query_start_loc[i]``,
    no ``.item()``). Its consumers only slice and add with them, so the oracle asks for an
    integer usable as an index on the host; the re-created mutant is still caught."""
    from attnfuzz.adapters.vllm import decode_split as adapter

    c = case((1, 3, 4), (2, 5, 0))
    got = adapter.run(ref.make_inputs(c)).split_extends
    assert all(isinstance(v, int) for v in got[:4])
    assert all(isinstance(v, torch.Tensor) and v.dim() == 0 for v in got[4:])
    assert [int(v) for v in got] == [1, 1, 1, 1, 3, 4]
    t = get_target(TARGET)
    assert t.judge(t.resolve("vllm"), c).ok
    assert not t.judge(t.resolve("extends-as-prefills"), c).ok


def test_vllm_s_split_with_short_extends_as_prefills_is_live_only_under_pcp_on_v2():
    """The padding-as-prefill defect's case (``require_uniform``, short extends as
    prefills): vLLM's builders pass that only with prefill context parallelism, which
    runs on the V2 runner only, with full graphs of decode-only steps only (0.30.0 on):
    neither the V1 runner nor cudagraph_mode FULL is named live."""
    from attnfuzz.adapters.vllm.plugin import _padded_single_decode
    from attnfuzz.harness.engines import get
    from attnfuzz.harness.reachability import LIVE, finding_reachability

    t = get_target("decode-split")
    mutant = t.resolve("upstream-pr29644-padding-as-prefills")
    case = _padded_single_decode()
    assert get("vllm").callers("decode-split", mutant.name) is not None
    r = finding_reachability(t, mutant, case, lambda c: t.judge(mutant, c))
    assert r.status == LIVE, r.reason
    assert {p.runner for p in r.pairs} == {"v2"}
    assert {p.cudagraph_mode for p in r.pairs if p.fails} == {
        "FULL_DECODE_ONLY",
        "FULL_AND_PIECEWISE",
    }
    assert "FULL" not in {p.cudagraph_mode for p in r.pairs}
    assert "--prefill-context-parallel-size > 1" in r.reason
    assert any("VllmConfig._validate_v1_model_runner" in d for d in r.decided_by)
    assert any("PCPManager.validate_config" in d for d in r.decided_by)
