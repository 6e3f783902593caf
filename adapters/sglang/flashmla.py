"""SGLang's FlashMLA attention backend as implementations of ``mla-block-table``.

``FlashMLABackend`` (``sglang/srt/layers/attention/flashmla_backend.py``, a
``FlashInferMLAAttnBackend``) runs a target verify and a draft extend (spec v2) as a
decode of ``N`` query rows a request over pages of 64 tokens (its ``PAGE_SIZE``;
``arg_groups/overrides.py:_mla_backend_page_constraints`` makes any other page 64). It
is built over ``sglang-trtllm-mla``'s stand-in model runner and real ``ForwardBatch``
(:mod:`.trtllm_mla`: the request-to-token table, SGLang's ``KVIndexTranslator``, the
runners' buffers and padding), and runs unchanged:

- eager: ``init_forward_metadata`` (its block table by
  ``create_flashmla_kv_indices_triton``, under the interpreter where there is no GPU;
  the split-KV schedule by ``flash_mla_interface.get_mla_metadata``);
- replayed: ``init_cuda_graph_state`` for the largest captured graph, the capture of the
  step's graph and the replay's ``init_forward_metadata_out_graph``
  (``_apply_decode_target_verify_metadata``), over the buffers the runners pad.

What the kernel reads (``forward_extend``'s ``flash_mla_with_kvcache`` call):
``block_table = forward_metadata.block_kv_indices[:bs]``; ``cache_seqlens`` the forward
batch's ``seq_lens + num_draft_tokens`` in a target verify (in a replay the graph's
batch, the runner's padded buffers) and ``forward_metadata.seq_lens_k`` in a draft
extend; the queries dense, ``q.view(bs, -1, ...)`` (a verify: no layout) and
``q_3d.view(bs, window, ...)`` with ``window = num_draft_tokens`` (a draft extend: that
dense layout, from the backend's own window).

Stood in where there is no GPU: the ``flash_mla`` wheel (the package of
``sglang-deepseek-v4``, :data:`.runner_step_deepseek_v4.FLASH_MLA`, whose
``get_mla_decoding_metadata`` gives the legacy schedule's shapes); the compute
capability (9.0: FlashMLA's dense decode is SM90's); the device's SM count and its
``"cuda"`` allocations in ``init_cuda_graph_state`` (:func:`_on_device`); and
``sglang-trtllm-mla``'s stand-ins for the FlashInfer MLA parent (:func:`.trtllm_mla.stand_ins`).

Two builds, as ``sglang-trtllm-mla``'s: ``run`` (``model_config.context_len`` the
request-to-token table's width, ``max_model_len + N``) and ``run_context_len`` (the
production sizing, ``context_len = max_model_len``: the graph's block table has
``(context_len + 64) // 64`` pages a row).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from attnfuzz.adapters.sglang import _engine, trtllm_mla
from attnfuzz.adapters.sglang.runner_step_deepseek_v4 import FLASH_MLA, NUM_SMS
from attnfuzz.adapters.sglang.runner_step_flashinfer import _OnDevice as OnDevice
from attnfuzz.adapters.standins import in_sys_modules
from attnfuzz.reference.mla_block_table import (
    TARGET_VERIFY,
    MlaBlockTableInputs,
    MlaBlockTableOutputs,
)

PAGE_SIZE = 64
"""``flashmla_backend.PAGE_SIZE``: the one page size SGLang runs FlashMLA with."""


@contextlib.contextmanager
def vendor() -> Iterator[None]:
    """``flash_mla`` importable: the wheel where it imports, else the stand-in package."""
    try:
        import flash_mla  # noqa: F401
    except ImportError:
        with in_sys_modules(FLASH_MLA):
            yield
        return
    yield


def prepare() -> None:
    """Import SGLang and the backend before a judge forks its child."""
    trtllm_mla.prepare()
    with vendor():
        from sglang.srt.layers.attention import flashmla_backend  # noqa: F401


class _OnDevice(OnDevice):
    """``torch`` as ``flashmla_backend`` sees it where there is no CUDA: its ``"cuda"``
    graph buffers on the step's device (:class:`.runner_step_flashinfer._OnDevice`), and
    the device's SM count (``NUM_SMS``), which sizes the schedule's buffer."""

    def __init__(self, device: torch.device) -> None:
        super().__init__(device)
        props = _engine.StandIn(multi_processor_count=NUM_SMS)
        self.cuda = _engine.StandIn(get_device_properties=lambda device=None: props)


@contextlib.contextmanager
def _on_device(device: torch.device) -> Iterator[None]:
    """:class:`_OnDevice` as ``flashmla_backend``'s ``torch`` for the block, where there
    is no CUDA."""
    if torch.cuda.is_available():
        yield
        return
    from sglang.srt.layers.attention import flashmla_backend as module

    real = module.torch
    module.torch = _OnDevice(device)
    try:
        yield
    finally:
        module.torch = real


def _guard(backend: Any, rows: int = trtllm_mla.GUARD_ROWS) -> None:
    """The graph's block table with ``rows`` spare rows past its end, as
    :func:`.trtllm_mla.guard_block_table` gives TRT-LLM MLA's: the interpreter never
    writes outside a tensor; every row the backend has is unchanged."""
    table = backend.cuda_graph_kv_indices
    spare = torch.full((table.shape[0] + rows, table.shape[1]), -1, dtype=table.dtype)
    spare[: table.shape[0]] = table
    backend.cuda_graph_kv_indices = spare.to(table.device)[: table.shape[0]]


def _outputs(backend: Any, inputs: MlaBlockTableInputs, seq_lens: torch.Tensor) -> Any:
    """What ``forward_extend`` hands ``flash_mla_with_kvcache`` (module docstring), for a
    forward batch of ``seq_lens`` (the graph's, padding included, in a replay)."""
    metadata, bs = backend.forward_metadata, seq_lens.shape[0]
    if inputs.phase == TARGET_VERIFY:
        kv = seq_lens.to(torch.int32) + backend.num_draft_tokens
        return MlaBlockTableOutputs(kv, metadata.block_kv_indices[:bs], None, None, None)
    window = backend.num_draft_tokens
    return MlaBlockTableOutputs(
        seq_lens_k=metadata.seq_lens_k,
        block_kv_indices=metadata.block_kv_indices[:bs],
        cu_seqlens_q=torch.arange(0, bs * window + 1, window, dtype=torch.int32),
        seq_lens_q=torch.full((bs,), window, dtype=torch.int32),
        max_seq_len_q=int(window),
    )


def _run(inputs: MlaBlockTableInputs, *, context_len: int | None = None) -> MlaBlockTableOutputs:
    """Eager or replayed, as ``inputs.graph_bs`` says. ``context_len``: the model's
    (default: the table's width)."""
    prepare()
    width = inputs.req_to_token.shape[1]
    device = inputs.req_to_token.device
    server = trtllm_mla._server_args(inputs, "flashmla")
    with vendor(), server as args, _engine.device_capability((9, 0)):
        from sglang.srt.layers.attention.flashmla_backend import FlashMLABackend

        context = width if context_len is None else context_len
        runner = trtllm_mla._model_runner(inputs, context, args)
        with trtllm_mla.stand_ins():
            backend = FlashMLABackend(runner, skip_prefill=False)
        fb = trtllm_mla._step(inputs)
        if inputs.graph_bs is None:
            backend.init_forward_metadata(fb)
            return _outputs(backend, inputs, fb.seq_lens)
        N, max_bs = inputs.next_n, max(inputs.capture_bs)
        verify = inputs.phase == TARGET_VERIFY
        if verify:
            fill = backend.get_cuda_graph_seq_len_fill_value()
        else:
            from sglang.srt.speculative.eagle_draft_extend_cuda_graph_runner import (
                resolve_draft_extend_seq_len_fill_value,
            )

            fill = resolve_draft_extend_seq_len_fill_value(backend, N)
        with _on_device(device):
            backend.init_cuda_graph_state(max_bs, max_bs * N)
        _guard(backend)
        buffers = trtllm_mla._buffers(inputs, max_bs, fill)
        trtllm_mla._capture(backend, inputs, buffers, inputs.graph_bs)
        replay = trtllm_mla._replay_verify if verify else trtllm_mla._replay_draft_extend
        replay(backend, inputs, fb, buffers, fill)
        return _outputs(backend, inputs, buffers.seq_lens[: inputs.graph_bs])


def run(inputs: MlaBlockTableInputs) -> MlaBlockTableOutputs:
    """``FlashMLABackend``'s metadata of the step, eager or a padded graph replay, its
    ``model_config.context_len`` the request-to-token table's width (``max_model_len
    + N``)."""
    return _run(inputs)


def run_context_len(inputs: MlaBlockTableInputs) -> MlaBlockTableOutputs:
    """The same with the production sizing, ``context_len = max_model_len``, the
    request-to-token table ``N`` wider as SGLang allocates it."""
    return _run(inputs, context_len=inputs.context_len)
