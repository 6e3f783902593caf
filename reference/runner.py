"""What the model runner builds for one step: the CUDA-graph mode it runs in, and its padding.

Plain rules, each read off vLLM 0.33.0's own decision code (cited per rule);
:mod:`attnfuzz.adapters.vllm.runner_modes` runs that code itself, and a test
checks that the two agree on drawn configs.

The terms:

- ``cudagraph_mode`` (the engine's ``CompilationConfig.cudagraph_mode``) is one of
  :data:`CUDAGRAPH_MODES`. Its *decode* part decides uniform decode steps, its
  *mixed* part every other step (``CUDAGraphMode.decode_mode`` / ``mixed_mode``).
- ``cg_support`` is the attention backend's ``AttentionCGSupport``. A mode the
  backend cannot run is rewritten by ``CompilationConfig.resolve_cudagraph_mode_and_sizes``
  (``vllm/config/compilation.py``); attnfuzz draws the modes the engine keeps
  and refuses the others (:func:`mode_problem`): the resolved mode is the one to write.
- A step runs in one *runtime* mode (:data:`RUNTIME_MODES`): ``NONE`` (eager),
  ``PIECEWISE`` (attention runs eagerly between captured pieces), or ``FULL``
  (the whole forward, attention included, replays a captured graph).
- Only ``FULL`` pads the attention metadata: ``pad_attn = cudagraph_mode ==
  CUDAGraphMode.FULL`` (``vllm/v1/worker/gpu_model_runner.py``,
  ``GPUModelRunner.execute_model``; Model Runner V2 in
  ``vllm/v1/worker/gpu/model_states/default.py``, ``DefaultModelState.prepare_attn``).
  Padding requests have ``q_len = 0`` and ``seq_len = 0``.

Not modelled: dual-batch overlap (``--enable-dbo``), which slices a step's
metadata into micro-batches (``vllm/v1/worker/ubatch_utils.py``,
``maybe_create_ubatch_slices`` and ``split_attn_metadata``); each slice is a
step of its own kind, which a target would need to be judged on separately.
"""

from __future__ import annotations

from dataclasses import dataclass

CUDAGRAPH_MODES = ("NONE", "PIECEWISE", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE", "FULL")
CG_SUPPORTS = ("NEVER", "UNIFORM_SINGLE_TOKEN_DECODE", "UNIFORM_BATCH", "ALWAYS")
RUNNERS = ("v1", "v2")
RUNTIME_MODES = ("NONE", "PIECEWISE", "FULL")

DEEPSEEK_V32_CG_SUPPORTS = ("UNIFORM_BATCH", "NEVER")
"""The ``AttentionCGSupport`` of DeepSeek-V3.2's sparse MLA backends in vLLM 0.33.0
(``flashmla_sparse.py``, ``flashinfer_mla_sparse.py``, ``rocm_aiter_mla_sparse.py``:
UNIFORM_BATCH; ``xpu_mla_sparse.py``: NEVER)."""
DEFAULT_CUDAGRAPH_MODE = "FULL_AND_PIECEWISE"  # vLLM's default
DEFAULT_CG_SUPPORT = "UNIFORM_BATCH"  # the MLA and indexer backends of the DeepSeek targets
DEFAULT_RUNNER = "v2"  # Model Runner V2, the default of vLLM 0.33.0

_DECISIONS = {
    "v1": "vllm/v1/cudagraph_dispatcher.py: CudagraphDispatcher.dispatch",
    "v2": "vllm/v1/worker/gpu/cudagraph_utils.py: CudaGraphManager.dispatch",
}
_PAD_ATTN = {
    "v1": "vllm/v1/worker/gpu_model_runner.py: GPUModelRunner.execute_model "
    "(pad_attn = cudagraph_mode == CUDAGraphMode.FULL)",
    "v2": "vllm/v1/worker/gpu/model_states/default.py: DefaultModelState.prepare_attn "
    "(padded sizes only when cudagraph_mode == CUDAGraphMode.FULL)",
}


def decode_mode(mode: str) -> str:
    """The runtime mode of uniform decode steps (``CUDAGraphMode.decode_mode``)."""
    return {"NONE": "NONE", "PIECEWISE": "PIECEWISE"}.get(mode, "FULL")


def mixed_mode(mode: str) -> str:
    """The runtime mode of every other step (``CUDAGraphMode.mixed_mode``)."""
    return {"FULL": "FULL", "NONE": "NONE", "FULL_DECODE_ONLY": "NONE"}.get(mode, "PIECEWISE")


def separate_routine(mode: str) -> bool:
    """Uniform decodes have graphs of their own (``CUDAGraphMode.separate_routine``)."""
    return mode in ("FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")


def mode_problem(mode: str, support: str, next_n: int) -> str | None:
    """Why the engine would not keep ``mode`` with a backend of ``support``, or None.

    The rules of ``CompilationConfig.resolve_cudagraph_mode_and_sizes``
    (``vllm/config/compilation.py``): FULL graphs of mixed steps need
    ``ALWAYS``; FULL graphs of decodes need more than ``NEVER``, and with
    speculative decoding (``next_n > 1``) at least ``UNIFORM_BATCH``.
    """
    if mode not in CUDAGRAPH_MODES:
        return f"cudagraph_mode {mode!r}: expected one of {', '.join(CUDAGRAPH_MODES)}"
    if support not in CG_SUPPORTS:
        return f"cg_support {support!r}: expected one of {', '.join(CG_SUPPORTS)}"
    where = "(vllm/config/compilation.py: CompilationConfig.resolve_cudagraph_mode_and_sizes)"
    if mixed_mode(mode) == "FULL" and support != "ALWAYS":
        return (
            f"cudagraph_mode {mode} needs a backend with cg_support ALWAYS, not {support} {where}"
        )
    if decode_mode(mode) == "FULL" and support == "NEVER":
        return (
            f"cudagraph_mode {mode} needs FULL graphs, which cg_support NEVER has none of {where}"
        )
    if decode_mode(mode) == "FULL" and next_n > 1 and support == "UNIFORM_SINGLE_TOKEN_DECODE":
        return (
            f"cudagraph_mode {mode} with next_n={next_n} needs cg_support UNIFORM_BATCH "
            f"or ALWAYS, not {support} {where}"
        )
    return None


def allowed_modes(support: str, next_n: int) -> tuple[str, ...]:
    """The modes the engine keeps for a backend of ``support``, in :data:`CUDAGRAPH_MODES` order."""
    return tuple(m for m in CUDAGRAPH_MODES if mode_problem(m, support, next_n) is None)


@dataclass(frozen=True)
class GraphKey:
    """A graph the runner captures: its runtime mode, token count, and request count
    (None: any, a PIECEWISE graph); ``uniform`` is the query length of a uniform
    decode graph, ``max_query_len`` the bound of a varlen decode graph."""

    mode: str
    num_tokens: int
    num_reqs: int | None
    uniform: int | None = None
    max_query_len: int | None = None


def graph_keys(
    mode: str,
    capture_sizes: tuple[int, ...],
    next_n: int,
    max_num_seqs: int,
    runner: str,
    varlen_decode: bool = False,
) -> list[GraphKey]:
    """Every graph the runner captures, smallest first.

    - V1 (``CudagraphDispatcher.initialize_cudagraph_keys``): a mixed graph per
      capture size ``s`` with ``min(s, max_num_seqs)`` requests (any count for
      PIECEWISE); with a separate decode routine, a uniform decode graph per
      capture size in ``[next_n, next_n * max_num_seqs]`` with ``s // next_n`` requests.
    - V2 (``CudaGraphManager._init_candidates``): the same mixed graphs; decode
      graphs at ``round_up(s, next_n)`` tokens, or with ``varlen_decode``
      (adaptive verification) a varlen decode graph per capture size up to
      ``next_n * max_num_seqs``, taking any mix of ``1..next_n`` tokens per
      request, ``min(s, max_num_seqs)`` requests.
    """
    if mode == "NONE" or not capture_sizes:
        return []
    sizes = sorted(capture_sizes)
    max_decode_tokens = next_n * max_num_seqs
    keys: list[GraphKey] = []
    for s in sizes:
        if separate_routine(mode):
            if runner == "v2" and varlen_decode:
                if s <= max_decode_tokens:
                    keys.append(GraphKey("FULL", s, min(s, max_num_seqs), None, next_n))
            elif runner == "v2":
                rounded = -(-s // next_n) * next_n
                key = GraphKey("FULL", rounded, rounded // next_n, next_n)
                if rounded <= min(max_decode_tokens, sizes[-1]) and key not in keys:
                    keys.append(key)
            elif next_n <= s <= max_decode_tokens:
                keys.append(GraphKey("FULL", s, min(s // next_n, max_num_seqs), next_n))
        mixed = mixed_mode(mode)
        if mixed != "NONE":
            keys.append(GraphKey(mixed, s, min(s, max_num_seqs) if mixed == "FULL" else None))
    return keys


@dataclass(frozen=True)
class StepPlan:
    """What the runner runs one step as.

    ``num_tokens_padded`` is the token count the model runs (a graph's size,
    or the data-parallel maximum); ``num_reqs_padded`` and ``num_tokens_attn``
    the sizes of the attention metadata (padded only on FULL steps);
    ``slot_mapping_tokens`` the length of the step's slot mapping, padded with
    ``-1`` (V2 always pads it to ``num_tokens_padded``: ``BlockTables.compute_slot_mappings``
    in ``DefaultModelState``'s runner; V1 only on FULL steps or where a backend
    updates the KV cache outside ``forward``: ``has_separate_kv_update`` in
    ``GPUModelRunner.execute_model``). ``decided_by`` cites the lines that decided.
    """

    mode: str
    num_tokens: int
    num_reqs: int
    num_tokens_padded: int
    num_reqs_padded: int
    slot_mapping_tokens: int
    decided_by: tuple[str, ...]

    @property
    def pad_attn(self) -> bool:
        return self.mode == "FULL"

    @property
    def num_tokens_attn(self) -> int:
        return self.num_tokens_padded if self.pad_attn else self.num_tokens

    @property
    def padded(self) -> bool:
        """The attention metadata is at a graph's sizes (possibly the real ones)."""
        return self.pad_attn


def _compatible(
    key: GraphKey, num_reqs: int, num_tokens: int, uniform: int | None, max_query_len: int | None
) -> bool:
    """``_is_compatible`` of ``vllm/v1/worker/gpu/cudagraph_utils.py``."""
    return (
        (key.uniform is None or key.uniform == uniform)
        and (
            key.max_query_len is None
            or (max_query_len is not None and key.max_query_len >= max_query_len)
        )
        and (key.num_reqs is None or key.num_reqs >= num_reqs)
        and key.num_tokens >= num_tokens
    )


def dispatch(
    keys: list[GraphKey],
    runner: str,
    num_reqs: int,
    num_tokens: int,
    uniform: int | None,
    max_query_len: int | None,
    allowed: tuple[str, ...] = RUNTIME_MODES,
    capture_sizes: tuple[int, ...] = (),
) -> GraphKey:
    """The graph a step of these sizes replays, or a NONE key (eager, unpadded).

    Both runners try the FULL graphs first, then PIECEWISE. V1 pads the token
    count to the smallest capture size and looks the key up exactly; V2 tries
    the graphs of the smallest size at or above the count, first compatible wins.
    """
    for mode in ("FULL", "PIECEWISE"):
        if mode not in allowed:
            continue
        of_mode = [k for k in keys if k.mode == mode and k.num_tokens >= num_tokens]
        if runner == "v1":  # pad to the smallest capture size, then look the key up
            fitting = sorted(s for s in capture_sizes if s >= num_tokens)
            if not fitting:
                break
            of_mode = [k for k in of_mode if k.num_tokens == fitting[0]]
        if not of_mode:
            continue
        smallest = min(k.num_tokens for k in of_mode)
        for key in (k for k in of_mode if k.num_tokens == smallest):
            if _compatible(key, num_reqs, num_tokens, uniform, max_query_len):
                return key
    return GraphKey("NONE", num_tokens, num_reqs)


def step_plan(config, batch) -> StepPlan:  # noqa: ANN001 (reference.batch imports this module)
    """The runtime mode and padding of ``batch`` under ``config`` (an ``EngineConfig``).

    A step is a uniform decode when every request carries ``next_n`` tokens
    (``GPUModelRunner._is_uniform_decode``; V2's ``get_uniform_decode_token_count``
    with the decode query length). ``batch.use_cudagraph = False`` forces an
    eager step (the runner's ``force_eager``). With data parallelism
    (``batch.dp_peer_tokens > 0``) the ranks agree on the smaller runtime mode
    and, unless that is NONE, every rank runs the largest token count
    (V1: ``coordinate_batch_across_dp`` in ``vllm/v1/worker/dp_utils.py``;
    V2: ``sync_cudagraph_and_dp_padding`` in ``vllm/v1/worker/gpu/dp_utils.py``).
    """
    runner, mode, next_n = config.runner, config.cudagraph_mode, config.next_n
    q_lens = batch.q_lens
    num_reqs, num_tokens = len(q_lens), sum(q_lens)
    uniform = next_n if q_lens and all(q == next_n for q in q_lens) else None
    decodes_only = all(q <= config.threshold for q in q_lens)
    max_query_len = max(q_lens, default=0) if decodes_only else None
    cite = [_DECISIONS[runner]]
    if not batch.use_cudagraph:
        key = GraphKey("NONE", num_tokens, num_reqs)
        cite = ["a step forced eager (force_eager / need_eager)"]
    else:
        keys = graph_keys(
            mode,
            config.cudagraph_capture_sizes,
            next_n,
            config.max_num_seqs,
            runner,
            config.varlen_decode,
        )
        sizes = config.cudagraph_capture_sizes
        key = dispatch(
            keys, runner, num_reqs, num_tokens, uniform, max_query_len, capture_sizes=sizes
        )
        if batch.dp_peer_tokens:
            peer_uniform = next_n if batch.dp_peer_uniform else None
            peer_reqs = batch.dp_peer_tokens // next_n if peer_uniform else 1
            peer = dispatch(
                keys,
                runner,
                peer_reqs,
                batch.dp_peer_tokens,
                peer_uniform,
                next_n if peer_uniform else None,
                capture_sizes=sizes,
            )
            synced = min(key.mode, peer.mode, key=RUNTIME_MODES.index)
            cite.append(_DP[runner])
            if synced != "NONE":
                if runner == "v1":  # ranks pad to the largest padded count, one mode
                    dp_tokens = max(key.num_tokens, peer.num_tokens)
                    key = dispatch(
                        keys,
                        runner,
                        num_reqs,
                        dp_tokens,
                        uniform,
                        max_query_len,
                        allowed=(synced,),
                        capture_sizes=sizes,
                    )
                    if key.mode == "NONE":  # the runner's assert: every rank found its graph
                        key = GraphKey("NONE", dp_tokens, num_reqs)
                else:  # the largest unpadded count, uniform only where both are
                    synced_uniform = uniform if uniform == peer_uniform else None
                    peer_mql = next_n if peer_uniform else None
                    synced_mql = (
                        None
                        if max_query_len is None or peer_mql is None
                        else max(max_query_len, peer_mql)
                    )
                    key = dispatch(
                        keys,
                        runner,
                        num_reqs,
                        max(num_tokens, batch.dp_peer_tokens),
                        synced_uniform,
                        synced_mql,
                        capture_sizes=sizes,
                    )
            elif runner == "v1":  # eager on every rank; each keeps its own padded count
                key = GraphKey("NONE", key.num_tokens, num_reqs)
            else:
                key = GraphKey("NONE", num_tokens, num_reqs)
    pad_attn = key.mode == "FULL"
    if pad_attn:
        cite.append(_PAD_ATTN[runner])
    num_reqs_padded = key.num_reqs if pad_attn and key.num_reqs is not None else num_reqs
    if runner == "v2" or pad_attn or config.separate_kv_update:
        slot_tokens = key.num_tokens
    else:
        slot_tokens = num_tokens
    return StepPlan(
        mode=key.mode,
        num_tokens=num_tokens,
        num_reqs=num_reqs,
        num_tokens_padded=key.num_tokens,
        num_reqs_padded=num_reqs_padded,
        slot_mapping_tokens=slot_tokens,
        decided_by=tuple(cite),
    )


_DP = {
    "v1": "vllm/v1/worker/dp_utils.py: coordinate_batch_across_dp (DP padding, min mode)",
    "v2": "vllm/v1/worker/gpu/dp_utils.py: sync_cudagraph_and_dp_padding (DP padding, min mode)",
}


def capture_batches(config) -> list[tuple[GraphKey, tuple[int, ...]]]:  # noqa: ANN001
    """The dummy steps the runner captures its FULL graphs on: per FULL graph, the
    query lengths of its requests (every request new: ``seq_len = q_len``).

    A uniform decode graph of ``T`` tokens captures ``T // next_n`` requests of
    ``next_n``; a mixed or varlen graph ``min(T, max_num_seqs)`` requests sharing
    ``T`` evenly, the remainder on the last (V1 ``GPUModelRunner._dummy_run``,
    V2 ``InputBatch.make_dummy``). None has zero-length requests.
    """
    out = []
    keys = graph_keys(
        config.cudagraph_mode,
        config.cudagraph_capture_sizes,
        config.next_n,
        config.max_num_seqs,
        config.runner,
        config.varlen_decode,
    )
    for key in keys:
        if key.mode != "FULL":
            continue
        reqs = key.num_reqs or min(key.num_tokens, config.max_num_seqs)
        each, extra = divmod(key.num_tokens, reqs)
        q_lens = [each] * reqs
        q_lens[-1] += extra
        out.append((key, tuple(q_lens)))
    return out
