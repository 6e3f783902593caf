"""SGLang's decode graph runner step on the Intel XPU attention backend, as the
implementation ``sglang-xpu`` of ``runner-step``.

The step of :mod:`~attnfuzz.adapters.sglang.runner_step_fa3` (the same model runner,
request rows, decode graph runner, graph stand-in and fields), on the engine started
with ``--attention-backend intel_xpu``: ``layers/attention/xpu_backend.py``'s
``XPUAttentionBackend``, a backend of its own that keeps FlashAttention 3's metadata
(``FlashAttentionMetadata``) but builds it in its own code (SGLang 0.5.23), unchanged:
``__init__``; ``init_forward_metadata`` (eager: a decode, a target verify of ``topk``
1, an extend); ``init_cuda_graph_state`` (its own graph buffers, the page table sized
by the model's ``context_len``); ``init_forward_metadata_out_graph`` for every capture
batch size and, from ``load_batch``, the replay (``_set_decode_page_metadata``).

Where SGLang runs it: on ``--device xpu``. Decode graphs are opt-in there
(``arg_groups/platform_hook.py: handle_xpu_backends`` disables them unless
``--cuda-graph-backend-decode full`` is given, the one decode backend XPU takes): the
``padded`` and ``replay`` builds are that opt-in engine's, the ``eager`` and ``fresh``
builds the default's. Nothing beyond ``sglang-fa3``'s is stood in: the backend's
kernels (``sgl_kernel``'s XPU ops) never run, and the model runner answers the
attributes the backend reads at construction for a plain decoder (no sliding window, no
hybrid SWA pool, not encoder-decoder, not a draft worker).

It runs the cases ``sglang-fa3`` runs (the same engine and speculative options) on the
pages SGLang runs this backend with: 64 or 128 tokens (``arg_groups/overrides.py:
_intel_xpu_page_constraint``, for a model that is not MLA; any other page size becomes
128), so another page size is declined (:func:`declines`). An EAGLE tree (``topk`` > 1)
is never run here either: SGLang refuses it on pages above one token for every backend
but FlashInfer, FA3 and Triton (``arg_groups/speculative_hook.py:_handle_eagle_family``),
and this backend has no page of one token.

Mutant: ``sglang-xpu-table-short-of-window`` (the graph's page table sized for a
context ``next_n`` tokens short of the model's: safe padding at a replay or a verify's
capture), as ``sglang-fa3-table-short-of-window`` re-creates it for FlashAttention 3.
"""

from __future__ import annotations

from typing import Any

import torch
from attnfuzz.adapters.sglang import runner_step_fa3 as fa3
from attnfuzz.adapters.sglang.runner_step import arrive_then_step
from attnfuzz.reference.batch import Case, EngineConfig
from attnfuzz.reference.runner_step import RunnerStepInputs, RunnerStepOutputs
from attnfuzz.reference.trace import Trace

_XPU = "xpu_backend.py:XPUAttentionBackend"

PAGE_SIZES = (64, 128)
"""``arg_groups/overrides.py:_intel_xpu_page_constraint``: the page sizes SGLang runs the
XPU backend with for a model that is not MLA (any other becomes 128)."""


def prepare() -> None:
    """Import SGLang's runner and the XPU backend before a judge forks its child."""
    fa3.prepare()
    from sglang.srt.layers.attention import xpu_backend  # noqa: F401


def declines(case: Case) -> str | None:
    """Why SGLang never runs the XPU backend on ``case``'s config, else None."""
    page = case.config.block_size
    if page not in PAGE_SIZES:
        return (
            f"page size {page}: SGLang runs the intel_xpu backend with pages of 64 or 128 "
            "tokens only, any other becomes 128 (arg_groups/overrides.py: "
            "_intel_xpu_page_constraint)"
        )
    return None


class XPUEngine(fa3.FA3Engine):
    """One SGLang engine whose model runner's attention backend is Intel XPU's."""

    ATTENTION_BACKEND = "intel_xpu"
    WHERE = {
        "eager": f"{_XPU}.init_forward_metadata",
        "fresh": f"{_XPU}.init_forward_metadata (a new engine)",
        "padded": "decode_cuda_graph_runner.py:DecodeCudaGraphRunner.load_batch "
        f"(buffers; {_XPU}.init_forward_metadata_out_graph's forward_metadata)",
        "replay": "decode_cuda_graph_runner.py:DecodeCudaGraphRunner.execute (the metadata "
        "the graph captured)",
        "capture": "decode_cuda_graph_runner.py:DecodeCudaGraphRunner.capture_one_shape "
        f"({_XPU}.init_forward_metadata_out_graph, in_capture)",
    }

    def make_backend(self) -> Any:
        """``XPUAttentionBackend(model_runner)``, on what it reads of the model runner
        besides FlashAttention 3's."""
        from sglang.srt.layers.attention.xpu_backend import XPUAttentionBackend

        runner = self.runner
        runner.kv_cache_dtype = fa3.KV_CACHE_DTYPE
        runner.kv_cache_dtype_str = "auto"
        runner.model_config.is_local_attention_model = False
        runner.model_config.is_encoder_decoder = False
        runner.is_hybrid_swa = False
        runner.sliding_window_size = None
        runner.is_draft_worker = False
        return XPUAttentionBackend(runner)


class XPULife(fa3.FA3Life):
    """The engine of ``sglang-xpu``: :class:`XPUEngine`, kept across a life's steps."""

    engine_class: type[XPUEngine] = XPUEngine

    def prepare(self) -> None:
        prepare()

    def make(self, config: Any, device: torch.device, graphs: bool) -> XPUEngine:
        return self.engine_class(config, device, graphs=graphs)


ENGINE = XPULife()
"""The engine of the implementation ``sglang-xpu`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``sglang-xpu`` of ``runner-step``: the step on :data:`ENGINE`,
    kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]


# -- mutant: the XPU backend's graph page table short of the model's context --------------------


class _TableShortOfWindow(fa3._TableShortOfWindow, XPUEngine):
    """``sglang-fa3``'s defect on the XPU backend: the model's ``context_len`` ``next_n``
    tokens short while the backend is built, so ``init_cuda_graph_state`` sizes the
    graph's page table (``max_num_pages`` from ``max_context_len``) short of it."""


class _MutantLife(XPULife):
    engine_class = _TableShortOfWindow


TABLE_SHORT_OF_WINDOW = _MutantLife()


def run_table_short_of_window(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The mutant ``sglang-xpu-table-short-of-window``: :class:`_TableShortOfWindow`."""
    return TABLE_SHORT_OF_WINDOW(inputs)


run_table_short_of_window.new_engine = TABLE_SHORT_OF_WINDOW.new_engine  # type: ignore[attr-defined]

# Where the mutant lives and when it shows: sglang-fa3's.
reach_graph = fa3.reach_graph
trigger_table_short_of_window = fa3.trigger_table_short_of_window


def smallest_table_short_of_window() -> Trace:
    """One request of 64 tokens, then its decode to the model's limit of 65, in the graph
    of one: pages of 64 (the least this backend runs), so a table sized for 64 tokens
    holds one page and the 65th token's key lies in a second."""
    config = EngineConfig(max_model_len=65, max_num_seqs=1, max_num_batched_tokens=65,
                          block_size=64, num_spec=0, cudagraph_capture_sizes=(1,))  # fmt: skip
    return arrive_then_step(config, 64)
