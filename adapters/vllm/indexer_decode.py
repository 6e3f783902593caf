"""vLLM's own sparse-indexer glue as implementations of ``indexer-decode``, and bug A upstream.

Each ``run_*`` drives one backend variant of the indexer as the installed release
(0.21.0 to 0.33.0) ships it, unchanged, on one layer of one step (file names as
in 0.33.0; :mod:`._indexer_glue` says what differs in older releases and how
the adapter finds out):

- ``vllm`` (:func:`run`): ``vllm/model_executor/layers/sparse_attn_indexer.py:
  sparse_attn_indexer``, the CUDA path (DeepGEMM logits, the decode top-k of
  ``model_executor/layers/indexer_topk.py``);
- ``vllm-xpu`` (:func:`run_xpu`): the same function's XPU branches
  (``current_platform.is_xpu()``);
- ``vllm-rocm`` (:func:`run_rocm`): ``v1/attention/ops/rocm_aiter_mla_sparse.py:
  rocm_aiter_sparse_attn_indexer``;
- ``vllm-cpu`` (:func:`run_cpu`): ``sparse_attn_indexer.py:SparseAttnIndexer.forward_cpu``
  (DeepSeek-V4 on the CPU platform), with the CPU platform's own builder (0.30.0 on);
- ``vllm-deepseek-v41-amd`` (:func:`run_deepseek_v41_amd`): ``models/deepseek_v41/amd/
  ops/sparse_indexer.py:gfx942_sparse_attn_indexer`` and its ``_decode_step``
  (DeepSeek-V4.1 with ``--monokernel`` on gfx942; 0.33.0), a mutant: it still has bug A.

Each imports only the modules it calls: the CPU and gfx942 modules exist from
0.30.0 and 0.33.0 only, and the CUDA, XPU and ROCm glue runs without them.

The metadata is vLLM's own: ``DeepseekV32IndexerMetadataBuilder.build``
(``v1/attention/backends/mla/indexer.py``; for ``vllm-cpu`` its CPU subclass
``DeepseekV4CPUIndexerMetadataBuilder``), built per engine once (its buffers
are persistent), on the step's ``CommonAttentionMetadata``, read by the glue
from the forward context (``vllm.forward_context.set_forward_context``). On
this (CPU) platform the builder takes the native ``[B, L]`` path for
``next_n <= 2`` and flattens every decode token to its own row beyond (0.21.0 to
0.27.1: decodes of more than one token only). The builder is made as each
release's engine makes it (:mod:`._indexer_builder`). The
indexer cache is the uncompressed one the target models (``compress_ratio``
1): DeepSeek-V4's compressed (C4) indexer pages are not modelled.

The vendor kernels the glue calls are the stand-ins of :mod:`.vendor_ops` (and,
for the contracts older releases call, :mod:`.vendor_ops_releases`), registered
for the call only. The keys sit in the fp8 cache layout vLLM writes
(``vendor_ops.quantized_cache``); queries are fp8, weights fp32, as the FP8
path hands them over. The glue's ``topk_indices_buffer`` is the case's own
buffer, so the rows the glue writes and the rows it leaves are judged as they
are. The prefill branch runs too (the glue runs it first in the same call,
after clearing the step's rows): its stand-ins recompute the rows the case
holds as the prefill result.

What runs interpreted: vLLM's ``pack_seq_triton`` / ``unpack_seq_triton`` and
the builder's ``@triton.jit`` kernels run under the Triton interpreter.

:func:`upstream_pr39542` is the CUDA glue with #39542's fix reverted (see there).
"""

from __future__ import annotations

import inspect
import linecache
import types
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import attnfuzz.kernels._triton  # noqa: F401 - TRITON_INTERPRET=1 before vLLM imports Triton
import torch
from attnfuzz.adapters.vllm import _engine, _indexer_builder, _indexer_glue
from attnfuzz.adapters.vllm import vendor_ops as vendor
from attnfuzz.reference.batch import EngineConfig
from attnfuzz.reference.indexer_decode import IndexerDecodeInputs, IndexerDecodeOutputs

LAYER = "model.layers.0.self_attn.indexer.k_cache"
_CACHE_SIZE = 16
_builders: OrderedDict[tuple[EngineConfig, bool], Any] = OrderedDict()


def prepare() -> None:
    """Import vLLM's indexer glue and build one builder, before any judge forks.

    Only what every implementation calls: the CPU platform's and gfx942's modules
    (0.30.0 and 0.33.0 on) are imported by the implementations that call them."""
    from attnfuzz.harness.testing import spec_config

    _engine.prepare()
    import vllm.model_executor.layers.sparse_attn_indexer  # noqa: F401
    import vllm.v1.attention.ops.rocm_aiter_mla_sparse  # noqa: F401

    _workspace()
    _builder(spec_config())


def _workspace() -> None:
    """The engine's workspace manager (the prefill branch takes its gather buffers there)."""
    from vllm.v1.worker import workspace

    if not workspace.is_workspace_manager_initialized():
        workspace.init_workspace_manager(torch.device("cpu"))


def _builder(config: EngineConfig, cpu: bool = False) -> Any:
    """vLLM's indexer metadata builder for ``config``, made once per engine: the shared
    ``DeepseekV32IndexerMetadataBuilder``, or with ``cpu`` the CPU platform's own
    (``models/deepseek_v4/cpu/cpu_mla.py:DeepseekV4CPUIndexerMetadataBuilder``, the
    builder of the one model the CPU platform runs the sparse indexer for)."""
    key = (config, cpu)
    builder = _builders.get(key)
    if builder is None:
        from vllm.v1.attention.backends.mla.indexer import DeepseekV32IndexerMetadataBuilder
        from vllm.v1.kv_cache_interface import MLAAttentionSpec

        cls = DeepseekV32IndexerMetadataBuilder
        if cpu:
            from vllm.models.deepseek_v4.cpu.cpu_mla import DeepseekV4CPUIndexerMetadataBuilder

            cls = DeepseekV4CPUIndexerMetadataBuilder
        vllm_config = _engine.vllm_config(config)
        # The indexer's cache: one head of uint8, fp8 keys then their fp32 scales.
        spec = MLAAttentionSpec(
            block_size=config.block_size,
            num_kv_heads=1,
            head_size=config.head_dim + vendor.SCALE_BYTES,
            dtype=torch.uint8,
        )
        # Before 0.27.0 the builder sizes its table itself, as cdiv(max_model_len,
        # block_size): the width of the case's table (see _indexer_builder).
        builder = _indexer_builder.make(
            cls, spec, [LAYER], vllm_config, block_table_width=config.max_blocks_per_seq
        )
        _builders[key] = builder
        while len(_builders) > _CACHE_SIZE:
            _builders.popitem(last=False)
    else:
        _builders.move_to_end(key)
    return builder


class _Step:
    """What one call of the glue receives: vLLM's metadata, the fp8 operands, the buffer."""

    def __init__(self, inputs: IndexerDecodeInputs, cpu: bool = False):
        from vllm.config import set_current_vllm_config

        config, common = inputs.config, inputs.common
        if config is None or common is None:
            raise ValueError("vLLM's indexer needs the case's EngineConfig and CommonMetadata")
        self.inputs, self.config = inputs, config
        self.vllm_config = _engine.vllm_config(config)
        self.builder = _builder(config, cpu)
        with set_current_vllm_config(self.vllm_config):
            self.metadata = self.builder.build(0, _engine.common_attn_metadata(common, "cpu"))
        self.kv_cache = vendor.quantized_cache(inputs.kv_cache.float().cpu())
        self.q_fp8 = inputs.q.float().cpu().to(vendor.FP8)
        self.weights = inputs.weights.float().cpu().contiguous()
        self.buffer = inputs.topk_indices_buffer
        self.hidden_states = torch.empty((inputs.q.shape[0], 1), dtype=torch.bfloat16)
        self.logits: list[torch.Tensor] = []

    def recording(self, fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        """``fn`` that also keeps what it returned (the decode logits the glue computes)."""

        def call(*args: Any, **kwargs: Any) -> torch.Tensor:
            out = fn(*args, **kwargs)
            self.logits.append(out)
            return out

        return call

    def forward_context(self) -> Any:
        from vllm.forward_context import set_forward_context

        return set_forward_context({LAYER: self.metadata}, self.vllm_config)

    def outputs(self) -> IndexerDecodeOutputs:
        """The decode logits in the target's ``[B*L, max_model_len]`` layout."""
        inp = self.inputs
        B, L, M = inp.num_decodes, inp.max_decode_len, inp.max_model_len
        out = torch.full((B * L, M), float("-inf"), dtype=torch.float32)
        if not self.logits:
            return IndexerDecodeOutputs(out[:0] if B == 0 else out)
        got = self.logits[-1][:, :M]  # the CPU kernel's rows are max_seq_len wide
        if got.shape[0] == B * L and got.shape[1] == M:  # the native [B, L] layout
            return IndexerDecodeOutputs(got)
        width = got.shape[1]
        if got.shape[0] == B * L:
            out[:, :width] = got
            return IndexerDecodeOutputs(out)
        # Flattened: one row per decode token, in token order.
        qsl = inp.query_start_loc.tolist()
        for b, d in enumerate(inp.decode_lens.tolist()):
            for j in range(d):
                out[b * L + j, :width] = got[qsl[b] + j]
        return IndexerDecodeOutputs(out)


def _glue_args(step: _Step) -> dict[str, Any]:
    """The arguments the model's indexer layer hands ``sparse_attn_indexer`` (FP8 cache,
    no context parallelism, keys already cached), under every name a supported
    release takes; :func:`._indexer_glue.call` passes those the installed one does."""
    from vllm.utils.torch_utils import _encode_layer_name
    from vllm.v1.attention.backends.mla.indexer import get_max_prefill_buffer_size

    c = step.config
    return dict(
        hidden_states=step.hidden_states,
        k_cache_prefix=_encode_layer_name(LAYER),
        kv_cache=step.kv_cache,
        q_quant=step.q_fp8,
        q_scale=None,
        k=None,  # the glue reads it only to cache it: skip_k_cache_insert
        weights=step.weights,
        quant_block_size=c.head_dim,
        scale_fmt="ue8m0",
        topk_tokens=c.topk,
        head_dim=c.head_dim,
        max_model_len=c.max_model_len,
        total_seq_lens=get_max_prefill_buffer_size(step.vllm_config),
        topk_indices_buffer=step.buffer,
        skip_k_cache_insert=True,
        use_pcp=False,
        pcp_shard_decode_requests=False,
        dense_mha_metadata_layer_name=_encode_layer_name(""),
    )


def _no_accelerator() -> list[tuple[Any, str, Any]]:
    """The workspace manager releases the device cache before it grows the prefill
    gather buffers; with no accelerator (this machine) there is nothing to release."""
    if torch.accelerator.is_available():
        return []
    return [(torch.accelerator, "empty_cache", lambda: None)]


def _cuda_stand_ins(step: _Step) -> list[tuple[Any, str, Any]]:
    """DeepGEMM's logits of the contract the installed glue calls, and the compiled ops
    where it reaches them (:mod:`._indexer_glue`)."""
    from vllm.model_executor.layers import sparse_attn_indexer as glue

    return (
        _no_accelerator()
        + _indexer_glue.deepgemm_stand_ins(glue, step.recording)
        + _indexer_glue.custom_ops_stand_ins(glue)
    )


@contextmanager
def _one_thread() -> Iterator[None]:
    """The stand-ins' tensors are tiny: intra-op threads only contend (on a loaded
    machine a 2-thread matmul of a few hundred elements takes milliseconds)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _call_cuda_glue(fn: Callable[..., Any], inputs: IndexerDecodeInputs) -> IndexerDecodeOutputs:
    _workspace()
    with _one_thread():
        step = _Step(inputs)
        with vendor.registered(*_cuda_stand_ins(step)), step.forward_context():
            _indexer_glue.call(fn, _glue_args(step))
        return step.outputs()


def run(inputs: IndexerDecodeInputs) -> IndexerDecodeOutputs:
    """The installed ``sparse_attn_indexer`` (CUDA path), unchanged."""
    from vllm.model_executor.layers.sparse_attn_indexer import sparse_attn_indexer

    return _call_cuda_glue(sparse_attn_indexer, inputs)


def run_rocm(inputs: IndexerDecodeInputs) -> IndexerDecodeOutputs:
    """The installed ``rocm_aiter_sparse_attn_indexer`` (``v1/attention/ops/
    rocm_aiter_mla_sparse.py``), unchanged; AITER's kernels and ``torch.ops._C``'s
    top-k stood in."""
    from vllm.v1.attention.ops import rocm_aiter_mla_sparse as rocm

    _workspace()
    with _one_thread():
        step = _Step(inputs)
        with vendor.registered(*_rocm_stand_ins(step)), step.forward_context():
            entry = rocm.rocm_aiter_sparse_attn_indexer
            _indexer_glue.call(entry, _rocm_args(step, entry))
        return step.outputs()


class _XpuPlatform:
    """The platform as the XPU branches of ``sparse_attn_indexer`` see it."""

    def __init__(self, base: Any):
        self._base = base

    def is_xpu(self) -> bool:
        return True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._base, name)


def run_xpu(inputs: IndexerDecodeInputs) -> IndexerDecodeOutputs:
    """The installed ``sparse_attn_indexer`` through its XPU branches (``current_platform.
    is_xpu()``), unchanged. 0.22.0 on: ``torch.ops.vllm.xpu_fp8_paged_mqa_logits`` with
    one length per sequence, ``xpu_fp8_mqa_logits`` with absolute row starts (XPU
    kernels stood in). 0.21.0: DeepGEMM's logits (stood in) and ``xpu_ops.
    top_k_per_row_*``, the release's own torch code (``vllm/_xpu_ops.py``)."""
    from vllm.model_executor.layers import sparse_attn_indexer as glue

    _workspace()
    with _one_thread():
        step = _Step(inputs)
        stand_ins = _cuda_stand_ins(step) + [
            (glue, "current_platform", _XpuPlatform(glue.current_platform)),
            (
                torch.ops.vllm,
                "xpu_fp8_paged_mqa_logits",
                step.recording(vendor.xpu_fp8_paged_mqa_logits),
            ),
            (torch.ops.vllm, "xpu_fp8_mqa_logits", vendor.xpu_fp8_mqa_logits),
        ]
        # 0.21.0 binds xpu_ops at import on an XPU platform only.
        if not hasattr(glue, "xpu_ops") and _indexer_glue.calls(
            glue.sparse_attn_indexer, "xpu_ops"
        ):
            stand_ins.append((glue, "xpu_ops", _indexer_glue.release_xpu_top_k()))
        with vendor.registered(*stand_ins), step.forward_context():
            _indexer_glue.call(glue.sparse_attn_indexer, _glue_args(step))
        return step.outputs()


def run_cpu(inputs: IndexerDecodeInputs) -> IndexerDecodeOutputs:
    """vLLM 0.33.0 ``SparseAttnIndexer.forward_cpu`` (``sparse_attn_indexer.py``), unchanged,
    on a layer built by its own ``__init__``, with the CPU platform's own metadata
    builder (``DeepseekV4CPUIndexerMetadataBuilder``: the whole prefill in one chunk,
    as ``forward_cpu`` asserts); the CPU kernels stood in (the installed build has none).

    The glue and its kernels refuse what they cannot do: any ``index_topk`` but 512,
    native MTP decodes (more than one query token per decode request: ``next_n = 2``
    on this platform, see ``indexer.py:_supports_native_decode``), and any indexer
    head dim but 128 (the logits kernel's compile-time ``kIndexHeadDim``)."""
    from vllm import _custom_ops
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.sparse_attn_indexer import SparseAttnIndexer

    with _one_thread():
        step = _Step(inputs, cpu=True)
        c = step.config
        cache = types.SimpleNamespace(prefix=LAYER, kv_cache=step.kv_cache)
        with set_current_vllm_config(step.vllm_config):
            layer = SparseAttnIndexer(
                cache,
                quant_block_size=c.head_dim,
                scale_fmt="ue8m0",
                topk_tokens=c.topk,
                head_dim=c.head_dim,
                max_model_len=c.max_model_len,
                max_total_seq_len=_glue_args(step)["total_seq_lens"],
                topk_indices_buffer=step.buffer,
                skip_k_cache_insert=True,
            )
        stand_ins = [
            (
                _custom_ops,
                "fp8_paged_mqa_logits_cpu",
                step.recording(vendor.fp8_paged_mqa_logits_cpu),
            ),
            (_custom_ops, "topk_transform_512_cpu", vendor.topk_transform_512_cpu),
        ]
        with vendor.registered(*stand_ins), step.forward_context():
            layer.forward_cpu(step.hidden_states, step.q_fp8, None, step.weights)
        if step.metadata.num_prefills:  # the prefill branch's logits came first
            step.logits = step.logits[1:]
        return step.outputs()


class _Gfx942Extension:
    """``topk512_gfx942.cu`` as ``models/deepseek_v41/amd/ops/topk.py`` loads it: the two
    decode top-512 entry points its ``top_k_per_row_decode_512`` calls, whose contract
    that function's docstring states: "the contract of vLLM's ops.top_k_per_row_decode
    with topK = 512" (any order within a row, ``-1`` past a short row's end). The
    candidate launches (DSpark layers 24 to 36) are absent: the layer adapted here
    has no candidate blocks, and a call of one fails loudly."""

    @staticmethod
    def top_k_per_row_decode_512(
        logits: torch.Tensor,
        next_n: int,
        seq_lens: torch.Tensor,
        indices: torch.Tensor,
        max_blocks: int = 8,
        min_chunk: int = 16384,
    ) -> None:
        vendor.top_k_per_row_decode(
            logits, next_n, seq_lens, indices, logits.shape[0], *logits.stride(), 512
        )

    @staticmethod
    def top_k_per_row_decode_512_regs(
        logits: torch.Tensor, next_n: int, seq_lens: torch.Tensor, indices: torch.Tensor
    ) -> None:
        _Gfx942Extension.top_k_per_row_decode_512(logits, next_n, seq_lens, indices)


def _rocm_stand_ins(step: _Step) -> list[tuple[Any, str, Any]]:
    """AITER's kernels and ``torch.ops._C``'s top-k, for ``rocm_aiter_mla_sparse``, of
    the contract the installed glue calls (:func:`._indexer_glue.rocm_stand_ins`)."""
    from vllm.v1.attention.ops import rocm_aiter_mla_sparse as rocm

    return _no_accelerator() + _indexer_glue.rocm_stand_ins(rocm, step.recording)


def _rocm_args(step: _Step, fn: Callable[..., Any]) -> dict[str, Any]:
    """:func:`_glue_args` as the ROCm op ``fn``'s signature names them; where it takes no
    ``skip_k_cache_insert`` (0.21.0: it always caches the step's keys), the step's keys
    as ``k`` (:func:`._indexer_glue.step_keys`)."""
    args = _glue_args(step)
    args["q_fp8"] = args.pop("q_quant")
    if "skip_k_cache_insert" not in inspect.signature(fn).parameters:
        tokens = step.hidden_states.shape[0]
        args["k"] = _indexer_glue.step_keys(step.kv_cache, step.metadata.slot_mapping, tokens)
    return args


def run_deepseek_v41_amd(inputs: IndexerDecodeInputs) -> IndexerDecodeOutputs:
    """vLLM 0.33.0 ``models/deepseek_v41/amd/ops/sparse_indexer.py:
    gfx942_sparse_attn_indexer`` (what ``Gfx942SparseAttnIndexer.forward_hip`` calls,
    DeepSeek-V4.1 with ``--monokernel`` on gfx942), unchanged: a step of only decode
    rows runs its own ``_decode_step``, any other step ``rocm_aiter_sparse_attn_indexer``.

    Stood in: ``ops.enabled()`` (true with ``--monokernel`` on gfx942) where the glue
    reads it, the built ``topk512_gfx942.cu`` extension (:class:`_Gfx942Extension`;
    its Python hooks in ``topk.py`` run unchanged), AITER's logits and
    ``torch.ops._C``'s top-k. The metadata is the shared builder's: the FP8 indexer
    of DeepSeek-V4.1 is ``DeepseekV41IndexerBackend``, which keeps
    ``DeepseekV32IndexerMetadataBuilder``."""
    from vllm.models.deepseek_v41.amd.ops import sparse_indexer as gfx942
    from vllm.models.deepseek_v41.amd.ops import topk

    _workspace()
    with _one_thread():
        step = _Step(inputs)
        stand_ins = _rocm_stand_ins(step) + [
            (gfx942, "enabled", lambda: True),
            (topk, "enabled", lambda: True),
            (topk, "_ext", _Gfx942Extension),
            (
                gfx942,
                "rocm_fp8_paged_mqa_logits",
                step.recording(vendor.rocm_fp8_paged_mqa_logits),
            ),
        ]
        # The layer hands its cache's prefix as a plain str (``Gfx942SparseAttnIndexer.
        # forward_hip``), which the glue looks up in the forward context as it is.
        entry = gfx942.gfx942_sparse_attn_indexer
        args = _rocm_args(step, entry) | dict(k_cache_prefix=LAYER)
        with vendor.registered(*stand_ins), step.forward_context():
            _indexer_glue.call(entry, args)
        return step.outputs()


# -- the upstream mutant of bug A ---------------------------------------------------------

# #39542 fixed two lines of the decode branch. Before it (the pre-fix lines as they
# were, e.g. vllm-project/vllm ``sparse_attn_indexer.py`` before the fix):
#     fp8_paged_mqa_logits(..., decode_metadata.seq_lens, ...)
#     top_k_per_row_decode(logits, next_n, decode_metadata.seq_lens, ...)
#     topk_indices_buffer[:num_decode_tokens, : topk_indices.shape[-1]] = topk_indices
# Every supported release (0.21.0 to 0.33.0) reads ``seq_lens =
# decode_metadata.seq_lens[:batch_size]`` for both, and writes back
# ``topk_indices_buffer[: topk_indices.shape[0], ...]``.
_PR39542_REVERTED = (
    (
        "        seq_lens = decode_metadata.seq_lens[:batch_size]\n",
        "        seq_lens = decode_metadata.seq_lens\n",
    ),
    (
        "            topk_indices_buffer[: topk_indices.shape[0], : topk_indices.shape[-1]] = (\n",
        "            topk_indices_buffer[:num_decode_tokens, : topk_indices.shape[-1]] = (\n",
    ),
)
_upstream_glue: Callable[..., Any] | None = None


_DECORATOR = "@eager_break_during_capture\n"


def pr39542_source() -> str:
    """The source of the installed ``sparse_attn_indexer`` (undecorated) with exactly the
    two lines of ``_PR39542_REVERTED`` replaced; each must occur once. 0.22.0 on
    decorate it with ``@eager_break_during_capture``; 0.21.0 does not."""
    from vllm.model_executor.layers import sparse_attn_indexer as glue

    source = inspect.getsource(inspect.unwrap(glue.sparse_attn_indexer))
    if source.startswith(_DECORATOR):
        source = source[len(_DECORATOR) :]
    elif not source.startswith("def sparse_attn_indexer("):
        raise RuntimeError("vLLM's sparse_attn_indexer has a decorator this adapter does not know")
    for fixed, pre_fix in _PR39542_REVERTED:
        if source.count(fixed) != 1:
            raise RuntimeError(f"vLLM's sparse_attn_indexer no longer has: {fixed.strip()}")
        source = source.replace(fixed, pre_fix)
    return source


def _pr39542_glue() -> Callable[..., Any]:
    """:func:`pr39542_source` compiled, bound to the module's own globals (so it calls
    what the module calls, stand-ins included) and decorated as the module decorates it
    (where it does)."""
    global _upstream_glue
    if _upstream_glue is None:
        from vllm.model_executor.layers import sparse_attn_indexer as glue

        source = pr39542_source()
        filename = "<vllm sparse_attn_indexer, #39542 reverted>"
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        scratch: dict[str, Any] = {}
        exec(compile(source, filename, "exec"), dict(vars(glue)), scratch)  # noqa: S102
        compiled = scratch["sparse_attn_indexer"]
        raw = types.FunctionType(compiled.__code__, vars(glue), "sparse_attn_indexer")
        raw.__defaults__ = compiled.__defaults__
        raw.__kwdefaults__ = compiled.__kwdefaults__
        decorated = inspect.getsource(glue.sparse_attn_indexer).startswith(_DECORATOR)
        _upstream_glue = glue.eager_break_during_capture(raw) if decorated else raw
    return _upstream_glue


def upstream_pr39542(inputs: IndexerDecodeInputs) -> IndexerDecodeOutputs:
    """#39542 upstream: the decode branch of ``sparse_attn_indexer`` before its fix
    (unsliced lengths, write-back of ``buffer[:N_d]``), through the same adapter."""
    return _call_cuda_glue(_pr39542_glue(), inputs)
