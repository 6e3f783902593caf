"""What SGLang's CUDA-graph runners do around a backend's replay, shared by the adapters.

A runner allocates its input buffers once, for its largest graph, at their fill
values; before each replay it pads a step of ``raw_bs`` requests to the graph's
``bs`` with requests of the fill length on the reserved row 0, copies the step's
rows in, and calls the backend with a view over those buffers. These are the
decode runner's steps (target verify, decode); the draft-extend runner's view
differs by backend and stays in each adapter.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch
from attnfuzz.adapters.sglang import _engine, compat


def runner_buffers(
    device: torch.device | str, max_bs: int, rows: int, fill: int, **extra: Any
) -> _engine.StandIn:
    """The runner's input buffers of its largest graph (``max_bs`` requests of ``rows``
    query rows), at their initial values; ``extra``: a backend's own buffers."""
    max_num_token = max_bs * rows
    return _engine.StandIn(
        input_ids=torch.zeros(max_num_token, dtype=torch.int64, device=device),
        positions=torch.zeros(max_num_token, dtype=torch.int64, device=device),
        out_cache_loc=torch.zeros(max_num_token, dtype=torch.int64, device=device),
        req_pool_indices=torch.zeros(max_bs, dtype=torch.int64, device=device),
        seq_lens=torch.full((max_bs,), fill, dtype=torch.int64, device=device),
        seq_lens_cpu=torch.full((max_bs,), fill, dtype=torch.int64),
        extend_seq_lens=torch.full((max_bs,), rows, dtype=torch.int32, device=device),
        encoder_lens=None,
        mamba_track_indices=None,
        **extra,
    )


def pad_requests(buffers: Any, fb: Any, bs: int, fill: int) -> None:
    """The replay prep: padding requests of the fill length on row 0, then the step's rows."""
    raw_bs = fb.batch_size
    if bs != raw_bs:
        buffers.seq_lens.fill_(fill)
        buffers.seq_lens_cpu.fill_(fill)
        buffers.req_pool_indices.zero_()
    buffers.seq_lens[:raw_bs].copy_(fb.seq_lens)
    buffers.seq_lens_cpu[:raw_bs].copy_(fb.seq_lens_cpu)
    buffers.req_pool_indices[:raw_bs].copy_(fb.req_pool_indices)


def build_replay_fb_view() -> Any:
    """The decode runner's ``build_replay_fb_view``: in ``runner/decode_cuda_graph_runner.py``,
    or ``cuda_graph_runner.py`` where the runner was ``CudaGraphRunner`` (0.5.13)."""
    api = compat.REPLAY_FB_VIEW if compat.has(compat.REPLAY_FB_VIEW) else compat.OLD_REPLAY_FB_VIEW
    return getattr(importlib.import_module(api.module), api.attr)


def replay_decode_runner(
    backend: Any, fb: Any, buffers: Any, bs: int, rows: int, fill: int, *, old: bool,
    mode: Any = None, spec_info: Any = None,
) -> None:  # fmt: skip
    """Pad the buffers and call the backend's replay as the decode runner does: the
    view of ``build_replay_fb_view`` and ``init_forward_metadata_out_graph``, or
    (``old``: ``CudaGraphRunner.replay_prepare``, 0.5.12 and older)
    ``init_forward_metadata_replay_cuda_graph`` over the padded buffers. ``mode``:
    the graph's forward mode (default: the step's)."""
    mode = fb.forward_mode if mode is None else mode
    raw_bs = fb.batch_size
    pad_requests(buffers, fb, bs, fill)
    if old:
        backend.init_forward_metadata_replay_cuda_graph(
            bs,
            buffers.req_pool_indices[:bs],
            buffers.seq_lens[:bs],
            fb.seq_lens_sum + (bs - raw_bs) * fill,
            None,
            mode,
            spec_info,
            seq_lens_cpu=buffers.seq_lens_cpu[:bs],
        )
        return
    takes_global = compat.has(compat.REPLAY_FB_VIEW_GLOBAL)
    global_tokens = {"global_num_tokens_cpu": None} if takes_global else {}
    view = build_replay_fb_view()(
        forward_batch=fb,
        buffers=buffers,
        bs=bs,
        raw_bs=raw_bs,
        num_tokens=bs * rows,
        seq_len_fill_value=fill,
        capture_forward_mode=mode,
        is_encoder_decoder=False,
        **global_tokens,
    )
    backend.init_forward_metadata_out_graph(view)
