"""Standalone reproductions of SGLang findings: scripts that import only torch and SGLang.

Each function here takes a target's inputs (what the implementation's ``fn`` takes)
and returns the text of a script a maintainer runs with SGLang installed and no
attnfuzz (``attnfuzz export --standalone``). The script builds SGLang's own objects
with the witness's values written in as literals, drives the engine's code as SGLang
does, prints the wrong value beside the right one, and exits 1 where the defect
shows (0 where it does not). Importing this module imports nothing of SGLang.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from attnfuzz.harness.errors import UsageError

if TYPE_CHECKING:
    from attnfuzz.reference.mla_block_table import MlaBlockTableInputs

# What both MLA scripts build alike: one rank's server arguments of an EAGLE run on the
# backend, the request-to-token pool and the model runner its __init__ reads.
_MODEL_RUNNER = """\
# One process of one rank, and the server arguments of an EAGLE run on BACKEND_NAME.
parallel = get_parallel()
ranks = dict(attn_dcp_rank=0, attn_tp_rank=0, tp_rank=0)
parallel.override_permanently(**{{k: v for k, v in ranks.items() if hasattr(type(parallel), k)}})
args = get_context().override_server_args(
    device=DEVICE,
    attention_backend="BACKEND_ARG",
    speculative_algorithm="EAGLE",
    speculative_num_draft_tokens=N,
    speculative_num_steps=max(N - 1, 1),
    speculative_eagle_topk=1,
    page_size=PAGE_SIZE,
)
args.__enter__()

# The request-to-token pool (every token its own KV slot) and a model runner
# holding what BACKEND_CLASS.__init__ reads of it.
req_to_token = torch.arange(math.prod(POOL_SHAPE), dtype=torch.int32, device=DEVICE)
req_to_token = req_to_token.view(POOL_SHAPE)
kv_pool = SimpleNamespace(start_layer=0)
translator = None
try:  # mem_cache/kv_index_translator.py, where the release has it
    from sglang.srt.mem_cache.kv_index_translator import KVIndexTranslator

    translator = KVIndexTranslator(
        req_to_token=req_to_token,
        token_to_kv_pool_allocator=None,
        token_to_kv_pool=kv_pool,
        page_size=PAGE_SIZE,
        device=DEVICE,
    )
except ImportError:
    pass
model_runner = SimpleNamespace(
    model_config=SimpleNamespace(
        context_len=CONTEXT_LEN,  # as SGLang sizes it: max_model_len
        num_attention_heads=16,
        get_num_kv_heads=lambda tp_size: 1,
        kv_lora_rank=512,  # DeepSeek's MLA: the metadata depends on none of these
        qk_nope_head_dim=128,
        qk_rope_head_dim=64,
        v_head_dim=512,
        scaling=1.0,
        is_encoder_decoder=False,
    ),
    device=DEVICE,
    req_to_token_pool=SimpleNamespace(size=POOL_SHAPE[0] - 1, req_to_token=req_to_token),
    token_to_kv_pool=kv_pool,
    kv_index_translator=translator,
    page_size=PAGE_SIZE,
    kv_cache_dtype=DTYPE,
    dtype=DTYPE,
    max_running_requests=POOL_SHAPE[0] - 1,
    is_draft_worker=MODE != "TARGET_VERIFY",
    gpu_id=0,
    server_args=args,
)
"""


def _with_runner(template: str, marker: str, name: str, arg: str, cls: str) -> str:
    """``template`` with :data:`_MODEL_RUNNER` of backend ``arg`` where ``marker`` is."""
    block = _MODEL_RUNNER.replace("BACKEND_NAME", name).replace("BACKEND_ARG", arg)
    return template.replace(marker, block.replace("BACKEND_CLASS", cls))


TRTLLM_MLA_CONTEXT_LEN = '''\
"""SGLang TRT-LLM MLA: the CUDA-graph block table is sized by the model's context_len.

TRTLLMMLABackend.init_cuda_graph_state (layers/attention/trtllm_mla_backend.py)
gives each graph request _calc_padded_blocks(context_len) pages, while a request
being verified holds up to context_len - 4 + S committed tokens plus the N of the
step (managers/scheduler.py, speculative/eagle_worker_v2.py): its KV can pass
the context, and its row then lacks its last pages, which the decode kernel reads
through the row (one entry past it). Needs only torch and sglang; exits 1 where
the row is too narrow.
"""

import math
import os
import sys
from types import SimpleNamespace

import torch

# The witness: one step, as SGLang's scheduler and graph runner hand it on.
CONTEXT_LEN = {context_len}  # model_config.context_len (max_model_len)
PAGE_SIZE = {page_size}
N = {next_n}  # speculative_num_draft_tokens
MODE = "{mode}"  # ForwardMode of the step
MAX_BS = {max_bs}  # the largest captured graph (init_cuda_graph_state)
GRAPH_BS = {graph_bs}  # the graph the step is replayed in
SEQ_LENS = {seq_lens}  # the forward's seq_lens
REQ_POOL_INDICES = {req_pool_indices}
POOL_SHAPE = {pool_shape}  # req_to_token: context_len + N and more wide (allocation_sizing.py)

GPU = torch.cuda.is_available()
DEVICE = "cuda" if GPU else "cpu"
DTYPE = torch.bfloat16 if GPU else torch.float32  # the CPU's stand-ins take any dtype
if not GPU:  # no GPU: SGLang's Triton kernel runs under Triton's interpreter
    os.environ["TRITON_INTERPRET"] = "1"
    os.environ["CUDA_VISIBLE_DEVICES"] = ""

from sglang.srt.layers.attention import flashinfer_mla_backend, trtllm_mla_backend  # noqa: E402
from sglang.srt.model_executor.forward_batch_info import ForwardMode  # noqa: E402
from sglang.srt.runtime_context import get_context, get_parallel  # noqa: E402

if not GPU:  # stand in the CUDA-only pieces __init__ builds; the metadata never uses them
    flashinfer_mla_backend.BatchMLAPagedAttentionWrapper = lambda *a, **k: None
    flashinfer_mla_backend.BatchPrefillWithRaggedKVCacheWrapper = lambda *a, **k: None
    trtllm_mla_backend._jit_fixup_module = lambda dtype: None
    trtllm_mla_backend.flashinfer = SimpleNamespace(
        utils=SimpleNamespace(
            get_device_sm_count=lambda device: 132,
            get_trtllm_gen_multi_ctas_kv_counter_bytes=lambda *a: 64,
        )
    )
    torch.cuda.get_device_capability = lambda device=None: (10, 0)
    zeros = torch.zeros
    torch.zeros = lambda *a, pin_memory=False, **k: zeros(*a, **k)

<<MODEL_RUNNER_TRTLLM>>
backend = trtllm_mla_backend.TRTLLMMLABackend(model_runner)
mode = getattr(ForwardMode, MODE)

# The graph runner: its state for the largest graph, the capture of GRAPH_BS
# requests at the fill length, then the replay of the step padded to GRAPH_BS
# with requests of the fill length on row 0 (build_replay_fb_view).
kv_indices = None if GPU else torch.zeros(MAX_BS * CONTEXT_LEN, dtype=torch.int32)
backend.init_cuda_graph_state(MAX_BS, MAX_BS * N, kv_indices_buf=kv_indices)
# One spare row past the table (the engine keeps a view of its rows): no store
# past a row can leave the buffer, whatever the kernel's grid.
table = backend.decode_cuda_graph_kv_indices
spare = torch.full((table.shape[0] + 1, table.shape[1]), -1, dtype=table.dtype, device=DEVICE)
backend.decode_cuda_graph_kv_indices = spare[: table.shape[0]]
fill = backend.get_cuda_graph_seq_len_fill_value()


def view(seq_lens, req_pool_indices):
    return SimpleNamespace(
        forward_mode=mode,
        batch_size=GRAPH_BS,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int64, device=DEVICE),
        req_pool_indices=torch.tensor(req_pool_indices, dtype=torch.int64, device=DEVICE),
        positions=torch.zeros(GRAPH_BS * N, dtype=torch.int64, device=DEVICE),
        kv_loc_plan=None,
    )


padding = GRAPH_BS - len(SEQ_LENS)
backend.init_forward_metadata_out_graph(view([fill] * GRAPH_BS, [0] * GRAPH_BS), in_capture=True)
backend.init_forward_metadata_out_graph(
    view(SEQ_LENS + [fill] * padding, REQ_POOL_INDICES + [0] * padding)
)

# What the trtllm-gen kernel reads: each request's KV length and its row of pages.
metadata = backend.decode_cuda_graph_metadata[GRAPH_BS]
width = metadata.block_kv_indices.shape[1]
wrong = False
for r in range(len(SEQ_LENS)):
    kv_len = int(metadata.seq_lens_k[r])
    pages = -(-kv_len // PAGE_SIZE)
    wrong |= pages > width
    print(
        f"request {{r}}: block_kv_indices row width: {{width}} pages; the request's KV of "
        f"{{kv_len}} tokens needs {{pages}} pages of {{PAGE_SIZE}}"
        + (" (the row is too narrow)" if pages > width else "")
    )
sys.exit(1 if wrong else 0)
'''


FLASHMLA_CONTEXT_LEN = """\
\"\"\"SGLang FlashMLA: the CUDA-graph block table is sized by the model's context_len.

FlashMLABackend.init_cuda_graph_state (layers/attention/flashmla_backend.py) gives
each graph request (context_len + 64) // 64 pages of 64, while a request being
verified holds up to context_len - 4 + S committed tokens plus the N of the step
(managers/scheduler.py, speculative/eagle_worker_v2.py): at a context 61 to 63
tokens past a multiple of 64 its KV can pass the row, whose last pages are then
missing; flash_mla_with_kvcache reads them through the row (one entry past it).
Needs only torch and sglang; exits 1 where the row is too narrow.
\"\"\"

import math
import os
import sys
import types
from types import SimpleNamespace

import torch

# The witness: one step, as SGLang's scheduler and graph runner hand it on.
CONTEXT_LEN = {context_len}  # model_config.context_len (max_model_len)
N = {next_n}  # speculative_num_draft_tokens
MODE = "{mode}"  # ForwardMode of the step
MAX_BS = {max_bs}  # the largest captured graph (init_cuda_graph_state)
GRAPH_BS = {graph_bs}  # the graph the step is replayed in
SEQ_LENS = {seq_lens}  # the forward's seq_lens
REQ_POOL_INDICES = {req_pool_indices}
POOL_SHAPE = {pool_shape}  # req_to_token: context_len + N and more wide (allocation_sizing.py)
PAGE_SIZE = 64  # flashmla_backend.PAGE_SIZE

GPU = torch.cuda.is_available()
DEVICE = "cuda" if GPU else "cpu"
DTYPE = torch.bfloat16 if GPU else torch.float32  # the CPU's stand-ins take any dtype
if not GPU:  # no GPU: SGLang's Triton kernel runs under Triton's interpreter
    os.environ["TRITON_INTERPRET"] = "1"
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
try:
    import flash_mla  # noqa: F401
except ImportError:  # the wheel is CUDA only: its schedule's shapes, no kernel
    def decoding_metadata(seqlens, q_per_head_k, heads_k, *args, **kwargs):
        parts = max(132 // heads_k // -(-q_per_head_k // 64), 1)
        splits = torch.arange(seqlens.shape[0] + 1, dtype=torch.int32)
        return torch.zeros((parts, 8), dtype=torch.int32), splits

    interface = types.ModuleType("flash_mla.flash_mla_interface")
    interface.FlashMLASchedMeta = type("FlashMLASchedMeta", (), {{}})
    package = types.ModuleType("flash_mla")
    package.__path__ = []
    package.flash_mla_interface = interface
    package.get_mla_decoding_metadata = decoding_metadata
    package.fused_norm_rope_attn_rope_cast = None
    sys.modules.update({{"flash_mla": package, "flash_mla.flash_mla_interface": interface}})
if not GPU:  # the device queries and "cuda" buffers of init_cuda_graph_state
    torch.cuda.get_device_capability = lambda device=None: (9, 0)
    torch.cuda.get_device_properties = lambda device=None: SimpleNamespace(
        multi_processor_count=132
    )
    for name in ("full", "empty", "ones", "zeros"):
        def on_cpu(*a, _real=getattr(torch, name), pin_memory=False, **k):
            if str(k.get("device")) == "cuda":
                k["device"] = "cpu"
            return _real(*a, **k)

        setattr(torch, name, on_cpu)

from sglang.srt.layers.attention import flashinfer_mla_backend, flashmla_backend  # noqa: E402
from sglang.srt.model_executor.forward_batch_info import ForwardMode  # noqa: E402
from sglang.srt.runtime_context import get_context, get_parallel  # noqa: E402

if not GPU:  # stand in the wrappers the parent's __init__ builds; the metadata never uses them
    flashinfer_mla_backend.BatchMLAPagedAttentionWrapper = lambda *a, **k: None
    flashinfer_mla_backend.BatchPrefillWithRaggedKVCacheWrapper = lambda *a, **k: None

<<MODEL_RUNNER_FLASHMLA>>
backend = flashmla_backend.FlashMLABackend(model_runner)
mode = getattr(ForwardMode, MODE)

# The graph runner: its state for the largest graph, the capture of GRAPH_BS
# requests at the fill length, then the replay of the step padded to GRAPH_BS
# with requests of the fill length on row 0 (build_replay_fb_view).
backend.init_cuda_graph_state(MAX_BS, MAX_BS * N)
# One spare row past the table (the engine keeps a view of its rows): no store
# past a row can leave the buffer, whatever the kernel's grid.
table = backend.cuda_graph_kv_indices
spare = torch.full((table.shape[0] + 1, table.shape[1]), -1, dtype=table.dtype, device=DEVICE)
backend.cuda_graph_kv_indices = spare[: table.shape[0]]
if MODE == "TARGET_VERIFY":
    fill = backend.get_cuda_graph_seq_len_fill_value()
else:  # the draft-extend runner's fill
    from sglang.srt.speculative.eagle_draft_extend_cuda_graph_runner import (  # noqa: E402
        resolve_draft_extend_seq_len_fill_value,
    )

    fill = resolve_draft_extend_seq_len_fill_value(backend, N)


def view(seq_lens, req_pool_indices):
    lens = torch.tensor(seq_lens, dtype=torch.int64, device=DEVICE)
    return SimpleNamespace(
        forward_mode=mode,
        batch_size=GRAPH_BS,
        seq_lens=lens,
        seq_lens_cpu=lens.cpu(),
        req_pool_indices=torch.tensor(req_pool_indices, dtype=torch.int64, device=DEVICE),
        positions=torch.zeros(GRAPH_BS * N, dtype=torch.int64, device=DEVICE),
        kv_loc_plan=None,
    )


padding = GRAPH_BS - len(SEQ_LENS)
backend.init_forward_metadata_out_graph(view([fill] * GRAPH_BS, [0] * GRAPH_BS), in_capture=True)
seq_lens = SEQ_LENS + [fill] * padding
backend.init_forward_metadata_out_graph(view(seq_lens, REQ_POOL_INDICES + [0] * padding))

# What flash_mla_with_kvcache reads (forward_extend): each request's KV length (a
# verify's seq_lens + N, a draft extend's seq_lens_k) and its row of pages.
metadata = backend.forward_metadata
width = backend.cuda_graph_kv_indices.shape[1]
wrong = False
for r in range(len(SEQ_LENS)):
    if MODE == "TARGET_VERIFY":
        kv_len = seq_lens[r] + backend.num_draft_tokens
    else:
        kv_len = int(metadata.seq_lens_k[r])
    pages = -(-kv_len // PAGE_SIZE)
    wrong |= pages > width
    print(
        f"request {{r}}: block_kv_indices row width: {{width}} pages; the request's KV of "
        f"{{kv_len}} tokens needs {{pages}} pages of {{PAGE_SIZE}}"
        + (" (the row is too narrow)" if pages > width else "")
    )
sys.exit(1 if wrong else 0)
"""


def trtllm_mla_context_len(inputs: MlaBlockTableInputs) -> str:
    """The script of ``sglang-trtllm-mla-context-len``: SGLang's ``TRTLLMMLABackend``
    built as SGLang sizes it (``context_len`` the model's), the step's graph replay."""
    from attnfuzz.reference.mla_block_table import TARGET_VERIFY

    if inputs.graph_bs is None:
        raise UsageError(
            "the case is an eager step: the context-len finding is in the graph replay, "
            "so there is nothing to reproduce"
        )
    script = _with_runner(
        TRTLLM_MLA_CONTEXT_LEN, "<<MODEL_RUNNER_TRTLLM>>", "TRT-LLM MLA", "trtllm_mla",
        "TRTLLMMLABackend",
    )  # fmt: skip
    return script.format(
        context_len=inputs.context_len,
        page_size=inputs.page_size,
        next_n=inputs.next_n,
        mode="TARGET_VERIFY" if inputs.phase == TARGET_VERIFY else "DRAFT_EXTEND_V2",
        max_bs=max(inputs.capture_bs),
        graph_bs=inputs.graph_bs,
        seq_lens=[int(x) for x in inputs.seq_lens.cpu()],
        req_pool_indices=[int(x) for x in inputs.req_pool_indices.cpu()],
        pool_shape=tuple(inputs.req_to_token.shape),
    )


def flashmla_context_len(inputs: MlaBlockTableInputs) -> str:
    """The script of ``sglang-flashmla-context-len``: SGLang's ``FlashMLABackend`` built
    as SGLang sizes it (``context_len`` the model's), the step's graph replay."""
    from attnfuzz.reference.mla_block_table import TARGET_VERIFY

    if inputs.graph_bs is None:
        raise UsageError(
            "the case is an eager step: the context-len defect is in the graph replay, "
            "so there is nothing to reproduce"
        )
    script = _with_runner(
        FLASHMLA_CONTEXT_LEN, "<<MODEL_RUNNER_FLASHMLA>>", "FlashMLA", "flashmla", "FlashMLABackend"
    )
    return script.format(
        context_len=inputs.context_len,
        next_n=inputs.next_n,
        mode="TARGET_VERIFY" if inputs.phase == TARGET_VERIFY else "DRAFT_EXTEND_V2",
        max_bs=max(inputs.capture_bs),
        graph_bs=inputs.graph_bs,
        seq_lens=[int(x) for x in inputs.seq_lens.cpu()],
        req_pool_indices=[int(x) for x in inputs.req_pool_indices.cpu()],
        pool_shape=tuple(inputs.req_to_token.shape),
    )
