"""SGLang's decode graph runner step on the FlashAttention 3 backend under EAGLE's tree
draft (runner-step's ``sglang-fa3-tree``): the tree verify's expanded metadata, eager,
padded and replayed, and its mutant."""

from __future__ import annotations

import dataclasses

from attnfuzz.adapters.sglang.runner_step import arrive_then_step
from attnfuzz.adapters.sglang.testing import arrive_then_decode as _arrive_then_decode
from attnfuzz.adapters.sglang.testing import field_values as _values
from attnfuzz.adapters.sglang.testing import life
from attnfuzz.adapters.sglang.testing import sglang_test as _sglang
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.batch import Case
from attnfuzz.reference.trace import Trace

# -- the tree (no SGLang) ----------------------------------------------------------------------


def _tree():
    from attnfuzz.adapters.sglang import runner_step_fa3_tree

    return runner_step_fa3_tree


def test_the_tree_is_k_ary_in_breadth_order_each_token_seeing_its_ancestors():
    tree = _tree()
    assert tree.tree_parents(6, 2) == [-1, 0, 0, 1, 1, 2]
    assert tree.tree_depths(6, 2) == [0, 1, 1, 2, 2, 2]
    seen = tree.tree_rows(4, 2)
    # Token 2 is the root's second child: it sees the root and itself, not token 1.
    assert seen.astype(int).tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]]


def test_a_chain_or_no_draft_is_declined():
    tree = _tree()
    config = tree.smallest_mask_unsorted().config
    assert tree.declines(Case(config, ())) is None
    assert "chain" in tree.declines(Case(dataclasses.replace(config, topk=1), ()))
    assert "num_spec 0" in tree.declines(Case(dataclasses.replace(config, num_spec=0), ()))


# -- the engine's step -----------------------------------------------------------------------


@_sglang
def test_a_tree_verify_of_three_requests_replays_the_graph_of_five():
    tree = _tree()
    trace = _arrive_then_decode(num_spec=2)
    trace = Trace(dataclasses.replace(trace.config, topk=2), trace.steps)
    first, verify = life(tree.run, trace)
    assert ref.violations(first) == [] and ref.violations(verify) == []
    assert [b.how for b in verify.builds] == ["eager", "padded", "replay", "fresh"]
    # The prefix's metadata: the committed prefix alone (the drafts are the expand's).
    assert _values(verify, "eager", "cache_seqlens_int32") == [5, 3, 1]
    # Each token's positions: the prefix and its depth in the tree (0, 1, 1).
    assert _values(verify, "eager", "positions") == [5, 6, 6, 3, 4, 4, 1, 2, 2]
    for how in ("eager", "padded", "replay"):
        lens = _values(verify, how, "expand.cache_seqlens_int32")
        table = _values(verify, how, "expand.page_table")
        # Request 0's drafts in slots 9, 10, 11 (page 2 of 4 tokens, from token 5):
        # the root reads itself, token 1 the root and itself, token 2 the root and
        # itself, its sibling sorted behind the row's reach.
        assert lens[:3] == [1, 2, 2], how
        assert table[:3] == [[9, 10, 11], [9, 10, 11], [9, 11, 10]], how
        assert _values(verify, how, "kv_len")[:3] == [8, 6, 4], how
    # The padding requests (fill length 1, the reserved row 0): their mask indices
    # zeroed, each token reads the padding slot 0, all N of its columns.
    assert _values(verify, "replay", "expand.cache_seqlens_int32")[9:] == [3] * 6
    assert _values(verify, "replay", "expand.page_table")[9:] == [[0, 0, 0]] * 6
    assert _values(verify, "replay", "expand.cu_seqlens_q") == list(range(16))


@_sglang
def test_the_mutant_fails_its_properties_on_its_smallest_trace():
    """The correct engine holds every property on the trace; the mutant's replay reads a
    sibling's key: its expanded page table differs from the eager one."""
    tree = _tree()
    trace = tree.smallest_mask_unsorted()
    assert tree.trigger_mask_unsorted(trace)
    assert all(ref.violations(out) == [] for out in life(tree.run, trace))
    *_, out = life(tree.run_mask_unsorted, trace)
    found = {(v.prop, v.build, v.field) for v in ref.violations(out)}
    assert {
        ("padding invariance", "padded", "expand.page_table"),
        ("replay equals eager", "replay", "expand.page_table"),
    } <= found


def test_where_the_mutant_reaches():
    tree = _tree()
    trace = tree.smallest_mask_unsorted()
    assert tree.reach_tree_verify_replay(trace) and tree.trigger_mask_unsorted(trace)
    # A verify of two tokens: token 1 sees the root and itself, sorted or not.
    two = arrive_then_step(dataclasses.replace(trace.config, num_spec=1), 1)
    assert tree.reach_tree_verify_replay(two) and not tree.trigger_mask_unsorted(two)
    chain = Trace(dataclasses.replace(trace.config, topk=1), trace.steps)
    assert not tree.reach_tree_verify_replay(chain)


# -- a sliding-window model ---------------------------------------------------------------------


def test_the_sliding_window_tree_verify_declines_pages_past_one_token():
    tree = _tree()
    config = tree.smallest_mask_unsorted().config
    assert tree.declines_swa(Case(config, ())) is None
    why = tree.declines_swa(Case(dataclasses.replace(config, block_size=4), ()))
    assert "page_size == 1" in why
    assert "chain" in tree.declines_swa(Case(dataclasses.replace(config, topk=1), ()))


def _swa_verify() -> list[ref.RunnerStepOutputs]:
    """One request of 5 tokens, then its verify of a tree of three (the root, two
    children) in the graph of two requests (a padding one), on pages of one token."""
    from attnfuzz.reference.batch import EngineConfig

    config = EngineConfig(
        max_model_len=16, max_num_seqs=2, max_num_batched_tokens=16, block_size=1, num_spec=2,
        topk=2, cudagraph_capture_sizes=(6,),
    )  # fmt: skip
    return life(_tree().run_swa, arrive_then_step(config, 5))


@_sglang
def test_a_sliding_window_tree_verify_merges_each_token_s_keys_in_every_build():
    """Each draft token's window keys (``swa_spec_metadata``) are its request's prefix
    then its tree path's, eager, padded and replayed: the cascade's keys."""
    first, verify = _swa_verify()
    assert ref.violations(first) == [] and ref.violations(verify) == []
    for how in ("eager", "padded", "replay"):
        lens = _values(verify, how, "swa.cache_seqlens_int32")
        # Request 0: 5 committed, then the root (1 key), each child 2 (root and itself).
        assert lens[:3] == [6, 7, 7], how
        assert lens == _values(verify, how, "swa.cascade_len"), how
        assert _values(verify, how, "swa.page_table") == _values(verify, how, "swa.cascade_slots")


@_sglang
def test_a_window_merge_that_drops_the_tree_fails_agreement_within_the_build(monkeypatch):
    """A merge that keeps the prefix alone (the expanded keys forgotten) hands the window
    layers too few keys: ``swa.cache_seqlens_int32`` and ``swa.page_table`` disagree with
    the cascade's in every build."""
    from sglang.srt.layers.attention import flashattention_backend as fab

    real = fab.prepare_swa_spec_page_table_triton

    def prefix_only(dst, a, b, len_a, len_b, n):
        return real(dst, a, b, len_a, len_b.clone().zero_(), n)

    monkeypatch.setattr(fab, "prepare_swa_spec_page_table_triton", prefix_only)
    _, verify = _swa_verify()
    found = {(v.prop, v.build, v.field) for v in ref.violations(verify)}
    for how in ("eager", "replay"):
        assert ("agreement within a build", how, "swa.page_table") in found, found
