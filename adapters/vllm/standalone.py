"""Standalone reproductions of vLLM findings: scripts that import only torch and vLLM.

Each function here takes a target's inputs (what the implementation's ``fn`` takes)
and returns the text of a script a maintainer runs with vLLM installed and no
attnfuzz (``attnfuzz export --standalone``). The script builds vLLM's own metadata
(``DeepseekV32IndexerMetadataBuilder`` on the step's ``CommonAttentionMetadata``)
with the witness's values written in as literals, calls vLLM's glue as installed,
then the same glue with #39542's slice, prints what each gives, and exits 1 where
the installed glue fails at the write-back (0 where it passes, 2 where it fails
anywhere else). Importing this module imports nothing of vLLM.
"""

from __future__ import annotations

import json
import pprint
from typing import TYPE_CHECKING

from attnfuzz.harness.errors import UsageError

if TYPE_CHECKING:
    from attnfuzz.reference.indexer_decode import IndexerDecodeInputs

# What both scripts share: the witness, vLLM's config and metadata, the stand-in.
_HEAD = '''\
"""{title}

{what}
The fix is #39542's slice (as in model_executor/layers/sparse_attn_indexer.py):
    {fixed_line}
Needs only torch and vllm; runs on the CPU. Builds the step's metadata with
vLLM's own DeepseekV32IndexerMetadataBuilder, calls the glue as installed, then
the same glue with that one line changed. Exits 1 where the installed glue fails
at the write-back, 0 where it passes, 2 where it fails anywhere else.
"""

import inspect
import json
import os
import sys
import tempfile
import traceback

import torch

if not torch.cuda.is_available():  # vLLM's CPU platform; its Triton kernels interpreted
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ["TRITON_INTERPRET"] = "1"
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
DEVICE = "cpu"

# The witness: one step of the engine below, as the model runner hands it to the
# builder (a decode step padded to a CUDA graph: padding requests of no tokens).
MAX_MODEL_LEN = {max_model_len}
MAX_NUM_SEQS = {max_num_seqs}
MAX_NUM_BATCHED_TOKENS = {max_num_batched_tokens}
BLOCK_SIZE = {block_size}
NUM_SPEC = {num_spec}  # MTP tokens (speculative_config.num_speculative_tokens)
CAPTURE_SIZES = {capture_sizes}
TOPK = {topk}  # index_topk
HEADS, HEAD_DIM = {num_heads}, {head_dim}  # indexer heads and head dim
QUERY_START_LOC = {query_start_loc}
SEQ_LENS = {seq_lens}
BLOCK_TABLE = {block_table}
SLOT_MAPPING = {slot_mapping}
NUM_ACTUAL_TOKENS = {num_actual_tokens}
MAX_QUERY_LEN, MAX_SEQ_LEN = {max_query_len}, {max_seq_len}
# The layer's operands: small integers, exact in fp8 (keys cached with scale 1).
Q = {q}  # [tokens, heads, head_dim]
WEIGHTS = {weights}  # [tokens, heads]
KEYS = {keys}  # [num_blocks, block_size, head_dim]
BUFFER = {buffer}  # topk_indices_buffer as the step finds it

from vllm import __version__  # noqa: E402
from vllm.config import (  # noqa: E402
    CacheConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
    SpeculativeConfig,
    VllmConfig,
    set_current_vllm_config,
)
from vllm.forward_context import set_forward_context  # noqa: E402
from vllm.v1.attention.backend import CommonAttentionMetadata  # noqa: E402
from vllm.v1.attention.backends.mla.indexer import DeepseekV32IndexerMetadataBuilder  # noqa: E402
from vllm.v1.kv_cache_interface import MLAAttentionSpec  # noqa: E402

# A DeepSeek-V3.2-style model as small as vLLM accepts (the builder reads its config).
MODEL = {model}
model_dir = tempfile.mkdtemp()
with open(os.path.join(model_dir, "config.json"), "w") as f:
    json.dump(MODEL, f)
model = ModelConfig(model=model_dir, skip_tokenizer_init=True, dtype="bfloat16")
parallel = ParallelConfig()
spec = None
if NUM_SPEC:
    spec = SpeculativeConfig(
        method="mtp",
        num_speculative_tokens=NUM_SPEC,
        target_model_config=model,
        target_parallel_config=parallel,
    )
vllm_config = VllmConfig(
    model_config=model,
    speculative_config=spec,
    scheduler_config=SchedulerConfig(
        max_num_seqs=256,
        max_num_batched_tokens=8192,
        max_model_len=model.max_model_len,
        is_encoder_decoder=False,
    ),
    cache_config=CacheConfig(block_size=16),
    parallel_config=parallel,
)
# The engine's limits, set after validation (the CPU platform overrides some of them).
vllm_config.model_config.max_model_len = MAX_MODEL_LEN
vllm_config.scheduler_config.max_num_seqs = MAX_NUM_SEQS
vllm_config.scheduler_config.max_num_batched_tokens = MAX_NUM_BATCHED_TOKENS
vllm_config.scheduler_config.max_model_len = MAX_MODEL_LEN
vllm_config.cache_config.block_size = BLOCK_SIZE
vllm_config.compilation_config.cudagraph_capture_sizes = CAPTURE_SIZES
vllm_config.compilation_config.max_cudagraph_capture_size = max(CAPTURE_SIZES)

# The indexer's metadata, built by vLLM: its cache is one head of uint8, fp8 keys
# then their fp32 scales.
LAYER = "model.layers.0.self_attn.indexer.k_cache"
kv_spec = MLAAttentionSpec(
    block_size=BLOCK_SIZE, num_kv_heads=1, head_size=HEAD_DIM + 4, dtype=torch.uint8
)
with set_current_vllm_config(vllm_config):
    builder = DeepseekV32IndexerMetadataBuilder(
        kv_spec,
        [LAYER],
        vllm_config,
        torch.device(DEVICE),
        block_table_width=len(BLOCK_TABLE[0]),
    )
    common = CommonAttentionMetadata(
        query_start_loc=torch.tensor(QUERY_START_LOC, dtype=torch.int32),
        query_start_loc_cpu=torch.tensor(QUERY_START_LOC, dtype=torch.int32),
        seq_lens=torch.tensor(SEQ_LENS, dtype=torch.int32),
        num_reqs=len(SEQ_LENS),
        num_actual_tokens=NUM_ACTUAL_TOKENS,
        max_query_len=MAX_QUERY_LEN,
        max_seq_len=MAX_SEQ_LEN,
        block_table_tensor=torch.tensor(BLOCK_TABLE, dtype=torch.int32),
        slot_mapping=torch.tensor(SLOT_MAPPING, dtype=torch.int64),
        seq_lens_cpu_upper_bound=torch.tensor(SEQ_LENS, dtype=torch.int32),
    )
    metadata = builder.build(0, common)
decode = metadata.decode
decode_lens = decode.decode_lens.tolist()
real = int(sum(decode_lens))
print(
    f"vLLM {{__version__}}: num_decode_tokens {{metadata.num_decode_tokens}}, "
    f"decode_lens {{decode_lens}} ({{real}} real decode tokens), "
    f"requires_padding {{decode.requires_padding}}"
)

# The fp8 cache the glue reads, in the layout vLLM writes (a page's fp8 values, then
# its fp32 scales).
keys = torch.tensor(KEYS, dtype=torch.float32).to(torch.float8_e4m3fn).view(torch.uint8)
scales = torch.ones(keys.shape[:2], dtype=torch.float32).view(torch.uint8)
pages = torch.cat([keys.flatten(1), scales.flatten(1)], 1)
kv_cache = pages.view(keys.shape[0], BLOCK_SIZE, HEAD_DIM + 4)
q_fp8 = torch.tensor(Q, dtype=torch.float32).to(torch.float8_e4m3fn)
weights = torch.tensor(WEIGHTS, dtype=torch.float32)
hidden_states = torch.empty((len(Q), 1), dtype=torch.bfloat16)
total_seq_lens = MAX_NUM_BATCHED_TOKENS  # the prefill gather buffer: no prefill here


def paged_mqa_logits(
    q, kv_cache, weights, context_lens, block_tables, schedule_metadata, max_model_len, **_
):
    """Stands in for AITER's paged MQA logits (rocm_fp8_paged_mqa_logits: without AITER
    it runs vLLM's torch fallback, which views the scales at byte offset
    block_size * head_dim as fp32 and fails where that is not a multiple of 4); it
    computes no metadata. Row b * next_n + j: sum_h w[h] * relu(q[h] . key) for each key
    its context length covers, read through the block table; -inf after."""
    batch, next_n, _, dim = q.shape
    num_blocks, block_size = kv_cache.shape[:2]
    flat = kv_cache.reshape(num_blocks, -1)
    values = flat[:, : block_size * dim].contiguous().view(torch.float8_e4m3fn).float()
    scale = flat[:, block_size * dim :].contiguous().view(torch.float32)
    keys = values.view(num_blocks, block_size, dim) * scale.view(num_blocks, block_size, 1)
    lens = context_lens.reshape(batch, -1).long()
    if lens.shape[1] != next_n:  # one length a sequence: row j sees n - next_n + j + 1
        lens = (lens[:, -1:] - next_n + 1 + torch.arange(next_n)).clamp(min=0)
    logits = torch.full((batch * next_n, max_model_len), float("-inf"))
    for b in range(batch):
        for j in range(next_n):
            pos = torch.arange(int(lens[b, j]))
            k = keys[block_tables[b, pos // block_size].long(), pos % block_size]
            scores = torch.relu(k @ q[b, j].float().T) @ weights[b * next_n + j]
            logits[b * next_n + j, : pos.numel()] = scores
    return logits


def top_k_per_row_decode(logits, next_n, seq_lens, indices, num_rows, s0, s1, topk):
    """Stands in for torch.ops._C.top_k_per_row_decode (vLLM's compiled top-k, which a
    CPU build lacks); it computes no metadata. Row i keeps the topk best columns below
    its length (seq_lens per row, or per sequence of next_n rows: row i then sees
    seq_lens[i // next_n] - next_n + i % next_n + 1), -1 after; ties to the lowest."""
    lens = seq_lens.reshape(-1).long()
    if lens.numel() != num_rows:
        row = torch.arange(num_rows)
        lens = (lens[row // next_n] - next_n + 1 + row % next_n).clamp(min=0)
    for i in range(num_rows):
        best = torch.sort(logits[i, : int(lens[i])], descending=True, stable=True).indices
        indices[i, :topk] = -1
        indices[i, : min(topk, best.numel())] = best[:topk].to(indices.dtype)


if not hasattr(torch.ops._C, "top_k_per_row_decode"):
    torch.ops._C.top_k_per_row_decode = top_k_per_row_decode


def with_slice(function, line, fixed_line):
    """``function`` (undecorated) compiled from its source with ``line`` replaced by
    #39542's ``fixed_line``, in its module's globals; None where the installed source
    has no such line."""
    raw = inspect.unwrap(function)
    source = inspect.getsource(raw)
    source = source[source.index("def ") :]  # its decorator, if any, off
    if source.count(line) != 1:
        return None
    source = source.replace(line, fixed_line)
    scope = dict(raw.__globals__)
    exec(compile(source, f"<{{raw.__module__}} with #39542's slice>", "exec"), scope)
    return scope[raw.__name__]


def run(call):
    """The decode rows the glue leaves, or the exception it raised."""
    buffer = torch.tensor(BUFFER, dtype=torch.int32)
    context = set_forward_context({{LAYER: metadata}}, vllm_config)
    with set_current_vllm_config(vllm_config), context:
        try:
            call(
                hidden_states, LAYER, kv_cache, q_fp8, None, weights, HEAD_DIM, "ue8m0", TOPK,
                HEAD_DIM, MAX_MODEL_LEN, total_seq_lens, buffer, skip_k_cache_insert=True,
            )  # fmt: skip
        except Exception as e:
            return e
    return buffer[:real].tolist()


def show(label, result):
    if isinstance(result, Exception):
        print(f"{{label}}: {{type(result).__name__}}: {{result}}")
    else:
        print(f"{{label}}: topk_indices_buffer[:{{real}}] = {{result}}")

'''

_ROCM = """\
from vllm.v1.attention.ops import rocm_aiter_mla_sparse as rocm  # noqa: E402

rocm.rocm_fp8_paged_mqa_logits = paged_mqa_logits
LINE = "topk_indices_buffer[:num_decode_tokens, : topk_indices.shape[-1]] = ("
FIXED = "topk_indices_buffer[: topk_indices.shape[0], : topk_indices.shape[-1]] = ("
glue = rocm.rocm_aiter_sparse_attn_indexer
where = "v1/attention/ops/rocm_aiter_mla_sparse.py:rocm_aiter_sparse_attn_indexer"
installed = run(glue)
fixed = with_slice(glue, LINE, FIXED)
"""

_GFX942 = """\
from vllm.models.deepseek_v41.amd.ops import sparse_indexer  # noqa: E402

# --monokernel on a gfx942 GPU: ops.enabled() is what gfx942_sparse_attn_indexer
# reads to run its own _decode_step; stood in here, in that module only. topk.py
# keeps its own enabled() (False off ROCm, as ops/__init__.py reads): its gfx942
# hooks then return False and vLLM's op runs, their documented fallback ("each
# launch returns False for a call that it cannot take").
sparse_indexer.enabled = lambda: True
sparse_indexer.rocm_fp8_paged_mqa_logits = paged_mqa_logits
LINE = "topk_indices_buffer[:num_decode_tokens, : unpacked.shape[-1]] = unpacked"
FIXED = "topk_indices_buffer[: unpacked.shape[0], : unpacked.shape[-1]] = unpacked"
glue = sparse_indexer.gfx942_sparse_attn_indexer
where = "models/deepseek_v41/amd/ops/sparse_indexer.py:_decode_step"
installed = run(glue)
step = with_slice(sparse_indexer._decode_step, LINE, FIXED)
fixed = None
if step is not None:
    original, sparse_indexer._decode_step = sparse_indexer._decode_step, step
    fixed = glue


def fixed_run(call):
    try:
        return run(call)
    finally:
        sparse_indexer._decode_step = original
"""

_TAIL = """\
show(f"{{where}} as installed", installed)
if fixed is None:
    print(f"the installed glue has no line {{LINE!r}}: nothing to change")
else:
    show("with #39542's slice", {fixed_call})
failed = isinstance(installed, RuntimeError) and LINE.split(",")[0] in "".join(
    traceback.format_tb(installed.__traceback__)
)
if isinstance(installed, Exception) and not failed:
    traceback.print_exception(installed)
    sys.exit(2)  # the glue failed elsewhere: not this defect
sys.exit(1 if failed else 0)
"""

ROCM_TITLE = (
    "vLLM ROCm sparse indexer: the decode write-back takes num_decode_tokens rows.",
    "v1/attention/ops/rocm_aiter_mla_sparse.py:rocm_aiter_sparse_attn_indexer, on a\n"
    "decode step padded to a CUDA graph (decode_lens with zero-length padding\n"
    "requests), unpacks the decode rows to sum(decode_lens) rows and writes them back\n"
    "with topk_indices_buffer[:num_decode_tokens, : topk_indices.shape[-1]], which\n"
    "has num_decode_tokens rows.",
    "topk_indices_buffer[: topk_indices.shape[0], : topk_indices.shape[-1]] = topk_indices",
)
GFX942_TITLE = (
    "vLLM DeepSeek-V4.1 gfx942 sparse indexer: the decode write-back takes num_decode_tokens rows.",
    "models/deepseek_v41/amd/ops/sparse_indexer.py:_decode_step (what\n"
    "gfx942_sparse_attn_indexer runs for a step of only decode rows with --monokernel\n"
    "on gfx942), on a decode step padded to a CUDA graph (decode_lens with\n"
    "zero-length padding requests), unpacks the decode rows to sum(decode_lens) rows\n"
    "and writes them back with topk_indices_buffer[:num_decode_tokens, ...], which\n"
    "has num_decode_tokens rows.",
    "topk_indices_buffer[: unpacked.shape[0], : unpacked.shape[-1]] = unpacked",
)


def _literal(x) -> str:
    return json.dumps(x.tolist() if hasattr(x, "tolist") else x)


def _script(inputs: IndexerDecodeInputs, title: tuple[str, str, str], body: str, call: str) -> str:
    from attnfuzz.adapters.vllm._engine import TINY_DEEPSEEK_V32

    config, common = inputs.config, inputs.common
    if config is None or common is None:
        raise UsageError("the case has no engine config: vLLM's metadata cannot be built")
    if inputs.num_decode_tokens != common.num_actual_tokens:
        raise UsageError(
            "the case has prefill tokens: the defect is in the decode branch of a "
            "decode-only step (shrink the case to one)"
        )
    head = _HEAD.format(
        title=title[0],
        what=title[1],
        fixed_line=title[2],
        max_model_len=config.max_model_len,
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
        block_size=config.block_size,
        num_spec=config.num_spec,
        capture_sizes=_literal(sorted(config.cudagraph_capture_sizes)),
        topk=config.topk,
        num_heads=config.num_heads,
        head_dim=config.head_dim,
        query_start_loc=_literal(common.query_start_loc),
        seq_lens=_literal(common.seq_lens),
        block_table=_literal(common.block_table),
        slot_mapping=_literal(common.slot_mapping),
        num_actual_tokens=common.num_actual_tokens,
        max_query_len=common.max_query_len,
        max_seq_len=common.max_seq_len,
        q=_literal(inputs.q.float().cpu().to(int)),
        weights=_literal(inputs.weights.float().cpu().to(int)),
        keys=_literal(inputs.kv_cache.float().cpu().to(int)),
        buffer=_literal(inputs.topk_indices_buffer.cpu()),
        model=pprint.pformat(TINY_DEEPSEEK_V32, width=88, sort_dicts=False),
    )
    return head + "\n" + body + "\n" + _TAIL.format(fixed_call=call)


def rocm_writeback(inputs: IndexerDecodeInputs) -> str:
    """The script of ``vllm-rocm``: ``rocm_aiter_sparse_attn_indexer`` on the witness,
    as installed and with #39542's slice."""
    return _script(inputs, ROCM_TITLE, _ROCM, "run(fixed)")


def deepseek_v41_amd_writeback(inputs: IndexerDecodeInputs) -> str:
    """The script of ``vllm-deepseek-v41-amd``: ``gfx942_sparse_attn_indexer`` (its
    ``_decode_step``) on the witness, as installed and with #39542's slice."""
    return _script(inputs, GFX942_TITLE, _GFX942, "fixed_run(fixed)")
