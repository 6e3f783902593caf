"""vLLM 0.33.0's V2 runner of an encoder-decoder model (``vllm-v2-encoder-decoder``):
``EncoderDecoderModelState`` runs each request's encoder on its first step and hands
every KV-cache group its encoder length; the cross-attention group's builder reads its
requests' encoder keys through their own blocks and writes them there on their first
step only, eager and in the FULL decode graphs' replays; a mutant of its slots caught."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from attnfuzz.adapters.vllm.testing import Calls, own, requires_vllm, run_trace
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.batch import Batch, EngineConfig
from attnfuzz.reference.trace import Trace

pytestmark = [*requires_vllm]

CONFIG = EngineConfig(
    max_model_len=8, max_num_seqs=3, max_num_batched_tokens=32, block_size=4,
    cudagraph_capture_sizes=(1, 2), cudagraph_mode="FULL_DECODE_ONLY", runner="v2",
)  # fmt: skip


def adapter():
    from attnfuzz.adapters.vllm import runner_step_encoder_decoder

    return runner_step_encoder_decoder


def build(out: ref.RunnerStepOutputs, how: str) -> dict[str, np.ndarray]:
    (b,) = own(out, how)
    return {f.name: f.values for f in b.fields}


def arrivals(mode: str = "FULL_DECODE_ONLY") -> Trace:
    """Request 0 prefills 2 tokens; it decodes while request 1 arrives; both decode (a
    uniform decode of 2: a FULL graph replays it); request 2 arrives beside them."""
    return Trace(
        dataclasses.replace(CONFIG, cudagraph_mode=mode),
        (
            Batch((0,), (2,), req_ids=(0,), pages=((1,),), new_pages=(1,)),
            Batch((2, 0), (1, 2), req_ids=(0, 1), pages=((1,), (2,)), new_pages=(0, 1)),
            Batch((3, 2), (1, 1), req_ids=(0, 1), pages=((1,), (2,)), new_pages=(0, 0)),
            Batch((4, 3, 0), (1, 1, 3), req_ids=(0, 1, 2), pages=((1, 3), (2,), (4,)),
                  new_pages=(1, 0, 1)),
        ),
    )  # fmt: skip


@pytest.mark.parametrize("mode", ["FULL_DECODE_ONLY", "NONE"])
def test_cross_attention_follows_each_request_encoder(monkeypatch, mode):
    """Each request's encoder runs once, on its first step; the cross-attention build
    holds every request's encoder length and its own blocks, and writes the encoder's
    keys on that first step only, into those blocks; every property holds on every
    step, the FULL graph's replay included."""
    a = adapter()  # before vLLM
    from vllm.model_executor.layers.attention import cross_attention

    calls = Calls(monkeypatch)
    calls.count(cross_attention, "_get_cross_slot_mapping")
    encoded: list[list[int]] = []
    embed = a._EncoderDecoderModel.embed_multimodal

    def record(self, **kwargs):
        out = embed(self, **kwargs)
        encoded.append([len(t) for t in out])
        return out

    monkeypatch.setattr(a._EncoderDecoderModel, "embed_multimodal", record)
    outs = run_trace(arrivals(mode), a.run)
    assert all(ref.violations(out) == [] for out in outs)
    assert calls["_get_cross_slot_mapping"] > 0
    lens = [a.encoder_len(r) for r in range(3)]
    # The eager, graph and fresh engines each encode a request on its first step.
    assert [lens[0]] in encoded and [lens[1]] in encoded and [lens[2]] in encoded
    second, third = build(outs[1], "eager"), build(outs[2], "eager")
    assert second["cross.seq_lens"][:2].tolist() == lens[:2]
    # Request 0 decodes (nothing written), request 1 writes its encoder's keys.
    assert (second["cross.slot_mapping"][0] == -1).all()
    assert (second["cross.slot_mapping"][1][: lens[1]] >= 0).all()
    assert (third["cross.slot_mapping"] == -1).all()
    if mode == "FULL_DECODE_ONLY":  # the uniform decode of step 2 replayed its graph
        (replay,) = own(outs[2], "replay")
        assert replay.field("cross.seq_lens").values[:2].tolist() == lens[:2]


def test_the_mutant_is_caught_on_its_smallest_trace():
    """Read by its rank among the writers, request 1's blocks are request 0's row: its
    encoder's keys go into request 0's blocks. The installed engine passes the same
    trace."""
    a = adapter()
    trace = a.smallest_rows_by_rank()
    assert a.trigger_rows_by_rank(trace) and a.reach_encoder_decoder(trace)
    assert all(ref.violations(out) == [] for out in run_trace(trace, a.run))
    last = run_trace(trace, a.rows_by_rank)[-1]
    found = {(v.prop, v.field) for v in ref.violations(last)}
    assert ("agreement within a build", "cross.slot_mapping") in found


def test_a_cut_mapping_agrees_with_no_request():
    """Slots that do not add up to the writers' encoder tokens are kept whole, in one
    row, so that agreement with the slots read fails."""
    a = adapter()
    counts = np.array([0, 3])
    assert a.by_request(np.arange(3), counts)[1, :3].tolist() == [0, 1, 2]
    assert a.by_request(np.arange(2), counts).shape == (1, 2)


def test_what_vllm_does_not_run_is_declined():
    """Drafts, a graph mode vLLM overrides, a budget below max_model_len, a request new at
    computed tokens, a prefill chunk and encoder inputs past the budget are declined."""
    from attnfuzz.reference.batch import Case

    a = adapter()
    step = Batch((0,), (2,), req_ids=(0,), pages=((1,),), new_pages=(1,))
    assert a.declines(Case(CONFIG, step)) is None
    assert "FULL_DECODE_ONLY" in a.declines(
        Case(dataclasses.replace(CONFIG, cudagraph_mode="FULL_AND_PIECEWISE"), step)
    )
    assert "chunked prefill" in a.declines(
        Case(dataclasses.replace(CONFIG, max_num_batched_tokens=4), step)
    )
    hit = Batch((4,), (2,), req_ids=(0,), pages=((1, 2),), new_pages=(2,))
    assert "prefix caching" in a.declines(Case(CONFIG, hit))
    chunk = Batch((0,), (2,), req_ids=(0,), pages=((1,),), new_pages=(1,), prompt_lens=(5,))
    assert "chunk" in a.declines(Case(CONFIG, chunk))
    many = Batch((0,) * 3, (1,) * 3, req_ids=(1, 6, 13), pages=((1,), (2,), (3,)),
                 new_pages=(1, 1, 1))  # fmt: skip
    assert sum(a.encoder_len(r) for r in (1, 6, 13)) > CONFIG.max_num_batched_tokens
    assert "encoder budget" in a.declines(Case(CONFIG, many))
