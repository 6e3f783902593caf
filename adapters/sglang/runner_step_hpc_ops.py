"""SGLang's decode graph runner step on the HPC-Ops backend, as the implementation
``sglang-hpc-ops`` of ``runner-step``.

The step of :mod:`~attnfuzz.adapters.sglang.runner_step` (its driver
:class:`~attnfuzz.adapters.sglang.runner_step.EngineLife`, the same model runner,
request rows and decode graph runner), on the engine started with
``--attention-backend hpc_ops`` (Tencent's hpc-ops kernels, sm90 only). What runs
besides, unchanged (SGLang 0.5.23):

- ``layers/attention/hpc_ops_backend.py``: ``HPCOpsAttnBackend``: ``__init__``;
  ``init_forward_metadata`` (eager: a decode, an extend; the page table by
  ``build_trtllm_mha_page_table``, the decode task map by ``_assign_decode_tasks``);
  ``init_cuda_graph_state`` (the graph buffers and the one task-map workspace);
  ``init_forward_metadata_out_graph`` with ``in_capture=True`` for every capture batch
  size and, from ``load_batch``, the replay's; ``init_forward_metadata_in_graph``
  (``update_trtllm_mha_graph_metadata``, then the task map of the replay's lengths),
  what the graph records and runs again at each replay (the graph stand-in of
  ``sglang-trtllm-mha``, :class:`~.runner_step_trtllm_mha._RecordedGraph`);
- the Triton kernels ``build_trtllm_mha_page_table`` and
  ``update_trtllm_mha_graph_metadata``, under Triton's interpreter.

Stood in: the ``hpc`` package (:mod:`attnfuzz.adapters.hpc_ops`, the decode
scheduler's contract; its bf16 decode takes a task map, so SGLang schedules every
decode, ``_bf16_decode_supports_task_map``); where there is no GPU, its compute
capability, 9.0 (``__init__`` refuses any other); and, for ``__init__`` only, the model's attention
shape the backend requires (head dim 128, 8 query heads a KV head: ``_SUPPORTED_HEAD_DIM``,
``_SUPPORTED_GQA_GROUP_SIZES``), which no metadata reads but the task map's KV heads (1).
The KV cache is bf16; its buffers are never read.

SGLang runs the backend with pages of 64 tokens (``arg_groups/overrides.py``: "HPC-Ops
attention only supports a page_size of 64", any other becomes 64) and without
speculative decoding (``attention_registry.py:create_hpc_ops_backend`` and ``__init__``
refuse it): the implementation fixes both (``block_size`` 64, ``next_n`` 1).

Builds: those of :mod:`~attnfuzz.adapters.sglang.runner_step` (``capture``, ``eager``,
``padded``, ``replay``, ``fresh``).

Fields: the runner's ``seq_lens``, ``req_pool_indices``, ``out_cache_loc`` and
``positions``, and what hpc-ops' kernels read of ``HPCOpsMetadata``:
``cache_seqlens_int32`` and ``page_table`` by request (a row: the pages its
``cache_seqlens`` reach), for an extend ``cu_seqlens_q`` and ``max_seq_len_q``; and
``hpc.task_map_stale``: how many entries of the task map the decode kernel reads
differ from the stand-in's schedule of the lengths it reads beside it (one query a
request), 0 the only value it accepts. And ``kv_len`` and ``kv_slots``, what every
backend states alike (:meth:`HPCOpsEngine.kv_read`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from attnfuzz.adapters import hpc_ops
from attnfuzz.adapters.sglang import _engine
from attnfuzz.adapters.sglang import runner_step as decode
from attnfuzz.adapters.sglang.runner_step_flashinfer import _patched
from attnfuzz.adapters.sglang.runner_step_trtllm_mha import (
    TRTLLMMHALife,
    _computes_nothing,
    _RecordedGraph,
    paged_rows,
)
from attnfuzz.reference.runner_step import Field, RunnerStepInputs, RunnerStepOutputs, StepBuild

DTYPE = torch.bfloat16
"""The KV cache's dtype: bf16 (or fp8, whose scales only HunYuan V3's fused op makes)."""

PAGE_SIZE = 64
"""``arg_groups/overrides.py``: the one page size SGLang runs HPC-Ops with."""

HEAD_DIM, Q_HEADS_PER_KV = 128, 8
"""The attention shape ``HPCOpsAttnBackend.__init__`` requires (one KV head)."""


def prepare() -> None:
    """Import SGLang's runner and HPC-Ops backend before a judge forks its child."""
    decode.prepare()
    from sglang.srt.layers.attention import hpc_ops_backend  # noqa: F401


class HPCOpsEngine(decode._Engine):
    """One SGLang engine whose model runner's attention backend is HPC-Ops."""

    ATTENTION_BACKEND = "hpc_ops"
    GRAPH = _RecordedGraph
    WHERE = {
        "eager": "hpc_ops_backend.py:HPCOpsAttnBackend.init_forward_metadata",
        "fresh": "hpc_ops_backend.py:HPCOpsAttnBackend.init_forward_metadata (a new engine)",
        "padded": "decode_cuda_graph_runner.py:DecodeCudaGraphRunner.execute (buffers; "
        "HPCOpsAttnBackend.init_forward_metadata_in_graph's forward_metadata)",
        "replay": "decode_cuda_graph_runner.py:DecodeCudaGraphRunner.execute (the metadata "
        "the graph captured: HPCOpsAttnBackend.init_forward_metadata_out_graph's views, "
        "rewritten by the recorded init_forward_metadata_in_graph)",
        "capture": "decode_cuda_graph_runner.py:DecodeCudaGraphRunner.capture_one_shape "
        "(HPCOpsAttnBackend.init_forward_metadata_out_graph, then init_forward_metadata_in_graph)",
    }

    @contextlib.contextmanager
    def planning(self) -> Iterator[None]:
        """While the backend is built or builds: ``hpc`` importable (the stand-in)."""
        with hpc_ops.hpc():
            yield

    def make_backend(self) -> Any:
        """``HPCOpsAttnBackend(model_runner)`` on an sm90 GPU, the model's attention
        shape the one it requires."""
        from sglang.srt.layers.attention import hpc_ops_backend

        runner = self.runner
        runner.kv_cache_dtype = DTYPE
        runner.dtype = DTYPE
        runner.model = _engine.StandIn(
            shared_experts_config=None, forward=_computes_nothing, modules=lambda: iter(())
        )
        shape = _engine.StandIn(
            head_dim=HEAD_DIM,
            num_attention_heads=Q_HEADS_PER_KV,
            get_num_kv_heads=lambda tp_size, dcp_size=1: 1,
            context_len=runner.model_config.context_len,
        )
        capability = _engine.device_capability((9, 0))  # where there is no GPU to ask
        with self.planning(), capability, _patched(runner, "model_config", shape):
            return hpc_ops_backend.HPCOpsAttnBackend(runner)

    def _graph_runner(self) -> Any:
        with self.planning():
            return super()._graph_runner()

    def eager(self, inputs: RunnerStepInputs, mode: str, how: str = "eager") -> StepBuild:
        with self.planning():
            return super().eager(inputs, mode, how=how)

    def persistent_metadata(self, mode: str) -> Any:
        """What the backend's replay left as its metadata."""
        return self.backend.forward_metadata

    def accepts(self) -> dict[str, tuple[int, int]]:
        """What each field's consumer accepts: the runner's inputs'
        (:meth:`runner_step._Engine.accepts`), and the page table's: ``_paged_kv_buffers``
        views the pool's ``size + page_size`` rows as pages the kernels index."""
        acc = decode._Engine.accepts(self)
        page = self.config.block_size
        acc["page_table"] = (0, (self.runner.token_to_kv_pool.size + page) // page - 1)
        return acc

    def metadata_fields(self, rows: int, tokens: int, metadata: Any) -> tuple[Field, ...]:
        """``HPCOpsMetadata``'s fields for ``rows`` requests and ``tokens`` tokens
        (padding included), copied now."""
        # forward_decode hands attention_decode_bf16 block_ids=page_table and
        # num_seq_kvcache=cache_seqlens_int32 (new_kv_included: the step's keys counted),
        # every row; forward_extend the prefill kernel the same with cu_seqlens_q.
        out = list(paged_rows(self, metadata, rows))
        if metadata.cu_seqlens_q is not None:  # an extend's (the prefill kernel's)
            qo = decode.host(metadata.cu_seqlens_q[: rows + 1])
            out.append(Field("cu_seqlens_q", "offsets", qo, (0, tokens)))
            q = int(metadata.max_seq_len_q)
            out.append(Field("max_seq_len_q", "requests", np.full(rows, q), (1, tokens)))
        if metadata.hpc_task_map is not None:
            # attention_decode_bf16 reads the task map beside num_seq_kvcache (mtp 0: one
            # query a request): it must be the schedule of those rows' lengths.
            stale = hpc_ops.stale_entries(
                metadata.hpc_task_map, metadata.cache_seqlens_int32[:rows], 1
            )
            out.append(Field("hpc.task_map_stale", "requests", np.full(rows, stale), (0, 0)))
        return tuple(out)

    def kv_read(
        self, values: dict[str, np.ndarray], metadata: Any
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        """Each request's keys and their KV slots, as hpc-ops' kernels read them (every
        key from the paged cache, the step's own written first by ``set_kv_buffer``):
        ``cache_seqlens[b]`` keys, key ``j`` in page ``page_table[b, j // page_size]``."""
        lens, table = values["cache_seqlens_int32"], values["page_table"]
        page = self.config.block_size
        return lens, [decode.page_slots(table[b], lens[b], page) for b in range(len(lens))]


class HPCOpsLife(TRTLLMMHALife):
    """The engine of ``sglang-hpc-ops``: :class:`HPCOpsEngine`, kept across a life's
    steps; its graph's replay run with ``hpc`` importable (the engine's ``planning``)."""

    engine_class: type[HPCOpsEngine] = HPCOpsEngine  # type: ignore[assignment]

    def prepare(self) -> None:
        prepare()


ENGINE = HPCOpsLife()
"""The engine of the implementation ``sglang-hpc-ops`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``sglang-hpc-ops`` of ``runner-step``: the step on
    :data:`ENGINE`, kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]
