"""SGLang's FA3 step on a hybrid sliding-window pool under Dots' SWA-MLA wrapper
(runner-step's ``sglang-dots-swa-mla``): what it builds, and its agreements shown
failing on builds broken by hand."""

from __future__ import annotations

from typing import Any

import pytest
from attnfuzz.adapters.sglang.testing import field_values as _values
from attnfuzz.adapters.sglang.testing import life, requires_sglang
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.batch import EngineConfig

pytestmark = requires_sglang


def _dots():
    from attnfuzz.adapters.sglang import runner_step_dots

    return runner_step_dots


def _prompt_then_decode(block_size: int) -> Any:
    """One request of a 9-token prompt, then its decode in the graph of one."""
    from attnfuzz.adapters.sglang.runner_step import arrive_then_step

    config = EngineConfig(max_model_len=16, max_num_seqs=2, max_num_batched_tokens=16,
                          block_size=block_size, num_spec=0,
                          cudagraph_capture_sizes=(1, 2))  # fmt: skip
    return arrive_then_step(config, 9)


@pytest.mark.parametrize("block_size", [1, 4])
def test_the_window_layers_read_and_write_the_allocators_swa_slots(block_size):
    """The wrapper is ``wrap_dots_attention_backend``'s over FA3 on ``SWAKVPool``; the
    prompt's Dots prefill metadata is its whole 9-key tail (``min(q + window, seq_len)``)
    in SWA slots, the decode's window table and write the allocator's SWA pages, eager
    and replayed; every property holds."""
    m = _dots()
    m.run.new_engine()
    prompt, step = life(m.run, _prompt_then_decode(block_size))
    from sglang.srt.layers.attention.dots_hybrid_backend import DotsSWAMLAAttnBackend

    engine = m.ENGINE.engine
    assert type(engine.backend) is DotsSWAMLAAttnBackend
    assert engine.backend.backend.use_sliding_window_kv_pool
    pages, page = engine.pages(), block_size
    swa = [engine.swa_page(s // page) * page + s % page for s in engine.slots(0, 0, 10)]
    assert _values(prompt, "eager", "dots.kv_len") == [9]
    assert _values(prompt, "eager", "dots.kv_slots")[0][:9] == swa[:9]
    assert [b.how for b in step.builds] == ["eager", "padded", "replay", "fresh"]
    for how in ("eager", "replay"):
        assert _values(step, how, "swa_out_cache_loc")[:1] == [swa[9]], how
    assert 0 < min(swa) and max(swa) < pages * page
    assert ref.violations(prompt) == [] and ref.violations(step) == []


def test_a_table_read_off_the_full_pool_fails_agreement_with_the_allocator(monkeypatch):
    """An eager window table that names full pages (the pool's translation skipped)
    stays in range, yet reads other keys of the SWA pool: agreement within the build
    fails on ``swa_page_table`` at the prompt and the decode; the replay, whose table
    the graph's metadata kernel gathers through the translator's own mapping, holds it
    and so differs from the eager build."""
    from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool

    m = _dots()
    m.run.new_engine()
    monkeypatch.setattr(SWAKVPool, "translate_loc_from_full_to_swa", lambda self, loc: loc)
    prompt, step = life(m.run, _prompt_then_decode(1))
    found = {(v.prop, v.field, v.build) for v in ref.violations(step)}
    assert ("agreement within a build", "swa_page_table", "eager") in found, found
    assert ("agreement within a build", "swa_page_table", "replay") not in found, found
    assert ("replay equals eager", "swa_page_table", "replay") in found, found
    assert ("agreement within a build", "swa_page_table", "eager") in {
        (v.prop, v.field, v.build) for v in ref.violations(prompt)
    }


def test_a_prefill_tail_one_key_off_fails_agreement_with_the_window_table(monkeypatch):
    """Dots' prefill latent cache gathered one slot off (``kv_indices`` shifted): the
    tail's slots disagree with the same keys read off the build's ``swa_page_table``."""
    from sglang.srt.layers.attention.dots_hybrid_backend import DotsSWAMLAAttnBackend

    own = DotsSWAMLAAttnBackend._init_prefill_metadata

    def shifted(self: Any, forward_batch: Any) -> None:
        own(self, forward_batch)
        if self._prefill_metadata is not None:
            self._prefill_metadata.kv_indices += 1

    m = _dots()
    m.run.new_engine()
    monkeypatch.setattr(DotsSWAMLAAttnBackend, "_init_prefill_metadata", shifted)
    prompt, _ = life(m.run, _prompt_then_decode(1))
    found = {(v.prop, v.field, v.build) for v in ref.violations(prompt)}
    assert found == {
        ("agreement within a build", "dots.kv_slots", "eager"),
        ("agreement within a build", "dots.kv_slots", "fresh"),
    }
