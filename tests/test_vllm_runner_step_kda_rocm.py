"""vLLM 0.33.0's model runner V1 step of a hybrid model whose linear layer is Kimi K3's
KDA on ROCm (``vllm-v1-kimi-k3-kda-rocm`` of ``runner-step``): ``KimiK3ROCmKDAMetadataBuilder``
builds every step, its device-built FLA chunk metadata judged by the range its kernels
accept and held to GDN's host computation of the same step."""

from __future__ import annotations

import dataclasses

from attnfuzz.adapters.vllm.testing import Calls, own, requires_vllm, run_trace, values
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.batch import Batch, EngineConfig
from attnfuzz.reference.trace import Trace

pytestmark = [*requires_vllm]

SEQUENCE, CHUNK, OFFSETS = "gdn.chunk_indices[:, 0]", "gdn.chunk_indices[:, 1]", "gdn.chunk_offsets"
CHUNK_FIELDS = (SEQUENCE, CHUNK, OFFSETS)


def rocm_kda():
    from attnfuzz.adapters.vllm import runner_step_kda_rocm

    runner_step_kda_rocm.prepare()
    return runner_step_kda_rocm


def hybrid():
    from attnfuzz.adapters.vllm import runner_step_hybrid

    return runner_step_hybrid


def chunks(build: ref.StepBuild) -> dict[str, list]:
    """The build's device chunk fields and GDN's host ones."""
    names = [*CHUNK_FIELDS, *(f"host.{n}" for n in CHUNK_FIELDS)]
    return {n: values(build, n) for n in names if build.field(n) is not None}


def long_prefills() -> Trace:
    """Three requests prefill 5, 64 and 65 tokens (one chunk of FLA's 64 tokens, one, and
    two); then they decode one token each beside a fourth prefilling 100 (two chunks):
    GDN splits the decodes off and rebases the prefill's query offsets."""
    config = EngineConfig(
        max_model_len=256, max_num_seqs=4, max_num_batched_tokens=256, block_size=16,
        num_spec=0, cudagraph_capture_sizes=(4, 8), cudagraph_mode="FULL_AND_PIECEWISE",
        runner="v1",
    )  # fmt: skip
    return Trace(config, (
        Batch((0, 0, 0), (5, 64, 65), req_ids=(0, 1, 2),
              pages=((1,), (2, 3, 4, 5), (6, 7, 8, 9, 10)), new_pages=(1, 4, 5)),
        Batch((5, 64, 65, 0), (1, 1, 1, 100), req_ids=(0, 1, 2, 3),
              pages=((1,), (2, 3, 4, 5, 11), (6, 7, 8, 9, 10), tuple(range(12, 19))),
              new_pages=(0, 1, 0, 7)),
    ))  # fmt: skip


def spec_decode_beside_a_prefill() -> Trace:
    """One request prefills 5 tokens, then decodes its draft (2 tokens) beside a second
    prefilling 70 (two chunks): GDN masks the speculative decode off, the chunk
    metadata of the non-speculative rows."""
    config = dataclasses.replace(
        hybrid().smallest_full_spec_decode().config, max_num_batched_tokens=128,
        max_model_len=128,
    )  # fmt: skip
    return Trace(config, (
        Batch((0,), (5,), req_ids=(7,), pages=((1,),), new_pages=(1,)),
        Batch((5, 0), (2, 70), req_ids=(7, 8), pages=((1,), (2, 3, 4, 5, 6)),
              new_pages=(0, 5)),
    ))  # fmt: skip


def test_the_rocm_kda_builder_builds_every_step(monkeypatch):
    """``KimiK3ROCmKDAMetadataBuilder`` is the linear group's builder and builds every
    step and the capture runs of a 5-token prefill and its speculative decode, padded
    to the FULL graph of 2 requests: every property holds; the prefill's chunk metadata,
    built on the device, is one chunk of sequence 0, as GDN's host computation."""
    m = rocm_kda()
    from vllm.models.kimi_k3.amd import kda_metadata
    from vllm.v1.attention.backend import AttentionCGSupport

    builder_cls = kda_metadata.KimiK3ROCmKDAMetadataBuilder
    assert builder_cls._cudagraph_support == AttentionCGSupport.UNIFORM_BATCH  # GDN's
    calls = Calls(monkeypatch)
    calls.count(builder_cls, "build", "build_for_cudagraph_capture")
    calls.count(kda_metadata, "prepare_chunk_metadata_device")
    engine = m.ROCmKDARunnerStepEngine()
    first, second = run_trace(hybrid().smallest_full_spec_decode(), engine)
    builder = engine.graphs.runner.attn_groups[1][0].get_metadata_builder()
    assert type(builder) is builder_cls
    assert calls["build"] > 0 and calls["build_for_cudagraph_capture"] > 0
    assert calls["prepare_chunk_metadata_device"] > 0
    assert ref.violations(first) == [] and ref.violations(second) == []
    one_chunk = {SEQUENCE: [0], CHUNK: [0], OFFSETS: [0, 1]}
    for how in ("eager", "padded", "fresh"):
        (prefill,) = own(first, how)
        assert chunks(prefill) == {**one_chunk, **{f"host.{n}": v for n, v in one_chunk.items()}}
        assert prefill.field(OFFSETS).agrees_with == f"host.{OFFSETS}"
    # The decode step builds no chunk metadata: no prefill.
    assert not any(chunks(b) for b in second.builds)
    # The engine's recording is undone after each step: the builder is vLLM's again.
    assert "records_host_chunks" not in vars(builder_cls.build)


def test_chunks_of_longer_prefills_and_of_the_prefills_split_from_decodes():
    """Prefills of 5, 64 and 65 tokens are chunks 1, 1 and 2 of 64 tokens; decodes beside
    a 100-token prefill leave its two chunks, of sequence 0 of the rebased offsets."""
    m = rocm_kda()
    first, second = run_trace(long_prefills(), m.run)
    assert ref.violations(first) == [] and ref.violations(second) == []
    (prefill,) = own(first, "eager")
    assert values(prefill, "gdn.prefill_query_start_loc") == [0, 5, 69, 134]
    assert values(prefill, SEQUENCE) == [0, 1, 2, 2]
    assert values(prefill, CHUNK) == [0, 0, 0, 1]
    assert values(prefill, OFFSETS) == [0, 1, 2, 4]
    assert prefill.field(CHUNK).accepts == (0, 1)  # the 65-token sequence's 2 chunks
    assert prefill.field(OFFSETS).accepts == (0, 4)
    (mixed,) = own(second, "eager")
    assert values(mixed, "gdn.prefill_query_start_loc") == [0, 100]
    assert chunks(mixed)[SEQUENCE] == [0, 0] and chunks(mixed)[CHUNK] == [0, 1]
    assert chunks(mixed)[OFFSETS] == chunks(mixed)[f"host.{OFFSETS}"] == [0, 2]


def test_chunks_of_a_prefill_beside_a_speculative_decode():
    """A speculative decode beside a 70-token prefill: the chunk metadata is the
    non-speculative rows', the prefill's two chunks."""
    m = rocm_kda()
    _, second = run_trace(spec_decode_beside_a_prefill(), m.run)
    assert ref.violations(second) == []
    (mixed,) = own(second, "eager")
    assert values(mixed, "gdn.spec_query_start_loc") == [0, 2]
    assert chunks(mixed) == {
        SEQUENCE: [0, 0], CHUNK: [0, 1], OFFSETS: [0, 2],
        f"host.{SEQUENCE}": [0, 0], f"host.{CHUNK}": [0, 1], f"host.{OFFSETS}": [0, 2],
    }  # fmt: skip


def _changed(monkeypatch, change) -> None:
    """``prepare_chunk_metadata_device`` (the ROCm builder's) with ``change`` applied to
    what it returns."""
    from vllm.models.kimi_k3.amd import kda_metadata

    original = kda_metadata.prepare_chunk_metadata_device

    def device(*args, **kwargs):
        return change(*original(*args, **kwargs))

    monkeypatch.setattr(kda_metadata, "prepare_chunk_metadata_device", device)


def test_chunk_offsets_off_by_one_fail_the_agreement_with_gdn(monkeypatch):
    """The device's chunk offsets one chunk on (held to the chunks there are, so every
    value stays in the range the kernels accept): only GDN's host offsets tell them
    wrong, on every build of each prefill."""
    m = rocm_kda()
    _changed(monkeypatch, lambda i, o: (i, (o + 1).clamp(max=len(i))))
    first, second = run_trace(long_prefills(), m.run)
    for out in (first, second):
        found = ref.violations(out)
        assert found and {(v.prop, v.field) for v in found} == {
            ("agreement within a build", OFFSETS)
        }
        assert {v.build for v in found} >= {"eager", "padded", "fresh"}
    (prefill,) = own(first, "eager")
    assert values(prefill, OFFSETS) == [1, 2, 3, 4]
    assert values(prefill, f"host.{OFFSETS}") == [0, 1, 2, 4]


def test_chunk_indices_of_a_sequence_past_the_last_are_unsafe(monkeypatch):
    """The device's chunk indices naming the next sequence: the last chunk's is past the
    prefill's sequences (safe padding), and every one differs from GDN's."""
    m = rocm_kda()

    def shifted(i, o):
        i = i.clone()
        i[:, 0] += 1
        return i, o

    _changed(monkeypatch, shifted)
    first, _ = run_trace(hybrid().smallest_full_spec_decode(), m.run)
    found = {(v.prop, v.field) for v in ref.violations(first)}
    assert found == {("safe padding", SEQUENCE), ("agreement within a build", SEQUENCE)}


def test_it_declines_what_vllm_v1_hybrid_declines():
    """A first chunk a FULL decode graph replays: the builder stages the graph's buffers
    as GDN's (kept apart as vllm-v1-hybrid's finding); a FULL spec decode runs."""
    m = rocm_kda()
    h = hybrid()
    (case,) = h.smallest_prefill_in_decode_graph().cases()
    assert "vllm-v1-hybrid-prefill-in-decode-graph" in m.declines(case)
    assert all(m.declines(c) is None for c in h.smallest_full_spec_decode().cases())
