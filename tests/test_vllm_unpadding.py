"""vLLM 0.33.0's graph padding (model runner V2) and ``unpadded`` as the implementation ``vllm``."""

from __future__ import annotations

from attnfuzz.adapters.vllm.testing import requires_vllm
from attnfuzz.harness.registry import get_target
from attnfuzz.harness.targets import unpadding as target_module
from attnfuzz.reference import unpadding as ref

pytestmark = requires_vllm

TARGET = "unpadding"
UPSTREAM = "upstream-pr36580-stale-slots"


def test_vllm_unpadded_is_views_with_the_padded_max_query_len():
    """Fidelity: the reference's ``unpadded`` copies (host NumPy) and recomputes
    ``max_query_len``; vLLM's slices (views of the padded fields, which are views of
    the runner's persistent buffers) and keeps ``max_query_len``. The oracle asks for
    views, and the maximum over the real requests equals the padded one because padding
    requests carry no token; the copying mutant is still caught."""
    from attnfuzz.adapters.vllm import unpadding as adapter

    case = target_module.smallest_padded()
    out = adapter.run(ref.make_inputs(case))
    for field in ref.FIELDS:
        unpadded, padded = getattr(out.unpadded, field), getattr(out.padded, field)
        assert unpadded.data_ptr() == padded.data_ptr() == out.buffers[field].data_ptr()
    assert out.unpadded.max_query_len == 2
    assert out.padded.slot_mapping[6:].tolist() == [-1, -1]
    t = get_target(TARGET)
    assert t.judge(t.resolve("vllm"), case).ok
    assert not t.judge(t.resolve("unpadded-copy"), case).ok


def test_upstream_pr36580_leaves_the_padded_tokens_stale():
    from attnfuzz.adapters.vllm import unpadding as adapter

    case = target_module.smallest_padded()
    inputs = ref.make_inputs(case)
    stale = inputs.slot_mapping_buffer[6:8].tolist()
    assert adapter.upstream_stale_slots(inputs).padded.slot_mapping[6:].tolist() == stale
    t = get_target(TARGET)
    assert not t.judge(t.resolve(UPSTREAM), case).ok
    assert not t.judge(t.resolve("stale-slots"), case).ok


def test_binds_to_every_supported_release():
    """Every release from 0.21.0 has what the adapter calls (before 0.24.0 without
    buffer_utils._load_ptr, which nothing here imports): where the generic test skips
    an implementation that cannot run, this one fails."""
    for impl in ("vllm", UPSTREAM):
        assert get_target(TARGET).resolve(impl).why_unavailable() is None, impl


def test_staged_writes_reach_the_tables_through_the_releases_host_buffers():
    """The runner's BlockTables is the release's own (its __init__, its staged writes):
    host buffers that CPU-only torch can allocate, vLLM's NonUvaBuffer from 0.30.0 and
    the host stand-in for UvaBuffer before it, and an unpinned staging copy where
    async_tensor_h2d pins by default (0.21.0 to 0.23.0). What append_block_ids stages
    lands in the table and in the counts gather_block_tables reads."""
    import torch
    from attnfuzz.adapters.vllm import compat
    from attnfuzz.adapters.vllm.slot_mapping import host_memory, new_block_tables
    from vllm.v1.worker.gpu.block_table import BlockTables

    cpu = torch.device("cpu")
    tables = new_block_tables(4, 3, 16, 8, cpu)
    assert type(tables) is BlockTables
    if compat.has(compat.V2_KERNEL_BLOCK_SIZES):
        assert tables.kernel_block_sizes == [4]
    with host_memory(cpu):
        tables.append_block_ids(1, ([7, 5, 9],), overwrite=True)
        tables.apply_staged_writes()
    assert tables.block_tables[0].gpu[1, :3].tolist() == [7, 5, 9]
    assert tables.num_blocks.gpu[0].tolist() == [0, 3, 0]
    gathered = tables.gather_block_tables(torch.tensor([1], dtype=torch.int32), 2)
    assert gathered[0].tolist() == [[7, 5, 9, 0, 0, 0, 0, 0], [0] * 8]
