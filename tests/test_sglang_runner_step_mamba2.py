"""SGLang's decode graph runner step of a Mamba2 hybrid model (runner-step's
``sglang-hybrid-mamba2``): ``Mamba2Metadata`` of an extend (its sequence index per
token, initial-state flags and logical chunks) and of padded decodes in the graph."""

from __future__ import annotations

from attnfuzz.adapters.sglang.testing import field_values as _values
from attnfuzz.adapters.sglang.testing import life, requires_sglang, scheduled
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.batch import EngineConfig
from attnfuzz.reference.trace import Trace

pytestmark = requires_sglang


def _chunk_then_decode() -> Trace:
    """Two requests arrive (3 and 2 tokens); the first prefills 6 more, the second 2,
    from their states; both decode in the graph of two, then the second alone, padded.
    Chunks of CHUNK_SIZE = 4 tokens; pages of one token."""
    config = EngineConfig(max_model_len=16, max_num_seqs=4, max_num_batched_tokens=16,
                          block_size=1, num_spec=0, cudagraph_capture_sizes=(2, 4))  # fmt: skip
    first = (1, 2, 3, 4, 5, 8, 9, 12, 13, 14)
    second = (6, 7, 10, 11, 15, 16)
    return Trace(
        config,
        (
            scheduled((0, 0), (3, 2), (0, 1), (first[:3], second[:2]), (3, 2)),
            scheduled((3, 2), (6, 2), (0, 1), (first[:9], second[:4]), (6, 2)),
            scheduled((9, 4), (1, 1), (0, 1), (first, second[:5]), (1, 1)),
            scheduled((5,), (1,), (1,), (second,), (1,)),
        ),
    )


def test_an_extend_s_metadata_and_its_logical_chunks():
    from attnfuzz.adapters.sglang import runner_step_mamba2 as mamba2

    assert mamba2.CHUNK_SIZE == 4
    trace = _chunk_then_decode()
    arrive, resume = life(mamba2.run, Trace(trace.config, trace.steps[:2]))
    assert _values(arrive, "eager", "mamba2.seq_idx") == [0, 0, 0, 1, 1]
    assert _values(arrive, "eager", "mamba2.has_initial_states") == [0, 0]
    assert _values(resume, "eager", "mamba2.query_start_loc") == [0, 6, 8]
    assert _values(resume, "eager", "mamba2.seq_idx") == [0] * 6 + [1] * 2
    assert _values(resume, "eager", "mamba2.has_initial_states") == [1, 1]
    # Tokens 0-3 are chunk 0 (request 0), 4-5 chunk 1 (request 0), 6-7 chunk 1 from
    # offset 2 (request 1): a logical chunk each, as the SSD scan reads them.
    assert mamba2.chunks(mamba2.ENGINE.engine) == ([0, 1, 1], [0, 0, 2])
    for out in (arrive, resume):
        assert ref.violations(out) == []


def test_decodes_in_the_graph_and_a_padded_one():
    from attnfuzz.adapters.sglang import runner_step_mamba2 as mamba2

    arrive, _, both, alone = life(mamba2.run, _chunk_then_decode())
    slots = _values(arrive, "eager", "mamba2.mamba_cache_indices")
    assert len(set(slots)) == 2 and 0 not in slots  # slot 0 is the pool's dummy
    assert [b.how for b in both.builds] == ["eager", "padded", "replay", "fresh"]
    for how in ("eager", "padded", "replay"):
        assert _values(both, how, "mamba2.mamba_cache_indices") == slots, how
        assert _values(both, how, "mamba2.query_start_loc") == [0, 1, 2], how
    # The second request alone in the graph of two: its padding row PAD_SLOT_ID, no
    # tokens.
    for how in ("padded", "replay"):
        assert _values(alone, how, "mamba2.mamba_cache_indices") == [slots[1], -1], how
        assert _values(alone, how, "mamba2.query_start_loc") == [0, 1, 1], how
    for out in (both, alone):
        assert ref.violations(out) == []
