"""SGLang's decode graph runner step on its three attention backends side by side
(runner-step's ``sglang-backends``): what every backend derives alike from its own
metadata, and the mutant that agreement across backends alone catches."""

from __future__ import annotations

import numpy as np
import pytest
from attnfuzz.adapters.sglang.runner_step import page_slots, with_step_keys
from attnfuzz.adapters.sglang.testing import arrive_then_decode, life
from attnfuzz.adapters.sglang.testing import sglang_test as _sglang
from attnfuzz.harness.targets.runner_step import OwnCheck, compare
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.trace import Trace

# -- the derivations, without SGLang ---------------------------------------------------------------


def test_a_requests_slots_on_its_pages_stop_where_its_row_reaches():
    """Key ``j`` is in page ``j // page_size`` at ``j % page_size``; a length past the
    row's pages reads as far as the row reaches (its range is judged on the table)."""
    assert page_slots(np.array([3, 5]), 6, 4).tolist() == [12, 13, 14, 15, 20, 21]
    assert page_slots(np.array([3, 5]), 9, 4).size == 8
    assert page_slots(np.array([3, 5]), -1, 4).size == 0


def test_the_steps_own_keys_follow_the_cached_ones_at_their_written_slots():
    lengths, slots = with_step_keys(
        np.array([2, 0]),
        [np.array([7, 8]), np.array([], dtype=np.int64)],
        qo_indptr=np.array([0, 1, 3]),
        out_cache_loc=np.array([9, 20, 21]),
    )
    assert lengths.tolist() == [3, 2]
    assert [s.tolist() for s in slots] == [[7, 8, 9], [20, 21]]


# -- the engines ---------------------------------------------------------------------------------


def _backends():
    from attnfuzz.adapters.sglang import runner_step_backends

    return runner_step_backends


def _by_backend(out: ref.RunnerStepOutputs) -> dict[str, ref.StepBuild]:
    """The step's eager build by each backend, by the file of its function (and its
    model's attention where the file serves two)."""
    builds = [b for b in out.builds if b.how in ("eager", "backend")]
    return {b.where.split(".py")[0] + (" (MLA)" if "MLA model" in b.where else ""): b
            for b in builds}  # fmt: skip


@_sglang
@pytest.mark.parametrize("num_spec", [0, 1])
def test_every_backend_reads_the_same_keys_at_the_same_slots(num_spec):
    """Three requests arrive (an extend: Triton, FlashInfer and FlashInfer MLA read the
    step's own keys from the forward, FA3 and AITER from the cache, AITER MLA from the
    forward where no request has a prefix), then decode or verify their next_n tokens
    (Triton's and AITER's verify offsets hold the prefix alone, FlashInfer's, FlashInfer
    MLA's and AITER MLA's the window too): each backend's fields differ, the keys they
    read do not."""
    rb = _backends()
    w = 1 + num_spec
    arrival, step = life(rb.run, arrive_then_decode(num_spec))
    for out, lengths in ((arrival, [5, 3, 1]), (step, [5 + w, 3 + w, 1 + w])):
        builds = _by_backend(out)
        assert sorted(builds) == [
            "aiter_backend", "aiter_backend (MLA)", "flashattention_backend",
            "flashinfer_backend", "flashinfer_mla_backend", "triton_backend",
        ]  # fmt: skip
        for name, b in builds.items():
            assert b.field("kv_len").values.tolist() == lengths, name
            # Pages of 4 tokens: request 0 on pages 1 and 2, request 2 on page 5.
            slots = b.field("kv_slots").values
            assert slots[0, : lengths[0]].tolist() == list(range(4, 4 + lengths[0])), name
            assert slots[2, : lengths[2]].tolist() == list(range(20, 20 + lengths[2])), name
        assert ref.violations(out) == []
    # Another backend's build holds the fields every backend states alike, no others.
    for b in step.of("backend"):
        assert {f.name for f in b.fields} <= set(rb.SHARED)
    assert {"kv_len", "kv_slots"} <= {f.name for b in step.builds for f in b.fields}


@_sglang
def test_a_flashinfer_decode_one_key_short_fails_agreement_across_backends_alone():
    """The defect in every build FlashInfer makes (eager, capture, replay, a new
    engine's): its own builds agree and stay in range; beside Triton's, its KV length
    and its slots are one key short."""
    rb = _backends()
    trace = rb.smallest_flashinfer_decode_kv_short()
    assert rb.reach_decode(trace) and not rb.reach_decode(Trace(trace.config, trace.steps[:1]))
    alone = life(rb.FLASHINFER_KV_SHORT, trace)
    assert [b.how for b in alone[-1].builds] == ["eager", "padded", "replay", "fresh"]
    assert all(ref.violations(out) == [] for out in alone)
    assert all(ref.violations(out) == [] for out in life(rb.run, trace))
    arrival, decode = life(rb.run_flashinfer_decode_kv_short, trace)
    assert ref.violations(arrival) == []  # an extend: FlashInfer's prefill updater
    found = {(v.prop, v.build, v.field) for v in ref.violations(decode)}
    assert found == {
        ("agreement across backends", "backend", "kv_len"),
        ("agreement across backends", "backend", "kv_slots"),
    }
    inputs = ref.make_inputs(trace.cases()[-1])
    expected = ref.reference(trace.cases()[-1], inputs)
    mismatches = compare(trace.cases()[-1], inputs, expected, decode)
    assert {m.check for m in mismatches} == {OwnCheck.AGREEMENT}
    assert "1 where eager has 2" in str(mismatches[0])  # its decode's key, not counted
