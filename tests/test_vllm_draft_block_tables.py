"""Target ``draft-block-tables`` on vLLM's own drafter: passes where the installed release
has the fix of #43982 (0.23.0 on) and finds the bug where it has not (0.21.0 to 0.22.1),
#43982 reverted is caught, and the tables are as wide as vLLM's (the fidelity change)."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import inspect
import re

import pytest
import torch
from attnfuzz.adapters.vllm.testing import requires_vllm
from attnfuzz.harness.registry import get_target
from attnfuzz.harness.testing import assert_detected, assert_passes, hand_case
from attnfuzz.reference import draft_block_tables as ref
from attnfuzz.reference.batch import Case, build_common_metadata, cdiv

pytestmark = requires_vllm

TARGET = "draft-block-tables"
UPSTREAM = "upstream-pr43982-padded-table"
RECREATED = "pr43982-padded-table"


def _code_lines(fn) -> list[str]:
    """A function's statements: no docstring, comments or blank lines, stripped."""
    source = inspect.getsource(fn)
    source = re.sub(r'"""(.|\n)*?"""', "", source, count=1)
    lines = [re.sub(r"\s*#.*$", "", line).strip() for line in source.splitlines()]
    return [line for line in lines if line]


FIXED_LINE = "cm.block_table_tensor = self._per_group_block_tables[gid][:batch_size]"


@functools.cache
def vllm_has_fix() -> bool:
    """Whether the installed release's method has the fix of #43982 (first in 0.23.0): read
    from its statements, not from its version number."""
    # Through the adapter: it configures vLLM's environment before importing it.
    from attnfuzz.adapters.vllm import draft_block_tables as adapter

    method = adapter.Gemma4Proposer.build_per_group_and_layer_attn_metadata
    return FIXED_LINE in _code_lines(method)


def judge(impl: str, case: Case):
    target = get_target(TARGET)
    return target.judge(target.resolve(impl), case)


def smallest() -> Case:
    smallest = get_target(TARGET).implementations[UPSTREAM].smallest
    assert smallest is not None
    return smallest()


def with_params(case: Case, sliding_window: int, swa_block_size_log2: int) -> Case:
    params = {"sliding_window": sliding_window, "swa_block_size_log2": swa_block_size_log2}
    return dataclasses.replace(case, params=tuple(sorted(params.items())))


def test_vllm_passes_200_examples_where_fixed_and_fails_them_before():
    # 200 (the generic test's run where fixed): the first examples of a search are its
    # simplest (uniform decodes, padded in most drawn modes); mixed steps come a little later.
    if vllm_has_fix():
        result = assert_passes(TARGET, "vllm", max_examples=200)
        assert result.labels["padding_requests"] > 0 and result.labels["mixed"] > 0
        return
    # Before #43982 (0.21.0 to 0.22.1): the real bug, on a step with padding requests.
    result = assert_detected(TARGET, "vllm", max_examples=200)
    assert get_target(TARGET).implementations[UPSTREAM].trigger(result.case)
    assert "batch_size must be equal to batch_size_k" in result.verdict.mismatches[0].got


def test_upstream_mutant_is_found_on_a_padded_step_as_flash_attention_refuses_it():
    result = assert_detected(TARGET, UPSTREAM)  # the generic test's run
    meta = build_common_metadata(result.case.config, result.case.batch)
    assert meta.padded and meta.num_reqs > meta.num_real_reqs
    # the production symptom: FlashAttention refuses cu_seqlens_q for R against a table of R_pad
    assert "batch_size must be equal to batch_size_k" in result.verdict.mismatches[0].got
    assert result.case.batch.num_reqs <= smallest().batch.num_reqs


def test_smallest_trigger_passes_vllm_and_fails_the_upstream_mutant():
    case = smallest()
    verdict = judge(UPSTREAM, case)
    assert verdict.key == "exception:RuntimeError"
    assert "batch_size 3; block_table has 4 rows" in verdict.mismatches[0].got
    engine = judge("vllm", case)
    if vllm_has_fix():
        assert engine.ok
    else:  # before #43982 vLLM's method is the mutant's, line for line: the same failure
        assert (engine.key, engine.mismatches[0].got) == (verdict.key, verdict.mismatches[0].got)


@pytest.mark.parametrize(
    "q_lens, computed, use_cudagraph",
    [
        ((2, 2, 2, 2), (1, 2, 3, 4), True),  # 8 tokens: a capture size, R_pad == R
        ((2, 2, 2), (1, 2, 3), False),  # eager: never padded
        ((1, 2, 7), (4, 4, 0), True),  # ragged and mixed: graphs do not pad requests
    ],
)
def test_unpadded_steps_pass_both(q_lens, computed, use_cudagraph):
    """Without padding requests the stored tables have R rows: the revert changes nothing."""
    case = with_params(hand_case(q_lens, computed, use_cudagraph), 4, 1)
    assert judge("vllm", case).ok and judge(UPSTREAM, case).ok


@pytest.mark.parametrize("use_cudagraph", [True, False])
def test_sliding_window_with_freed_pages_passes(use_cudagraph):
    """Window 2 on pages of 1: requests 9 and 13 tokens long had their early pages freed
    to the null page (NaN): vLLM's metadata reaches only the pages the window sees.
    In a graph the step is padded to 4 requests: a release before #43982 fails there."""
    case = with_params(hand_case((2, 2, 2), (7, 11, 0), use_cudagraph), 2, 0)
    inputs = ref.make_inputs(case)
    assert (inputs.groups[1].block_table[:2, :5] == ref.NULL_PAGE).all()
    assert judge("vllm", case).ok is (vllm_has_fix() or not use_cudagraph)
    assert judge(UPSTREAM, case).ok is (not use_cudagraph)


def test_vllm_hands_views_of_its_persistent_tables_and_of_the_step_metadata():
    """What the method hands each group's builder: row-slices [:R] (views, no copies) of
    the runner's persistent per-group tables (before #43982: the stored [:R_pad]), and
    the step's own query_start_loc[:R + 1] and seq_lens[:R] (CommonAttentionMetadata.unpadded)."""
    from attnfuzz.adapters.vllm import draft_block_tables as adapter

    case = smallest()
    inputs = ref.make_inputs(case)
    per_group = adapter._propose(inputs, adapter.Gemma4Proposer)
    drafter = adapter._drafter(
        adapter.Gemma4Proposer,
        case.config,
        tuple((g.block_size, g.sliding_window) for g in inputs.groups),
        case.config.num_heads,
        case.config.head_dim,
        "cpu",
    )
    R = inputs.num_real_reqs
    rows = R if vllm_has_fix() else inputs.num_reqs
    for m, table, group in zip(
        per_group, drafter.block_tables.block_tables, inputs.groups, strict=True
    ):
        persistent = table.block_table.gpu
        assert m.block_table.data_ptr() == persistent.data_ptr()
        assert m.block_table.shape == (rows, persistent.shape[1])
        assert torch.equal(m.block_table, group.block_table[:rows])
        assert m.query_start_loc.data_ptr() == inputs.query_start_loc.data_ptr()
        assert m.query_start_loc.shape == (R + 1,) and m.seq_lens.shape == (R,)


def test_tables_are_as_wide_as_vllms_and_the_old_width_was_wrong():
    """Fidelity: vLLM's MultiGroupBlockTable (every release from 0.21.0) rounds each
    group's pages per request up to 128-token spans, and the drafter hands on whole rows.
    The example engine (max_model_len 64) has 16 pages of 4 and 64 pages of 1 per
    request, but tables 32 and 128 wide. The old reference, cdiv(max_model_len,
    block_size) columns, failed vLLM's correct output on shape; the re-created and
    upstream mutants are still caught."""
    from attnfuzz.adapters.vllm import draft_block_tables as adapter

    case = smallest()
    target = get_target(TARGET)
    inputs = target.make_inputs(case, torch.device("cpu"))
    expected = target.reference(case, inputs)
    per_group = adapter._propose(inputs, adapter.Gemma4Proposer)
    assert [m.block_table.shape[1] for m in per_group] == [32, 128]
    for mutant in (RECREATED, UPSTREAM):
        assert not target.judge(target.resolve(mutant), case).ok, mutant
    if not vllm_has_fix():  # 4 rows, not 3: the bug, judged by the tests above
        return
    got = adapter.run(inputs)
    assert [tuple(m.block_table.shape) for m in got.metadata] == [(3, 32), (3, 128)]
    assert target.compare(case, inputs, expected, got) == []

    # The old reference: the same rows, cdiv(max_model_len, block_size) columns.
    old = [
        dataclasses.replace(g, block_table=g.block_table[:, : cdiv(64, bs)])
        for g, bs in zip(expected.groups, (4, 1), strict=True)
    ]
    old_expected = dataclasses.replace(expected, groups=old)
    mismatches = target.compare(case, inputs, old_expected, got)
    assert [(m.check, m.where, m.expected, m.got) for m in mismatches] == [
        ("shape", "group0.block_table", "[3, 16]", "[3, 32]"),
        ("shape", "group1.block_table", "[3, 64]", "[3, 128]"),
    ]


def test_tables_are_sized_as_the_releases_runner_sizes_them():
    """Each group's pages per request, before MultiGroupBlockTable aligns them, as the
    installed release's runner computes them (GPUModelRunner.may_reinitialize_input_batch):
    from 0.26.0 KVCacheSpec.max_num_blocks_per_req; before it the runner's
    cdiv(max_model_len, block_size * get_total_cp_world_size()), which that release's
    MultiGroupBlockTable also computes itself when handed max_num_blocks=None."""
    from attnfuzz.adapters.vllm import compat
    from attnfuzz.adapters.vllm import draft_block_tables as adapter
    from vllm.config import set_current_vllm_config
    from vllm.v1.worker.block_table import MultiGroupBlockTable

    case = smallest()
    inputs = ref.make_inputs(case)
    drafter = adapter._drafter(
        adapter.Gemma4Proposer,
        case.config,
        tuple((g.block_size, g.sliding_window) for g in inputs.groups),
        case.config.num_heads,
        case.config.head_dim,
        "cpu",
    )
    specs = [g.kv_cache_spec for g in drafter.proposer.draft_attn_groups]
    widths = [t.max_num_blocks_per_req for t in drafter.block_tables.block_tables]
    assert widths == [32, 128]
    with set_current_vllm_config(drafter.vllm_config):
        kwargs = adapter._table_kwargs(case.config, specs, drafter.vllm_config)
        assert kwargs["max_num_blocks"] == [16, 64]  # max_model_len 64: pages of 4 and of 1
        if compat.has(compat.MAX_BLOCKS_PER_REQ):
            mine = [s.max_num_blocks_per_req(drafter.vllm_config, 64) for s in specs]
            assert kwargs["max_num_blocks"] == mine
        if compat.has(compat.TABLE_MAX_MODEL_LEN):  # 0.21.0 to 0.25.1
            own = MultiGroupBlockTable(
                device=torch.device("cpu"), **(kwargs | {"max_num_blocks": None})
            )
            assert [t.max_num_blocks_per_req for t in own.block_tables] == widths
    # Where the table takes kernel block sizes (0.21.0 to 0.31.0), a group is not split.
    assert kwargs.get("kernel_block_sizes", [4, 1]) == [4, 1]


def test_upstream_mutant_differs_from_vllm_only_in_the_lines_of_43982():
    from attnfuzz.adapters.vllm import draft_block_tables as adapter
    from vllm.v1.spec_decode.gemma4 import Gemma4Proposer

    fixed = _code_lines(Gemma4Proposer.build_per_group_and_layer_attn_metadata)
    reverted = _code_lines(
        adapter.Gemma4ProposerBefore43982.build_per_group_and_layer_attn_metadata
    )
    diff = [
        line
        for line in difflib.unified_diff(fixed, reverted, lineterm="", n=0)
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]
    if not vllm_has_fix():  # 0.21.0 to 0.22.1: the mutant is the release's own method
        assert diff == []
        return
    assert diff == [
        "-batch_size = common_attn_metadata.batch_size()",
        f"-{FIXED_LINE}",
        "+cm.block_table_tensor = self._per_group_block_tables[gid]",
    ]


@pytest.mark.parametrize(
    "q_lens, computed, window, swa_log2",
    [
        ((2, 2, 2), (7, 11, 0), 2, 0),  # window 2 on pages of 1: leading pages freed (NaN)
        ((1, 2, 9), (30, 41, 3), 7, 3),  # ragged and mixed, window 7 on pages of 8
    ],
)
def test_vllms_triton_attention_on_vllms_metadata_agrees_with_the_reference(
    q_lens, computed, window, swa_log2
):
    """The stand-in consumer's contract checked against vLLM's own: ``unified_attention``
    (``vllm/v1/attention/ops/triton_unified_attention.py``), called as
    ``TritonAttentionImpl.forward`` calls it (window ``(sliding_window - 1, 0)``), on the
    metadata vLLM's drafter built, computes the reference's output, and reads no null
    page (NaN) freed before a window. Too slow interpreted to run per fuzz example."""
    from attnfuzz.adapters.vllm import draft_block_tables as adapter
    from vllm.v1.attention.ops.triton_unified_attention import unified_attention

    case = with_params(hand_case(q_lens, computed), window, swa_log2)
    target = get_target(TARGET)
    inputs = target.make_inputs(case, torch.device("cpu"))
    expected = target.reference(case, inputs)
    per_group = adapter._propose(inputs, adapter.Gemma4Proposer)
    for m, group, want in zip(per_group, inputs.groups, expected.groups, strict=True):
        q = inputs.q[: m.num_actual_tokens]
        out = torch.zeros_like(q)
        window_size = (-1, -1) if group.sliding_window is None else (group.sliding_window - 1, 0)
        descale = torch.ones(m.query_start_loc.shape[0] - 1, q.shape[1])
        unified_attention(
            q=q,
            k=group.key_cache,
            v=group.value_cache,
            out=out,
            cu_seqlens_q=m.query_start_loc,
            max_seqlen_q=m.max_query_len,
            seqused_k=m.seq_lens,
            max_seqlen_k=m.max_seq_len,
            softmax_scale=inputs.softmax_scale,
            causal=True,
            window_size=window_size,
            block_table=m.block_table,
            softcap=0,
            q_descale=None,
            k_descale=descale,
            v_descale=descale,
            seq_threshold_3D=m.seq_threshold_3D,
            num_par_softmax_segments=m.num_par_softmax_segments,
            softmax_segm_output=m.softmax_segm_output,
            softmax_segm_max=m.softmax_segm_max,
            softmax_segm_expsum=m.softmax_segm_expsum,
        )
        assert out.isfinite().all()
        torch.testing.assert_close(out, torch.as_tensor(want.out))


def test_vllm_s_drafter_is_given_only_steps_with_speculative_tokens():
    """vLLM refuses a speculative config without a token
    (``SpeculativeConfig._verify_args``), so no drafter sees a step of ``num_spec = 0``:
    both vLLM implementations say so (``Implementation.admits``), and their searches
    draw only steps with drafts, as do the witnesses they shrink to."""
    from attnfuzz.adapters.vllm.limits import drafter_admits
    from hypothesis import given, settings

    target = get_target(TARGET)
    case = target.implementations[UPSTREAM].smallest()
    inputs = target.make_inputs(case, torch.device("cpu"))
    assert drafter_admits(inputs) is None  # next_n = 2
    alone = dataclasses.replace(case, config=dataclasses.replace(case.config, num_spec=0))
    assert "num_speculative_tokens > 0" in drafter_admits(target.make_inputs(alone, "cpu"))
    for name in ("vllm", UPSTREAM):
        impl = target.implementations[name]
        assert target.unreachable(impl, alone) is not None, name

        @settings(max_examples=30, derandomize=True, database=None, deadline=None)
        @given(target.cases(impl=impl))
        def drawn(case: Case) -> None:
            assert case.config.num_spec >= 1, case

        drawn()
