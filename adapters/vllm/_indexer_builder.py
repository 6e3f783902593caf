"""The DeepSeek-V3.2 indexer's metadata builder, made as each release's engine makes it.

Shared by :mod:`.flatten_decode` and :mod:`.indexer_decode`. Three things move
between the supported releases, each found by looking (:mod:`.compat`):

- the width of the expanded block table. From 0.27.0 (#50302) the runner hands
  the builder ``block_table_width=`` (``vllm/v1/worker/utils.py``
  ``AttentionGroup.create_metadata_builders``); before, ``__init__`` took no
  such argument and sized the table itself (0.26.0 ``v1/attention/backends/
  mla/indexer.py:DeepseekV32IndexerMetadataBuilder.__init__``:
  ``cdiv(max_model_len, block_size * get_kv_cache_shard_count())``). The
  builder is made with what its release's ``__init__`` takes, nothing else.
- the platform's compute-unit count, which ``__init__`` reads (``num_sms``: it
  sizes the DeepGEMM scheduler-metadata buffer, filled on CUDA only). The CPU
  platform answers from 0.23.0 (``platforms/cpu.py:CpuPlatform.
  num_compute_units``: ``torch.get_num_threads()``); on 0.21.0 to 0.22.1 it
  inherits ``Platform.num_compute_units``, which raises, and the builder could
  not be made at all. There the later CPU platform's answer is stood in while
  the builder is made (:func:`_compute_units`).
- how the flattening decision is reached (see :func:`flattening_class`).
"""

from __future__ import annotations

from contextlib import nullcontext
from functools import cache
from typing import Any

import torch
from attnfuzz.adapters.vllm import compat
from attnfuzz.adapters.vllm import vendor_ops as vendor


def make(
    cls: type,
    spec: Any,
    layers: list[str],
    vllm_config: Any,
    block_table_width: int,
    device: torch.device | None = None,
) -> Any:
    """``cls(spec, layers, vllm_config, device)`` under ``vllm_config`` (``device``: the
    CPU by default), with ``block_table_width`` where the release's ``__init__``
    takes it (0.27.0 on)."""
    from vllm.config import set_current_vllm_config

    kwargs: dict[str, Any] = {}
    if compat.has(compat.BUILDER_TABLE_WIDTH):
        kwargs["block_table_width"] = block_table_width
    with set_current_vllm_config(vllm_config), _compute_units():
        return cls(spec, layers, vllm_config, device or torch.device("cpu"), **kwargs)


def _platform_counts_units() -> bool:
    """Whether the installed CPU platform overrides ``Platform.num_compute_units``
    (the interface's own raises ``NotImplementedError``)."""
    from vllm.platforms import current_platform
    from vllm.platforms.interface import Platform

    own = getattr(type(current_platform), "num_compute_units", None)
    return own is not None and own.__func__ is not Platform.num_compute_units.__func__


def _compute_units() -> Any:
    """Stand in ``num_compute_units`` where the indexer reads it, on a release whose
    CPU platform has none (0.21.0 to 0.22.1): the answer 0.23.0's CPU platform gives."""
    from vllm.v1.attention.backends.mla import indexer

    if _platform_counts_units() or not hasattr(indexer, "num_compute_units"):
        return nullcontext()
    return vendor.registered((indexer, "num_compute_units", _cpu_compute_units))


def _cpu_compute_units(device_id: int | None = 0) -> int:
    return torch.get_num_threads()


@cache
def flattening_class(cls: type) -> type:
    """``cls``, or where its ``__init__`` decides flattening from a class attribute
    and sizes a buffer by that decision, a subclass whose attribute says "no native
    decode layout": then ``__init__`` takes its own flattening branch.

    0.21.0 to 0.23.0 ``indexer.py``: ``use_flattening = (use_fp4_indexer_cache or
    not is_device_capability_family(100)) and next_n not in
    natively_supported_next_n_fp4`` (``[1, 2]``); 0.21.0 also allocates
    ``decode_seq_lens_buffer`` 2-D ``[max_num_seqs, next_n]`` when it is False,
    which the flattening branch of ``_prepare_decode_tensors`` asserts is 1-D.
    Later releases decide from the platform alone and size no buffer by it; there
    the adapter sets ``use_flattening`` after ``__init__`` (all ``build`` reads).
    """
    if not hasattr(cls, "natively_supported_next_n_fp4"):
        return cls
    return type(cls.__name__, (cls,), {"natively_supported_next_n_fp4": [], "__doc__": cls.__doc__})
