"""How :mod:`.indexer_decode` binds each release's sparse-indexer glue: by what it calls.

The glue's Python moved between 0.21.0 and 0.33.0 in ways that change what the
adapter hands it and which vendor contract its kernels honour. Each choice is
made by looking at the installed glue, never at the version:

- the arguments: the glue is called with what its installed signature takes
  (:func:`call`); ``q_scale``, ``skip_k_cache_insert``, ``use_pcp`` (0.26.0),
  ``dense_mha_metadata_layer_name`` (0.27.0), ``pcp_shard_decode_requests``
  (0.32.0) come and go, and a parameter the adapter cannot fill is an error;
- DeepGEMM's logits: the glue calls the wrappers it imported from
  ``vllm/utils/deep_gemm.py``, whose signature names the contract
  (:func:`deepgemm_stand_ins`);
- where the kernels live: 0.21.0 imports ``vllm._custom_ops as ops`` only on a
  CUDA-alike platform and calls ``torch.ops._C.top_k_per_row_*`` directly;
  later releases import ``ops`` always and call ``ops.top_k_per_row_*``;
- XPU top-k: 0.21.0 selects with ``xpu_ops.top_k_per_row_*``, Python of
  ``vllm/_xpu_ops.py`` (:func:`release_xpu_top_k`); later releases call
  ``torch.ops.vllm.xpu_fp8_*`` logits and the shared top-k;
- ROCm: 0.21.0's glue has no ``skip_k_cache_insert`` and always caches the
  step's keys (:func:`step_keys`), and selects with ``_topk_indices_torch`` on
  logits it expects cleaned to ``-inf`` (:func:`rocm_stand_ins`).
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import types
from collections.abc import Callable
from typing import Any

import torch
from attnfuzz.adapters.vllm import vendor_ops as vendor
from attnfuzz.adapters.vllm import vendor_ops_releases as older


def call(fn: Callable[..., Any], args: dict[str, Any]) -> Any:
    """``fn(**args)`` with only the arguments its installed signature takes; a
    parameter without a default that ``args`` does not fill is an error."""
    params = inspect.signature(fn).parameters
    unfilled = [
        name
        for name, p in params.items()
        if name not in args and p.default is inspect.Parameter.empty
        and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]  # fmt: skip
    if unfilled:
        raise TypeError(f"{fn.__qualname__} takes {unfilled}, which the adapter does not fill")
    return fn(**{name: value for name, value in args.items() if name in params})


def _parameters(fn: Any) -> set[str]:
    return set(inspect.signature(fn).parameters)


def calls(fn: Callable[..., Any], name: str) -> bool:
    """Whether ``fn`` (undecorated) names the global ``name`` in its code."""
    return name in inspect.unwrap(fn).__code__.co_names


def deepgemm_stand_ins(glue: types.ModuleType, record: Callable[[Any], Any]) -> list[Any]:
    """DeepGEMM's two logits wrappers as the glue imported them, each replaced by the
    stand-in of the contract its installed signature declares (``record`` wraps the
    decode one): ``max_seqlen_k`` (0.33.0, compressed rows) or ``clean_logits`` (0.21.0
    to 0.32.0, absolute columns) for the prefill one; ``clean_logits`` or not for the
    decode one (same layout)."""
    ragged = _parameters(glue.fp8_fp4_mqa_logits)
    if "max_seqlen_k" in ragged:
        mqa = vendor.fp8_fp4_mqa_logits
    elif "clean_logits" in ragged:
        mqa = older.fp8_fp4_mqa_logits_absolute
    else:
        raise RuntimeError(f"no stand-in for fp8_fp4_mqa_logits{sorted(ragged)}")
    paged = vendor.fp8_fp4_paged_mqa_logits
    if "clean_logits" in _parameters(glue.fp8_fp4_paged_mqa_logits):
        paged = older.fp8_fp4_paged_mqa_logits_cleanable
    return [
        (glue, "fp8_fp4_paged_mqa_logits", record(paged)),
        (glue, "fp8_fp4_mqa_logits", mqa),
    ]


def custom_ops_stand_ins(glue: types.ModuleType) -> list[Any]:
    """The compiled ops the glue reaches through ``ops`` (``vllm._custom_ops``) or
    ``torch.ops._C`` directly (0.21.0's top-k); ``glue.ops`` bound where the release
    imports it on a CUDA-alike platform only (0.21.0: ``if current_platform.
    is_cuda_alike(): from vllm import _custom_ops as ops``), as a CUDA host binds it."""
    from vllm import _custom_ops

    out: list[Any] = []
    if not hasattr(glue, "ops"):
        out.append((glue, "ops", _custom_ops))
    for where in (_custom_ops, torch.ops._C):
        out += [
            (where, "top_k_per_row_prefill", vendor.top_k_per_row_prefill),
            (where, "top_k_per_row_decode", vendor.top_k_per_row_decode),
        ]
    out.append(
        (_custom_ops, "cp_gather_indexer_k_quant_cache", vendor.cp_gather_indexer_k_quant_cache)
    )
    return out


def release_xpu_top_k() -> types.SimpleNamespace:
    """``xpu_ops.top_k_per_row_prefill`` / ``top_k_per_row_decode`` of the installed
    ``vllm/_xpu_ops.py``, compiled from its source unchanged.

    0.21.0's XPU branches of ``sparse_attn_indexer`` select with these two static
    methods (pure torch), but the module imports ``vllm_xpu_kernels`` at its top and
    cannot be imported without an XPU build: the two methods are taken from the
    file as they are and run on torch alone, with nothing else of the module.
    """
    spec = importlib.util.find_spec("vllm._xpu_ops")
    if spec is None or spec.origin is None:
        raise RuntimeError("vllm/_xpu_ops.py is not installed")
    with open(spec.origin) as f:
        tree = ast.parse(f.read(), spec.origin)
    wanted = {"top_k_per_row_prefill", "top_k_per_row_decode"}
    found: dict[str, Any] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == "xpu_ops":
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name in wanted:
                    item.decorator_list = []  # @staticmethod: a plain function here
                    module = ast.Module(body=[item], type_ignores=[])
                    scope: dict[str, Any] = {"torch": torch}
                    exec(compile(module, spec.origin, "exec"), scope)  # noqa: S102
                    found[item.name] = scope[item.name]
    if set(found) != wanted:
        raise RuntimeError(f"vllm/_xpu_ops.py:xpu_ops has {sorted(found)}, not {sorted(wanted)}")
    return types.SimpleNamespace(**found)


def step_keys(kv_cache: torch.Tensor, slot_mapping: torch.Tensor, tokens: int) -> torch.Tensor:
    """The step's keys ``[tokens, D]`` as the cache holds them (dequantized), for glue
    that always caches the step's keys (0.21.0's ROCm glue). The case's cache already
    holds them, and requantizing a dequantized key gives back its bytes (power-of-two
    scales, small integers), so the glue's insert rewrites what is there."""
    head_dim = kv_cache.shape[-1] - vendor.SCALE_BYTES
    keys = vendor.dequantized_pages(kv_cache, head_dim).reshape(-1, head_dim)
    out = torch.zeros((tokens, head_dim), dtype=torch.float32)
    slots = slot_mapping.to(torch.int64)[:tokens]
    real = slots >= 0
    out[: slots.shape[0]][real] = keys[slots[real]]
    return out.to(torch.bfloat16)


def rocm_stand_ins(rocm: types.ModuleType, record: Callable[[Any], Any]) -> list[Any]:
    """AITER's kernels and ``torch.ops._C``'s top-k, for ``rocm_aiter_mla_sparse``; the
    logits cleaned to ``-inf`` where the release's glue selects with
    ``_topk_indices_torch`` (0.21.0's ``rocm_aiter_sparse_attn_indexer_native``: a
    ``torch.topk`` that takes ``-inf`` for "no token"), as 0.21.0's wrappers return them."""
    from vllm import _custom_ops

    entry = getattr(rocm, "rocm_aiter_sparse_attn_indexer_native", None)
    entry = entry or rocm.rocm_aiter_sparse_attn_indexer
    paged: Callable[..., Any] = vendor.rocm_fp8_paged_mqa_logits
    mqa: Callable[..., Any] = vendor.rocm_fp8_mqa_logits
    if calls(entry, "_topk_indices_torch"):
        paged, mqa = older.rocm_fp8_paged_mqa_logits_cleaned, older.rocm_fp8_mqa_logits_cleaned
    return [
        (rocm, "rocm_fp8_paged_mqa_logits", record(paged)),
        (rocm, "rocm_fp8_mqa_logits", mqa),
        (
            rocm,
            "cp_gather_indexer_k_quant_cache_triton",
            vendor.cp_gather_indexer_k_quant_cache_triton,
        ),
        # The step's keys, where the glue caches them (0.21.0: always), in the
        # plain layout the gather stand-in reads.
        (rocm, "indexer_k_quant_and_cache_triton", vendor.indexer_k_quant_and_cache),
        (_custom_ops, "indexer_k_quant_and_cache", vendor.indexer_k_quant_and_cache),
        (_custom_ops, "cp_gather_indexer_k_quant_cache", vendor.cp_gather_indexer_k_quant_cache),
        (torch.ops._C, "top_k_per_row_prefill", vendor.top_k_per_row_prefill),
        (torch.ops._C, "top_k_per_row_decode", vendor.top_k_per_row_decode),
    ]
