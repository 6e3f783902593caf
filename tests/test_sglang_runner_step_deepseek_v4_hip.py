"""SGLang's decode graph runner step on DeepSeek-V4's HIP radix backend (runner-step's
``sglang-deepseek-v4-hip-radix``), its platform stand-ins, its graph stand-in, its ranges
shown failing on a broken build, and its mutant."""

from __future__ import annotations

import sys
from typing import Any

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

BACKEND = "sglang.srt.layers.attention.deepseek_v4_backend_hip_radix"


def _life(trace: Trace, name: str = "run") -> list[ref.RunnerStepOutputs]:
    """Every step of ``trace`` on one new engine of ``runner_step_deepseek_v4_hip.<name>``."""
    from attnfuzz.adapters.sglang import runner_step_deepseek_v4_hip

    return life(getattr(runner_step_deepseek_v4_hip, name), trace)


_found = violations_found
_arrive_then_decode = arrive_past_the_window_then_decode
_swa = deepseek_v4_swa_slot


def test_a_decode_of_three_requests_replays_the_graph_of_four():
    """The window gathered by ``get_swa_page_indices`` (the last ``min(seq_len, 128)`` keys,
    newest first, at SWA slots); the compressed write ``c4_out_loc`` the new token's slot
    over 4 where it completes a group; the padding request the fill length 1 on row 0."""
    arrive, decode = _life(_arrive_then_decode(num_spec=0))
    assert [b.how for b in arrive.builds] == ["capture", "capture", "eager", "fresh"]
    assert ref.violations(arrive) == []
    assert [b.how for b in decode.builds] == ["eager", "padded", "replay", "fresh"]
    assert _values(decode, "eager", "swa_topk_lengths") == [128, 4, 2]
    window = _values(decode, "eager", "swa_page_indices")
    assert window[0][:2] == [_swa(1, 150), _swa(1, 149)] and window[0][127] == _swa(1, 23)
    assert window[1][:5] == [_swa(2, 3), _swa(2, 2), _swa(2, 1), _swa(2, 0), -1]
    assert _values(decode, "eager", "swa_out_cache_loc") == [_swa(1, 150), _swa(2, 3), _swa(3, 1)]
    # The second request's fourth key completes a C4 group: slot 2 * 256 + 3, over 4.
    assert _values(decode, "eager", "c4_out_loc") == [0, (2 * 256 + 3) // 4, 0]
    assert _values(decode, "eager", "c4_topk_lengths_raw") == [37, 1, 0]
    assert _values(decode, "eager", "c4_sparse_topk_lengths") == [37, 1, 1]
    # 151 keys: one C128 block, the first slot of page 1 in the C128 cache (2 a page).
    assert _values(decode, "eager", "c128_page_indices")[0][:2] == [2, -1]
    # What load_batch leaves is the raw metadata: the runner's inputs alone.
    assert next(decode.of("padded")).field("swa_page_indices") is None
    assert _values(decode, "replay", "seq_lens") == [151, 4, 2, 1]
    assert _values(decode, "replay", "swa_topk_lengths") == [128, 4, 2, 1]
    assert _values(decode, "replay", "c4_out_loc") == [0, (2 * 256 + 3) // 4, 0, 0]
    assert _values(decode, "replay", "swa_out_cache_loc")[3] == 0
    assert _values(decode, "replay", "swa_page_indices")[3][:2] == [0, -1]
    assert ref.violations(decode) == []


def test_a_verify_is_built_out_of_the_graph_and_copied_into_the_captured_metadata():
    """An EAGLE verify is no raw metadata on HIP (DSpark's alone is): load_batch builds it
    whole (``init_forward_metadata_target_verify_old``) and ``DSV4Metadata.copy_`` writes
    it into the captured tensors; only ``swa_out_cache_loc``, which ``copy_`` rebinds, is
    the recorded in-graph body's."""
    _, verify = _life(_arrive_then_decode(num_spec=1))
    assert _values(verify, "eager", "seq_lens_casual") == [151, 152, 4, 5, 2, 3]
    assert _values(verify, "eager", "swa_topk_lengths") == [128, 128, 4, 5, 2, 3]
    assert _values(verify, "eager", "kv_len") == [128, 5, 3]
    # The first request's second token (its 152nd key) and the second's first (its 4th)
    # complete a C4 group.
    assert _values(verify, "eager", "c4_out_loc") == [0, (256 + 151) // 4, (512 + 3) // 4, 0, 0, 0]
    padded = next(verify.of("padded"))
    assert padded.field("swa_out_cache_loc") is None
    assert _values(verify, "padded", "seq_lens_casual") == [151, 152, 4, 5, 2, 3, 2, 3]
    assert _values(verify, "replay", "seq_lens_casual") == [151, 152, 4, 5, 2, 3, 2, 3]
    assert _values(verify, "replay", "swa_out_cache_loc")[:2] == [_swa(1, 150), _swa(1, 151)]
    assert ref.violations(verify) == []


def test_the_platform_is_rocm_only_while_the_engine_builds_or_steps():
    """The engine is built on HIP's backend, with no FlashMLA or DeepGEMM imported (the HIP
    metadata path reaches neither); ``is_hip`` answers True inside :func:`rocm` alone."""
    from attnfuzz.adapters.sglang import runner_step_deepseek_v4_hip as hip

    hip.prepare()
    from sglang.srt import utils
    from sglang.srt.layers.attention.dsv4 import metadata

    _life(hip.smallest_out_loc_stale())
    assert type(hip.ENGINE.engine.backend).__module__ == BACKEND
    assert "flash_mla" not in sys.modules and "deep_gemm" not in sys.modules
    assert not utils.is_hip() and not metadata.is_hip()
    with hip.rocm():
        assert utils.is_hip() and metadata.is_hip()
        backend = sys.modules[BACKEND]
        # On ROCm no FlashMLA schedule is made (the tilelang kernel takes none).
        assert backend._create_flashmla_metadata() is None
        assert backend.torch.tensor([1], pin_memory=True).tolist() == [1]
    assert not utils.is_hip()


def test_the_graph_keeps_what_it_captured_while_the_backend_rebinds_fields():
    """The capture is kept as the tensors the graph reads: the backend's own metadata
    object, whose fields ``copy_`` and the in-graph body rebind, is not."""
    import dataclasses

    import torch
    from attnfuzz.adapters.sglang.runner_step_deepseek_v4_draft import structure

    @dataclasses.dataclass
    class Core:
        loc: torch.Tensor | None

    @dataclasses.dataclass
    class Metadata:
        core: Core

    live = Metadata(Core(torch.zeros(2)))
    captured = structure(live)
    live.core.loc = None
    assert captured.core.loc is not None and captured.core is not live.core


def test_the_draft_replays_each_attending_steps_metadata_built_in_the_graph():
    """The EAGLE draft of three steps after the verify: its two attending steps' windows
    over the committed prefix and the draft's own tokens (``seq_lens + step + 1``), each
    writing its own slot of the draft's (``per_step_draft_out_cache_loc``); the graph of
    four replays both, the third step's metadata (no attention) reported by no build."""
    arrive, verify = _life(_arrive_then_decode(num_spec=3), "run_draft")
    assert ref.violations(arrive) == []
    assert [b.how for b in verify.builds] == ["eager", "padded", "replay", "fresh"]
    assert _values(verify, "eager", "seq_lens") == [151, 4, 2]
    assert _values(verify, "eager", "out_cache_loc")[1] == [512 + 4, 512 + 5, 512 + 6]
    for how in ("eager", "replay"):
        assert _values(verify, how, "seq_lens_casual.0")[:3] == [152, 5, 3], how
        assert _values(verify, how, "seq_lens_casual.1")[:3] == [153, 6, 4], how
        assert _values(verify, how, "swa_out_cache_loc.1")[:3] == [
            _swa(1, 152), _swa(2, 5), _swa(3, 3)
        ], how  # fmt: skip
    assert _values(verify, "eager", "kv_len") == [128, 6, 4]
    # The padding request: the fill length 1, its drafts 2 and 3 keys of row 0.
    assert _values(verify, "replay", "seq_lens_casual.1")[3] == 3
    assert _values(verify, "replay", "swa_out_cache_loc.1")[3] == 0
    assert next(verify.of("padded")).field("seq_lens_casual.0") is None
    assert next(verify.of("replay")).field("seq_lens_casual.2") is None
    assert ref.violations(verify) == []


# -- each range shown failing on a build broken by hand -------------------------------------------


def _broken_core(monkeypatch: Any, after: Any) -> None:
    """HIP's ``make_core_attn_metadata`` followed by ``after(core)``: the metadata broken
    where SGLang builds it, in every build."""
    from attnfuzz.adapters.sglang import runner_step_deepseek_v4_hip as hip

    hip.prepare()
    backend = sys.modules[BACKEND].DeepseekV4HipRadixBackend
    make = backend.make_core_attn_metadata

    def broken(self: Any, *args: Any, **kwargs: Any) -> Any:
        core = make(self, *args, **kwargs)
        after(core)
        return core

    monkeypatch.setattr(backend, "make_core_attn_metadata", broken)


def test_a_window_length_unclamped_fails_its_range(monkeypatch):
    """``swa_topk_lengths`` not clamped to the window: past 128 keys the kernel would be
    handed a length past the 128 indices of the row."""
    _broken_core(monkeypatch, lambda core: core.swa_topk_lengths.copy_(core.seq_lens_casual))
    _, decode = _life(_arrive_then_decode(num_spec=0))
    found = _found(decode)
    for how in ("eager", "replay", "fresh"):
        assert ("safe padding", how, "swa_topk_lengths") in found


def test_a_compressed_write_past_its_cache_fails_its_range(monkeypatch):
    """A ``c4_out_loc`` of the full pool's slot (not over 4): past the C4 caches' rows."""

    def full_slot(core: Any) -> None:
        core.c4_out_loc.copy_(core.raw_out_loc * 4)

    _broken_core(monkeypatch, full_slot)
    _, decode = _life(_arrive_then_decode(num_spec=0))
    assert ("safe padding", "eager", "c4_out_loc") in _found(decode)


# -- the mutant ------------------------------------------------------------------------------------


def test_the_mutant_fails_replay_equals_eager_on_its_smallest_trace():
    """A request's fourth key, in the graph of one: its ``c4_out_loc`` the capture's 0 at
    the replay, its own slot over 4 eagerly; the fixed engine's replay agrees."""
    from attnfuzz.adapters.sglang import runner_step_deepseek_v4_hip as hip

    trace = hip.smallest_out_loc_stale()
    assert hip.trigger_out_loc_stale(trace) and hip.reach_decode_replay(trace)
    *_, fixed = _life(trace)
    assert ref.violations(fixed) == []
    assert _values(fixed, "replay", "c4_out_loc") == [(256 + 3) // 4]
    *_, out = _life(trace, "run_out_loc_stale")
    assert _values(out, "replay", "c4_out_loc") == [0]
    assert _found(out) == {("replay equals eager", "replay", "c4_out_loc")}
    # The recompiled copy_ drops the one statement, in SGLang's file.
    stale = hip._copy_without_out_loc()
    assert stale.__code__.co_filename == sys.modules[BACKEND].__file__


# The derandomized search (the engine passing it, the mutant's smallest trace judged
# first) is test_entries.py's, over every implementation of runner-step: not repeated here.
