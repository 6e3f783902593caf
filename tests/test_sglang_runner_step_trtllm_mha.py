"""SGLang's decode graph runner step on the TRT-LLM MHA backend (runner-step's
``sglang-trtllm-mha``), its page-size declines, and its mutant."""

from __future__ import annotations

import dataclasses

import pytest
from attnfuzz.adapters.sglang.testing import arrive_then_decode as _arrive_then_decode
from attnfuzz.adapters.sglang.testing import field_values as _values
from attnfuzz.adapters.sglang.testing import life, requires_sglang
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.trace import Trace

pytestmark = requires_sglang


def _life(trace: Trace, name: str = "run") -> list[ref.RunnerStepOutputs]:
    """Every step of ``trace`` on one new engine of ``runner_step_trtllm_mha.<name>``."""
    from attnfuzz.adapters.sglang import runner_step_trtllm_mha

    return life(getattr(runner_step_trtllm_mha, name), trace)


def _paged(trace: Trace, page: int = 16) -> Trace:
    """``trace`` on pages of ``page`` tokens (its requests' pages stay as many)."""
    return Trace(dataclasses.replace(trace.config, block_size=page), trace.steps)


@pytest.mark.parametrize("page, declined", [(4, True), (8, True), (16, False), (64, False)])
def test_pages_sglang_never_runs_trtllm_mha_with_are_declined(page, declined):
    from attnfuzz.adapters.sglang.runner_step_trtllm_mha import declines

    (case, *_) = _paged(_arrive_then_decode(num_spec=0), page).cases()
    why = declines(case)
    assert (why is not None) == declined
    if declined:
        assert "_mla_backend_page_constraints" in why and f"page size {page}" in why


def test_a_decode_of_three_requests_replays_the_graph_of_four():
    """The graph's metadata is written by the in-graph preparation
    (``_apply_cuda_graph_metadata``'s fused Triton kernel), which the graph stand-in
    runs at the capture and again at the replay: the replay holds the step's values."""
    trace = _paged(_arrive_then_decode(num_spec=0))
    first, second = _life(trace)
    assert [b.how for b in second.builds] == ["eager", "padded", "replay", "fresh"]
    # Pages of 16 tokens: each request's KV (6, 4, 2 tokens) lies in its first page.
    assert _values(second, "eager", "cache_seqlens_int32") == [6, 4, 2]
    assert [row[:2] for row in _values(second, "eager", "page_table")] == [[1, 0], [3, 0], [5, 0]]
    for how in ("padded", "replay"):
        # The padding request: the fill length 1 (get_cuda_graph_seq_len_fill_value) on
        # the reserved row 0 of the request-to-token table, its page 0.
        assert _values(second, how, "cache_seqlens_int32") == [6, 4, 2, 1], how
        table = _values(second, how, "page_table")
        assert [row[:2] for row in table] == [[1, 0], [3, 0], [5, 0], [0, 0]], how
        assert len(table[0]) == 4, how  # max_num_pages: cdiv(context_len 64, 16)
        assert _values(second, how, "cu_seqlens_q") == [0, 1, 2, 3, 4], how
        assert _values(second, how, "cu_seqlens_k") == [0, 6, 10, 12, 13], how
        assert _values(second, how, "kv_slots")[0][:6] == [16, 17, 18, 19, 20, 21], how
    assert ref.violations(first) == [] and ref.violations(second) == []


def test_a_verify_reads_its_drafts_in_the_graph_as_eagerly():
    _, verify = _life(_paged(_arrive_then_decode(num_spec=1)))
    # cache_seqlens: the committed prefix and the next_n tokens of the verify (the
    # replay's seqlen_offset max_seq_len_q); the padding request's the fill 1 and its window.
    assert _values(verify, "eager", "cache_seqlens_int32") == [7, 5, 3]
    assert _values(verify, "replay", "cache_seqlens_int32") == [7, 5, 3, 3]
    assert _values(verify, "replay", "cu_seqlens_q") == [0, 2, 4, 6, 8]
    assert _values(verify, "replay", "max_seq_len_q") == [2, 2, 2, 2]
    assert ref.violations(verify) == []


def test_the_mutant_fails_padding_invariance_and_replay_on_its_smallest_trace():
    """A verify's graph metadata without its draft window: cache_seqlens (and what the
    kernels read by it) of the committed prefix alone, in the padded and replayed builds."""
    from attnfuzz.adapters.sglang import runner_step_trtllm_mha as trtllm

    trace = trtllm.smallest_verify_offset_forgotten()
    assert trtllm.declines(trace.cases()[0]) is None and trtllm.reach_verify_replay(trace)
    *_, out = _life(trace, "run_verify_offset_forgotten")
    found = {(v.prop, v.build, v.field) for v in ref.violations(out)}
    for prop, build in (("padding invariance", "padded"), ("replay equals eager", "replay")):
        for field in ("cache_seqlens_int32", "cu_seqlens_k", "kv_len"):
            assert (prop, build, field) in found


def test_beside_triton_in_sglang_backends_its_keys_agree():
    """``sglang-backends`` runs the step's eager build on TRT-LLM MHA too, on pages it
    runs (on pages of 4, tests/test_sglang_runner_step_backends.py: three backends):
    its ``kv_len`` and ``kv_slots``, read through its ``page_table``, agree with Triton's."""
    from attnfuzz.adapters.sglang import runner_step_backends

    for out in life(runner_step_backends.run, _paged(_arrive_then_decode(num_spec=1))):
        (trtllm,) = [b for b in out.of("backend") if "trtllm_mha_backend" in b.where]
        assert trtllm.field("kv_len") is not None and trtllm.field("kv_slots") is not None
        assert ref.violations(out) == []


# The derandomized search (the engine passing it, the mutant's smallest trace judged
# first) is test_entries.py's, over every implementation of runner-step: not repeated here.
