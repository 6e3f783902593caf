"""vLLM 0.33.0's V1 runner of a model with chunked local attention
(``vllm-v1-chunked-local``): the runner's own ``_build_attention_metadata`` runs
``ChunkedLocalAttentionBuilder`` (``make_local_attention_virtual_batches``, then the
Triton builder) for the second KV-cache group on every step; the keys each token of the
local layer reads are held to its chunk's; its cases are of no FULL graph, as vLLM runs
the backend; a mutant of the last chunk's key count caught."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from attnfuzz.adapters.vllm.testing import own, requires_vllm, run_trace
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.batch import Batch, Case, EngineConfig
from attnfuzz.reference.trace import Trace
from hypothesis import find

pytestmark = [*requires_vllm]


def adapter():
    from attnfuzz.adapters.vllm import runner_step_chunked_local

    return runner_step_chunked_local


def eager(out: ref.RunnerStepOutputs) -> dict[str, np.ndarray]:
    (build,) = own(out, "eager")
    return {f.name: f.values for f in build.fields}


def crossing() -> Trace:
    """Two requests prefill 20 and 14 tokens; then the first decodes one and the second
    prefills 30 more, across its chunk boundary at 32 (pages of 16, chunks of 32); then
    both decode, piecewise graphs of 4 and 8 tokens."""
    config = EngineConfig(
        max_model_len=96, max_num_seqs=3, max_num_batched_tokens=48, block_size=16,
        cudagraph_capture_sizes=(4, 8), cudagraph_mode="PIECEWISE", cg_support="NEVER",
        runner="v1",
    )  # fmt: skip
    return Trace(
        config,
        (
            Batch((0, 0), (20, 14), req_ids=(0, 1), pages=((1, 2), (3,)), new_pages=(2, 1)),
            Batch((20, 14), (1, 30), req_ids=(0, 1), pages=((1, 2), (3, 4, 5)),
                  new_pages=(0, 2)),
            Batch((21, 44), (1, 1), req_ids=(0, 1), pages=((1, 2), (3, 4, 5)),
                  new_pages=(0, 0)),
        ),
    )  # fmt: skip


def test_virtual_requests_read_their_chunks_and_every_property_holds(monkeypatch):
    """The step across the chunk boundary splits request 1's query into two virtual
    requests (keys 14 to 31 of its first chunk, 32 to 43 of its second), each reading
    through a block-table row of its own pages, shifted past the attention pages; its
    token at position 40 reads the 9 keys 32 to 40 only. Every property holds on every
    step, and the chunked builder ran on each."""
    a = adapter()  # before vLLM
    import vllm.model_executor.layers.attention.chunked_local_attention as chunked

    calls = []
    original = chunked.make_local_attention_virtual_batches

    def counted(*args, **kwargs):
        calls.append(args[0])
        return original(*args, **kwargs)

    monkeypatch.setattr(chunked, "make_local_attention_virtual_batches", counted)
    trace = crossing()
    outs = run_trace(trace, a.run)
    for out in outs:
        assert ref.violations(out) == []
    assert calls and set(calls) == {32}
    from attnfuzz.adapters.vllm.runner_step import num_blocks

    shift = num_blocks(trace.config)
    second = eager(outs[1])
    # Request 0's one decode, then request 1's two virtual requests; the second's
    # chunk has one page of keys (32 to 43), its second column the table's unused 0.
    assert second["local.block_table"].tolist() == [
        [1 + shift, 2 + shift], [3 + shift, 4 + shift], [5 + shift, 0],
    ]  # fmt: skip
    row = 1 + (40 - 14)  # request 1's token at position 40
    assert second["local.kv_len"][row] == 9
    keys = np.arange(32, 41)
    pages = np.array([3, 4, 5]) + shift
    want = pages[keys // 16] * 16 + keys % 16
    assert second["local.kv_slots"][row, :9].tolist() == want.tolist()
    assert second["local.slot_mapping"][row] == want[-1]


def test_its_cases_are_of_no_full_graph():
    """vLLM runs the chunked local backend with no FULL graph
    (``AttentionCGSupport.NEVER``: ``resolve_cudagraph_mode_and_sizes`` refuses mode FULL
    and turns FULL decode graphs into PIECEWISE): the implementation draws and judges
    cases of ``cg_support`` NEVER alone, so that where a finding reaches is planned on
    the modes vLLM runs (NONE and PIECEWISE); a case of another support is refused."""
    from attnfuzz.harness.errors import InvalidCase
    from attnfuzz.harness.registry import get_target

    t = get_target("runner-step")
    impl = t.resolve("vllm-v1-chunked-local")
    assert impl.supports(t.cg_supports) == ("NEVER",)
    drawn = find(t.traces(impl=impl), lambda trace: True)
    assert drawn.config.cg_support == "NEVER"
    assert drawn.config.cudagraph_mode in ("NONE", "PIECEWISE")
    other = replace(
        crossing().config, cudagraph_mode="FULL_DECODE_ONLY", cg_support="UNIFORM_BATCH"
    )
    with pytest.raises(InvalidCase, match="AttentionCGSupport NEVER"):
        t.refuse_unfixed(impl, Case(other, crossing().steps[0]))


@pytest.mark.parametrize("mutant", [True, False])
def test_an_empty_last_chunk_is_caught(mutant):
    """The mutant ``vllm-v1-chunked-local-last-chunk-empty`` (the last chunk's keys
    counted ``seq_len % chunk``): one request prefilling a whole chunk of 32 keys reads
    none of them, which the chunk's keys (read from the full layer's metadata) disagree
    with on every build; the installed engine passes the same trace."""
    a = adapter()
    trace = a.smallest_last_chunk_empty()
    assert a.trigger_last_chunk_empty(trace)
    engine = a.run_last_chunk_empty if mutant else a.run
    (out,) = run_trace(trace, engine)
    found = {(v.prop, v.field) for v in ref.violations(out)}
    if mutant:
        assert ("agreement within a build", "local.kv_len") in found
        assert ("agreement within a build", "local.kv_slots") in found
    else:
        assert found == set()
