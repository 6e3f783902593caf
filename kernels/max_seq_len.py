"""``max_seq_len`` of the model state and the draft, and a paged kernel that walks by it.

``max_seq_len_metadata`` is the fixed path of upstream #43991: a Triton
reduction over the real rows of ``seq_lens_cpu_upper_bound`` (copied to the
kernels' device), then the host glue of the metadata builders (graph capture,
no draft model). ``paged_walk`` is
the consumer: it walks ``cdiv(max_seq_len, block_size)`` block-table entries
per request, reading its bound from the device so that building the metadata
never waits for the GPU. The mutants differ from the fixed path in the one
line each bug lived in.
"""

from __future__ import annotations

import torch
from attnfuzz.kernels._triton import INTERPRET, add, block, tl, triton
from attnfuzz.reference.max_seq_len import MaxSeqLenInputs, MaxSeqLenOutputs, has_draft


@triton.jit
def _max_seq_len_kernel(
    upper_ptr, out_ptr, num_rows, num_spec_steps, max_model_len, BLOCK: tl.constexpr
):
    # out[0] = max(upper[:num_rows]) (0 for no rows: bounds are >= 0);
    # out[1] = min(out[0] + num_spec_steps, max_model_len), the draft's bound.
    acc = tl.full((BLOCK,), 0, tl.int32)
    for r0 in range(0, num_rows, BLOCK):
        rows = r0 + tl.arange(0, BLOCK)
        acc = tl.maximum(acc, tl.load(upper_ptr + rows, mask=rows < num_rows, other=0))
    top = tl.reduce(acc, 0, tl.standard._elementwise_max)
    tl.store(out_ptr, top)
    tl.store(out_ptr + 1, tl.minimum(top + num_spec_steps, max_model_len))


def _check_vector(op: str, name: str, t: torch.Tensor, need: int) -> None:
    """``t`` is 1-D, contiguous, with at least ``need`` entries: the kernels index it
    flat, so a shorter (or strided, or expanded) one would be read past its end."""
    if t.dim() != 1 or t.numel() < need or (need > 1 and t.stride(0) != 1):
        raise ValueError(
            f"{op}: {name} must be a contiguous 1-D tensor of at least {need} entries "
            f"(got shape {list(t.shape)}, stride {list(t.stride())})"
        )


def batch_max_seq_lens(
    upper: torch.Tensor, num_rows: int, num_spec_steps: int, max_model_len: int
) -> torch.Tensor:
    """int32 ``[2]``: the bounds of the model state and the draft over ``upper[:num_rows]``.

    More rows than ``upper`` holds are refused: the reduction would read past it.
    """
    _check_vector("batch_max_seq_lens", "seq_lens_upper_bound", upper, num_rows)
    out = torch.empty(2, dtype=torch.int32, device=upper.device)
    tile = block(num_rows, cuda_cap=1024, floor=1)
    _max_seq_len_kernel[(1,)](upper, out, num_rows, num_spec_steps, max_model_len, BLOCK=tile)
    return out


@triton.jit
def _paged_walk_kernel(
    kv_ptr, table_ptr, seq_lens_ptr, bounds_ptr,
    out_ptr, walked_ptr, needed_ptr, oob_ptr,
    num_reqs, num_blocks, width, table_stride, block_size, D,
    BLOCK_R: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    # Row ``idx`` of the tile is request ``idx % num_reqs`` on path ``idx // num_reqs``
    # (0: model state, 1: draft); ``bounds_ptr[path]`` is that path's max_seq_len.
    # Integer arithmetic is int64 throughout: no index can wrap, and the
    # interpreter checks only narrower integers for overflow (extra ops on each).
    idx = tl.arange(0, BLOCK_R).to(tl.int64) + tl.program_id(0).to(tl.int64) * BLOCK_R
    in_rows = idx < 2 * num_reqs
    r = idx % num_reqs
    seq_len = tl.load(seq_lens_ptr + r, mask=in_rows, other=0).to(tl.int64)
    bound = tl.load(bounds_ptr + idx // num_reqs, mask=in_rows, other=0).to(tl.int64)
    # The walk covers whole pages: cdiv(max_seq_len, block_size) entries, never
    # past the table's width (that would read the next request's row).
    walk_end = tl.minimum((bound + block_size - 1) // block_size, width) * block_size
    longest = tl.reduce(walk_end, 0, tl.standard._elementwise_max)
    dims = tl.arange(0, BLOCK_D).to(tl.int64)
    in_d = dims < D
    acc = tl.full((BLOCK_R, BLOCK_D), 0, tl.float32)
    walked = tl.full((BLOCK_R,), 0, tl.int64)
    needed = tl.full((BLOCK_R,), 0, tl.int64)
    oob = tl.full((BLOCK_R,), 0, tl.int64)
    for p0 in range(0, longest, BLOCK_P):
        pos = tl.arange(0, BLOCK_P).to(tl.int64) + p0
        on_walk = in_rows[:, None] & (pos[None, :] < walk_end[:, None])  # [R, P]
        # Block-table entries are read for the whole walk, as the kernel goes.
        page = tl.load(
            table_ptr + r[:, None] * table_stride + pos[None, :] // block_size,
            mask=on_walk,
            other=0,
        )
        page = page.to(tl.int64)
        in_cache = (page >= 0) & (page < num_blocks)
        visible = on_walk & in_cache & (pos[None, :] < seq_len[:, None])
        # One count per entry: at its first position.
        first = on_walk & (pos[None, :] % block_size == 0)
        walked += tl.reduce(first.to(tl.int64), 1, add)
        needed += tl.reduce((first & visible).to(tl.int64), 1, add)
        oob += tl.reduce((first & ~in_cache).to(tl.int64), 1, add)
        # Keys only where visible: stale and poisoned pages are never loaded.
        page = tl.where(visible, page, 0)
        slot = (page * block_size + pos[None, :] % block_size) * D
        keys = tl.load(
            kv_ptr + slot[:, :, None] + dims[None, None, :],
            mask=visible[:, :, None] & in_d[None, None, :],
            other=0.0,
        )
        weight = tl.where(visible, pos[None, :] + 1, 0).to(tl.float32)
        acc += tl.reduce(weight[:, :, None] * keys, 1, add)
    tl.store(
        out_ptr + idx[:, None] * D + dims[None, :],
        acc,
        mask=in_rows[:, None] & in_d[None, :],
    )
    tl.store(walked_ptr + idx, walked.to(tl.int32), mask=in_rows)
    tl.store(needed_ptr + idx, needed.to(tl.int32), mask=in_rows)
    tl.store(oob_ptr + idx, oob.to(tl.int32), mask=in_rows)


def paged_walk(
    kv_cache: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor, bounds: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The consumer on both paths: ``out [2, R, D]`` and ``[2, R]`` walked, needed, oob counts.

    ``bounds`` is int32 ``[2]`` on the device: each path's ``max_seq_len``;
    ``seq_lens`` holds one length per row of ``block_table``. The walk never
    leaves a table row, nor loads a page outside the cache, whatever the bounds
    and lengths say; fewer lengths or bounds than that are refused.
    """
    num_blocks, block_size, D = kv_cache.shape
    R, width = block_table.shape
    assert block_table.stride(1) == 1 and kv_cache.is_contiguous()
    _check_vector("paged_walk", "seq_lens", seq_lens, R)
    _check_vector("paged_walk", "bounds", bounds, 2)
    device = kv_cache.device
    out = torch.empty((2, R, D), dtype=torch.float32, device=device)
    counts = torch.empty((3, 2, R), dtype=torch.int32, device=device)
    block_d = block(D, interpret_cap=4096, cuda_cap=256, floor=1)
    block_r = block(2 * R, interpret_cap=64, cuda_cap=4, floor=1)
    # Under the interpreter one tile covers the widest walk (up to 2**18 elements);
    # compiled, a [R, P, D] tile of keys stays near 2**12 elements.
    cap = max(1, (1 << (18 if INTERPRET else 12)) // (block_r * block_d))
    block_p = block(width * block_size, interpret_cap=cap, cuda_cap=cap, floor=1)
    grid = (triton.cdiv(2 * R, block_r),)
    _paged_walk_kernel[grid](
        kv_cache, block_table, seq_lens, bounds,
        out, counts[0], counts[1], counts[2],
        R, num_blocks, width, block_table.stride(0), block_size, D,
        BLOCK_R=block_r, BLOCK_P=block_p, BLOCK_D=block_d,
    )  # fmt: skip
    return out, counts[0], counts[1], counts[2]


def _run(inp: MaxSeqLenInputs, bounds: torch.Tensor) -> MaxSeqLenOutputs:
    """Host glue after the reduction: no draft model, then the consumer on both paths."""
    if not has_draft(inp.num_spec_steps):
        bounds[1] = 0  # no draft metadata: nothing walks on its path
    out, walked, needed, oob = paged_walk(inp.kv_cache, inp.block_table, inp.seq_lens, bounds)
    draft = bounds[1] if has_draft(inp.num_spec_steps) else None
    return MaxSeqLenOutputs(bounds[0], draft, out, walked, needed, oob)


def _bounds(inp: MaxSeqLenInputs, rows: int) -> torch.Tensor:
    """Both bounds from the first ``rows`` upper bounds; ``max_model_len`` at capture."""
    upper = inp.seq_lens_cpu_upper_bound.to(inp.kv_cache.device)
    bounds = batch_max_seq_lens(upper, rows, inp.num_spec_steps, inp.max_model_len)
    if inp.capturing:
        bounds.fill_(inp.max_model_len)
    return bounds


def max_seq_len_metadata(inp: MaxSeqLenInputs) -> MaxSeqLenOutputs:
    """Fixed (#43991): tight bounds from the real rows; ``max_model_len`` at capture."""
    return _run(inp, _bounds(inp, inp.num_real_reqs))


def mutant_model_len(inp: MaxSeqLenInputs) -> MaxSeqLenOutputs:
    """#43991: the model state's metadata takes ``max_model_len`` outside capture too."""
    bounds = _bounds(inp, inp.num_real_reqs)
    bounds[0] = inp.max_model_len
    return _run(inp, bounds)


def mutant_draft_model_len(inp: MaxSeqLenInputs) -> MaxSeqLenOutputs:
    """#43991: the draft model's metadata takes ``max_model_len``."""
    bounds = _bounds(inp, inp.num_real_reqs)
    bounds[1] = inp.max_model_len
    return _run(inp, bounds)
