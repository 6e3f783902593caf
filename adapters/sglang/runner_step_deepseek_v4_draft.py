"""The EAGLE draft after each step of SGLang's DeepSeek-V4 engine, on the multi-step
draft backend, as the implementation ``sglang-deepseek-v4-draft`` of ``runner-step``
(and, on ROCm's backend, the base of ``sglang-deepseek-v4-hip-radix-draft``).

The draft of :mod:`~attnfuzz.adapters.sglang.runner_step_draft` (its EAGLE draft graph
runner, ``EAGLEDraftCudaGraphRunner`` whole, its worker stand-in and inputs), after a
step of :mod:`~attnfuzz.adapters.sglang.runner_step_deepseek_v4`'s engine (its model,
pool, SWA allocator, pages of 256, server arguments), whose model runner becomes the
draft's. What runs, unchanged (SGLang 0.5.23), as ``draft_utils.py:
_create_dsv4_decode_backend`` and ``_create_dsv4_prefill_backend`` make them on a CUDA
GPU (``--dsv4-attn-backend flashmla``):

- ``layers/attention/deepseek_v4_trtllm_backend.py``: ``create_deepseek_v4_multistep_backend``
  and ``create_deepseek_v4_attn_backend`` (the draft model's extend backend);
- ``layers/attention/deepseek_v4_backend.py``: ``DeepseekV4MultiStepBackend`` (``__init__``,
  ``_make_step_backend``, ``init_forward_metadata``, ``init_cuda_graph_state``,
  ``init_forward_metadata_out_graph`` at capture and at replay (the first step's raw
  metadata, the others' ``replay_cuda_graph_metadata_from``),
  ``init_forward_metadata_in_graph``, ``on_after_cuda_graph_warmup``) and every step's
  ``DeepseekV4AttnBackend`` (``speculative_step_id`` s: its slice of the steps' shared
  ``out_cache_loc``, ``per_step_draft_out_cache_loc``);
- the draft's pool ``DeepSeekV4TokenToKVPool``: one NextN layer of compress ratio 0 (SWA
  only) over the target allocator's full-to-SWA mapping, as ``kv_cache_configurator.py:
  _build_dsv4_kv_pool`` and the draft's ``register_mapping`` make it.

The graph (:class:`_DraftInGraph`): every draft step builds its metadata inside the graph
(``capture_one_shape``'s ``run_once`` opens with ``init_forward_metadata_in_graph``); a
capture runs the body as the decode graph's stand-in does and keeps each attending step's
metadata; a replay runs it again over each step's captured raw metadata and writes what it
builds into the captured tensors.

Fields: the draft's inputs (``runner_step_draft``'s) and, for each draft step ``s`` whose
attention runs (``draft_forward`` breaks before the last step's forward), the window's
fields of its ``DSV4Metadata`` (the engine's :meth:`metadata_fields`): ``seq_lens_casual.s``,
``swa_topk_lengths.s``, ``swa_page_indices.s``, ``swa_out_cache_loc.s`` by request; and
``kv_len``, ``kv_slots`` of the last attending step (the keys of the draft as a whole).
The stand-ins are the engine's (:func:`runner_step_deepseek_v4.vendors`).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import sys
from collections.abc import Callable
from typing import Any

import torch
from attnfuzz.adapters.sglang import runner_step as decode
from attnfuzz.adapters.sglang import runner_step_deepseek_v4 as dsv4
from attnfuzz.adapters.sglang import runner_step_draft as draft
from attnfuzz.adapters.standins import no_collections
from attnfuzz.reference.batch import Case, EngineConfig
from attnfuzz.reference.runner_step import Field, RunnerStepInputs, RunnerStepOutputs, StepBuild


def prepare() -> None:
    """Import SGLang's runner, its draft runner and DeepSeek-V4's backends before a judge
    forks its child."""
    dsv4.prepare()
    draft.prepare()
    from sglang.srt.layers.attention import deepseek_v4_trtllm_backend  # noqa: F401


def declines(case: Case) -> str | None:
    """Why SGLang runs no DeepSeek-V4 draft decode for ``case``'s config, else None: pages
    of any size but 256, or fewer than two draft steps (no multi-step draft backend, no
    draft graph runner)."""
    return dsv4.declines(case) or draft.declines(case)


def structure(obj: Any) -> Any:
    """``obj``'s dataclasses copied (their tensors the same objects): what a graph captured
    of a metadata object the backend goes on rebinding fields of."""
    if not dataclasses.is_dataclass(obj) or isinstance(obj, type):
        return obj
    out = copy.copy(obj)
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name, None)
        if dataclasses.is_dataclass(value):
            setattr(out, f.name, structure(value))
    return out


class _DraftInGraph(decode._Graph):
    """The EAGLE draft runner's graph where there is no CUDA, for the multi-step backend,
    whose every draft step builds its metadata inside the graph
    (``EAGLEDraftCudaGraphRunner.capture_one_shape``'s ``run_once`` opens with
    ``DeepseekV4MultiStepBackend.init_forward_metadata_in_graph``). A capture runs the
    body as the decode graph's stand-in does (a warmup, the backend's
    ``on_after_cuda_graph_warmup``, the capture) and keeps each step's metadata as the
    capture made it; a replay runs the body again over the raw metadata each step's
    graph captured (what the recorded kernels read: the last step's too, which no replay
    preparation refreshes) and writes what it builds into the captured tensors."""

    def __init__(self, runner: Any) -> None:
        super().__init__(runner)
        self.bodies: dict[Any, Any] = {}

    def _steps(self) -> list[Any]:
        return self.runner.draft_attn_backend.attn_backends

    def _attending(self) -> list[Any]:
        """The steps whose attention the graph runs (``draft_forward`` breaks before the
        last step's forward): the metadata the graph's kernels read."""
        return self._steps()[:-1]

    def capture_one(
        self,
        shape_key: Any,
        forward_fn: Any,
        capture_inputs: Any = None,
        post_warmup_hook: Any = None,
    ) -> None:
        forward_fn()
        if post_warmup_hook is not None:
            post_warmup_hook()
        forward_fn()
        self.bodies[shape_key] = forward_fn
        self.graphs[shape_key] = [structure(b.forward_metadata) for b in self._attending()]

    def replay(self, shape_key: Any, static_forward_batch: Any, **kwargs: Any) -> Any:
        steps = self._steps()
        # The step backends' own module's bucket (ROCm's backend has its own enum).
        bucket = sys.modules[type(steps[0]).__module__]._GraphBucket.DECODE_OR_IDLE
        left = [b.forward_metadata for b in steps]
        try:
            for b in steps:
                raw = b.cuda_graph_metadata_of_bucket_and_bs[bucket][shape_key.size]
                b.forward_metadata = structure(raw)
            self.bodies[shape_key]()
            for captured, b in zip(self.graphs[shape_key], self._attending(), strict=True):
                dsv4.rewrite(captured, b.forward_metadata)
        finally:
            for b, metadata in zip(steps, left, strict=True):
                b.forward_metadata = metadata
        return self.runner.eagle_worker.draft_forward_output(shape_key.size)


def _of_step(f: Field, step: int) -> Field:
    """Field ``f`` of draft step ``step``: named ``<field>.<step>``, a row a request (one
    token a step), the field it names the same step's."""
    read_in = None if f.read_in is None else f"{f.read_in}.{step}"
    return dataclasses.replace(f, name=f"{f.name}.{step}", rows="requests", read_in=read_in)


class DeepseekV4DraftEngine(draft._DraftEngine):
    """One DeepSeek-V4 EAGLE engine's draft: the target's engine (no decode graph runner)
    whose model runner becomes the draft's, its KV pool the draft's (one NextN layer of
    compress ratio 0, SWA only, over the target allocator's full-to-SWA mapping), the
    draft's extend backend, the multi-step backend and the EAGLE draft graph runner."""

    GRAPH = _DraftInGraph
    WHERE = {
        "eager": "deepseek_v4_backend.py:DeepseekV4MultiStepBackend.init_forward_metadata",
        "fresh": "deepseek_v4_backend.py:DeepseekV4MultiStepBackend.init_forward_metadata "
        "(a new engine)",
        "padded": "eagle_draft_cuda_graph_runner.py:EAGLEDraftCudaGraphRunner.execute "
        "(buffers; DeepseekV4MultiStepBackend.init_forward_metadata_out_graph's raw metadata)",
        "replay": "eagle_draft_cuda_graph_runner.py:EAGLEDraftCudaGraphRunner.execute (each "
        "draft step's metadata the graph captured, rewritten by the recorded "
        "init_forward_metadata_in_graph)",
        "capture": "eagle_draft_cuda_graph_runner.py:EAGLEDraftCudaGraphRunner."
        "capture_one_shape (DeepseekV4MultiStepBackend.init_forward_metadata_out_graph, "
        "then init_forward_metadata_in_graph)",
    }
    platform: Callable[[], contextlib.AbstractContextManager[None]] = staticmethod(dsv4.vendors)
    """What is in place while the engine is built or steps: the engine's stand-ins."""

    def __init__(self, config: EngineConfig, device: torch.device, graphs: bool) -> None:
        with self.platform():
            super().__init__(config, device, graphs)

    def make_target(self, config: EngineConfig, device: torch.device) -> Any:
        return dsv4.DeepseekV4Engine(config, device, graphs=False)

    def make_backends(self, runner: Any) -> tuple[Any, Any]:
        """The draft model's extend backend and the multi-step backend
        (``draft_utils.py:_create_dsv4_prefill_backend``, ``_create_dsv4_decode_backend``
        on a CUDA GPU: ``deepseek_v4_trtllm_backend.py``'s factories, FlashMLA's)."""
        from sglang.srt.layers.attention import deepseek_v4_backend as v4
        from sglang.srt.layers.attention import deepseek_v4_trtllm_backend as factory

        extend = factory.create_deepseek_v4_attn_backend(runner, skip_prefill=False)
        steps = factory.create_deepseek_v4_multistep_backend(
            runner, draft.EAGLE_TOPK, self.num_steps
        )
        assert type(steps) is v4.DeepseekV4MultiStepBackend, type(steps)
        return extend, steps

    def make_draft_backend(self) -> Any:
        """The draft's pool, then its extend and multi-step backends
        (:meth:`make_backends`)."""
        from sglang.srt.mem_cache.deepseek_v4_memory_pool import DeepSeekV4TokenToKVPool
        from sglang.srt.mem_cache.kv_index_translator import KVIndexTranslator

        runner, config, target = self.runner, self.config, self.engine
        tokens = target.pages() * dsv4.PAGE_SIZE
        with dsv4._server_args(config):
            # deepseek_v4_nextn.py: COMPRESS_RATIO_NEXTN_LAYER, the draft's one layer.
            pool = DeepSeekV4TokenToKVPool(
                max_num_reqs=config.max_num_seqs,
                num_req_slots=runner.req_to_token_pool.req_to_token.shape[0],
                swa_size=tokens,
                c4_size=tokens // 4,
                c128_size=tokens // 128,
                c4_state_pool_size=tokens // 4,
                c128_state_pool_size=tokens // 128,
                page_size=dsv4.PAGE_SIZE,
                swa_page_size=dsv4.PAGE_SIZE,
                sliding_window=dsv4.SWA_WINDOW,
                dtype=dsv4.KV_DTYPE,
                c4_state_dtype=torch.float32,
                c128_state_dtype=torch.float32,
                qk_nope_head_dim=448,
                qk_rope_head_dim=64,
                indexer_head_dim=128,
                layer_num=1,
                device=str(self.device),
                enable_memory_saver=False,
                compression_ratios=[0],
                online_mtp_max_draft_tokens=config.next_n,
                full_size=tokens,
                is_draft_worker=True,
            )
            pool.register_mapping(target.allocator.full_to_swa_index_mapping)
            runner.token_to_kv_pool = pool
            runner.kv_index_translator = KVIndexTranslator(
                req_to_token=runner.req_to_token_pool.req_to_token,
                token_to_kv_pool_allocator=target.allocator,
                token_to_kv_pool=pool,
                page_size=dsv4.PAGE_SIZE,
                device=str(self.device),
            )
            target.backend, steps = self.make_backends(runner)
            target.runner.attn_backend = target.backend
            return steps

    def _worker(self) -> Any:
        """The EAGLE worker stand-in, its ``draft_forward`` advancing the positions by the
        attending steps as ``EagleWorkerV2.draft_forward`` does (``draft_topk1_postprocess``
        adds 1 a step), which ``run_once`` then takes back."""
        worker = super()._worker()
        own, advance = worker.draft_forward, self.num_steps - 1

        def draft_forward(forward_batch: Any) -> tuple:
            forward_batch.positions.add_(advance)
            return own(forward_batch)

        worker.draft_forward = draft_forward
        return worker

    def _graph_runner(self) -> Any:
        with dsv4._server_args(self.config), no_collections():
            return super()._graph_runner()

    def attending(self) -> list[Any]:
        """The backends of the draft steps whose attention runs (``draft_forward`` breaks
        before the last step's forward)."""
        return self.draft_backend.attn_backends[: self.num_steps - 1]

    def _fields(
        self, rows: int, inputs_of: dict[str, torch.Tensor], steps: list[Any]
    ) -> tuple[Field, ...]:
        """The draft's inputs (:class:`runner_step_draft._DraftEngine`'s), and what each
        attending draft step's kernels read of its ``DSV4Metadata`` (a row a request: one
        token a step), named ``<field>.<step>``; none of a raw metadata."""
        inputs = super()._fields(rows, inputs_of, [])
        out = list(inputs)
        fields: tuple[Field, ...] = ()
        for s, metadata in enumerate(m for m in steps if dsv4._full(m)):
            fields = self.engine.metadata_fields(rows, rows, metadata)
            out += [_of_step(f, s) for f in fields]
        if fields:
            # The last attending step reads every key the earlier ones read, and its own:
            # the keys of the draft as a whole (the target engine's kv_read of its window).
            seq_lens = next(f for f in inputs if f.name == "seq_lens")
            out += self.engine.kv_fields((seq_lens, *fields), None)
        return tuple(out)

    def eager(self, inputs: RunnerStepInputs, how: str = "eager") -> StepBuild:
        """``DeepseekV4MultiStepBackend.init_forward_metadata`` of the draft, no graph:
        each attending step's backend builds its own metadata (copied now), which is then
        put back to what it was: a step the graph replays runs no eager build."""
        fb = self.draft_batch(inputs)
        backends = self.draft_backend.attn_backends
        left = [b.forward_metadata for b in backends]
        with self.platform():
            try:
                self.draft_backend.init_forward_metadata(fb)
                steps = [b.forward_metadata for b in self.attending()]
                inputs_of = {"seq_lens": fb.seq_lens, "out_cache_loc": fb.out_cache_loc}
                inputs_of["positions"] = fb.positions
                if how != "fresh":  # a new engine's rows are its own: history picks them
                    inputs_of["req_pool_indices"] = fb.req_pool_indices
                R, T = inputs.num_reqs, inputs.num_tokens
                fields = self._fields(R, inputs_of, steps)
            finally:
                for b, metadata in zip(backends, left, strict=True):
                    b.forward_metadata = metadata
        return StepBuild(how, R, T, fields, self.WHERE[how])


class DeepseekV4DraftLife(dsv4.DeepseekV4Served, draft.DraftLife):
    """The draft of ``sglang-deepseek-v4-draft`` across the steps of one engine."""

    engine_class: type[DeepseekV4DraftEngine] = DeepseekV4DraftEngine

    def prepare(self) -> None:
        prepare()  # the draft runner's modules besides the target's

    def graph_builds(self, engine: Any, inputs: RunnerStepInputs, mode: str) -> list[StepBuild]:
        with self.engine_class.platform():
            return super().graph_builds(engine, inputs, mode)

    def persistent(self, engine: Any) -> list[Any]:
        """What each attending step's backend holds after the replay's preparation: the
        raw metadata (the runner's buffers, judged as the draft's inputs)."""
        return [b.forward_metadata for b in engine.attending()]


DRAFT = DeepseekV4DraftLife()
"""The engine of the implementation ``sglang-deepseek-v4-draft`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``sglang-deepseek-v4-draft`` of ``runner-step``: the step's
    draft on :data:`DRAFT`, kept across calls; ``run.new_engine()`` drops it."""
    return DRAFT(inputs)


run.new_engine = DRAFT.new_engine  # type: ignore[attr-defined]
