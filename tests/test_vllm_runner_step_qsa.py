"""vLLM 0.33.0's model runner V1 step of a model with a QSA indexer (``vllm-v1-qsa``):
``QSAMetadataBuilder`` of the raw key ring and of the compressed keys builds every step
and capture, read by ``QSAIndexer._metadata`` as the indexer's forward reads it."""

from __future__ import annotations

import copy
import dataclasses

import pytest
from attnfuzz.adapters.vllm.testing import Calls, own, requires_vllm, run_trace, values
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.trace import Trace

pytestmark = [*requires_vllm]


def qsa():
    from attnfuzz.adapters.vllm import runner_step_qsa

    return runner_step_qsa


def spec_decode() -> Trace:
    """``smallest_full_spec_decode``: a prefill of 5 tokens on page 1 (pages of 16), then
    a verify of 2 padded to the FULL graph of 2 requests."""
    from attnfuzz.adapters.vllm import runner_step_hybrid

    return runner_step_hybrid.smallest_full_spec_decode()


def test_both_qsa_builders_build_every_step_and_capture(monkeypatch):
    """Each side cache's builder builds the prefill, the verify (eager, padded, replayed)
    and the capture runs, through the Triton kernel; every property holds. The prefill
    stores each key in the request's ring (block 1, 8 rows) and its first group's state
    at position 3 (page 1, 4 states a page); the verify's padding tokens store nothing."""
    m = qsa()
    m.prepare()
    from vllm.models.qwen4_exp.common import qsa_cache
    from vllm.models.qwen4_exp.common.qsa_cache import QSAMetadataBuilder

    calls = Calls(monkeypatch)
    calls.count(QSAMetadataBuilder, "build")
    calls.count(qsa_cache, "build_qsa_metadata_triton", "_build_qsa_metadata_torch")
    engine = m.QSARunnerStepEngine()
    first, second = run_trace(spec_decode(), engine)
    builders = [g[0].get_metadata_builder() for g in engine.graphs.runner.attn_groups[1:]]
    assert [type(b) for b in builders] == [QSAMetadataBuilder, QSAMetadataBuilder]
    assert [b.is_circular_buffer for b in builders] == [True, False]
    assert calls["build"] > 0
    # The Triton kernel builds every QSA metadata, as on a GPU; the torch path none.
    assert calls["build_qsa_metadata_triton"] > 0 and calls["_build_qsa_metadata_torch"] == 0
    assert ref.violations(first) == [] and ref.violations(second) == []
    (prefill,) = own(first, "eager")
    assert values(prefill, "qsa.raw.slot_mapping") == [8, 9, 10, 11, 12]
    assert values(prefill, "qsa.cmp.slot_mapping") == [-1, -1, -1, 4, -1]
    assert values(prefill, "qsa.cmp.visible_blocks") == [0, 0, 0, 1, 1]
    (replay,) = own(second, "replay")
    assert values(replay, "qsa.raw.logical_positions") == [5, 6, -1, -1]
    assert values(replay, "qsa.raw.slot_mapping") == [13, 14, -1, -1]


def test_pages_the_ring_does_not_divide_are_declined():
    """The ring of 4 + 5 drafts is 12 rows, which pages of 16 do not hold whole."""
    m = qsa()
    config = spec_decode().config
    assert m.ring_rows(dataclasses.replace(config, num_spec=5)) == 12
    assert "12 rows" in m.declines_config(dataclasses.replace(config, num_spec=5))
    assert m.declines_config(config) is None


def test_a_ring_slot_mapping_made_anew_each_build_fails_replay_equals_eager(monkeypatch):
    """A ``build`` that hands the indexer a copy of its ring slot mapping (not the
    builder's buffer, rewritten in place) is captured by the FULL graph, whose replay
    reads the capture's slots: replay equals eager fails on ``qsa.raw.slot_mapping``."""
    m = qsa()
    m.prepare()
    from vllm.models.qwen4_exp.common.qsa_cache import QSAMetadataBuilder

    original = QSAMetadataBuilder.build

    def copied(self, *args, **kwargs):
        metadata = copy.copy(original(self, *args, **kwargs))
        metadata.slot_mapping = metadata.slot_mapping.clone()
        return metadata

    monkeypatch.setattr(QSAMetadataBuilder, "build", copied)
    _, second = run_trace(spec_decode(), m.QSARunnerStepEngine())
    stale = {v.field for v in ref.violations(second) if v.prop == "replay equals eager"}
    assert "qsa.raw.slot_mapping" in stale


def test_caches_whose_splits_disagree_are_refused_by_the_indexer(monkeypatch):
    """``QSAIndexer._metadata`` runs on every forward: a compressed cache's metadata of
    another decode query length is refused as the indexer refuses it, in vLLM's frame:
    the engine's refusal, a finding (harness/blame.py), never attnfuzz's fault."""
    from attnfuzz.harness.blame import attnfuzz_fault

    m = qsa()
    m.prepare()
    from vllm.models.qwen4_exp.common.qsa_cache import QSAMetadataBuilder

    original = QSAMetadataBuilder.build

    def skewed(self, *args, **kwargs):
        metadata = original(self, *args, **kwargs)
        if not self.is_circular_buffer:
            metadata.decode_query_len += 1
        return metadata

    monkeypatch.setattr(QSAMetadataBuilder, "build", skewed)
    with pytest.raises(RuntimeError, match="splits disagree") as refused:
        run_trace(spec_decode(), m.QSARunnerStepEngine())
    assert attnfuzz_fault(refused.value, refused.tb) is None


def test_a_dummy_run_into_the_held_requests_raw_ring_is_kept_apart():
    """``vllm-v1-qsa-dummy-held-rows``, a finding of vLLM 0.33.0 kept apart: the dummy run
    before the decode builds the raw ring's metadata from the persistent batch's row 0,
    which holds the running request: the dummy token stores into that request's ring
    (block 1, slot 4: the prefill's position 4). ``vllm-v1-qsa`` does not judge a dummy
    run against the requests it holds; the kept-apart entry does."""
    from attnfuzz.adapters.vllm import runner_step_kpool_tail
    from attnfuzz.adapters.vllm.testing import kept_apart_verdict

    witness = runner_step_kpool_tail.smallest_dummy_held_rows()
    verdict = kept_apart_verdict("vllm-v1-qsa", "vllm-v1-qsa-dummy-held-rows", witness)
    assert verdict.mismatches and all(
        x.check == "dummy-run-writes-nothing-live" and x.where == "dummy.qsa.raw.ring_block"
        and "slot 1," in x.got
        for x in verdict.mismatches
    )  # fmt: skip
