"""SGLang's TRT-LLM MLA attention backend as implementations of ``mla-block-table``.

``TRTLLMMLABackend`` (``sglang/srt/layers/attention/trtllm_mla_backend.py``) is
built over a stand-in model runner holding a real-shaped request-to-token pool
and SGLang's own ``KVIndexTranslator`` over it (a static pool: the backend fills
its block table with ``create_flashmla_kv_indices_triton``, run under the
interpreter where there is no GPU). Each step is a real ``ForwardBatch``; a draft
extend carries a real ``EagleDraftExtendInput`` with the step's accept counts.

- eager: ``init_forward_metadata`` (target verify, draft extend v2);
- replayed: ``init_cuda_graph_state`` for the largest captured graph, the capture
  of the step's graph (``init_forward_metadata_out_graph(in_capture=True)``) over
  the runner's buffers at their fill values, then the replay's
  ``init_forward_metadata_out_graph`` over the buffers padded as the runners pad
  them: the decode runner's ``build_replay_fb_view`` (target verify), the view
  ``EAGLEDraftExtendCudaGraphRunner.execute`` builds (draft extend, its
  ``num_accept_tokens`` buffer padded with ``N``). What the graph reads is the
  metadata built at capture, whose tensors the replay refilled.

The backend's CUDA-only pieces, none of which the metadata path calls, are
stood in while it is built (:func:`stand_ins`), each its own function with its
own test: flashinfer's attention wrappers (:class:`InertWrapper`), flashinfer's
device queries (:func:`flashinfer_utils`), the zero-KV fixup's JIT build
(:func:`no_jit_fixup`), pinned host buffers (:func:`no_pin_memory`), the
parent's ``device="cuda"`` graph buffer (:func:`kv_indices_buffer`). One guard
keeps the interpreter's memory safe (:func:`guard_block_table`).

Three builds of it:

- ``run``: ``model_config.context_len`` the request-to-token table's width,
  ``max_model_len + N``, so that its graph block table holds every KV the table
  does: this keeps its verdict on #21987-class bugs apart from the open
  candidate below;
- ``run_context_len``: the production sizing, ``context_len = max_model_len``
  while SGLang's pool is ``N`` (and more) wider
  (``mem_cache/allocation_sizing.py``): the graph block table
  (``_calc_padded_blocks(context_len)`` pages) lacks the pages of a KV that
  passes the context (#29665 / #35985's class), a live finding at contexts that
  are multiples of 4096 tokens;
- ``upstream_pr21987_accept_length_layout``: the replay with #21987 reverted.

Older releases, found by looking (:mod:`.compat`): 0.5.9 and 0.5.10 have the graph
metadata as the pair ``init_forward_metadata_capture_cuda_graph`` /
``init_forward_metadata_replay_cuda_graph``, called with the arguments their runners
pass (``cuda_graph_runner.py:CudaGraphRunner.replay_prepare`` for a target verify,
``eagle_draft_extend_cuda_graph_runner.py:EAGLEDraftExtendCudaGraphRunner.replay``
for a draft extend, whose padding they copy: :func:`_replay_draft_extend_old`); the
backend reads ``model_runner.server_args`` and the table off the pool, no
``KVIndexTranslator``. A draft extend (``DRAFT_EXTEND_V2``) carries ``EagleDraftInput``
with ``accept_length`` the verify's accept counts, the bonus token included, as a
case's: 0.5.9's ``eagle_info_v2.py:EagleVerifyInputV2Mixin.sample`` ends
``accept_length.add_(1)  # Include the bonus token``, and ``eagle_worker_v2.py``
hands it on (``GenerationBatchResult(accept_lens=accept_length)``, then
``_draft_extend_for_decode``: ``forward_batch.spec_info.accept_length =
batch_result.accept_lens``; ``accept_length_cpu`` stays None). 0.5.9's replay lays
the draft extend out by it (#21987, lines 544-560); 0.5.10's by
``num_draft_tokens``. The upstream mutant re-creates #21987 in
``init_forward_metadata_out_graph``: on these releases it refuses (0.5.9 ships the
bug itself, with no fix to revert). ``run_context_len`` binds as ``run`` does.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from attnfuzz.adapters.sglang import _engine, _graphs, compat
from attnfuzz.harness.blame import under_test
from attnfuzz.reference.mla_block_table import (
    TARGET_VERIFY,
    MlaBlockTableInputs,
    MlaBlockTableOutputs,
)

NUM_SMS = 132
"""The SM count flashinfer's device query answers (a B200's); sizes a workspace only."""
MULTI_CTAS_KV_COUNTER_BYTES = 64
"""The trtllm-gen multi-CTA KV counter's size the stand-in answers; never read here."""
HEADS = 16  # the model's dimensions: the metadata does not depend on them
GUARD_ROWS = 1
"""Rows of block table past the graph's buffer (:func:`guard_block_table`)."""


def _old() -> bool:
    """Whether the installed release has the capture/replay pair (0.5.9, 0.5.10)."""
    return not compat.has(compat.TRTLLM_MLA_GRAPH)


def prepare() -> None:
    """Import SGLang and the backend before a judge forks its child."""
    _engine.prepare()
    from sglang.srt.layers.attention import trtllm_mla_backend  # noqa: F401

    if not _old():
        from sglang.srt.model_executor.runner import decode_cuda_graph_runner  # noqa: F401
        from sglang.srt.speculative import eagle_draft_extend_cuda_graph_runner  # noqa: F401


# -- stand-ins -------------------------------------------------------------------------------


class InertWrapper:
    """flashinfer's ``BatchMLAPagedAttentionWrapper`` / ``BatchPrefillWithRaggedKVCacheWrapper``
    where flashinfer is absent: the parent ``FlashInferMLAAttnBackend.__init__``
    constructs them; the metadata of a target verify or draft extend never uses
    them (the trtllm-gen kernel reads the backend's own metadata). Constructible;
    any use raises."""

    def __init__(self, *args: Any, **kwargs: Any):
        pass

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError(f"flashinfer wrapper stand-in: {name} used; SGLang called it")


def flashinfer_utils() -> Any:
    """``flashinfer`` as ``trtllm_mla_backend`` asks it in ``__init__``: the SM count
    and the multi-CTA KV counter's byte size, which size a zeroed buffer the
    decode kernel alone reads."""
    utils = _engine.StandIn(
        get_device_sm_count=lambda device: NUM_SMS,
        get_trtllm_gen_multi_ctas_kv_counter_bytes=lambda bs, heads, sms: (
            MULTI_CTAS_KV_COUNTER_BYTES
        ),
    )
    return _engine.StandIn(utils=utils)


def no_jit_fixup(dtype: torch.dtype) -> None:
    """``_jit_fixup_module``: ``__init__`` prebuilds the zero-KV prefill fixup's CUDA
    kernel (a JIT compile); only a prefill chunk runs it."""
    return None


@contextlib.contextmanager
def no_pin_memory() -> Iterator[None]:
    """``torch.zeros`` without ``pin_memory``: the parent ``__init__`` pins its
    host plan buffers, which CPU-only torch refuses; pinning changes no value."""
    real = torch.zeros

    def zeros(*args: Any, **kwargs: Any) -> torch.Tensor:
        kwargs.pop("pin_memory", None)
        return real(*args, **kwargs)

    torch.zeros = zeros
    try:
        yield
    finally:
        torch.zeros = real


def kv_indices_buffer(backend: Any, max_bs: int) -> torch.Tensor:
    """The parent's flat graph ``kv_indices`` buffer (``max_bs * context_len``), which
    its ``init_cuda_graph_state`` allocates on ``"cuda"`` unless given: flashinfer's
    decode plan reads it, never the trtllm-gen kernel."""
    return torch.zeros(max_bs * backend.max_context_len, dtype=torch.int32, device=backend.device)


def guard_block_table(backend: Any, rows: int = GUARD_ROWS) -> None:
    """Give the graph's block-table buffer ``rows`` spare rows past its end.

    ``create_flashmla_kv_indices_triton`` runs a grid over the row's width, so a KV
    longer than the row leaves its last pages unwritten (observed: the spare row
    stays untouched, tests/test_sglang_trtllm_mla.py); the spare rows keep the
    interpreter from writing outside a tensor whatever a release's grid. The buffer
    is reallocated with spare rows and the backend keeps a view of its first
    ``max_bs`` rows; every row the backend has is unchanged."""
    table = backend.decode_cuda_graph_kv_indices
    spare = torch.full((table.shape[0] + rows, table.shape[1]), -1, dtype=table.dtype)
    spare[: table.shape[0]] = table
    backend.decode_cuda_graph_kv_indices = spare.to(table.device)[: table.shape[0]]


@contextlib.contextmanager
def stand_ins() -> Iterator[None]:
    """The stand-ins above, in the modules that bind them, for as long as the block
    runs (``TRTLLMMLABackend`` is built inside); the modules are restored after."""
    from sglang.srt.layers.attention import flashinfer_mla_backend as parent
    from sglang.srt.layers.attention import trtllm_mla_backend as module

    saved = [
        (parent, "BatchMLAPagedAttentionWrapper", InertWrapper),
        (parent, "BatchPrefillWithRaggedKVCacheWrapper", InertWrapper),
        (module, "flashinfer", flashinfer_utils()),
        (module, "_jit_fixup_module", no_jit_fixup),
    ]
    missing = object()
    before = [(m, name, getattr(m, name, missing)) for m, name, _ in saved]
    for m, name, value in saved:
        setattr(m, name, value)
    try:
        with no_pin_memory():
            yield
    finally:
        for m, name, value in before:
            if value is missing:
                delattr(m, name)
            else:
                setattr(m, name, value)


# -- the backend and its steps -------------------------------------------------------------


class _KVPool:
    """The token-to-KV pool, as far as the backend reads it."""

    start_layer = 0


def _translator(inputs: MlaBlockTableInputs, pool: Any) -> Any:
    """SGLang's ``KVIndexTranslator`` over the table; None before it existed (0.5.9,
    0.5.10: the backend reads ``req_to_token_pool.req_to_token``)."""
    if not compat.has(compat.KV_INDEX_TRANSLATOR):
        return None
    from sglang.srt.mem_cache.kv_index_translator import KVIndexTranslator

    return KVIndexTranslator(
        req_to_token=inputs.req_to_token,
        token_to_kv_pool_allocator=None,
        token_to_kv_pool=pool,
        page_size=inputs.page_size,
        device=str(inputs.req_to_token.device),
    )


def _model_runner(inputs: MlaBlockTableInputs, context_len: int, server_args: Any) -> Any:
    """A stand-in ``ModelRunner``: the real pool shape and translator, a small MLA model
    of context ``context_len`` (``server_args``: what 0.5.9 and 0.5.10 read from it)."""
    table = inputs.req_to_token
    device = str(table.device)
    pool = _KVPool()
    model_config = _engine.StandIn(
        context_len=context_len,
        num_attention_heads=HEADS,
        get_num_kv_heads=lambda tp_size: 1,
        kv_lora_rank=32,
        qk_nope_head_dim=16,
        qk_rope_head_dim=8,
        v_head_dim=32,
        scaling=1.0,
        is_encoder_decoder=False,
    )
    translator = _translator(inputs, pool)
    return _engine.StandIn(
        model_config=model_config,
        device=device,
        req_to_token_pool=_engine.StandIn(size=table.shape[0] - 1, req_to_token=table),
        token_to_kv_pool=pool,
        kv_index_translator=translator,
        page_size=inputs.page_size,
        kv_cache_dtype=torch.float32,
        dtype=torch.float32,
        max_running_requests=table.shape[0] - 1,
        is_draft_worker=inputs.phase != TARGET_VERIFY,
        gpu_id=0,
        server_args=server_args,
    )


def _server_args(inputs: MlaBlockTableInputs, backend: str = "trtllm_mla") -> Any:
    """An EAGLE run's server arguments on ``backend`` (``--attention-backend``)."""
    N = inputs.next_n
    return _engine.server_args(
        attention_backend=backend,
        speculative_algorithm="EAGLE",
        speculative_num_draft_tokens=N,
        speculative_num_steps=max(N - 1, 1),
        speculative_eagle_topk=1,
        page_size=inputs.page_size,
    )


def _mode(inputs: MlaBlockTableInputs) -> Any:
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    verify = inputs.phase == TARGET_VERIFY
    return ForwardMode.TARGET_VERIFY if verify else ForwardMode.DRAFT_EXTEND_V2


def _draft_extend_input(N: int, accept: torch.Tensor) -> Any:
    """Spec v2's draft-extend input: the accept counts (the bonus token included), as
    ``num_accept_tokens``, or as ``EagleDraftInput.accept_length`` where the release
    has no ``EagleDraftExtendInput`` (0.5.9, 0.5.10: the same count, module docstring)."""
    if not compat.has(compat.EAGLE_INPUTS):
        from sglang.srt.speculative.eagle_info import EagleDraftInput

        return EagleDraftInput(accept_length=accept, num_tokens_per_req=N)
    from sglang.srt.speculative.eagle_info import EagleDraftExtendInput

    return EagleDraftExtendInput(
        num_tokens_per_req=N, num_accept_tokens=accept, num_correct_drafts=accept - 1
    )


def _step(inputs: MlaBlockTableInputs) -> Any:
    """The step's real ``ForwardBatch`` (a draft extend: as ``prepare_for_draft_extend``
    builds it, the post-write ``seq_len`` and the whole window of ``N`` rows)."""
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch

    N, R = inputs.next_n, inputs.num_reqs
    device = inputs.req_to_token.device
    seq_lens = inputs.seq_lens.to(torch.int64)
    fields: dict[str, Any] = dict(
        forward_mode=_mode(inputs),
        batch_size=R,
        input_ids=torch.zeros(R * N, dtype=torch.int64, device=device),
        req_pool_indices=inputs.req_pool_indices,
        seq_lens=seq_lens,
        seq_lens_sum=int(seq_lens.sum()),
        seq_lens_cpu=seq_lens.cpu(),
        out_cache_loc=torch.zeros(R * N, dtype=torch.int64, device=device),
        positions=torch.zeros(R * N, dtype=torch.int64, device=device),
    )
    if inputs.phase != TARGET_VERIFY:
        prefix = (seq_lens - N).clamp(min=0).to(torch.int32)
        fields.update(
            extend_seq_lens=torch.full((R,), N, dtype=torch.int32, device=device),
            extend_seq_lens_cpu=[N] * R,
            extend_prefix_lens=prefix,
            extend_prefix_lens_cpu=[int(p) for p in prefix.cpu()],
            extend_num_tokens=R * N,
            spec_info=_draft_extend_input(N, inputs.accept_lens.to(torch.int32)),
        )
    return ForwardBatch(**fields)


def _outputs(metadata: Any) -> MlaBlockTableOutputs:
    return MlaBlockTableOutputs(
        seq_lens_k=metadata.seq_lens_k,
        block_kv_indices=metadata.block_kv_indices,
        cu_seqlens_q=metadata.cu_seqlens_q,
        seq_lens_q=metadata.seq_lens_q,
        max_seq_len_q=metadata.max_seq_len_q,
    )


def _buffers(inputs: MlaBlockTableInputs, max_bs: int, fill: int) -> Any:
    """The runners' input buffers of the largest graph, with the draft extend's accept counts."""
    N, device = inputs.next_n, inputs.req_to_token.device
    accept = torch.full((max_bs,), N, dtype=torch.int32, device=device)
    return _graphs.runner_buffers(device, max_bs, N, fill, num_accept_tokens=accept)


def _capture(backend: Any, inputs: MlaBlockTableInputs, buffers: Any, bs: int) -> None:
    """Capture the graph of ``bs`` requests over the runner's buffers (fill values)."""
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch

    N = inputs.next_n
    num_tokens = bs * N
    verify = inputs.phase == TARGET_VERIFY
    fb = ForwardBatch(
        forward_mode=_mode(inputs),
        batch_size=bs,
        input_ids=buffers.input_ids[:num_tokens],
        req_pool_indices=buffers.req_pool_indices[:bs],
        seq_lens=buffers.seq_lens[:bs],
        seq_lens_cpu=buffers.seq_lens_cpu[:bs],
        out_cache_loc=buffers.out_cache_loc[:num_tokens],
        positions=buffers.positions[:num_tokens],
        seq_lens_sum=int(buffers.seq_lens[:bs].sum()),
        **(
            {}
            if verify
            else dict(
                extend_seq_lens=buffers.extend_seq_lens[:bs],
                extend_seq_lens_cpu=[N] * bs,
                spec_info=_draft_extend_input(N, buffers.num_accept_tokens[:bs]),
            )
        ),
    )
    if _old():  # CudaGraphRunner / EAGLEDraftExtendCudaGraphRunner.capture_one_batch_size
        backend.init_forward_metadata_capture_cuda_graph(
            bs, num_tokens, fb.req_pool_indices, fb.seq_lens, None, fb.forward_mode, fb.spec_info
        )
        return
    backend.init_forward_metadata_out_graph(fb, in_capture=True)


def _replay_verify(backend: Any, inputs: MlaBlockTableInputs, fb: Any, buffers: Any, fill: int):
    """The decode runner's replay prep: pad the buffers, then the replay view (the
    replay's call with the padded buffers, 0.5.9 and 0.5.10)."""
    _graphs.replay_decode_runner(
        backend, fb, buffers, inputs.graph_bs, inputs.next_n, fill, old=_old()
    )


def _replay_draft_extend_old(
    backend: Any, inputs: MlaBlockTableInputs, fb: Any, buffers: Any, fill: int
) -> None:
    """0.5.9 and 0.5.10's ``EAGLEDraftExtendCudaGraphRunner.replay``, as far as attention
    reads it: padding requests of the fill length (their ``req_pool_indices`` as the
    buffer holds them: that runner does not reset them), accept count ``N``; the
    backend's replay gets the whole buffers and ``spec_info`` with ``accept_length``
    the padded buffer's first ``bs`` rows."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    raw_bs, bs, N = fb.batch_size, inputs.graph_bs, inputs.next_n
    if bs * N != fb.input_ids.shape[0]:
        buffers.seq_lens.fill_(fill)
        buffers.out_cache_loc.zero_()
        buffers.positions.zero_()
        buffers.num_accept_tokens.fill_(N)
        buffers.extend_seq_lens.fill_(N)
    buffers.seq_lens[:raw_bs].copy_(fb.seq_lens)
    buffers.extend_seq_lens[:raw_bs].copy_(fb.extend_seq_lens)
    spec = fb.spec_info
    buffers.num_accept_tokens[:raw_bs].copy_(spec.accept_length)
    buffers.req_pool_indices[:raw_bs].copy_(fb.req_pool_indices)
    if bs != raw_bs:
        buffers.seq_lens_cpu.fill_(fill)
    buffers.seq_lens_cpu[:raw_bs].copy_(fb.seq_lens_cpu)
    spec.extend_seq_lens_cpu = [N] * bs
    spec.extend_seq_lens_tensor = buffers.extend_seq_lens[:bs]
    if bs != raw_bs:
        spec.positions = buffers.positions[: bs * N]
        spec.accept_length = buffers.num_accept_tokens[:bs]
    backend.init_forward_metadata_replay_cuda_graph(
        bs=bs,
        req_pool_indices=buffers.req_pool_indices,
        seq_lens=buffers.seq_lens,
        seq_lens_sum=fb.seq_lens_sum + (bs - raw_bs) * fill,
        encoder_lens=None,
        forward_mode=ForwardMode.DRAFT_EXTEND_V2,
        spec_info=spec,
        seq_lens_cpu=buffers.seq_lens_cpu,
    )


def _replay_draft_extend(
    backend: Any, inputs: MlaBlockTableInputs, fb: Any, buffers: Any, fill: int
) -> None:
    """``EAGLEDraftExtendCudaGraphRunner.execute``'s replay prep, as far as attention
    reads it: padding requests of the fill length on row 0, accept count ``N``."""
    raw_bs, bs, N = fb.batch_size, inputs.graph_bs, inputs.next_n
    if bs * N != fb.input_ids.shape[0]:
        buffers.seq_lens.fill_(fill)
        buffers.req_pool_indices.zero_()
        buffers.num_accept_tokens.fill_(N)
        buffers.extend_seq_lens.fill_(N)
    buffers.seq_lens[:raw_bs].copy_(fb.seq_lens)
    buffers.req_pool_indices[:raw_bs].copy_(fb.req_pool_indices)
    buffers.extend_seq_lens[:raw_bs].copy_(fb.extend_seq_lens)
    buffers.num_accept_tokens[:raw_bs].copy_(fb.spec_info.num_accept_tokens)
    if bs != raw_bs:
        buffers.seq_lens_cpu.fill_(fill)
    buffers.seq_lens_cpu[:raw_bs].copy_(fb.seq_lens_cpu)
    spec = fb.spec_info
    spec.extend_seq_lens_cpu = [N] * bs
    spec.extend_seq_lens_tensor = buffers.extend_seq_lens[:bs]
    if bs != raw_bs:
        spec.num_accept_tokens = buffers.num_accept_tokens[:bs]
        spec.num_correct_drafts = buffers.num_accept_tokens[:bs] - 1
    view = _engine.StandIn(
        batch_size=bs,
        forward_mode=fb.forward_mode,
        input_ids=fb.input_ids,
        req_pool_indices=buffers.req_pool_indices,
        seq_lens=buffers.seq_lens,
        seq_lens_sum=fb.seq_lens_sum + (bs - raw_bs) * fill,
        seq_lens_cpu=buffers.seq_lens_cpu,
        max_seq_len_host=None,
        encoder_lens=None,
        out_cache_loc=buffers.out_cache_loc[: fb.input_ids.shape[0]],
        out_cache_loc_virtual=None,
        kv_loc_plan=fb.kv_loc_plan,
        kv_loc_cols=None,
        out_cache_loc_dsv4=None,
        mamba_track_indices=None,
        spec_info=spec,
    )
    backend.init_forward_metadata_out_graph(view)


def _run(
    inputs: MlaBlockTableInputs, *, context_len: int | None = None, patch: Any = None
) -> MlaBlockTableOutputs:
    """Eager or replayed, as ``inputs.graph_bs`` says. ``context_len``: the model's
    (default: the table's width); ``patch(backend)`` may replace a method of the
    backend (an upstream mutant)."""
    prepare()
    from sglang.srt.layers.attention.trtllm_mla_backend import TRTLLMMLABackend

    width = inputs.req_to_token.shape[1]
    with _server_args(inputs) as args, _engine.device_capability((10, 0)):
        runner = _model_runner(inputs, width if context_len is None else context_len, args)
        with stand_ins():
            backend = TRTLLMMLABackend(runner, skip_prefill=False)
        if patch is not None:
            patch(backend)
        fb = _step(inputs)
        if inputs.graph_bs is None:
            backend.init_forward_metadata(fb)
            return _outputs(backend.forward_decode_metadata)
        N, max_bs, verify = inputs.next_n, max(inputs.capture_bs), inputs.phase == TARGET_VERIFY
        if verify or _old():  # the draft-extend runner of 0.5.9, 0.5.10: the backend's
            fill = backend.get_cuda_graph_seq_len_fill_value()
        else:
            from sglang.srt.speculative.eagle_draft_extend_cuda_graph_runner import (
                resolve_draft_extend_seq_len_fill_value,
            )

            fill = resolve_draft_extend_seq_len_fill_value(backend, N)
        backend.init_cuda_graph_state(
            max_bs, max_bs * N, kv_indices_buf=kv_indices_buffer(backend, max_bs)
        )
        guard_block_table(backend)
        buffers = _buffers(inputs, max_bs, fill)
        _capture(backend, inputs, buffers, inputs.graph_bs)
        if verify:
            replay = _replay_verify
        else:
            replay = _replay_draft_extend_old if _old() else _replay_draft_extend
        replay(backend, inputs, fb, buffers, fill)
        return _outputs(backend.decode_cuda_graph_metadata[inputs.graph_bs])


def run(inputs: MlaBlockTableInputs) -> MlaBlockTableOutputs:
    """``TRTLLMMLABackend``'s metadata of the step, eager or a padded graph replay, its
    ``model_config.context_len`` the request-to-token table's width (``max_model_len
    + N``): its graph block table holds every KV the table does."""
    return _run(inputs)


def run_context_len(inputs: MlaBlockTableInputs) -> MlaBlockTableOutputs:
    """The same with the production sizing, ``context_len = max_model_len``, the
    request-to-token table ``N`` wider as SGLang allocates it: a replayed KV past
    the context needs more pages than the graph's block table has."""
    return _run(inputs, context_len=inputs.context_len)


def _with_accept_length_layout(backend: Any) -> Any:
    from sglang.kernels.ops.attention.kv_indices import (
        create_flashmla_kv_indices_triton,
        get_num_kv_index_blocks_flashmla,
    )

    real = backend.init_forward_metadata_out_graph

    @under_test
    def init_forward_metadata_out_graph_pre_pr21987(fb: Any, in_capture: bool = False) -> None:
        """This release's ``init_forward_metadata_out_graph`` with #21987 reverted in
        its draft-extend-v2 replay: SGLang 0.5.9's
        ``init_forward_metadata_replay_cuda_graph`` lines 544-560 (its ``accept_length``
        is this release's ``num_accept_tokens``, the accepted tokens with the bonus
        one, and ``accept_length_cpu`` its ``num_accept_tokens_cpu``, None in a graph
        replay); capture and the other modes as the release has them."""
        if in_capture or not fb.forward_mode.is_draft_extend_v2():
            return real(fb, in_capture=in_capture)
        self, bs, spec_info = backend, fb.batch_size, fb.spec_info
        metadata = self.decode_cuda_graph_metadata[bs]
        accept_length = spec_info.num_accept_tokens[:bs]
        accept_length_cpu = getattr(spec_info, "num_accept_tokens_cpu", None)
        if accept_length_cpu:
            metadata.max_seq_len_q = max(accept_length_cpu[:bs]) + 1
            metadata.sum_seq_lens_q = sum(accept_length_cpu[:bs]) + bs
        else:
            metadata.max_seq_len_q = 1
            metadata.sum_seq_lens_q = bs
        extend_seq_lens = accept_length + 1  # pre-fix (0.5.9)
        metadata.cu_seqlens_q[1:].copy_(torch.cumsum(extend_seq_lens, dim=0, dtype=torch.int32))
        metadata.seq_lens_q.copy_(extend_seq_lens)
        seq_lens = fb.seq_lens[:bs] - metadata.seq_lens_q + metadata.max_seq_len_q
        metadata.seq_lens_k.copy_(seq_lens.to(torch.int32))
        width = metadata.block_kv_indices.shape[1]
        create_flashmla_kv_indices_triton[
            (bs, get_num_kv_index_blocks_flashmla(width, self.page_size))
        ](
            self.req_to_token,
            fb.req_pool_indices[:bs],
            seq_lens,
            None,
            metadata.block_kv_indices,
            self.req_to_token.stride(0),
            width,
            PAGED_SIZE=self.page_size,
        )
        return None

    return init_forward_metadata_out_graph_pre_pr21987


def upstream_pr21987_accept_length_layout(inputs: MlaBlockTableInputs) -> MlaBlockTableOutputs:
    """The backend (context the table's width, as :func:`run`) with #21987 reverted
    in its draft-extend replay (see :func:`_with_accept_length_layout`)."""

    def patch(backend: Any) -> None:
        backend.init_forward_metadata_out_graph = _with_accept_length_layout(backend)

    return _run(inputs, patch=patch)
