"""Where SGLang runs each implementation's code in production (reachability's sites).

SGLang's attention metadata runs in Python on every step it serves: eagerly
(``EagerRunner``), and before each CUDA-graph replay
(``init_forward_metadata_out_graph`` is called on the replayed step's view, and
the graph runners fill their input buffers in Python). So a defect of that code
is live wherever one of its callers still calls it: each :class:`Site` names the
caller in SGLang's source and the name it must contain, and reachability reads
the installed release's source to see which hold. Callers of releases before
0.5.2x, where the runners were ``cuda_graph_runner.py``'s ``CudaGraphRunner``,
are alternatives of the same (runner, step).
"""

from __future__ import annotations

from attnfuzz.harness.engines import Site

_SRT = "sglang.srt"
_EAGER = f"{_SRT}.model_executor.runner.eager_runner:EagerRunner"
_DECODE = f"{_SRT}.model_executor.runner.decode_cuda_graph_runner:DecodeCudaGraphRunner"
_DRAFT_EXTEND = (
    f"{_SRT}.speculative.eagle_draft_extend_cuda_graph_runner:EAGLEDraftExtendCudaGraphRunner"
)
_OLD_DECODE = f"{_SRT}.model_executor.cuda_graph_runner:CudaGraphRunner"
_OUT_GRAPH = "init_forward_metadata_out_graph"
_OLD_REPLAY = "init_forward_metadata_replay_cuda_graph"

# The attention backends' metadata: eager steps, graph capture, each replay.
BACKEND_METADATA = (
    Site("EagerRunner", "eager decode / target verify", f"{_EAGER}._execute_decode",
         "init_forward_metadata", graph=False),
    Site("EagerRunner", "eager extend / draft extend", f"{_EAGER}._execute_extend",
         "init_forward_metadata", graph=False),
    Site("decode CUDA-graph runner", "replay", f"{_DECODE}._init_replay_attn_metadata_from_view",
         _OUT_GRAPH, graph=True),
    Site("decode CUDA-graph runner", "replay", f"{_OLD_DECODE}.replay_prepare", _OLD_REPLAY,
         graph=True),
    Site("EAGLE draft-extend CUDA-graph runner", "replay", f"{_DRAFT_EXTEND}.execute",
         _OUT_GRAPH, graph=True),
    Site("EAGLE draft-extend CUDA-graph runner", "replay", f"{_DRAFT_EXTEND}.replay",
         _OLD_REPLAY, graph=True),
)  # fmt: skip

# The decode graph runner's input buffers, filled before each replay.
GRAPH_INPUTS = (
    Site("decode CUDA-graph runner", "replay", f"{_DECODE}.load_batch", "fill_from", graph=True),
    Site("decode CUDA-graph runner", "replay", f"{_OLD_DECODE}.replay_prepare", "fill_from",
         graph=True),  # 0.5.13's registry
    Site("decode CUDA-graph runner", "replay", f"{_OLD_DECODE}.replay_prepare",
         "populate_from_forward_batch", graph=True),
)  # fmt: skip

SITES = {
    "dsa-metadata": BACKEND_METADATA,
    "graph-input-padding": GRAPH_INPUTS,
    "mla-block-table": BACKEND_METADATA,
    "spec-indptr": BACKEND_METADATA,
}


def sites(target: str, impl: str) -> tuple[Site, ...]:
    """The sites of ``target``'s SGLang implementation ``impl`` (an upstream mutant
    runs where the function it reverts runs)."""
    return SITES.get(target, ())
