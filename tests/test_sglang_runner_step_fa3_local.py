"""SGLang's decode graph runner step on the FlashAttention 3 backend of a model with
chunked (local) attention (runner-step's ``sglang-fa3-local``): each query token's local
keys, eager, padded and replayed, held to the keys of its chunk."""

from __future__ import annotations

import dataclasses

from attnfuzz.adapters.sglang.runner_step import arrive_then_step
from attnfuzz.adapters.sglang.testing import field_values as _values
from attnfuzz.adapters.sglang.testing import life
from attnfuzz.adapters.sglang.testing import sglang_test as _sglang
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.batch import Case, EngineConfig

CONFIG = EngineConfig(
    max_model_len=32, max_num_seqs=2, max_num_batched_tokens=32, block_size=1,
    cudagraph_capture_sizes=(2,),
)  # fmt: skip


def _local():
    from attnfuzz.adapters.sglang import runner_step_fa3_local

    return runner_step_fa3_local


def test_the_chunk_is_a_whole_number_of_pages_and_drafts_are_declined():
    local = _local()
    assert [local.chunk_of(p) for p in (1, 2, 4, 8, 64)] == [4, 4, 4, 8, 64]
    assert local.declines(Case(CONFIG, ())) is None
    assert "target verify" in local.declines(Case(dataclasses.replace(CONFIG, num_spec=1), ()))


@_sglang
def test_an_extend_then_a_decode_read_each_token_s_chunk():
    """An extend of 6 tokens (chunks of 4: positions 0-3, then 4-5), then the decode of
    position 6 in the graph of two (a padding request): each token reads its chunk's keys
    up to itself, in every build."""
    extend, decode = life(_local().run, arrive_then_step(CONFIG, 6))
    assert ref.violations(extend) == [] and ref.violations(decode) == []
    assert _values(extend, "eager", "local.kv_len") == [1, 2, 3, 4, 1, 2]
    for how in ("eager", "padded", "replay"):
        lens = _values(decode, how, "local.kv_len")
        assert lens[0] == 3, how  # positions 4, 5 and 6
        slots = _values(decode, how, "kv_slots")[0]
        assert _values(decode, how, "local.kv_slots")[0][:3] == slots[4:7], how


@_sglang
def test_an_eager_layout_of_chunks_one_token_long_fails_agreement_within_the_build(monkeypatch):
    """An eager build that splits the requests into chunks one token longer than the
    model's: the keys handed to the kernel are not the tokens' chunks."""
    from sglang.srt.layers.attention.local_attention import LocalAttentionMetadataBuilder

    real = LocalAttentionMetadataBuilder.build

    def one_long(self, **kwargs):
        self.attention_chunk_size += 1
        try:
            return real(self, **kwargs)
        finally:
            self.attention_chunk_size -= 1

    monkeypatch.setattr(LocalAttentionMetadataBuilder, "build", one_long)
    extend, _ = life(_local().run, arrive_then_step(CONFIG, 6))
    found = {(v.prop, v.build, v.field) for v in ref.violations(extend)}
    assert ("agreement within a build", "eager", "local.kv_len") in found
