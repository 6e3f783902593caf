"""Tencent's hpc-ops decode scheduler, stood in for both engines' HPC backends.

vLLM's ``HPC_ATTN`` (``v1/attention/backends/hpc_attn.py``) and SGLang's ``hpc_ops``
backend (``layers/attention/hpc_ops_backend.py``) import the ``hpc`` package, a CUDA
build for sm90 only. Of it their metadata code calls the decode scheduler alone: one
workspace made at start-up (``get_attention_decode_task_workspace``), refilled in
place by every decode build and graph replay (``assign_attention_decode_task`` of the
requests' KV lengths); the decode kernel reads that task map beside the lengths it was
made from. The stand-in follows the contract ``hpc/attention.py`` writes for the two
calls and refuses what would overrun or misread the workspace
(:class:`~attnfuzz.adapters.standins.VendorContractError`, a finding). The vendor's
schedule (48-byte tasks of 64-key tiles dealt to the CTAs) is its own; the stand-in's
workspace keeps what a schedule is made of instead: the requests, the queries of each,
whether the lengths count the step's keys, each request's keys (:func:`schedule`).
No kernel runs: ``attention_decode_bf16`` is there for its signature, which SGLang
inspects (a ``task_map`` parameter: the release whose bf16 decode takes the map).
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import types
from collections.abc import Iterator

import torch
from attnfuzz.adapters.standins import VendorContractError, in_sys_modules

MAX_QUERIES = 4
"""The decode kernels' ``mtp`` is 0 to 3 (vLLM's ``HpcAttnMetadataBuilder.__init__``):
the queries a request the scheduler takes are 1 to 4."""

# The stand-in workspace, int32: hpc's header words (2: KV heads, 3: requests it is made
# for), then attnfuzz's record of the last schedule.
_HEADS, _MAX_BATCH, _MAX_SEQLEN, BATCH, _LENGTHS = 2, 3, 4, 5, 8


def get_attention_decode_task_workspace(
    max_num_batch: int, max_seqlen: int, num_head_kv: int, min_process_len: int = 512
) -> torch.Tensor:
    """``hpc.get_attention_decode_task_workspace``: the task map of decodes of up to
    ``max_num_batch`` requests of ``max_seqlen`` keys on ``num_head_kv`` KV heads (no
    schedule yet: the batch word is -1)."""
    workspace = torch.zeros(_LENGTHS + max_num_batch, dtype=torch.int32)
    workspace[[_HEADS, _MAX_BATCH, _MAX_SEQLEN, BATCH]] = torch.tensor(
        [num_head_kv, max_num_batch, max_seqlen, -1], dtype=torch.int32
    )
    return workspace


def schedule(num_seq_kvcache: torch.Tensor, num_seq_q: int, new_kv_included: bool) -> list[int]:
    """The record a schedule of these requests leaves in the workspace (from ``BATCH``)."""
    lengths = [int(n) for n in num_seq_kvcache.tolist()]
    return [len(lengths), int(num_seq_q), int(bool(new_kv_included)), *lengths]


def stale_entries(task_map: torch.Tensor, lengths: torch.Tensor, num_seq_q: int) -> int:
    """How many entries of ``task_map``'s record differ from the schedule of ``lengths``
    (their KV counting the step's, as both engines' decode kernels are told) and
    ``num_seq_q`` queries a request: 0 where the kernel reads the map of its lengths."""
    want = torch.tensor(schedule(lengths, num_seq_q, True), dtype=torch.int32)
    got = task_map.view(torch.int32)[BATCH : BATCH + len(want)]
    return int((got != want).sum())


def assign_attention_decode_task(
    num_seq_kvcache: torch.Tensor,
    task_map: torch.Tensor,
    num_head_kv: int,
    mtp: int,
    new_kv_included: bool,
    min_process_len: int = 512,
) -> torch.Tensor:
    """``hpc.assign_attention_decode_task``: fills ``task_map`` with the schedule of the
    decodes of ``num_seq_kvcache`` keys (int32, one a request). Its fourth argument is
    named ``mtp`` there, but the op takes the query tokens a request (``num_seq_q = mtp
    + 1``), as ``assign_attention_decode_task_adaptive``, which calls the same op, says
    ("passing mtp here ... yields an empty task_map"). Refused, as the op would overrun
    or misread its workspace: lengths not int32 of one dimension, more requests than
    the workspace was made for, a length past its ``max_seqlen``, other KV heads, a
    query count outside 1 to 4 (the decode kernels' ``mtp`` 0 to 3)."""
    op = "hpc.assign_attention_decode_task"
    if num_seq_kvcache.dtype != torch.int32 or num_seq_kvcache.dim() != 1:
        raise VendorContractError(
            f"{op}: num_seq_kvcache must be int32 of one dimension, got "
            f"{num_seq_kvcache.dtype} {tuple(num_seq_kvcache.shape)}"
        )
    words = task_map.view(torch.int32)
    heads, max_batch, max_seqlen = (int(words[i]) for i in (_HEADS, _MAX_BATCH, _MAX_SEQLEN))
    lengths = num_seq_kvcache.tolist()
    if num_head_kv != heads:
        raise VendorContractError(f"{op}: {num_head_kv} KV heads, the task map's are {heads}")
    if len(lengths) > max_batch:
        raise VendorContractError(f"{op}: {len(lengths)} requests, the task map holds {max_batch}")
    longest = max(lengths, default=0) + (0 if new_kv_included else mtp)
    if longest > max_seqlen:
        raise VendorContractError(
            f"{op}: a request of {longest} keys, the task map's max_seqlen is {max_seqlen}"
        )
    if not 1 <= mtp <= MAX_QUERIES:
        raise VendorContractError(f"{op}: {mtp} queries a request, the kernels take 1 to 4")
    record = schedule(num_seq_kvcache, mtp, new_kv_included)
    words[BATCH : BATCH + len(record)] = torch.tensor(record, dtype=torch.int32)
    return task_map


def attention_decode_bf16(
    q: torch.Tensor,
    kcache: torch.Tensor,
    vcache: torch.Tensor,
    block_ids: torch.Tensor,
    num_seq_kvcache: torch.Tensor,
    mtp: int = 0,
    new_kv_included: bool = False,
    splitk: bool = True,
    task_map: torch.Tensor | None = None,
    split_flag: torch.Tensor | None = None,
    output: torch.Tensor | None = None,
) -> torch.Tensor:
    """``hpc.attention_decode_bf16``'s signature (with ``task_map``); attnfuzz runs no
    forward."""
    raise RuntimeError("hpc's decode kernel is attnfuzz's stand-in; no forward runs here")


def hpc_module() -> types.ModuleType:
    """The ``hpc`` package as the engines' HPC backends call it (importable: it has a
    spec, which ``importlib.util.find_spec`` returns)."""
    module = types.ModuleType("hpc")
    module.__spec__ = importlib.machinery.ModuleSpec("hpc", None)
    module.get_attention_decode_task_workspace = get_attention_decode_task_workspace
    module.assign_attention_decode_task = assign_attention_decode_task
    module.attention_decode_bf16 = attention_decode_bf16
    return module


@contextlib.contextmanager
def hpc() -> Iterator[None]:
    """``hpc`` importable, the stand-in (this machine has no CUDA build of it)."""
    with in_sys_modules({"hpc": hpc_module()}):
        yield
