"""SGLang's Triton attention backend as implementations of ``spec-indptr``.

``TritonAttnBackend`` (``sglang/srt/layers/attention/triton_backend.py``) is
built over a stand-in model runner holding a real-shaped request-to-token
pool and SGLang's own ``KVIndexTranslator`` over it; each step is a real
``ForwardBatch`` with a real ``EagleVerifyInput`` (target verify) or
``EagleDraftExtendInput`` (draft extend, spec v2). The kv-index kernels are
SGLang's Triton kernels, run under the interpreter where there is no GPU.

- eager: ``init_forward_metadata``;
- replayed: ``init_cuda_graph_state`` for the largest captured graph, the
  capture of the step's graph (``init_forward_metadata_out_graph(in_capture=True)``
  then ``init_forward_metadata_in_graph``) over the runner's buffers at their
  fill values, then the replay's ``init_forward_metadata_out_graph`` over the
  buffers padded as the runners pad them: the decode runner's
  ``build_replay_fb_view`` (target verify), and the view
  ``EAGLEDraftExtendCudaGraphRunner.execute`` builds (draft extend). What the
  graph reads is the metadata built at capture, whose tensors the replay refilled.

Older releases, found by looking (:mod:`.compat`): before the capture/replay pair
became ``init_forward_metadata_out_graph`` (0.5.12 and older), the capture is
``init_forward_metadata_capture_cuda_graph`` and the replay
``init_forward_metadata_replay_cuda_graph``, called with the arguments the
runners of those releases pass (``cuda_graph_runner.py:CudaGraphRunner.replay_prepare``,
``EAGLEDraftExtendCudaGraphRunner.replay``); before ``KVIndexTranslator``
(0.5.13 and older) the backend reads the request-to-token table itself.
"""

from __future__ import annotations

import types
from typing import Any

import torch
from attnfuzz.adapters.sglang import _engine, _graphs, compat
from attnfuzz.harness.blame import under_test
from attnfuzz.reference.spec_indptr import (
    TARGET_VERIFY,
    SpecIndptrInputs,
    SpecIndptrOutputs,
)

HEAD_DIM = 4  # the model's dimensions: the metadata does not depend on them


def prepare() -> None:
    """Import SGLang and the backend before a judge forks its child."""
    _engine.prepare()
    from sglang.srt.layers.attention import triton_backend  # noqa: F401
    from sglang.srt.speculative import eagle_draft_extend_cuda_graph_runner  # noqa: F401


class _KVPool:
    """The token-to-KV pool, as far as the backend reads it: one layer's value width."""

    start_layer = 0

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        return torch.zeros(1, 1, HEAD_DIM)


def _translator(table: torch.Tensor, pool: Any, device: str) -> Any:
    """SGLang's ``KVIndexTranslator`` over the table; None before it existed."""
    if not compat.has(compat.KV_INDEX_TRANSLATOR):
        return None
    from sglang.srt.mem_cache.kv_index_translator import KVIndexTranslator

    return KVIndexTranslator(
        req_to_token=table,
        token_to_kv_pool_allocator=None,
        token_to_kv_pool=pool,
        page_size=1,
        device=device,
    )


def _model_runner(inputs: SpecIndptrInputs, server_args: Any = None) -> Any:
    """A stand-in ``ModelRunner``: the real pool shape and translator, a small MHA model
    (``server_args``: what releases before the runtime context read from the runner)."""
    from sglang.srt.configs.model_config import AttentionArch
    from transformers import LlamaConfig

    table = inputs.req_to_token
    device = str(table.device)
    pool = _KVPool()
    hf_config = LlamaConfig(
        num_attention_heads=2, num_key_value_heads=1, hidden_size=2 * HEAD_DIM, num_hidden_layers=1
    )
    model_config = _engine.StandIn(
        attention_arch=AttentionArch.MHA,
        hf_config=hf_config,
        context_len=table.shape[1],
        head_dim=HEAD_DIM,
        v_head_dim=HEAD_DIM,
        swa_v_head_dim=HEAD_DIM,
        is_encoder_decoder=False,
        is_draft_model=False,
        num_attention_heads=2,  # read by releases before get_max_num_attention_heads
        linear_attn_registry_result=None,
        get_max_num_attention_heads=lambda: 2,
        get_num_kv_heads=lambda tp_size, dcp_size=1: 1,
    )
    translator = _translator(table, pool, device)
    N = inputs.spec.num_draft_tokens
    return _engine.StandIn(
        req_to_token_pool=_engine.StandIn(size=table.shape[0], req_to_token=table),
        token_to_kv_pool=pool,
        token_to_kv_pool_allocator=None,
        kv_index_translator=translator,
        sliding_window_size=None,
        page_size=1,
        model_config=model_config,
        decode_num_tokens_per_req=lambda: N,
        is_draft_worker=inputs.phase != TARGET_VERIFY,
        spec_algorithm=None,
        device=device,
        gpu_id=0,
        kv_cache_dtype=torch.float32,
        server_args=server_args,
        # What releases before the linear-attention registry ask of the runner.
        hybrid_gdn_config=None,
        kimi_linear_config=None,
        linear_attn_model_spec=None,
    )


def _server_args(inputs: SpecIndptrInputs) -> Any:
    spec = inputs.spec
    return _engine.server_args(
        attention_backend="triton",
        speculative_algorithm="EAGLE",
        speculative_num_draft_tokens=spec.num_draft_tokens,
        speculative_num_steps=spec.num_steps,
        speculative_eagle_topk=spec.topk,
    )


def _outputs(backend: Any, inputs: SpecIndptrInputs) -> SpecIndptrOutputs:
    m = backend.forward_metadata
    verify = inputs.phase == TARGET_VERIFY
    return SpecIndptrOutputs(
        qo_indptr=m.qo_indptr,
        kv_indptr=m.kv_indptr,
        kv_indices=m.kv_indices,
        mask_indptr=m.mask_indptr if verify else None,
        max_extend_len=int(m.max_extend_len),
    )


def _window_slots(inputs: SpecIndptrInputs, seq_lens: torch.Tensor) -> torch.Tensor:
    """The slots the step writes: each request's ``N`` table entries after ``seq_lens``."""
    N, table = inputs.spec.num_draft_tokens, inputs.req_to_token
    rows = inputs.req_pool_indices
    slots = [table[int(rows[r]), int(seq_lens[r]) : int(seq_lens[r]) + N] for r in range(len(rows))]
    return torch.cat(slots).to(torch.int64) if slots else torch.zeros(0, dtype=torch.int64)


def _verify_input(inputs: SpecIndptrInputs, seq_lens: torch.Tensor | None, custom_mask: Any) -> Any:
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
    from sglang.srt.speculative.eagle_info import EagleVerifyInput

    spec = inputs.spec
    return EagleVerifyInput(
        draft_token=None,
        custom_mask=custom_mask,
        positions=None,
        retrieve_index=None,
        retrieve_next_token=None,
        retrieve_next_sibling=None,
        retrieve_cum_len=None,
        spec_steps=spec.num_steps,
        topk=spec.topk,
        draft_token_num=spec.num_draft_tokens,
        capture_hidden_mode=CaptureHiddenMode.FULL,
        seq_lens_sum=None if seq_lens is None else int(seq_lens.sum()),
        seq_lens_cpu=None if seq_lens is None else seq_lens.cpu(),
    )


def _draft_extend_input(N: int) -> Any:
    from sglang.srt.speculative.eagle_info import EagleDraftExtendInput

    return EagleDraftExtendInput(num_tokens_per_req=N)


def _step(inputs: SpecIndptrInputs, runner: Any) -> Any:
    """The step's real ``ForwardBatch``, bound to a plan of its own (its own iteration)."""
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

    N, R = inputs.spec.num_draft_tokens, inputs.num_reqs
    device = inputs.req_to_token.device
    committed = inputs.seq_lens.to(torch.int64)
    common = dict(
        batch_size=R,
        input_ids=torch.zeros(R * N, dtype=torch.int64, device=device),
        req_pool_indices=inputs.req_pool_indices,
        out_cache_loc=_window_slots(inputs, committed).to(device),
    )
    if inputs.phase == TARGET_VERIFY:
        # The tree mask: one block of N * (seq_len + N) per request.
        mask = torch.ones(int((N * (committed + N)).sum()), dtype=torch.bool, device=device)
        fb = ForwardBatch(
            forward_mode=ForwardMode.TARGET_VERIFY,
            seq_lens=committed,
            seq_lens_sum=int(committed.sum()),
            seq_lens_cpu=committed.cpu(),
            spec_info=_verify_input(inputs, committed, mask),
            **common,
        )
    else:
        # Spec v2 (prepare_for_draft_extend): the forward sees the post-write length,
        # the whole window of N tokens is extended over the committed prefix.
        seq_lens = committed + N
        prefix = committed.to(torch.int32)
        fb = ForwardBatch(
            forward_mode=ForwardMode.DRAFT_EXTEND_V2,
            seq_lens=seq_lens,
            seq_lens_sum=int(seq_lens.sum()),
            seq_lens_cpu=seq_lens.cpu(),
            extend_seq_lens=torch.full((R,), N, dtype=torch.int32, device=device),
            extend_seq_lens_cpu=[N] * R,
            extend_prefix_lens=prefix,
            extend_prefix_lens_cpu=[int(x) for x in prefix.cpu()],
            extend_num_tokens=R * N,
            spec_info=_draft_extend_input(N),
            **common,
        )
    if runner.kv_index_translator is not None:
        runner.kv_index_translator.bind_own_plan(fb)
    return fb


def _capture(backend: Any, runner: Any, inputs: SpecIndptrInputs, buffers: Any, bs: int) -> None:
    """Capture the graph of ``bs`` requests over the runner's buffers (fill values)."""
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

    N = inputs.spec.num_draft_tokens
    verify = inputs.phase == TARGET_VERIFY
    num_tokens = bs * N
    fb = ForwardBatch(
        forward_mode=ForwardMode.TARGET_VERIFY if verify else ForwardMode.DRAFT_EXTEND_V2,
        batch_size=bs,
        input_ids=buffers.input_ids[:num_tokens],
        req_pool_indices=buffers.req_pool_indices[:bs],
        seq_lens=buffers.seq_lens[:bs],
        seq_lens_cpu=buffers.seq_lens_cpu[:bs],
        out_cache_loc=buffers.out_cache_loc[:num_tokens],
        seq_lens_sum=int(buffers.seq_lens[:bs].sum()),
        spec_info=(
            _verify_input(inputs, None, buffers.custom_mask) if verify else _draft_extend_input(N)
        ),
        **(
            {}
            if verify
            else dict(extend_seq_lens=buffers.extend_seq_lens[:bs], extend_seq_lens_cpu=[N] * bs)
        ),
    )
    if not compat.has(compat.TRITON_GRAPH):  # 0.5.12 and older
        backend.init_forward_metadata_capture_cuda_graph(
            bs, num_tokens, fb.req_pool_indices, fb.seq_lens, None, fb.forward_mode, fb.spec_info
        )
        return
    if runner.kv_index_translator is not None:
        runner.kv_index_translator.bind_runner_slots(fb)
    backend.init_forward_metadata_out_graph(fb, in_capture=True)
    backend.init_forward_metadata_in_graph(fb)


def _buffers(inputs: SpecIndptrInputs, max_bs: int, fill: int) -> Any:
    """The runner's input buffers of the largest graph, with the verify's tree mask."""
    N = inputs.spec.num_draft_tokens
    mask = torch.ones((max_bs * fill + max_bs * N) * N, dtype=torch.bool)
    return _graphs.runner_buffers(inputs.req_to_token.device, max_bs, N, fill, custom_mask=mask)


def _replay_verify(
    backend: Any, inputs: SpecIndptrInputs, fb: Any, buffers: Any, fill: int
) -> None:
    """The decode runner's replay prep: pad the buffers, then the replay view."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    N = inputs.spec.num_draft_tokens
    old = not compat.has(compat.TRITON_GRAPH)  # CudaGraphRunner.replay_prepare, <= 0.5.12
    _graphs.replay_decode_runner(
        backend, fb, buffers, inputs.graph_bs, N, fill, old=old,
        mode=ForwardMode.TARGET_VERIFY, spec_info=fb.spec_info,
    )  # fmt: skip


def _replay_draft_extend(
    backend: Any, inputs: SpecIndptrInputs, fb: Any, buffers: Any, fill: int
) -> None:
    """``EAGLEDraftExtendCudaGraphRunner.execute``'s replay prep, as far as attention reads it."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    raw_bs, bs, N = fb.batch_size, inputs.graph_bs, inputs.spec.num_draft_tokens
    if bs * N != fb.input_ids.shape[0]:
        buffers.seq_lens.fill_(fill)
        buffers.req_pool_indices.zero_()
        buffers.extend_seq_lens.fill_(N)
    buffers.seq_lens[:raw_bs].copy_(fb.seq_lens)
    buffers.req_pool_indices[:raw_bs].copy_(fb.req_pool_indices)
    buffers.extend_seq_lens[:raw_bs].copy_(fb.extend_seq_lens)
    if bs != raw_bs:
        buffers.seq_lens_cpu.fill_(fill)
    buffers.seq_lens_cpu[:raw_bs].copy_(fb.seq_lens_cpu)
    fb.spec_info.extend_seq_lens_cpu = [N] * bs
    fb.spec_info.extend_seq_lens_tensor = buffers.extend_seq_lens[:bs]
    if not compat.has(compat.TRITON_GRAPH):  # EAGLEDraftExtendCudaGraphRunner.replay, <= 0.5.12
        backend.init_forward_metadata_replay_cuda_graph(
            bs=bs,
            req_pool_indices=buffers.req_pool_indices,
            seq_lens=buffers.seq_lens,
            seq_lens_sum=fb.seq_lens_sum + (bs - raw_bs) * fill,
            encoder_lens=None,
            forward_mode=ForwardMode.DRAFT_EXTEND_V2,
            spec_info=fb.spec_info,
            seq_lens_cpu=buffers.seq_lens_cpu,
        )
        return
    view = _engine.StandIn(
        batch_size=bs,
        forward_mode=ForwardMode.DRAFT_EXTEND_V2,
        input_ids=fb.input_ids,
        req_pool_indices=buffers.req_pool_indices,
        seq_lens=buffers.seq_lens,
        seq_lens_sum=fb.seq_lens_sum + (bs - raw_bs) * fill,
        seq_lens_cpu=buffers.seq_lens_cpu,
        max_seq_len_host=None,
        encoder_lens=None,
        out_cache_loc=buffers.out_cache_loc[: fb.input_ids.shape[0]],
        # The translator's fields (none before 0.5.2x's KVIndexTranslator).
        out_cache_loc_virtual=getattr(fb, "out_cache_loc_virtual", None),
        kv_loc_plan=getattr(fb, "kv_loc_plan", None),
        kv_loc_cols=getattr(fb, "kv_loc_cols", None),
        out_cache_loc_dsv4=None,
        mamba_track_indices=None,
        spec_info=fb.spec_info,
    )
    backend.init_forward_metadata_out_graph(view)


def _run(inputs: SpecIndptrInputs, patch: Any = None) -> SpecIndptrOutputs:
    """Eager or replayed, as ``inputs.graph_bs`` says; ``patch(backend)`` may
    replace a method of the backend (an upstream mutant)."""
    prepare()
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

    with _server_args(inputs) as args:
        runner = _model_runner(inputs, args)
        backend = TritonAttnBackend(runner)
        if patch is not None:
            patch(backend)
        fb = _step(inputs, runner)
        if inputs.graph_bs is None:
            backend.init_forward_metadata(fb)
            return _outputs(backend, inputs)
        verify = inputs.phase == TARGET_VERIFY
        N, max_bs = inputs.spec.num_draft_tokens, max(inputs.capture_bs)
        if verify:
            fill = backend.get_cuda_graph_seq_len_fill_value()
        elif compat.has(compat.DRAFT_EXTEND_FILL):
            from sglang.srt.speculative.eagle_draft_extend_cuda_graph_runner import (
                resolve_draft_extend_seq_len_fill_value,
            )

            fill = resolve_draft_extend_seq_len_fill_value(backend, N)
        else:  # the draft-extend runner of 0.5.13 and older: the backend's fill value
            fill = backend.get_cuda_graph_seq_len_fill_value()
        backend.init_cuda_graph_state(max_bs, max_bs * N)
        buffers = _buffers(inputs, max_bs, fill)
        _capture(backend, runner, inputs, buffers, inputs.graph_bs)
        replay = _replay_verify if verify else _replay_draft_extend
        replay(backend, inputs, fb, buffers, fill)
        return _outputs(backend, inputs)


def run(inputs: SpecIndptrInputs) -> SpecIndptrOutputs:
    """``TritonAttnBackend``'s metadata of the step: eager, or a padded graph replay."""
    return _run(inputs)


@under_test
def _update_draft_extend_buffers_pre_pr27545(
    self: Any,
    plan: Any,
    bs: int,
    seq_lens: torch.Tensor,
    forward_mode: Any,
    spec_info: Any,
    req_pool_indices: torch.Tensor,
) -> Any:
    """``TritonAttnBackend._update_draft_extend_buffers`` of this release with #27545
    reverted: the query stride as SGLang 0.5.12's draft-extend replay had it,
    ``num_tokens_per_bs = self.speculative_num_steps + 1``; every other line as the
    release has it (the sliding-window branch left out: no window here)."""
    seq_lens = seq_lens[:bs]
    num_tokens_per_bs = self.speculative_num_steps + 1  # pre-fix (0.5.12)
    qo_indptr = self.qo_indptr[: bs + 1]
    qo_indptr[: bs + 1] = torch.arange(
        0,
        bs * num_tokens_per_bs + 1,
        step=num_tokens_per_bs,
        dtype=torch.int32,
        device=self.device,
    )
    if spec_info is not None and getattr(spec_info, "extend_seq_lens_tensor", None) is not None:
        extend_seq_lens = spec_info.extend_seq_lens_tensor[:bs].to(torch.int32)
    else:
        extend_seq_lens = torch.zeros(bs, dtype=torch.int32, device=seq_lens.device)
    kv_lens = torch.clamp(seq_lens - extend_seq_lens, min=0).to(torch.int32)
    planned = () if plan is _NO_PLAN else (plan,)  # 0.5.13: no plan argument
    kv_indptr = self._fill_kv_indptr_and_indices(
        *planned, bs, kv_lens, req_pool_indices, self.cuda_graph_kv_indices
    )
    assert self.sliding_window_size is None, "the pre-fix copy leaves the window branch out"
    return qo_indptr, kv_indptr, num_tokens_per_bs


_NO_PLAN = object()


def _update_draft_extend_buffers_pre_pr27545_without_plan(
    self: Any,
    bs: int,
    seq_lens: torch.Tensor,
    req_pool_indices: torch.Tensor,
    forward_mode: Any,
    spec_info: Any,
) -> Any:
    """The same revert in 0.5.13's ``_update_draft_extend_buffers(bs, seq_lens,
    req_pool_indices, forward_mode, spec_info)``, before the translator's plan."""
    return _update_draft_extend_buffers_pre_pr27545(
        self, _NO_PLAN, bs, seq_lens, forward_mode, spec_info, req_pool_indices
    )


def upstream_pr27545_draft_extend_stride(inputs: SpecIndptrInputs) -> SpecIndptrOutputs:
    """The backend with #27545 reverted in its draft-extend replay (see
    :func:`_update_draft_extend_buffers_pre_pr27545`)."""

    def patch(backend: Any) -> None:
        if compat.has(compat.TRITON_DRAFT_EXTEND_BUFFERS_PLAN):
            fn = _update_draft_extend_buffers_pre_pr27545
        else:  # 0.5.13's signature: no plan, the request rows third
            fn = _update_draft_extend_buffers_pre_pr27545_without_plan
        backend._update_draft_extend_buffers = types.MethodType(fn, backend)

    return _run(inputs, patch)
