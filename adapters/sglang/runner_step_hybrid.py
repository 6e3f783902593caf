"""SGLang's decode graph runner step of a hybrid model (full attention layers and Gated
Delta Network linear-attention layers), as the implementation ``sglang-hybrid-gdn`` of
``runner-step``.

The step of :mod:`~attnfuzz.adapters.sglang.runner_step` (its driver
:class:`~attnfuzz.adapters.sglang.runner_step.EngineLife`, the same model runner and
decode graph runner), on the engine SGLang makes for a hybrid GDN model (Qwen3-Next's
layout: layer 0 full attention, layer 1 GDN) on ``--attention-backend triton``. What
runs besides, unchanged (SGLang 0.5.23):

- ``layers/attention/hybrid_linear_attn_backend.py``: ``HybridLinearAttnBackend``, the
  model runner's attention backend (as ``attention_registry.py:attn_backend_wrapper``
  wraps the full-attention backend for a hybrid GDN model), over the Triton backend and
  ``layers/attention/linear/gdn_backend.py``'s ``GDNAttnBackend``: its
  ``MambaAttnBackendBase._forward_metadata`` (eager: a decode, a target verify, an
  extend), ``init_cuda_graph_state``, and ``_replay_metadata`` (the capture's, and the
  replay's from ``load_batch``: the state indices of the batch, its padding rows'
  sentinel, the query offsets);
- ``mem_cache/memory_pool.py``: ``HybridReqToTokenPool`` and its ``MambaPool`` (the
  request rows, each with its mamba state slot: ``alloc``, ``free``,
  ``free_mamba_cache``, ``get_mamba_indices``), as ``kv_cache_configurator.py:
  _build_hybrid_req_pool`` makes them, without the mamba extra buffer (the
  ``no_buffer`` strategy).

Stand-ins, besides the step's: ``uvicorn`` (:func:`~attnfuzz.adapters.sglang._engine.
stand_in_server`), which the model runner's module imports and never calls here. The
linear layers' kernels never run (the graph stand-in runs no forward).

Builds: those of :mod:`~attnfuzz.adapters.sglang.runner_step` (``capture``, ``eager``,
``padded``: the backends' persistent buffers after ``load_batch``, ``replay``: the
metadata each graph captured, ``fresh``).

Fields: the Triton engine's (``seq_lens``, ``req_pool_indices``, ``out_cache_loc``,
``positions``, ``kv_indptr``, ``kv_indices``, ``qo_indptr``, ``kv_len``,
``kv_slots``), and what the GDN kernels read of the linear backend's
``ForwardMetadata``, prefixed ``gdn.``: ``query_start_loc`` (offsets: each request's
tokens), ``mamba_cache_indices`` (by request: its state slot, a padding row's
``PAD_SLOT_ID``), and for a verify ``intermediate_state_indices`` (by request: its row
of the speculative scratch). Each with the range its consumer accepts
(:meth:`HybridGDNEngine.accepts`). A new engine's state slots are its own (history
picks them), as its request rows are: the ``fresh`` build holds no
``gdn.mamba_cache_indices``.

Mutant (a re-created defect of the linear backend's graph metadata):
``sglang-hybrid-gdn-padding-by-fill`` (the replay's padding rows counted by the padding
fill value of ``seq_lens``, not handed by the runner: a verify's request of one committed
token is taken for padding, its state slot ``PAD_SLOT_ID``: replay equals eager,
padding invariance).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from attnfuzz.adapters.sglang import _engine
from attnfuzz.adapters.sglang import runner_step as decode
from attnfuzz.adapters.sglang.runner_step import arrive_then_step
from attnfuzz.adapters.sglang.runner_step import reach_verify_replay as reach_verify_replay
from attnfuzz.reference.batch import Case, EngineConfig
from attnfuzz.reference.runner_step import Field, RunnerStepInputs, RunnerStepOutputs, StepBuild
from attnfuzz.reference.trace import Trace

FULL_ATTENTION_LAYERS = [0]
"""The model's full attention layers (``HybridLinearAttnBackend.full_attn_layers``)."""
GDN_LAYERS = [1]
"""Its GDN layers: the mamba pool's layers (``mamba_layer_ids``)."""

DUMMY_SLOT = 0
"""The mamba pool's slot no request holds (``mem_cache/allocator/mamba.py``'s ``clear``:
reserved as the dummy write target of padded tokens): ``Field.null_slot``."""

# The GDN layer's state: one key head and one value head of 8 (Qwen3-Next's shape, small),
# a causal convolution of 4 (its linear_conv_kernel_dim).
HEAD = 8
CONV_KERNEL = 4


def prepare() -> None:
    """Import SGLang's runner and hybrid linear-attention backend before a judge forks."""
    decode.prepare()
    from sglang.srt.layers.attention import hybrid_linear_attn_backend  # noqa: F401
    from sglang.srt.layers.attention.linear import gdn_backend  # noqa: F401


def declines(case: Case) -> str | None:
    """Why SGLang never runs a hybrid GDN model on ``case``'s config, else None
    (:func:`declines_config`)."""
    return declines_config(case.config)


def declines_config(config: EngineConfig) -> str | None:
    """Why SGLang never runs a hybrid GDN model on ``config``, else None. The engine runs
    the radix cache without the mamba extra buffer (``--mamba-radix-cache-strategy``
    ``no_buffer``), which takes pages of one token only; with the extra buffer SGLang
    tracks states at its own intervals, a different engine. Its other refusals no case
    meets: an MLA model (``attention_registry.py:attn_backend_wrapper``: "hybrid_gdn can
    only be used with non-MLA models"; the model is MHA), and the Blackwell backends'
    list (the step runs the Triton backend, which every list holds)."""
    page = config.block_size
    if page != 1:
        return (
            f"page size {page}: SGLang runs a hybrid linear-attention model's radix cache "
            "without the mamba extra buffer on pages of one token only "
            "(arg_groups/mamba_hook.py: validate_mamba_no_buffer, 'no_buffer only "
            "supports page_size=1')"
        )
    return None


class _Slot:
    """A request's KV handle as ``HybridReqToTokenPool`` reads it (``schedule_batch.py``:
    the ``Req.kv`` fields ``alloc``, ``free`` and ``free_mamba_cache`` use)."""

    def __init__(self) -> None:
        self.req_pool_idx: int | None = None
        self.mamba_pool_idx: torch.Tensor | None = None
        self.mamba_needs_clear = False
        self.kv_allocated_len = 0

    @property
    def holds_kv(self) -> bool:
        return self.req_pool_idx is not None

    @property
    def holds_mamba(self) -> bool:
        return self.mamba_pool_idx is not None


def _metadata(backend: Any, verify: bool) -> Any:
    """What a graph or a build reads of the hybrid backend: the Triton backend's
    metadata (``full``) and the GDN backend's (``gdn``), as each was then; ``verify``:
    of a target verify."""
    return _engine.StandIn(
        full=backend.full_attn_backend.forward_metadata,
        gdn=backend.linear_attn_backend.forward_metadata,
        verify=verify,
    )


class _HybridGraph(decode._Graph):
    """The graph stand-in of :mod:`runner_step`, recording both backends' metadata
    (``METADATA``: what a graph or a build reads of the hybrid backend)."""

    METADATA = staticmethod(_metadata)

    def capture_one(
        self,
        shape_key: Any,
        forward_fn: Any,
        capture_inputs: Any = None,
        post_warmup_hook: Any = None,
    ) -> None:
        # The decode graphs of a speculative engine are its target verify's.
        verify = not self.runner.model_runner.spec_algorithm.is_none()
        self.graphs[shape_key] = self.METADATA(self.runner.attn_backend, verify)


class HybridGDNEngine(decode._Engine):
    """One SGLang engine of a hybrid GDN model: ``HybridReqToTokenPool`` for its request
    rows and state slots, ``HybridLinearAttnBackend`` over Triton and GDN."""

    GRAPH = _HybridGraph
    PREFIX = "gdn"  # of the linear backend's fields
    WHERE = {
        "eager": "hybrid_linear_attn_backend.py:HybridLinearAttnBackend.init_forward_metadata "
        "(TritonAttnBackend's, GDNAttnBackend's _forward_metadata)",
        "fresh": "hybrid_linear_attn_backend.py:HybridLinearAttnBackend.init_forward_metadata "
        "(a new engine)",
        "padded": "decode_cuda_graph_runner.py:DecodeCudaGraphRunner.load_batch (buffers, "
        "Triton's, and GDNAttnBackend._replay_metadata's)",
        "replay": "decode_cuda_graph_runner.py:DecodeCudaGraphRunner.execute (what the graph "
        "reads: GDNAttnBackend's state_indices_list and query_start_loc_list of its size)",
        "capture": "decode_cuda_graph_runner.py:DecodeCudaGraphRunner.capture_one_shape "
        "(GDNAttnBackend._replay_metadata, in_capture)",
    }

    def __init__(self, config: EngineConfig, device: torch.device, graphs: bool) -> None:
        self.slots_of: dict[int, Any] = {}  # request id -> its Req stand-in
        super().__init__(config, device, graphs)

    def _pool(self) -> Any:
        """``HybridReqToTokenPool`` as ``_build_hybrid_req_pool`` makes it: as many state
        slots as requests (``max_mamba_cache_size``), the speculative scratch of as many
        (``mamba_spec_state_size``), no extra buffer, no overlap schedule (``no_buffer``
        refuses it: ``validate_mamba_no_buffer``)."""
        from sglang.srt.configs.mamba_utils import (
            Mamba2CacheParams,
            Mamba2StateShape,
            mamba2_state_dtype,
        )
        from sglang.srt.mem_cache.memory_pool import HybridReqToTokenPool

        config, table = self.config, self.runner.req_to_token_pool.req_to_token
        shape = Mamba2StateShape.create(
            tp_world_size=1,
            intermediate_size=HEAD,
            n_groups=1,
            num_heads=1,
            head_dim=HEAD,
            state_size=HEAD,
            conv_kernel=CONV_KERNEL,
            conv_shard_groups=[HEAD, HEAD, HEAD],
        )
        params = Mamba2CacheParams(shape=shape, layers=GDN_LAYERS, dtype=mamba2_state_dtype())
        return HybridReqToTokenPool(
            size=config.max_num_seqs,
            mamba_size=config.max_num_seqs,
            mamba_spec_state_size=config.max_num_seqs,
            max_context_len=table.shape[1],
            device=str(self.device),
            enable_memory_saver=False,
            cache_params=params,
            mamba_layer_ids=GDN_LAYERS,
            enable_mamba_extra_buffer=False,
            speculative_num_draft_tokens=config.next_n if config.num_spec else None,
            speculative_eagle_topk=1 if config.num_spec else None,
            enable_overlap_schedule=False,
        )

    def make_backend(self) -> Any:
        """``HybridLinearAttnBackend(TritonAttnBackend, GDNAttnBackend, [0])`` on the
        model runner's hybrid pool, as ``attn_backend_wrapper`` builds it."""
        from sglang.srt.layers.attention.hybrid_linear_attn_backend import (
            HybridLinearAttnBackend,
        )
        from sglang.srt.layers.attention.linear.utils import resolve_linear_attn_backends
        from sglang.srt.mem_cache.kv_index_translator import KVIndexTranslator

        runner = self.runner
        pool = self._pool()
        runner.req_to_token_pool = pool
        runner.kv_index_translator = KVIndexTranslator(
            req_to_token=pool.req_to_token,
            token_to_kv_pool_allocator=None,
            token_to_kv_pool=runner.token_to_kv_pool,
            page_size=self.config.block_size,
            device=str(self.device),
        )
        full = super().make_backend()
        runner.linear_attn_backends = resolve_linear_attn_backends()
        return HybridLinearAttnBackend(full, self.linear_backend(), FULL_ATTENTION_LAYERS)

    def linear_backend(self) -> Any:
        """The linear layers' backend on the model runner: ``GDNAttnBackend``."""
        from sglang.srt.layers.attention.linear.gdn_backend import GDNAttnBackend

        return GDNAttnBackend(self.runner)

    # -- the scheduler output: a request's row and its state slot -------------------------------

    def admit(self, inputs: RunnerStepInputs) -> None:
        """The requests of the step: those gone free their state slot and row
        (``free_mamba_cache``, ``free``), new ones take both (``alloc``), each appends its
        new pages."""
        pool = self.runner.req_to_token_pool
        staying = {i for i, new in zip(inputs.req_ids, inputs.is_new, strict=True) if not new}
        for i in [i for i in self.requests if i not in staying]:
            del self.requests[i]
            req = self.slots_of.pop(i)
            pool.free_mamba_cache(req)
            pool.free(req)
        for i, new, gained in zip(inputs.req_ids, inputs.is_new, inputs.new_block_ids, strict=True):
            if new:
                req = _engine.StandIn(kv=_Slot())
                (row,) = pool.alloc([req])
                self.slots_of[i] = req
                self.requests[i] = decode._Request(row)
            self.requests[i].pages += list(gained)

    # -- builds ---------------------------------------------------------------------------------

    def persistent_metadata(self, mode: str) -> Any:
        """Triton's persistent buffers after the replay preparation, and what the GDN
        backend's ``_replay_metadata`` left as its metadata."""
        triton = self.backend.full_attn_backend
        full = _engine.StandIn(
            kv_indptr=triton.kv_indptr,
            kv_indices=triton.cuda_graph_kv_indices,
            qo_indptr=triton.qo_indptr if mode == "verify" else None,
        )
        linear = self.backend.linear_attn_backend.forward_metadata
        return _engine.StandIn(full=full, gdn=linear, verify=mode == "verify")

    def eager(self, inputs: RunnerStepInputs, mode: str, how: str = "eager") -> StepBuild:
        """``init_forward_metadata`` of the step's ForwardBatch, no graph (copied now)."""
        fb = self.forward_batch(inputs, mode)
        self.backend.init_forward_metadata(fb)
        inputs_of = {
            "seq_lens": fb.seq_lens,
            "out_cache_loc": fb.out_cache_loc,
            "positions": fb.positions,
        }
        if how != "fresh":  # a new engine's rows and slots are its own: history picks them
            inputs_of["req_pool_indices"] = fb.req_pool_indices
        R, T = inputs.num_reqs, inputs.num_tokens
        fields = self._fields(R, T, inputs_of, self.GRAPH.METADATA(self.backend, mode == "verify"))
        if how == "fresh":
            fields = tuple(f for f in fields if f.name != self.state_field())
        return StepBuild(how, R, T, fields, where=self.WHERE[how])

    def state_field(self) -> str:
        """The field of each request's state slot, which a new engine picks itself."""
        return f"{self.PREFIX}.mamba_cache_indices"

    def accepts(self) -> dict[str, tuple[int, int]]:
        """What each field's consumer accepts, read from its code: the Triton engine's
        (:meth:`runner_step._Engine.accepts`), and the GDN kernels'."""
        from sglang.kernels.ops.mamba.causal_conv1d_triton import PAD_SLOT_ID

        acc = super().accepts()
        pool = self.runner.req_to_token_pool
        # causal_conv1d_update / fused_sigmoid_gating_delta_rule_update (forward_decode) and
        # the verify's conv and recurrent kernels index conv_states[cache_indices[i]],
        # ssm_states[...]: the pool's size + 1 slots (slot 0 the dummy's), and skip a row
        # whose index is PAD_SLOT_ID (replay_state_indices_validator.py states both).
        acc[f"{self.PREFIX}.mamba_cache_indices"] = (PAD_SLOT_ID, pool.mamba_pool.size)
        # The verify kernels index intermediate_ssm / intermediate_conv_window
        # [intermediate_state_indices[i]]: MambaPool.SpeculativeState's spec_state_size + 1
        # rows (the last a padding row).
        acc[f"{self.PREFIX}.intermediate_state_indices"] = (0, pool.size)
        return acc

    def metadata_fields(self, rows: int, tokens: int, metadata: Any) -> tuple[Field, ...]:
        """The Triton backend's fields (:meth:`runner_step._Engine.metadata_fields`) and
        the GDN backend's, for ``rows`` requests and ``tokens`` tokens (padding included),
        copied now."""
        from sglang.srt.layers.attention.linear.utils import (
            select_verify_intermediate_state_indices,
        )

        acc = self.accepts()
        gdn = metadata.gdn
        indices = gdn.mamba_cache_indices[:rows]
        out = [
            # The conv and recurrent kernels read each request's tokens
            # [query_start_loc[i], query_start_loc[i + 1]) of the forward's.
            Field(
                f"{self.PREFIX}.query_start_loc",
                "offsets",
                decode.host(gdn.query_start_loc[: rows + 1]),
                (0, tokens),
            ),
            # The conv and recurrent kernels update the state at its index in place.
            Field(
                self.state_field(),
                "requests",
                decode.host(indices),
                acc[self.state_field()],
                writes_state=True,
                null_slot=DUMMY_SLOT,
            ),
        ]
        if metadata.verify:
            # A verify (every request next_n tokens): gdn_backend.py:forward_extend's
            # intermediate_state_indices, from its req_pool_indices and live rows.
            linear = self.backend.linear_attn_backend
            pool = self.runner.req_to_token_pool
            req_rows = torch.arange(rows)  # positional unless pp spec stable rows
            intermediate = select_verify_intermediate_state_indices(
                linear.verify_intermediate_state_indices, req_rows, indices >= 0, pool.size
            )
            out.append(
                Field(
                    f"{self.PREFIX}.intermediate_state_indices",
                    "requests",
                    decode.host(intermediate[:rows]),
                    acc[f"{self.PREFIX}.intermediate_state_indices"],
                )
            )
        return decode._Engine.metadata_fields(self, rows, tokens, metadata.full) + tuple(out)

    def kv_read(
        self, values: dict[str, np.ndarray], metadata: Any
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        """The full attention layers' keys: the Triton engine's (:meth:`_Engine.kv_read`)."""
        return super().kv_read(values, metadata.full)


class HybridGDNLife(decode.EngineLife):
    """The engine of ``sglang-hybrid-gdn``: :class:`HybridGDNEngine`, kept across a life's
    steps."""

    engine_class: type[HybridGDNEngine] = HybridGDNEngine

    def __init__(self, engine_class: type[HybridGDNEngine] | None = None) -> None:
        """``engine_class``: another engine of this life's family (a mutant's)."""
        if engine_class is not None:
            self.engine_class = engine_class
        super().__init__()

    def prepare(self) -> None:
        prepare()

    def make(self, config: Any, device: torch.device, graphs: bool) -> HybridGDNEngine:
        return self.engine_class(config, device, graphs=graphs)

    def graph_read(self, engine: Any) -> list[Any]:
        """Both backends' buffers: the eager build writes Triton's, the graph reads both."""
        return [engine.backend.full_attn_backend, engine.backend.linear_attn_backend]


ENGINE = HybridGDNLife()
"""The engine of the implementation ``sglang-hybrid-gdn`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``sglang-hybrid-gdn`` of ``runner-step``: the step on
    :data:`ENGINE`, kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]


# -- mutant: a defect of the GDN backend's graph metadata, re-created --------------------------


class _PaddingByFill(HybridGDNEngine):
    """The replay's padding rows counted, not handed by the runner: ``_replay_metadata``
    given no ``num_padding`` counts the rows whose ``seq_lens`` is the padding fill value
    (1), so a verify's request of one committed token is taken for padding: its state
    slot ``PAD_SLOT_ID`` (the kernels skip its state) and its query offsets cut."""

    def make_backend(self) -> Any:
        backend = super().make_backend()
        linear = backend.linear_attn_backend
        replay = linear._replay_metadata

        def counted(*args: Any, **kwargs: Any) -> Any:
            if not kwargs.get("in_capture", False):
                kwargs["num_padding"] = None
            return replay(*args, **kwargs)

        linear._replay_metadata = counted
        return backend


PADDING_BY_FILL = HybridGDNLife(_PaddingByFill)


def run_padding_by_fill(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The mutant ``sglang-hybrid-gdn-padding-by-fill``: :class:`_PaddingByFill`."""
    return PADDING_BY_FILL(inputs)


run_padding_by_fill.new_engine = PADDING_BY_FILL.new_engine  # type: ignore[attr-defined]


def trigger_padding_by_fill(trace: Trace | Case) -> bool:
    """A verify the decode graph replays with a request of one committed token."""
    return trace.config.num_spec >= 1 and any(
        1 in s.num_computed_tokens for s in decode.replayed(trace)
    )


def smallest_padding_by_fill() -> Trace:
    """One request of one token, then its verify of ``next_n`` 2 in the graph of one."""
    config = EngineConfig(max_model_len=8, max_num_seqs=1, max_num_batched_tokens=8,
                          block_size=1, num_spec=1, cudagraph_capture_sizes=(2,))  # fmt: skip
    return arrive_then_step(config, 1)
