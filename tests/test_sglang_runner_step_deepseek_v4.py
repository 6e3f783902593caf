"""SGLang's decode graph runner step on the DeepSeek-V4 backend (runner-step's
``sglang-deepseek-v4``), its stand-ins, its ranges shown failing on a broken build, and its
mutant."""

from __future__ import annotations

import sys
from typing import Any

import pytest
from attnfuzz.adapters.sglang.testing import (
    arrive_past_the_window_then_decode,
    deepseek_v4_swa_slot,
    life,
    requires_sglang,
    violations_found,
)
from attnfuzz.adapters.sglang.testing import field_values as _values
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.trace import Trace

pytestmark = requires_sglang


def _life(trace: Trace, name: str = "run") -> list[ref.RunnerStepOutputs]:
    """Every step of ``trace`` on one new engine of ``runner_step_deepseek_v4.<name>``."""
    from attnfuzz.adapters.sglang import runner_step_deepseek_v4

    return life(getattr(runner_step_deepseek_v4, name), trace)


_found = violations_found
_arrive_then_decode = arrive_past_the_window_then_decode
_swa = deepseek_v4_swa_slot


def test_a_decode_of_three_requests_replays_the_graph_of_four():
    """The window: the last ``min(seq_len, 128)`` keys, newest first, at SWA slots; the
    compressed lengths ``seq_len // 4`` and ``// 128``; the padding request the fill length
    1 on row 0, whose one key is SWA slot 0 of the padding page."""
    arrive, decode = _life(_arrive_then_decode(num_spec=0))
    assert [b.how for b in arrive.builds] == ["capture", "capture", "eager", "fresh"]
    assert ref.violations(arrive) == []
    assert [b.how for b in decode.builds] == ["eager", "padded", "replay", "fresh"]
    assert _values(decode, "eager", "swa_topk_lengths") == [128, 4, 2]
    window = _values(decode, "eager", "swa_page_indices")
    assert window[0][:2] == [_swa(1, 150), _swa(1, 149)] and window[0][127] == _swa(1, 23)
    assert window[1][:5] == [_swa(2, 3), _swa(2, 2), _swa(2, 1), _swa(2, 0), -1]
    assert _values(decode, "eager", "swa_out_cache_loc") == [_swa(1, 150), _swa(2, 3), _swa(3, 1)]
    assert _values(decode, "eager", "c4_topk_lengths_raw") == [37, 1, 0]
    assert _values(decode, "eager", "c4_sparse_topk_lengths") == [37, 1, 1]
    # 151 keys: one C128 block, the first slot of page 1 in the C128 cache (2 a page).
    assert _values(decode, "eager", "c128_page_indices")[0][:2] == [2, -1]
    for how in ("padded", "replay"):
        assert _values(decode, how, "seq_lens") == [151, 4, 2, 1], how
        assert _values(decode, how, "req_pool_indices")[3] == 0, how
    # The raw metadata load_batch leaves holds the runner's inputs alone.
    assert next(decode.of("padded")).field("swa_page_indices") is None
    assert _values(decode, "replay", "swa_topk_lengths") == [128, 4, 2, 1]
    assert _values(decode, "replay", "swa_out_cache_loc")[3] == 0
    assert _values(decode, "replay", "swa_page_indices")[3][:2] == [0, -1]
    assert ref.violations(decode) == []


def test_a_verify_builds_a_row_per_query_token():
    """A verify's metadata rows are its query tokens: ``seq_lens_casual`` the committed
    prefix plus each draft; its padding request's two tokens past the fill length 1."""
    _, verify = _life(_arrive_then_decode(num_spec=1))
    assert _values(verify, "eager", "seq_lens") == [150, 3, 1]
    assert _values(verify, "eager", "seq_lens_casual") == [151, 152, 4, 5, 2, 3]
    assert _values(verify, "eager", "swa_topk_lengths") == [128, 128, 4, 5, 2, 3]
    assert _values(verify, "eager", "kv_len") == [128, 5, 3]
    assert _values(verify, "replay", "seq_lens_casual") == [151, 152, 4, 5, 2, 3, 2, 3]
    assert ref.violations(verify) == []


def test_the_vendors_are_in_sys_modules_only_while_the_engine_builds_or_steps():
    """``flash_mla`` and ``deep_gemm`` are there while the engine runs SGLang's code, and
    gone after; their kernels refuse; SGLang's JIT planners are its own again."""
    from attnfuzz.adapters.sglang import runner_step_deepseek_v4 as dsv4

    dsv4.prepare()
    from sglang.kernels.ops.attention.dsv4 import compress

    real = compress._jit_compress_plan_module
    _life(dsv4.smallest_swa_lengths_unclamped())
    assert "flash_mla" not in sys.modules and "deep_gemm" not in sys.modules
    assert compress._jit_compress_plan_module is real
    with dsv4.vendors():
        import flash_mla  # type: ignore[import-not-found]

        assert flash_mla.get_mla_metadata()[0].tile_scheduler_metadata is None
        with pytest.raises(RuntimeError, match="no forward runs here"):
            flash_mla.flash_mla_with_kvcache()
        assert compress._jit_compress_plan_module() is dsv4._CompressPlanModule
    assert "flash_mla" not in sys.modules


def test_the_graph_writes_into_the_captured_tensors():
    """A replay writes the tensors the capture made (what the recorded kernels write), of
    the same shapes; a shape the capture did not have is the stand-in's error."""
    import torch
    from attnfuzz.adapters.sglang.runner_step_deepseek_v4 import rewrite

    captured = {"a": torch.zeros(3, dtype=torch.int32)}
    rewrite(captured, {"a": torch.arange(3, dtype=torch.int32)})
    assert captured["a"].tolist() == [0, 1, 2]
    with pytest.raises(RuntimeError, match="changes no shape"):
        rewrite(captured, {"a": torch.arange(4, dtype=torch.int32)})


# -- each range shown failing on a build broken by hand -------------------------------------------


def _broken_window(monkeypatch: Any, after: Any) -> None:
    """``make_core_attn_metadata`` followed by ``after(core)``: the metadata broken where
    SGLang builds it, in every build (eager, capture, each replay's recorded body)."""
    from attnfuzz.adapters.sglang import runner_step_deepseek_v4 as dsv4

    dsv4.prepare()
    from sglang.srt.layers.attention.deepseek_v4_backend import DeepseekV4AttnBackend

    make = DeepseekV4AttnBackend.make_core_attn_metadata

    def broken(self: Any, *args: Any, **kwargs: Any) -> Any:
        core = make(self, *args, **kwargs)
        after(core)
        return core

    monkeypatch.setattr(DeepseekV4AttnBackend, "make_core_attn_metadata", broken)


def test_a_window_length_unclamped_fails_its_range(monkeypatch):
    """``swa_topk_lengths`` not clamped to the window (the causal length itself): past 128
    keys FlashMLA would read indices past the 128 it is handed."""
    _broken_window(monkeypatch, lambda core: core.swa_topk_lengths.copy_(core.seq_lens_casual))
    _, decode = _life(_arrive_then_decode(num_spec=0))
    found = _found(decode)
    for how in ("eager", "replay", "fresh"):
        assert ("safe padding", how, "swa_topk_lengths") in found


def test_a_padding_write_at_a_real_slot_fails_padding_writes_no_real_kv(monkeypatch):
    """A padding token's SWA write at a slot a real request's window reads: the padded
    forward would overwrite that request's key."""

    def onto_request_0(core: Any) -> None:
        if core.swa_out_cache_loc is not None and core.swa_out_cache_loc.shape[0] == 4:
            core.swa_out_cache_loc[3] = core.swa_page_indices[0, 1]

    from attnfuzz.adapters.sglang import runner_step_deepseek_v4 as dsv4

    dsv4.prepare()
    from sglang.srt.layers.attention.deepseek_v4_backend import DeepseekV4AttnBackend

    in_graph = DeepseekV4AttnBackend.init_forward_metadata_in_graph

    def broken(self: Any, forward_batch: Any) -> None:
        in_graph(self, forward_batch)
        onto_request_0(self.forward_metadata.core_attn_metadata)

    monkeypatch.setattr(DeepseekV4AttnBackend, "init_forward_metadata_in_graph", broken)
    _, decode = _life(_arrive_then_decode(num_spec=0))
    assert ("padding writes no real KV", "replay", "swa_out_cache_loc") in _found(decode)


# -- the mutant ------------------------------------------------------------------------------------


def test_the_mutant_fails_safe_padding_on_its_smallest_trace():
    """A request of 129 keys: its window length 129, past the 128 indices FlashMLA is
    handed, in the eager build, the replay and the new engine's alike."""
    from attnfuzz.adapters.sglang import runner_step_deepseek_v4 as dsv4

    trace = dsv4.smallest_swa_lengths_unclamped()
    assert dsv4.reach_past_window(trace)
    *_, fixed = _life(trace)
    assert ref.violations(fixed) == []
    assert _values(fixed, "replay", "swa_topk_lengths") == [128]
    *_, out = _life(trace, "run_swa_lengths_unclamped")
    found = _found(out)
    for how in ("eager", "replay", "fresh"):
        assert ("safe padding", how, "swa_topk_lengths") in found


def test_a_stale_raw_out_loc_changes_no_field_of_a_cuda_replay():
    """The captured raw metadata's ``out_cache_loc`` left stale at a replay (its values
    put back after ``replay_cuda_graph_metadata_from``) changes no field on CUDA: the SWA
    write locations come from the runner's own buffer
    (``init_forward_metadata_in_graph``), and the C4 / C128 write locations the
    compressors read (``_get_out_loc``, judged) come out as an eager build's. HIP's
    backend, which copies the raw metadata (``DSV4RawDecodeMetadata.copy_``), is where
    such a copy can go stale (``sglang-deepseek-v4-hip-radix-out-loc-stale``)."""
    from attnfuzz.adapters.sglang import runner_step_deepseek_v4 as dsv4

    class Stale(dsv4.DeepseekV4Engine):
        def make_backend(self) -> Any:
            backend = super().make_backend()
            replay_from = backend.replay_cuda_graph_metadata_from

            def stale(bs: int, temp_metadata: Any, bucket: Any) -> None:
                chosen = backend.cuda_graph_metadata_of_bucket_and_bs[bucket].get(bs)
                kept = None if chosen is None else chosen.out_cache_loc.clone()
                replay_from(bs=bs, temp_metadata=temp_metadata, bucket=bucket)
                if kept is not None:
                    chosen.out_cache_loc.copy_(kept)

            backend.replay_cuda_graph_metadata_from = stale
            return backend

    life_ = dsv4._MutantLife(Stale)
    *_, out = life(life_, dsv4.smallest_swa_lengths_unclamped())
    assert ref.violations(out) == []
    assert _values(out, "replay", "c4_out_loc") == _values(out, "eager", "c4_out_loc")
    assert _values(out, "replay", "swa_out_cache_loc") == _values(out, "eager", "swa_out_cache_loc")


# The derandomized search (the engine passing it, the mutant's smallest trace judged
# first) is test_entries.py's, over every implementation of runner-step: not repeated here.
