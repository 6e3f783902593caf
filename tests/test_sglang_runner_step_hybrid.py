"""SGLang's decode graph runner step of a hybrid GDN model (runner-step's
``sglang-hybrid-gdn``): the linear backend's state slots and query offsets in each
build, its page-size declines, and its mutant."""

from __future__ import annotations

import dataclasses

import pytest
from attnfuzz.adapters.sglang.testing import field_values as _values
from attnfuzz.adapters.sglang.testing import life, requires_sglang, scheduled
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.batch import EngineConfig
from attnfuzz.reference.trace import Trace

pytestmark = requires_sglang


def _life(
    trace: Trace, name: str = "run", module: str = "runner_step_hybrid"
) -> list[ref.RunnerStepOutputs]:
    """Every step of ``trace`` on one new engine of ``<module>.<name>``."""
    import importlib

    adapter = importlib.import_module(f"attnfuzz.adapters.sglang.{module}")
    return life(getattr(adapter, name), trace)


# The linear backends whose metadata is MambaAttnBackendBase's ForwardMetadata, as
# their kernels read it: GDN's (Qwen3-Next) and KDA's (Kimi Linear).
BASE_METADATA = pytest.mark.parametrize(
    "module, prefix", [("runner_step_hybrid", "gdn"), ("runner_step_kda", "kda")]
)


def _arrive_mix_decode(num_spec: int) -> Trace:
    """Two requests arrive; they decode while a third arrives (a mixed extend); then the
    three decode (or verify) together, in the graph of four. Pages of one token."""
    w = num_spec + 1
    config = EngineConfig(max_model_len=16, max_num_seqs=4, max_num_batched_tokens=16,
                          block_size=1, num_spec=num_spec,
                          cudagraph_capture_sizes=(2 * w, 4 * w))  # fmt: skip
    return Trace(
        config,
        (
            scheduled((0, 0), (3, 2), (0, 1), ((1, 2, 3), (6, 7)), (3, 2)),
            scheduled(
                (3, 2, 0), (1, 1, 2), (0, 1, 2), ((1, 2, 3, 4), (6, 7, 8), (10, 11)), (1, 1, 2)
            ),  # fmt: skip
            scheduled(
                (4, 3, 2),
                (w, w, w),
                (0, 1, 2),
                ((1, 2, 3, 4, 5, 13), (6, 7, 8, 9, 14), (10, 11, 12, 15)),
                (w, w, w),
            ),  # fmt: skip
        ),
    )


@pytest.mark.parametrize("page, declined", [(1, False), (4, True), (16, True)])
def test_pages_sglang_never_runs_a_hybrid_gdn_model_with_are_declined(page, declined):
    from attnfuzz.adapters.sglang.runner_step_hybrid import declines

    trace = _arrive_mix_decode(num_spec=0)
    (case, *_) = Trace(dataclasses.replace(trace.config, block_size=page), trace.steps).cases()
    why = declines(case)
    assert (why is not None) == declined
    if declined:
        assert "validate_mamba_no_buffer" in why and f"page size {page}" in why


@BASE_METADATA
def test_a_mixed_extend_and_a_padded_decode_read_each_request_s_state_slot(module, prefix):
    first, mixed, step = _life(_arrive_mix_decode(num_spec=0), module=module)
    # The mixed extend (two decoding requests, one arriving) runs eagerly: each request's
    # tokens, and its state slot (HybridReqToTokenPool.alloc: one per request, 0 the dummy's).
    assert [b.how for b in mixed.builds] == ["eager", "fresh"]
    assert _values(mixed, "eager", f"{prefix}.query_start_loc") == [0, 1, 2, 4]
    slots = _values(mixed, "eager", f"{prefix}.mamba_cache_indices")
    assert sorted(slots) == [1, 2, 3]
    # A new engine's slots are its own: the fresh build holds the offsets only.
    (fresh,) = mixed.of("fresh")
    assert fresh.field(f"{prefix}.mamba_cache_indices") is None
    assert fresh.field(f"{prefix}.query_start_loc") is not None
    # The decode of three in the graph of four: the padding row's slot is PAD_SLOT_ID (its
    # state skipped), its query empty (_replay_metadata).
    assert [b.how for b in step.builds] == ["eager", "padded", "replay", "fresh"]
    assert _values(step, "eager", f"{prefix}.mamba_cache_indices") == slots
    for how in ("padded", "replay"):
        assert _values(step, how, f"{prefix}.mamba_cache_indices") == [*slots, -1], how
        assert _values(step, how, f"{prefix}.query_start_loc") == [0, 1, 2, 3, 3], how
    # Each capture's state slots: the dummy slot 0 of the capture's rows.
    state = f"{prefix}.mamba_cache_indices"
    captured = [b.field(state).values.tolist() for b in first.of("capture")]
    assert captured == [[0, 0, 0, 0], [0, 0]]
    assert all(ref.violations(out) == [] for out in (first, mixed, step))


@BASE_METADATA
def test_a_verify_reads_its_drafts_and_scratch_rows_in_the_graph_as_eagerly(module, prefix):
    *_, verify = _life(_arrive_mix_decode(num_spec=1), module=module)
    assert _values(verify, "eager", f"{prefix}.query_start_loc") == [0, 2, 4, 6]
    assert _values(verify, "replay", f"{prefix}.query_start_loc") == [0, 2, 4, 6, 6]
    # The speculative scratch rows (select_verify_intermediate_state_indices): positional.
    assert _values(verify, "replay", f"{prefix}.intermediate_state_indices") == [0, 1, 2, 3]
    assert _values(verify, "replay", f"{prefix}.mamba_cache_indices")[-1] == -1
    assert ref.violations(verify) == []


def test_the_mutant_fails_padding_invariance_and_replay_on_its_smallest_trace():
    """A verify of one committed token taken for padding: its state slot PAD_SLOT_ID and
    its query offsets empty, in the padded and replayed builds."""
    from attnfuzz.adapters.sglang import runner_step_hybrid as hybrid

    trace = hybrid.smallest_padding_by_fill()
    assert hybrid.declines(trace.cases()[0]) is None and hybrid.trigger_padding_by_fill(trace)
    *_, out = _life(trace, "run_padding_by_fill")
    found = {(v.prop, v.build, v.field) for v in ref.violations(out)}
    for prop, build in (("padding invariance", "padded"), ("replay equals eager", "replay")):
        for field in ("gdn.mamba_cache_indices", "gdn.query_start_loc"):
            assert (prop, build, field) in found
    *_, sound = _life(trace)
    assert ref.violations(sound) == []


# The derandomized search (the engine passing it, the mutant's smallest trace judged
# first) is test_entries.py's, over every implementation of runner-step: not repeated here.
