"""SGLang's decode graph runner step of a MiniMax-M3 sparse-attention model on ROCm
(runner-step's ``sglang-minimax-sparse``): the sparse layers' rows of an extend, of a
decode and of a verify (a row a query, built in the graph), the platform stand-in, a range
shown failing on a broken build, and its mutant caught by *safe padding*."""

from __future__ import annotations

from typing import Any

import pytest
from attnfuzz.adapters.sglang.testing import arrive_then_decode, life, requires_sglang
from attnfuzz.adapters.sglang.testing import field_values as _values
from attnfuzz.harness.registry import get_target
from attnfuzz.harness.runner import fuzz
from attnfuzz.harness.testing import assert_passes
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.trace import Trace

pytestmark = requires_sglang

IMPL = "sglang-minimax-sparse"
MUTANT = "sglang-minimax-sparse-verify-bound-without-drafts"


def _minimax() -> Any:
    from attnfuzz.adapters.sglang import runner_step_minimax_sparse

    return runner_step_minimax_sparse


def _life(trace: Trace, name: str = "run") -> list[ref.RunnerStepOutputs]:
    """Every step of ``trace`` on one new engine of ``runner_step_minimax_sparse.<name>``."""
    return life(getattr(_minimax(), name), trace)


def _found(outs: list[ref.RunnerStepOutputs]) -> set[tuple[str, str, str]]:
    return {(v.prop, v.field, v.build) for out in outs for v in ref.violations(out)}


def test_an_extend_then_a_decode_in_the_graph_of_four():
    """Three requests arrive (one extend: 5, 3 and 1 tokens from no prefix), then decode
    together, padded to the graph of four: the padding request of length 1 (the backend's
    fill) on request row 0; each request's keys those of its row below its length."""
    trace = arrive_then_decode(num_spec=0)
    arrive, decode = _life(trace)
    assert _values(arrive, "eager", "sparse.cu_seqlens") == [0, 5, 8, 9]
    assert _values(arrive, "eager", "sparse.seq_lens") == [5, 3, 1]
    assert _values(arrive, "eager", "sparse.prefix_lens") == [0, 0, 0]
    assert _values(arrive, "eager", "sparse.extend_lens") == [5, 3, 1]
    assert [b.how for b in decode.builds] == ["eager", "padded", "replay", "fresh"]
    assert _values(decode, "eager", "sparse.seq_lens") == [6, 4, 2]
    for how in ("padded", "replay"):
        assert _values(decode, how, "sparse.seq_lens") == [6, 4, 2, 1], how
        assert _values(decode, how, "req_pool_indices")[3] == 0, how
    (eager,) = decode.of("eager")
    rows = _values(decode, "eager", "req_pool_indices")
    assert len(set(rows)) == 3 and 0 not in rows
    page = trace.config.block_size  # request 0 on pages 1 and 2
    assert eager.field("kv_slots").values[0, :6].tolist() == list(range(page, page + 6))
    assert ref.violations(arrive) == [] and ref.violations(decode) == []


def test_a_verify_has_a_sparse_row_a_query_built_in_the_graph():
    """A verify of ``next_n`` 2: each draft a row of its own, one key longer than the
    previous, on its request's row; the padding request's two rows of lengths 2 and 3 on
    request row 0; a new engine's build holds no request row."""
    _, verify = _life(arrive_then_decode(num_spec=1))
    assert _values(verify, "eager", "seq_lens") == [5, 3, 1]  # the committed prefix
    assert _values(verify, "eager", "sparse.seq_lens") == [6, 7, 4, 5, 2, 3]
    assert _values(verify, "eager", "kv_len") == [7, 5, 3]
    rows = _values(verify, "eager", "sparse.req_pool_indices")
    assert rows[::2] == rows[1::2] == _values(verify, "eager", "req_pool_indices")
    for how in ("padded", "replay"):
        assert _values(verify, how, "sparse.seq_lens")[6:] == [2, 3], how
        assert _values(verify, how, "sparse.req_pool_indices") == rows + [0, 0], how
    (fresh,) = verify.of("fresh")
    assert fresh.field("sparse.req_pool_indices") is None
    assert ref.violations(verify) == []


def test_the_backend_is_built_as_on_an_mi300x_and_the_platform_put_back():
    """``attn_backend_wrapper`` makes the hybrid over Triton and the sparse backend, which
    read ROCm (no gfx95: no index cache; no SM100: no MSA) while built; the module's
    ``is_hip`` is its own again after."""
    m = _minimax()
    m.run.new_engine()
    m.run(ref.make_inputs(arrive_then_decode(num_spec=1).case(0)))
    backend = m.ENGINE.engine.backend
    module = __import__(m.BACKEND_MODULE, fromlist=["is_hip"])
    from sglang.srt.layers.attention.minimax_sparse_backend import MiniMaxHybridAttnBackend
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
    from sglang.srt.utils import is_hip

    assert type(backend) is MiniMaxHybridAttnBackend
    assert type(backend.dense) is TritonAttnBackend and backend.sparse_layer_ids == [1]
    sparse = backend.sparse
    assert sparse.is_hip and not sparse.use_msa and not sparse.index_cache_enabled
    assert sparse.block_size_k == m.SPARSE_BLOCK and sparse.speculative_num_draft_tokens == 2
    assert module.is_hip is is_hip


def test_a_padding_row_past_the_table_fails_safe_padding(monkeypatch):
    """The sparse kernels read ``req_to_token[req_pool_indices[r]]``: a verify's padding
    rows, broken where ``_init_rocm_linear_verify_metadata`` writes them, past the table
    fail their range."""
    m = _minimax()
    m.prepare()
    from sglang.srt.layers.attention.minimax_sparse_backend import MiniMaxSparseAttnBackend

    own = MiniMaxSparseAttnBackend._init_rocm_linear_verify_metadata

    def broken(self: Any, forward_batch: Any) -> None:
        own(self, forward_batch)
        self._linear_verify_meta.req_pool_indices[-1] = 10_000

    monkeypatch.setattr(MiniMaxSparseAttnBackend, "_init_rocm_linear_verify_metadata", broken)
    found = _found(_life(arrive_then_decode(num_spec=1)))
    for how in ("padded", "replay"):
        assert ("safe padding", "sparse.req_pool_indices", how) in found


# -- the mutant ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["run", "run_verify_bound_without_drafts"])
def test_the_verify_bound_without_drafts_fails_safe_padding(name):
    """Three committed keys and two drafts: rows of 4 and 5 keys, the second past the
    one block of score buffer the prefix alone asks; the graph's bound is the context's."""
    m = _minimax()
    trace = m.smallest_verify_bound_without_drafts()
    assert m.reach_verify(trace) and m.trigger_verify_bound_without_drafts(trace)
    outs = _life(trace, name)
    if name == "run":
        assert _found(outs) == set()
        return
    assert _found(outs) == {
        ("safe padding", "sparse.seq_lens", "eager"),
        ("safe padding", "sparse.seq_lens", "padded"),
        ("safe padding", "sparse.seq_lens", "fresh"),
    }
    assert _values(outs[-1], "replay", "sparse.seq_lens") == [4, 5]


@pytest.mark.slow
@pytest.mark.nightly
def test_a_short_derandomized_search_passes_the_engine_and_finds_the_mutant():
    """A few generated traces pass; a search of as few finds the mutant, on a trace that
    meets its trigger."""
    assert_passes("runner-step", IMPL, max_examples=6)
    target = get_target("runner-step")
    result = fuzz(target, target.resolve(MUTANT), max_examples=20, rng_seed=0,
                  database=None, traced=True, shrink=False)  # fmt: skip
    assert result.case is not None, "the mutant was not found"
    assert _minimax().trigger_verify_bound_without_drafts(result.case)
    assert {m.where for m in result.verdict.mismatches} >= {"eager.sparse.seq_lens"}
