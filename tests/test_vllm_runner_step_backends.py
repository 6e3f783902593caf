"""vLLM 0.33.0's model runner V1 step on four attention backends side by side
(runner-step's ``vllm-v1-backends``): the keys each backend's kernels read, derived from
its own metadata, and the mutant that agreement across backends alone catches."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from attnfuzz.adapters.vllm.testing import requires_vllm, run_trace
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.batch import Batch
from attnfuzz.reference.trace import Trace

pytestmark = [*requires_vllm]


def _backends():
    from attnfuzz.adapters.vllm import runner_step_backends

    return runner_step_backends


def _hybrid():
    from attnfuzz.adapters.vllm import runner_step_hybrid

    return runner_step_hybrid


def _mla():
    from attnfuzz.adapters.vllm import runner_step_mla

    return runner_step_mla


def keys(build: ref.StepBuild) -> list[list[int]]:
    """Each row's KV slots as read (its first ``kv_len``)."""
    lengths = build.field("kv_len").values
    return [
        row[:n].tolist() for row, n in zip(build.field("kv_slots").values, lengths, strict=True)
    ]


def by_backend(out: ref.RunnerStepOutputs) -> dict[str, ref.StepBuild]:
    """The step's eager build by each backend, by the file of its builder."""
    builds = [b for b in out.builds if b.how in ("eager", "backend") and b.draft is None]
    return {b.where.split(".py")[0].rsplit("/", 1)[-1]: b for b in builds}


# -- the derivations -------------------------------------------------------------------------


def test_a_requests_slots_on_its_pages_stop_where_its_row_reaches():
    """Key ``j`` is in page ``j // block_size`` at ``j % block_size``; a length past the
    row's pages reads as far as the row reaches (its range is judged on the table)."""
    from attnfuzz.adapters.vllm.runner_step_v1 import page_slots

    assert page_slots(np.array([3, 5]), 6, 4).tolist() == [12, 13, 14, 15, 20, 21]
    assert page_slots(np.array([3, 5]), 7, 4, start=5).tolist() == [21, 22]
    assert page_slots(np.array([3, 5]), 9, 4).size == 8
    assert page_slots(np.array([3, 5]), -1, 4).size == 0


def test_a_decode_padded_for_a_full_graph_reads_the_same_keys_in_every_build():
    """A prefill of 3 tokens, then a decode padded to the FULL graph of 2 requests: the
    Triton engine's eager, padded, replayed and fresh builds, FlashAttention's,
    FlashInfer's, MLA's, AITER FlashAttention's and AITER MLA's eager builds all read
    keys 0..3 on page 1; the graph's padding row reads none."""
    rb = _backends()
    _, out = run_trace(_mla().smallest_full_decode(), rb.run)
    assert ref.violations(out) == []
    builds = by_backend(out)
    assert sorted(builds) == [
        "flash_attn", "flashinfer", "gpu_model_runner", "mla_attention", "rocm_aiter_fa",
        "rocm_aiter_mla",
    ]  # fmt: skip
    for name, b in builds.items():
        assert keys(b) == [[16, 17, 18, 19]], name
    (padded,) = [b for b in out.of("padded") if b.draft is None]
    (replay,) = out.of("replay")
    for b in (padded, replay, *[b for b in out.of("fresh") if b.draft is None]):
        assert b.field("kv_len").values[: b.num_reqs].tolist() == [4], b.name
    assert padded.field("kv_len").values.tolist() == [4, 0]  # the padding row: no key
    # A backend's build holds the fields every backend states alike, no others.
    for b in out.of("backend"):
        assert {f.name for f in b.fields} == set(rb.SHARED)


def test_flashmla_joins_at_pages_of_64_and_reads_the_same_keys():
    """At pages of 64 tokens FlashMLA (fp8 cache) is beside the others: the same prefill
    then decode padded to the FULL graph, every backend reads keys 0..3 of page 1."""
    rb = _backends()
    from attnfuzz.adapters.vllm import runner_step_flashmla

    _, out = run_trace(runner_step_flashmla.smallest_full_decode(), rb.run)
    assert ref.violations(out) == []
    builds = by_backend(out)
    assert sorted(builds) == [
        "flash_attn", "flashinfer", "flashmla", "gpu_model_runner", "mla_attention",
        "rocm_aiter_fa", "rocm_aiter_mla",
    ]  # fmt: skip
    for name, b in builds.items():
        assert keys(b) == [[64, 65, 66, 67]], name


def test_a_chunked_prefill_reads_its_cached_context_then_its_own_keys():
    """Request 0 chunks 12 more tokens of its prompt onto 5 cached ones (row 0) while
    request 1 decodes 2 (with one draft): MLA puts the decode first
    (``reorder_batch_to_split_decodes_and_prefills``), gathers request 0's context from
    the cache through the prefill block table and takes its 12 new keys from the
    forward, at the slots the slot mapping writes them to (AITER FlashAttention alike, as
    an extend: ``cp_mha_gather_cache``); Triton, FlashAttention and FlashInfer (its
    paged KV indices) read all 17 through the block table. In the Triton engine's rows,
    all agree."""
    rb = _backends()
    config = _hybrid().smallest_full_spec_decode().config
    steps = (
        Batch((0, 0), (5, 3), req_ids=(0, 1), pages=((2,), (1,)), new_pages=(1, 1)),
        Batch((5, 3), (12, 2), req_ids=(0, 1), pages=((2, 3), (1,)), new_pages=(1, 0)),
    )
    _, out = run_trace(Trace(config, steps), rb.run)
    assert ref.violations(out) == []
    triton = rb.ENGINES.triton.eager
    (mla_engine,) = [o.engine for o in rb.ENGINES.others if o.where == rb._MLA_WHERE]
    assert triton.runner.input_batch.req_ids == ["0", "1"]
    assert mla_engine.runner.input_batch.req_ids == ["1", "0"]  # decodes first
    prefill = [*range(32, 48), 48]  # page 2, then page 3's first key
    for name, b in by_backend(out).items():
        assert b.field("kv_len").values.tolist() == [17, 5], name
        assert keys(b) == [prefill, [16, 17, 18, 19, 20]], name
    (mla_build,) = [b for b in out.of("backend") if b.where == rb._MLA_WHERE]
    # The new keys' slots are the slot mapping's, in the Triton engine's token order.
    assert mla_build.field("slot_mapping").values[:12].tolist() == list(range(37, 49))


def test_a_speculative_step_and_its_drafts_read_their_keys():
    """With one draft, a 2-token verify padded to the FULL graph of 2 requests: every
    backend reads 7 keys; the drafter's sub-steps state their keys too."""
    rb = _backends()
    _, out = run_trace(_hybrid().smallest_full_spec_decode(), rb.run)
    assert ref.violations(out) == []
    for name, b in by_backend(out).items():
        assert keys(b) == [list(range(16, 23))], name
    drafts = [b for b in out.of("eager") if b.draft is not None]
    assert drafts and all(b.field("kv_len") is not None for b in drafts)


# -- the mutant ------------------------------------------------------------------------------


def test_a_flash_attn_kv_one_key_short_fails_agreement_across_backends_alone():
    """The defect in every build FlashAttention makes (capture, eager, padded, replay,
    drafting, a new engine's): alone its builds agree and stay in range, graphs too;
    beside Triton's, its KV length and slots are one key short."""
    from attnfuzz.harness.targets.runner_step import OwnCheck, compare

    rb = _backends()
    for trace in (_mla().smallest_full_decode(), _hybrid().smallest_full_spec_decode()):
        alone = run_trace(trace, rb.FLASH_ATTN_KV_SHORT)
        assert any(out.of("replay") for out in alone)
        assert all(ref.violations(out) == [] for out in alone)
        short = [b for out in alone for b in out.of("eager") if b.draft is None]
        assert short[-1].field("fa.seq_lens").values.tolist() == [
            3 if trace.config.num_spec == 0 else 6
        ]
    trace = rb.smallest_flash_attn_kv_short()
    assert rb.reach_flash_attn(trace)
    assert all(ref.violations(out) == [] for out in run_trace(trace, rb.run))
    (out,) = run_trace(trace, rb.run_flash_attn_kv_short)
    found = {(v.prop, v.build, v.field) for v in ref.violations(out)}
    assert found == {
        ("agreement across backends", "backend", "kv_len"),
        ("agreement across backends", "backend", "kv_slots"),
    }
    case = trace.cases()[-1]
    inputs = ref.make_inputs(case)
    mismatches = compare(case, inputs, ref.reference(case, inputs), out)
    assert {m.check for m in mismatches} == {OwnCheck.AGREEMENT}
    assert "0 where eager has 1" in str(mismatches[0])  # its own key, not counted


# -- declines --------------------------------------------------------------------------------


def test_a_backend_that_declines_a_config_is_left_out_the_others_kept():
    rb = _backends()
    from attnfuzz.adapters.vllm import runner_step_flash_attn as fa
    from attnfuzz.adapters.vllm import runner_step_v1 as v1

    declined = rb.BackendsLife(
        v1.RunnerStepEngine(),
        rb.EagerBackend(fa.FlashAttnRunnerStepEngine(), lambda case: "declined", "fa"),
        rb.EagerBackend(_mla().MLARunnerStepEngine(), _mla().declines_config, "mla"),
    )
    (out,) = run_trace(rb.smallest_flash_attn_kv_short(), declined)
    assert [b.where for b in out.of("backend")] == ["mla"]
    assert ref.violations(out) == []


@pytest.mark.parametrize(("block_size", "declined"), [(8, True), (24, True), (32, False)])
def test_each_backend_declines_the_block_sizes_the_triton_backend_does(block_size, declined):
    """On vLLM 0.33.0 the three backends' kernel block sizes are all multiples of 16: a
    config ``vllm-v1`` runs, every backend runs too."""
    from attnfuzz.adapters.vllm import runner_step_flash_attn as fa

    rb = _backends()
    smallest = rb.smallest_flash_attn_kv_short()
    config = dataclasses.replace(smallest.config, block_size=block_size)
    case = next(iter(Trace(config, smallest.steps).cases()))
    for declines in (rb.declines, fa.declines, _mla().declines):
        assert (declines(case) is not None) == declined
