"""SGLang's DSA attention backend as implementations of ``dsa-metadata``.

``DeepseekSparseAttnBackend`` (``sglang/srt/layers/attention/dsa_backend.py``)
is built over a stand-in model runner holding a real-shaped request-to-token
pool and a DeepSeek-V3.2 ``hf_config`` (its ``index_topk`` the case's); each
step is a real ``ForwardBatch``. Its Triton kernels (``seqlens_expand_triton``,
the fused metadata kernels) run under the interpreter where there is no GPU,
recompiled without their ``assert x.is_cuda``
(:func:`attnfuzz.adapters.standins.without_cuda_asserts`).

- eager: ``init_forward_metadata`` (decode, target verify, draft extend v2, extend);
- replayed: ``init_cuda_graph_state`` for the largest captured graph, the
  capture of the step's graph (``init_forward_metadata_out_graph(in_capture=True)``)
  over the runner's buffers at their fill values, then the replay's
  ``init_forward_metadata_out_graph`` over the buffers padded as the runners pad
  them (the decode runner's ``build_replay_fb_view``; the view
  ``EAGLEDraftExtendCudaGraphRunner.execute`` builds for a draft extend). The
  replay body, ``_apply_cuda_graph_metadata``, has two paths: the torch
  fallback (``sglang-dsa``: what the backend takes off CUDA) and the fused
  Triton kernels a CUDA GPU takes (``sglang-dsa-fused``), with DeepGEMM's
  paged-MQA schedule stood in (:func:`paged_mqa_schedule`).

Older releases, found by looking (:mod:`.compat`): 0.5.9 and 0.5.10 named the
backend ``NativeSparseAttnBackend`` (``layers/attention/nsa_backend.py``), its
metadata's DSA fields ``nsa_*`` (``nsa_seqlens_expanded``, ...) and the server
arguments ``nsa_*_backend``; they read the server arguments off the model runner
and the request-to-token pool off the step. The graph's metadata is the pair
``init_forward_metadata_capture_cuda_graph`` / ``init_forward_metadata_replay_cuda_graph``,
called with the arguments ``cuda_graph_runner.py:CudaGraphRunner`` passes; there is
no fused replay (``sglang-dsa-fused`` refuses, naming the missing kernels). Their
draft-extend replay lays the rows out by ``spec_info.accept_length``, the verify's
accept counts, which a case does not carry: such a case is declined (:func:`declines`).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch
from attnfuzz.adapters.sglang import _engine, _graphs, compat
from attnfuzz.adapters.standins import without_cuda_asserts
from attnfuzz.harness.blame import under_test
from attnfuzz.reference import dsa_metadata as ref
from attnfuzz.reference.batch import Case
from attnfuzz.reference.dsa_metadata import (
    DECODE,
    DRAFT_EXTEND,
    EXTEND,
    TARGET_VERIFY,
    DsaMetadataInputs,
    DsaMetadataOutputs,
)

FUSED_KERNELS = ("_fused_decode_metadata", "_fused_verify_metadata", "_fused_draft_extend_metadata")
"""The backend's fused metadata kernels (``kernels/ops/attention/dsa/metadata.py``'s wrappers)."""
NUM_SMS = 4
"""The SM count the fused replay's schedule is sized by (a small GPU's)."""
SPLIT_KV = 256
"""Keys per unit of the paged-MQA schedule (DeepGEMM's ``SPLIT_KV = block_kv * 4``)."""


_without_cuda_asserts = functools.cache(without_cuda_asserts)
"""Each wrapper recompiled once per process."""


def _nsa() -> bool:
    """Whether the installed release has the backend in its older form (0.5.9, 0.5.10)."""
    return not compat.has(compat.DSA_BACKEND)


def _backend_module() -> types.ModuleType:
    """The backend's module: ``dsa_backend``, or ``nsa_backend`` (0.5.9, 0.5.10)."""
    api = compat.NSA_BACKEND if _nsa() else compat.DSA_BACKEND
    return importlib.import_module(api.module)


def _backend_class() -> type:
    api = compat.NSA_BACKEND if _nsa() else compat.DSA_BACKEND
    return getattr(_backend_module(), api.attr.split(".")[0])


def prepare() -> None:
    """Import SGLang and the backend before a judge forks its child."""
    _engine.prepare()
    with _engine.device_capability():
        _backend_module()
    if not _nsa():
        from sglang.srt.model_executor.runner import decode_cuda_graph_runner  # noqa: F401


def declines(case: Case) -> str | None:
    """Why the installed release runs ``case``'s step through other code, else None.

    A replayed draft extend, where the backend's replay reads ``spec_info.accept_length``
    (0.5.9 and 0.5.10's ``init_forward_metadata_replay_cuda_graph``: the rows laid out by
    the verify's accept counts, which the draft-extend runner copies in): a case is the
    spec-v2 window of ``next_n`` rows per request and carries no accept counts.
    """
    if ref.phase_of(case) != DRAFT_EXTEND or ref.graph_bs(case) is None or not _nsa():
        return None
    prepare()
    replay = _backend_class().init_forward_metadata_replay_cuda_graph
    if "spec_info.accept_length" not in inspect.getsource(replay):
        return None
    return (
        f"SGLang {compat.installed_version()}'s NativeSparseAttnBackend replays a draft "
        "extend laid out by spec_info.accept_length (the verify's accept counts), which "
        "a dsa-metadata case (the v2 window, next_n rows per request) does not carry"
    )


def paged_mqa_schedule(context_lens: torch.Tensor, block_kv: int, num_sms: int) -> torch.Tensor:
    """DeepGEMM's ``get_paged_mqa_logits_metadata`` where DeepGEMM cannot run:
    ``[num_sms + 1, 2]`` int32, row ``s`` the (query row, ``SPLIT_KV`` block) at
    which SM ``s`` starts, the blocks of all rows shared out evenly; the last
    row is the end. Only the paged-MQA logits kernel reads it, never the
    metadata ``dsa-metadata`` compares."""
    lens = context_lens.reshape(-1).to(torch.int64).cpu()
    blocks = [-(-int(n) // SPLIT_KV) for n in lens]
    total = sum(blocks)
    starts = []
    for s in range(num_sms + 1):
        unit, row = -(-total * s // num_sms) if num_sms else total, 0
        while row < len(blocks) and unit >= blocks[row] and blocks[row] > 0:
            unit -= blocks[row]
            row += 1
        starts.append((row, unit if row < len(blocks) else 0))
    return torch.tensor(starts, dtype=torch.int32, device=context_lens.device)


@contextlib.contextmanager
def fused_replay() -> Iterator[None]:
    """The backend as a CUDA GPU runs it: ``is_cuda()`` answers True inside its
    module, DeepGEMM's schedule and SM count stood in (:func:`paged_mqa_schedule`)."""
    dsa_backend = _backend_module()
    saved = {
        name: getattr(dsa_backend, name)
        for name in ("is_cuda", "resolve_paged_mqa_logits_metadata_fn", "resolve_num_sms")
    }
    dsa_backend.is_cuda = lambda: True
    dsa_backend.resolve_paged_mqa_logits_metadata_fn = lambda: paged_mqa_schedule
    dsa_backend.resolve_num_sms = lambda: NUM_SMS
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(dsa_backend, name, value)


@contextlib.contextmanager
def _kernels_without_cuda_asserts() -> Iterator[None]:
    """SGLang's Triton wrappers the backend calls, without their ``assert x.is_cuda``."""
    dsa_backend = _backend_module()
    real = getattr(dsa_backend, "seqlens_expand_triton", None)
    if real is None:  # 0.5.9 expands in torch
        yield
        return
    dsa_backend.seqlens_expand_triton = _without_cuda_asserts(real)
    try:
        yield
    finally:
        dsa_backend.seqlens_expand_triton = real


def _model_runner(inputs: DsaMetadataInputs, server_args: Any = None) -> Any:
    """A stand-in ``ModelRunner``: the real pool shape, a DeepSeek-V3.2 DSA model
    (``server_args``: what 0.5.9 and 0.5.10 read from the runner)."""
    from transformers import PretrainedConfig

    table = inputs.req_to_token
    hf_config = PretrainedConfig(
        architectures=["DeepseekV32ForCausalLM"], index_topk=inputs.index_topk
    )
    model_config = _engine.StandIn(
        hf_config=hf_config,
        context_len=inputs.context_len,
        num_attention_heads=4,
        qk_nope_head_dim=4,
        kv_lora_rank=4,
        qk_rope_head_dim=4,
    )
    pool = _engine.StandIn(
        dsa_kv_cache_store_fp8=False,
        nsa_kv_cache_store_fp8=False,  # 0.5.9, 0.5.10
        kv_cache_dim=8,
        dtype=torch.bfloat16,
        size=int(table.numel()),
        page_size=inputs.page_size,
    )
    old = {} if server_args is None else {"server_args": server_args}
    return _engine.StandIn(
        **old,
        device=str(table.device),
        page_size=inputs.page_size,
        model_config=model_config,
        token_to_kv_pool=pool,
        req_to_token_pool=_engine.StandIn(size=table.shape[0], req_to_token=table),
        hisparse_coordinator=None,
        is_draft_worker=inputs.phase == DRAFT_EXTEND,
        kv_cache_dtype=torch.bfloat16,
        max_running_requests=table.shape[0],
    )


def _server_args(inputs: DsaMetadataInputs) -> Any:
    speculative: dict[str, Any] = {}
    if inputs.phase in (TARGET_VERIFY, DRAFT_EXTEND):
        N = inputs.next_n
        speculative = dict(
            speculative_algorithm="EAGLE",
            speculative_num_draft_tokens=N,
            speculative_num_steps=max(N - 1, 1),
            speculative_eagle_topk=1,
        )
    if not compat.has(compat.DSA_SERVER_ARGS):  # 0.5.9, 0.5.10: nsa_*, no topk backends
        return _engine.server_args(
            attention_backend="nsa",
            nsa_decode_backend="flashmla_sparse",
            nsa_prefill_backend="flashmla_sparse",
            **speculative,
        )
    return _engine.server_args(
        attention_backend="dsa",
        dsa_decode_backend="flashmla_sparse",
        dsa_prefill_backend="flashmla_sparse",
        dsa_topk_backend="torch",
        speculative_dsa_topk_backend="torch",
        **speculative,
    )


_MODES = {
    DECODE: "DECODE",
    TARGET_VERIFY: "TARGET_VERIFY",
    DRAFT_EXTEND: "DRAFT_EXTEND_V2",
    EXTEND: "EXTEND",
}


def _step(inputs: DsaMetadataInputs, runner: Any) -> Any:
    """The step's real ``ForwardBatch`` (0.5.9 and 0.5.10 read the pools off it)."""
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

    device = inputs.req_to_token.device
    seq_lens = inputs.seq_lens.to(torch.int64)
    q_lens = inputs.extend_seq_lens.to(torch.int32)
    num_tokens = int(q_lens.sum())
    fields: dict[str, Any] = dict(
        forward_mode=getattr(ForwardMode, _MODES[inputs.phase]),
        batch_size=inputs.num_reqs,
        input_ids=torch.zeros(num_tokens, dtype=torch.int64, device=device),
        req_pool_indices=inputs.req_pool_indices,
        seq_lens=seq_lens,
        seq_lens_sum=int(seq_lens.sum()),
        seq_lens_cpu=seq_lens.cpu(),
        out_cache_loc=torch.zeros(num_tokens, dtype=torch.int64, device=device),
    )
    if _nsa():
        fields.update(
            req_to_token_pool=runner.req_to_token_pool, token_to_kv_pool=runner.token_to_kv_pool
        )
    if inputs.phase in (DRAFT_EXTEND, EXTEND):
        prefix = (seq_lens - q_lens).to(torch.int32)
        fields.update(
            extend_seq_lens=q_lens,
            extend_seq_lens_cpu=[int(q) for q in q_lens.cpu()],
            extend_prefix_lens=prefix,
            extend_prefix_lens_cpu=[int(p) for p in prefix.cpu()],
            extend_num_tokens=num_tokens,
        )
    return ForwardBatch(**fields)


def _sparse(metadata: Any, name: str) -> Any:
    """The metadata's sparse field ``dsa_<name>``, or ``nsa_<name>`` (0.5.9, 0.5.10)."""
    if hasattr(metadata, f"dsa_{name}"):
        return getattr(metadata, f"dsa_{name}")
    return getattr(metadata, f"nsa_{name}")


def _outputs(backend: Any) -> DsaMetadataOutputs:
    m = backend.forward_metadata
    ks, ke = m.indexer_k_start_end if m.indexer_k_start_end is not None else (None, None)
    return DsaMetadataOutputs(
        cache_seqlens=m.cache_seqlens_int32,
        cu_seqlens_k=m.cu_seqlens_k,
        cu_seqlens_q=m.cu_seqlens_q,
        seqlens_expanded=_sparse(m, "seqlens_expanded"),
        dsa_cache_seqlens=_sparse(m, "cache_seqlens_int32"),
        dsa_cu_seqlens_k=_sparse(m, "cu_seqlens_k"),
        page_table_1=m.page_table_1,
        real_page_table=m.real_page_table,
        indexer_ks=ks,
        indexer_ke=ke,
        token_to_batch_idx=m.token_to_batch_idx,
    )


def _capture(backend: Any, mode: Any, buffers: Any, bs: int, rows: int) -> None:
    """Capture the graph of ``bs`` requests over the runner's buffers (fill values)."""
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch

    num_tokens = bs * rows
    if _nsa():  # CudaGraphRunner.capture_one_batch_size, 0.5.9 and 0.5.10
        backend.init_forward_metadata_capture_cuda_graph(
            bs, num_tokens, buffers.req_pool_indices[:bs], buffers.seq_lens[:bs], None, mode, None
        )
        return
    fb = ForwardBatch(
        forward_mode=mode,
        batch_size=bs,
        input_ids=buffers.input_ids[:num_tokens],
        req_pool_indices=buffers.req_pool_indices[:bs],
        seq_lens=buffers.seq_lens[:bs],
        seq_lens_cpu=buffers.seq_lens_cpu[:bs],
        out_cache_loc=buffers.out_cache_loc[:num_tokens],
        seq_lens_sum=int(buffers.seq_lens[:bs].sum()),
    )
    backend.init_forward_metadata_out_graph(fb, in_capture=True)


def _replay_draft_extend(backend: Any, inputs: DsaMetadataInputs, fb: Any, buffers: Any, fill: int):
    """The view ``EAGLEDraftExtendCudaGraphRunner.execute`` builds, over the padded buffers."""
    bs, raw_bs, rows = inputs.graph_bs, fb.batch_size, inputs.next_n
    _graphs.pad_requests(buffers, fb, bs, fill)
    buffers.extend_seq_lens[:raw_bs].copy_(fb.extend_seq_lens)
    view = _engine.StandIn(
        batch_size=bs,
        forward_mode=fb.forward_mode,
        input_ids=buffers.input_ids[: bs * rows],
        req_pool_indices=buffers.req_pool_indices,
        seq_lens=buffers.seq_lens,
        seq_lens_sum=fb.seq_lens_sum + (bs - raw_bs) * fill,
        seq_lens_cpu=buffers.seq_lens_cpu,
        out_cache_loc=buffers.out_cache_loc[: bs * rows],
        spec_info=None,
    )
    backend.init_forward_metadata_out_graph(view)


def _run(
    inputs: DsaMetadataInputs,
    *,
    fused: bool = False,
    patch: Callable[[Any], None] | None = None,
) -> DsaMetadataOutputs:
    """Eager or replayed, as ``inputs.graph_bs`` says; ``fused``: the replay's
    fused Triton kernels (CUDA's path) instead of the torch fallback;
    ``patch(backend)`` may replace a method of the backend (an upstream mutant)."""
    prepare()
    backend_class = _backend_class()
    paths = fused_replay() if fused and inputs.graph_bs is not None else contextlib.nullcontext()
    with (
        _server_args(inputs) as args,
        _engine.device_capability(),
        _kernels_without_cuda_asserts(),
        paths,
    ):
        runner = _model_runner(inputs, args if _nsa() else None)
        backend = backend_class(runner)
        for name in FUSED_KERNELS:
            if hasattr(backend, name):  # none before the fused replay
                setattr(backend, name, _without_cuda_asserts(getattr(backend, name)))
        if patch is not None:
            patch(backend)
        fb = _step(inputs, runner)
        if inputs.graph_bs is None:
            backend.init_forward_metadata(fb)
            return _outputs(backend)
        rows = 1 if inputs.phase == DECODE else inputs.next_n
        max_bs = max(inputs.capture_bs)
        fill = backend.get_cuda_graph_seq_len_fill_value()
        backend.init_cuda_graph_state(max_bs, max_bs * rows)
        buffers = _graphs.runner_buffers(inputs.req_to_token.device, max_bs, rows, fill)
        _capture(backend, fb.forward_mode, buffers, inputs.graph_bs, rows)
        if inputs.phase == DRAFT_EXTEND and not _nsa():
            _replay_draft_extend(backend, inputs, fb, buffers, fill)
        else:  # the decode runner's (0.5.9 and 0.5.10: its replay_prepare)
            _graphs.replay_decode_runner(
                backend, fb, buffers, inputs.graph_bs, rows, fill, old=_nsa()
            )
        return _outputs(backend)


def run(inputs: DsaMetadataInputs) -> DsaMetadataOutputs:
    """The backend's metadata of the step: eager, or a padded graph replay by the
    torch fallback (the path off CUDA)."""
    return _run(inputs)


def run_fused(inputs: DsaMetadataInputs) -> DsaMetadataOutputs:
    """The backend's metadata of the step: eager, or a padded graph replay by the
    fused Triton kernels (the path a CUDA GPU takes)."""
    return _run(inputs, fused=True)


def _with_context_len_table(init_cuda_graph_state: Callable[..., Any]) -> Callable[..., Any]:
    @under_test
    def init_cuda_graph_state_pre_pr19016(max_bs: int, max_num_tokens: int) -> None:
        """``init_cuda_graph_state`` of this release with #19016 reverted: the
        graph's page table allocated as SGLang 0.5.9's ``nsa_backend.py`` did,
        ``torch.zeros(max_num_tokens, self.max_context_len, ...)``, the model's
        context length wide instead of the request-to-token table's width."""
        init_cuda_graph_state(max_bs, max_num_tokens)
        self = init_cuda_graph_state.__self__
        metadata = self.decode_cuda_graph_metadata
        if metadata["page_table"] is not None:
            metadata["page_table"] = torch.zeros(
                max_num_tokens, self.max_context_len, dtype=torch.int32, device=self.device
            )  # pre-fix (0.5.9)

    return init_cuda_graph_state_pre_pr19016


def upstream_pr19016_context_len_table(inputs: DsaMetadataInputs) -> DsaMetadataOutputs:
    """The backend with #19016 reverted in its graph state, replayed by the fused
    kernels (see :func:`_with_context_len_table`)."""

    def patch(backend: Any) -> None:
        backend.init_cuda_graph_state = _with_context_len_table(backend.init_cuda_graph_state)

    return _run(inputs, fused=True, patch=patch)
