"""SGLang's decode graph runner step with FA3 for prefill and Triton for decode
(runner-step's ``sglang-prefill-decode`` and ``sglang-prefill-decode-verify-on-decode``):
``HybridAttnBackend`` hands each step, eager and in the graph, to the backend it selects,
and each backend's build is read as that backend's own implementation reads it."""

from __future__ import annotations

from attnfuzz.adapters.sglang.testing import arrive_then_decode, life
from attnfuzz.adapters.sglang.testing import field_values as _values
from attnfuzz.adapters.sglang.testing import sglang_test as _sglang
from attnfuzz.reference import runner_step as ref


def _names(out, how: str) -> set[str]:
    (build,) = [b for b in out.builds if b.how == how]
    return {f.name for f in build.fields}


def _where(out, how: str) -> str:
    (build,) = [b for b in out.builds if b.how == how]
    return build.where


@_sglang
def test_an_extend_goes_to_fa3_and_a_decode_to_triton_eagerly_and_in_the_graph():
    """Three requests arrive (FA3's extend), then decode in the graph of four (Triton's
    capture, padding and replay); the keys each request reads are those the Triton
    engine alone reads."""
    from attnfuzz.adapters.sglang import runner_step, runner_step_prefill_decode

    trace = arrive_then_decode(num_spec=0)
    arrive, step = life(runner_step_prefill_decode.run, trace)
    assert "cache_seqlens_int32" in _names(arrive, "eager")
    assert _where(arrive, "eager").endswith("FlashAttentionBackend (extend)")
    assert [b.how for b in step.builds] == ["eager", "padded", "replay", "fresh"]
    for how in ("eager", "padded", "replay", "fresh"):
        assert {"kv_indptr", "kv_indices"} <= _names(step, how), how
        assert _where(step, how).endswith("TritonAttnBackend (decode)"), how
    assert [b.how for b in arrive.builds if b.how == "capture"] == ["capture"] * 3
    _, alone = life(runner_step.run, trace)
    for how in ("eager", "replay"):
        assert _values(step, how, "kv_len") == _values(alone, how, "kv_len"), how
        assert _values(step, how, "kv_slots") == _values(alone, how, "kv_slots"), how
    assert ref.violations(arrive) == [] and ref.violations(step) == []


@_sglang
def test_a_verify_goes_to_fa3_whose_graph_state_the_wrapper_made():
    """Under --speculative-attention-mode prefill (the default) the verify runs on FA3,
    eagerly and in the graph: HybridAttnBackend.init_cuda_graph_state made FA3's graph
    buffers too, and the capture ran on FA3."""
    from attnfuzz.adapters.sglang import runner_step_fa3, runner_step_prefill_decode

    trace = arrive_then_decode(num_spec=1)
    arrive, verify = life(runner_step_prefill_decode.run, trace)
    backend = runner_step_prefill_decode.ENGINE.engine.backend
    assert backend.prefill_backend.target_verify_metadata  # filled by init_cuda_graph_state
    for how in ("eager", "padded", "replay"):
        assert _where(verify, how).endswith("FlashAttentionBackend (verify)"), how
    assert _values(verify, "eager", "cache_seqlens_int32") == [7, 5, 3]
    assert _values(verify, "replay", "cache_seqlens_int32")[:3] == [7, 5, 3]
    captures = [b for b in arrive.builds if b.how == "capture"]
    assert captures and all("cache_seqlens_int32" in {f.name for f in b.fields} for b in captures)
    _, alone = life(runner_step_fa3.run, trace)
    for how in ("eager", "replay"):
        assert _values(verify, how, "kv_slots") == _values(alone, how, "kv_slots"), how
    assert ref.violations(arrive) == [] and ref.violations(verify) == []


@_sglang
def test_under_the_decode_mode_a_verify_goes_to_triton_and_fa3_makes_no_graph_state():
    from attnfuzz.adapters.sglang import runner_step, runner_step_prefill_decode

    trace = arrive_then_decode(num_spec=1)
    _, verify = life(runner_step_prefill_decode.run_verify_on_decode, trace)
    backend = runner_step_prefill_decode.VERIFY_ON_DECODE.engine.backend
    assert backend.prefill_backend.target_verify_metadata == {}  # as __init__ left it
    for how in ("eager", "padded", "replay"):
        assert _where(verify, how).endswith("TritonAttnBackend (verify)"), how
        assert "qo_indptr" in _names(verify, how), how
    _, alone = life(runner_step.run, trace)
    for how in ("eager", "replay"):
        assert _values(verify, how, "kv_slots") == _values(alone, how, "kv_slots"), how
    assert ref.violations(verify) == []
