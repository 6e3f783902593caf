"""SGLang's decode CUDA-graph runner filling its input buffers for a replay, as the
implementation ``sglang`` of ``graph-input-padding``.

What runs, unchanged (SGLang 0.5.23):

- ``model_executor/runner_utils/buffers.py``: ``DecodeInputBuffers.create``, the
  runner's persistent buffers, made as ``DecodeCudaGraphRunner.__init__`` makes
  them (``model_executor/runner/decode_cuda_graph_runner.py``);
- ``model_executor/cuda_graph_buffer_registry.py``: ``build_decode_registry``
  adopting those buffers (``source=``), and ``CudaGraphBufferRegistry.fill_from``,
  which ``DecodeCudaGraphRunner.load_batch`` calls on every replay: each slot's
  padded rows reset by its padding policy, then the step's rows copied;
- ``decode_cuda_graph_runner.py``: ``build_replay_fb_view``, the view the
  attention backend's replay prep reads (``batch_size``, ``num_padding``,
  ``seq_lens_sum`` and the buffers' padded slices);
- ``model_executor/forward_batch_info.py``: a real ``ForwardBatch`` as the step.

Stand-ins: none of a model. The buffers are made once per runner shape, as at
start-up, in host memory (the fill is plain torch); each call first writes the
case's stale content (what an earlier step left) into them, so that what the
padding must overwrite is there to be seen. ``share_buffers`` (the process-wide
pool) is not called: it would alias the buffers of two runner shapes.

The sliding-window slots. SGLang 0.5.11 and 0.5.12 kept them in the runner, as
``DecodeInputBuffers.out_cache_loc_swa``, zeroed with ``out_cache_loc`` on a
padded step since #24743. 0.5.23 has no such runner buffer: a backend that writes
a sliding-window pool keeps its own and zeroes the rows past the step's tokens
(``flashinfer_backend.py``, ``init_forward_metadata_out_graph``,
``cuda_graph_swa_out_cache_loc[n:].zero_()``), code that cannot run without
FlashInfer. The adapter therefore registers the slot 0.5.12's runner had, as a
``GraphSlot`` of SGLang's own registry with the policy SGLang gives the
full-pool slots (``ZERO``: padded rows to the padding slot 0), and SGLang's
``fill_from`` fills it with the others. The slot's declaration is the adapter's;
the fill is SGLang's.

Older releases, found by looking (:mod:`.compat`): 0.5.11 and 0.5.12 had no
registry. Their runner (``model_executor/cuda_graph_runner.py``) made its buffers
with ``DecodeInputBuffers.create`` (``is_hybrid_swa=True``: a sliding-window
buffer of their own) and filled them with ``populate_from_forward_batch``, called
as ``CudaGraphRunner.replay_prepare`` calls it, which then handed the backend
``bs``, the buffers' first ``bs`` rows and ``seq_lens_sum + (bs - raw_bs) * fill``
inline (no ``build_replay_fb_view``): the view is those values (:func:`_run_populate`).
0.5.13 had the registry, adopting the namespace ``cuda_graph_runner.py``'s
``_allocate_decode_buffers`` makes, and ``build_replay_fb_view`` in that module;
0.5.14 to 0.5.2x ``runner_utils/buffers.py``'s ``DecodeInputBuffers.create``, whose
arguments were renamed on the way (``vocab_size`` / ``dp_size`` /
``num_tokens_per_bs`` before the logits buffer / ``num_dp_ranks`` /
``num_tokens_per_req``): each is called with the arguments it takes
(:func:`_decode_buffers`, :func:`_replay_fb_view`).

A defect these releases ship (#24401): up to 0.5.13, the padded rows of
``positions`` (and, before the registry, of ``req_pool_indices``) keep what an
earlier step left; 0.5.14's registry gives ``positions`` the policy ``ZERO``.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import attnfuzz.kernels._triton  # noqa: F401  (TRITON_INTERPRET before SGLang is imported)
import torch
from attnfuzz.adapters.sglang import _engine, compat
from attnfuzz.reference.graph_input_padding import (
    REQUEST_FIELDS,
    GraphInputPaddingInputs,
    GraphInputPaddingOutputs,
)

SWA = "out_cache_loc_swa"
_HIDDEN_SIZE = 8  # the runner's input_embeds width: never read here


def prepare() -> None:
    _engine.prepare()
    if _populate() or not compat.has(compat.GRAPH_RUNNER_REGISTRY[0]):  # <= 0.5.13
        import sglang.srt.model_executor.cuda_graph_runner  # noqa: F401

        if _populate():
            return
    import sglang.srt.model_executor.cuda_graph_buffer_registry  # noqa: F401

    if compat.has(compat.REPLAY_FB_VIEW):
        import sglang.srt.model_executor.runner.decode_cuda_graph_runner  # noqa: F401


def _populate() -> bool:
    """Whether the installed release fills the buffers by ``populate_from_forward_batch``
    (0.5.11, 0.5.12) rather than by the buffer registry."""
    return not compat.has(compat.DECODE_REGISTRY) and compat.has(compat.DECODE_POPULATE)


def _decode_buffers(**arguments: Any) -> Any:
    """The runner's decode buffers: ``runner_utils.buffers.DecodeInputBuffers.create``
    (0.5.14 on), or 0.5.13's ``cuda_graph_runner._allocate_decode_buffers``, given the
    arguments it takes of ``arguments`` (which name both releases' spellings)."""
    import importlib
    import inspect

    api = compat.GRAPH_RUNNER_REGISTRY[0]
    if not compat.has(api):
        api = compat.GRAPH_RUNNER_REGISTRY_0_5_13[0]
    owner: Any = importlib.import_module(api.module)
    for name in api.attr.split("."):
        owner = getattr(owner, name)
    taken = inspect.signature(owner).parameters
    return owner(**{k: v for k, v in arguments.items() if k in taken})


def _replay_fb_view(**arguments: Any) -> Any:
    """The decode runner's ``build_replay_fb_view``: ``runner/decode_cuda_graph_runner.py``,
    or ``cuda_graph_runner.py`` (0.5.13); ``global_num_tokens_cpu`` where it takes it."""
    import importlib

    api = compat.REPLAY_FB_VIEW if compat.has(compat.REPLAY_FB_VIEW) else compat.OLD_REPLAY_FB_VIEW
    if not compat.has(compat.REPLAY_FB_VIEW_GLOBAL):
        arguments.pop("global_num_tokens_cpu", None)
    return getattr(importlib.import_module(api.module), api.attr)(**arguments)


@cache
def _runner(
    device: torch.device, max_bs: int, width: int, fill: int, swa_policy: str | None
) -> tuple[Any, Any]:
    """The runner's ``DecodeInputBuffers`` and the registry adopting them, for one shape
    (``swa_policy``: the sliding-window slot's padding policy, None without the pool)."""
    from sglang.srt.model_executor.cuda_graph_buffer_registry import (
        GraphSlot,
        PaddingPolicy,
        build_decode_registry,
    )

    max_num_token = max_bs * width
    with _engine.server_args():
        buffers = _decode_buffers(
            device=device,
            max_bs=max_bs,
            max_num_token=max_num_token,
            hidden_size=_HIDDEN_SIZE,
            next_token_logits_buffer=torch.zeros((max_num_token, 1), device=device),
            vocab_size=1,  # the logits buffer's width (0.5.13, 0.5.14): never read here
            dtype=torch.float32,
            num_dp_ranks=1,
            dp_size=1,
            pp_size=1,
            is_encoder_decoder=False,
            require_mlp_tp_gather=False,
            seq_len_fill_value=fill,
            encoder_len_fill_value=0,
            num_tokens_per_req=width,
            num_tokens_per_bs=width,
            cache_loc_dtype=torch.int64,  # DecodeCudaGraphRunner._cache_loc_dtype
            enable_mamba_track=False,
        )
        registry = build_decode_registry(
            device=device,
            max_bs=max_bs,
            max_num_token=max_num_token,
            seq_len_fill_value=fill,
            cache_loc_dtype=torch.int64,
            source=buffers,
        )
    if swa_policy is not None:
        registry.register_slot(
            GraphSlot(
                SWA,
                lambda _bs, mt: (mt,),
                torch.int64,
                axis="tokens",
                padding_policy=PaddingPolicy(swa_policy),
            ),
            bind=torch.zeros(max_num_token, dtype=torch.int64, device=device),
        )
    return buffers, registry


def _forward_batch(inputs: GraphInputPaddingInputs) -> Any:
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

    step = inputs.step
    mode = ForwardMode.DECODE if inputs.tokens_per_req == 1 else ForwardMode.TARGET_VERIFY
    batch = ForwardBatch(
        forward_mode=mode,
        batch_size=inputs.raw_bs,
        input_ids=step["input_ids"],
        req_pool_indices=step["req_pool_indices"],
        seq_lens=step["seq_lens"],
        out_cache_loc=step["out_cache_loc"],
        seq_lens_sum=inputs.seq_lens_sum,
        positions=step["positions"],
        seq_lens_cpu=step["seq_lens_cpu"],
    )
    if SWA in step:  # the field 0.5.11 and 0.5.12's ForwardBatch had
        batch.out_cache_loc_swa = step[SWA]
    return batch


@cache
def _populate_buffers(device: torch.device, max_bs: int, width: int, fill: int, swa: bool) -> Any:
    """0.5.11 and 0.5.12's ``DecodeInputBuffers``, made as ``CudaGraphRunner.__init__``
    makes them, for one shape (``swa``: a hybrid sliding-window pool)."""
    import inspect

    from sglang.srt.model_executor.cuda_graph_runner import DecodeInputBuffers

    max_num_token = max_bs * width
    arguments = dict(
        device=device,
        max_bs=max_bs,
        max_num_token=max_num_token,
        hidden_size=_HIDDEN_SIZE,
        vocab_size=1,  # the logits buffer's width: never read here
        dtype=torch.float32,
        dp_size=1,
        pp_size=1,
        is_encoder_decoder=False,
        require_mlp_tp_gather=False,
        seq_len_fill_value=fill,
        encoder_len_fill_value=0,
        num_tokens_per_bs=width,
        cache_loc_dtype=torch.int64,  # CudaGraphRunner._cache_loc_dtype
        enable_mamba_track=False,
        is_hybrid_swa=swa,
    )
    taken = inspect.signature(DecodeInputBuffers.create).parameters
    with _engine.server_args():
        return DecodeInputBuffers.create(**{k: v for k, v in arguments.items() if k in taken})


def _run_populate(inputs: GraphInputPaddingInputs) -> GraphInputPaddingOutputs:
    """0.5.11 and 0.5.12: ``CudaGraphRunner.replay_prepare``'s fill of its buffers."""
    device = inputs.step["input_ids"].device
    w, raw_bs, bs = inputs.tokens_per_req, inputs.raw_bs, inputs.bs
    fill = inputs.seq_len_fill_value
    buffers = _populate_buffers(device, inputs.max_bs, w, fill, SWA in inputs.step)
    for name, stale in inputs.buffers.items():  # what an earlier step left
        getattr(buffers, name).copy_(stale)
    batch = _forward_batch(inputs)
    with _engine.server_args():
        buffers.populate_from_forward_batch(
            forward_batch=batch,
            raw_bs=raw_bs,
            raw_num_token=raw_bs * w,
            bs=bs,
            seq_len_fill_value=fill,
            require_gathered_buffer=False,
            num_tokens_per_bs=w,
            nsa_enable_prefill_cp=False,
            enable_num_token_non_padded_flag=False,
        )
    graph = {}
    for name in inputs.step:
        rows = bs if name in REQUEST_FIELDS else bs * w
        graph[name] = getattr(buffers, name)[:rows]  # what replay_prepare hands on
    return GraphInputPaddingOutputs(
        graph=graph,
        buffers={name: getattr(buffers, name) for name in inputs.step},
        batch_size=bs,
        num_padding=bs - raw_bs,
        seq_lens_sum=inputs.seq_lens_sum + (bs - raw_bs) * fill,
    )


def _run(inputs: GraphInputPaddingInputs, swa_policy: str) -> GraphInputPaddingOutputs:
    prepare()  # SGLang's environment before it is imported (once; a no-op after)
    if _populate():
        return _run_populate(inputs)
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    device = inputs.step["input_ids"].device
    w, raw_bs, bs = inputs.tokens_per_req, inputs.raw_bs, inputs.bs
    policy = swa_policy if SWA in inputs.step else None
    buffers, registry = _runner(device, inputs.max_bs, w, inputs.seq_len_fill_value, policy)
    for name, stale in inputs.buffers.items():  # what an earlier step left
        registry.get_slot(name).buffer.copy_(stale)
    batch = _forward_batch(inputs)
    with _engine.server_args():
        registry.fill_from(
            batch, raw_bs=raw_bs, padded_bs=bs, raw_num_tokens=raw_bs * w, padded_num_tokens=bs * w
        )
        view = _replay_fb_view(
            forward_batch=batch,
            buffers=buffers,
            bs=bs,
            raw_bs=raw_bs,
            num_tokens=bs * w,
            global_num_tokens_cpu=None,
            seq_len_fill_value=inputs.seq_len_fill_value,
            capture_forward_mode=ForwardMode.DECODE if w == 1 else ForwardMode.TARGET_VERIFY,
            is_encoder_decoder=False,
        )
    graph = {}
    for name in inputs.step:
        if (name in REQUEST_FIELDS or name in ("input_ids", "positions")) and hasattr(view, name):
            graph[name] = getattr(view, name)  # the replay view's slices of the buffers
        else:  # the view carries the live batch's slots, or none (0.5.13's tokens):
            # the graph reads the buffer's
            graph[name] = registry.get_slot(name).slice_for(bs, bs * w)
    return GraphInputPaddingOutputs(
        graph=graph,
        buffers={name: registry.get_slot(name).buffer for name in inputs.step},
        batch_size=view.batch_size,
        # 0.5.13's view has no num_padding: its runner pads bs - raw_bs requests.
        num_padding=getattr(view, "num_padding", bs - raw_bs),
        seq_lens_sum=view.seq_lens_sum,
    )


def run(inputs: GraphInputPaddingInputs) -> GraphInputPaddingOutputs:
    return _run(inputs, "zero")


# -- upstream mutant: #24743 reverted ----------------------------------------------------


def upstream_stale_swa_slots(inputs: GraphInputPaddingInputs) -> GraphInputPaddingOutputs:
    """#24743 ("zero out_cache_loc_swa on padded replay") reverted. SGLang 0.5.11's
    ``DecodeInputBuffers.populate_from_forward_batch`` (``cuda_graph_runner.py``)
    reset the padded rows of ``seq_lens`` and ``out_cache_loc`` only::

        if bs != raw_bs:
            self.seq_lens.fill_(seq_len_fill_value)
            self.out_cache_loc.zero_()
            ...
        if (
            self.out_cache_loc_swa is not None
            and forward_batch.out_cache_loc_swa is not None
        ):
            dsts.append(self.out_cache_loc_swa[:raw_num_token])
            srcs.append(forward_batch.out_cache_loc_swa[:raw_num_token])

    and 0.5.12 added ``self.out_cache_loc_swa.zero_()`` to the reset. 0.5.23 fills
    through the registry, so the revert is re-created there: the sliding-window
    slot copies the step's ``raw_num_token`` rows and leaves its padded rows as
    they were (``PaddingPolicy.FOREACH_COPY``, SGLang's name for exactly that),
    where the fixed slot has ``ZERO``. Every other line is SGLang 0.5.23's.
    Padded tokens keep an earlier step's sliding-window slots: the graph writes
    their keys and values into slots live requests own.
    """
    return _run(inputs, "foreach_copy")
