"""vLLM's model runner V1 step under async scheduling, as the implementation
``vllm-v1-async`` of ``runner-step``.

The engines of :mod:`.runner_step_v1` with ``SchedulerConfig.async_scheduling`` on, as
vLLM 0.33.0's ``VllmConfig`` leaves it on a CUDA engine whose options allow it (an
EAGLE/MTP drafter with the padded drafter batch; ``VllmConfig.__post_init__``); the CPU
platform turns it off (``CpuPlatform.check_and_update_config``), so ``vllm-v1`` runs
without it. Nothing else is stood in beyond ``vllm-v1``'s.

The scheduler output is the one ``AsyncScheduler`` sends: it schedules a step before
the previous step's sampled tokens are back, so a request that verified drafts in the
step just before comes with its computed tokens counted as if every draft were accepted
(``Scheduler._update_after_schedule`` advanced them by the whole query; the rejection
is taken back only after the output). The runner corrects that itself, unchanged:
``_update_states`` queues the correction (``prev_num_draft_len``,
``correct_spec_decode_token_counts``), ``_prepare_inputs`` corrects the positions and
sequence lengths on the device (``update_num_computed_tokens_for_batch_change`` with the
previous step's ``valid_sampled_token_count``) and takes the input ids of requests that
ran in the previous step from its sampled tokens on the device (``_prepare_input_ids``,
``prev_positions``); ``_bookkeeping_sync`` keeps the sampled tokens there.

The trace states the true computed tokens; each engine sends the optimistic count for
each request that drafted in the step it ran just before, from its own history
(:meth:`_AsyncEngine.output`). The step's builds are ``vllm-v1``'s: the fresh engine,
whose requests come new in a warm-up step without drafts, is sent the true counts, so
*history invariance* holds the corrected engine to it. Near the drafter's length limit
the corrected engine may propose nothing where the fresh one proposes, by design
(:meth:`AsyncRunnerStepEngine.withheld`): the fresh engine's draft sub-steps of such a
step are left out, and only of such a step.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any
from unittest import mock

import torch
from attnfuzz.adapters.vllm import runner_step_v1 as v1
from attnfuzz.reference.batch import Batch, Case, EngineConfig
from attnfuzz.reference.runner_step import RunnerStepInputs, RunnerStepOutputs
from attnfuzz.reference.trace import Trace, as_trace

prepare = v1.prepare


def declines(case: Case) -> str | None:
    """``vllm-v1``'s declines: async scheduling takes every config ``vllm-v1`` does (an
    engine without a drafter too: its input ids still come from the device)."""
    return v1.declines(case)


class _AsyncEngine(v1._Engine):
    """A V1 engine scheduled asynchronously."""

    async_scheduling = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Per request of the step this engine ran last: where its query ended, and
        # whether it carried drafts.
        self.ran: dict[str, tuple[int, bool]] = {}
        self.upper = 0  # the step's longest sequence as its scheduler output counts it
        super().__init__(*args, **kwargs)

    def num_output_tokens(self, state: Any) -> int:
        """``AsyncScheduler``'s count: the step in flight's tokens as placeholders, every
        draft taken as accepted, as ``_update_states`` extends a request of the
        persistent batch that drafted (``prev_num_draft_len``) before it compares."""
        n = len(state.output_token_ids)
        if state.prev_num_draft_len and state.req_id in self.runner.input_batch.req_id_to_index:
            n += state.prev_num_draft_len
        return n

    def output(self, inputs: RunnerStepInputs) -> Any:
        """``vllm-v1``'s scheduler output, each request that drafted in the step before
        counted as if it had accepted every draft (``AsyncScheduler``'s count)."""
        out = super().output(inputs)
        cached = out.scheduled_cached_reqs
        computed = zip(inputs.req_ids, inputs.num_computed_tokens, strict=True)
        true = {str(rid): c for rid, c in computed}
        for j, rid in enumerate(cached.req_ids):
            end, drafted = self.ran.get(rid, (0, False))
            if drafted and rid not in cached.resumed_req_ids:
                if end < true[rid]:
                    raise RuntimeError(
                        f"attnfuzz: request {rid} runs on from {true[rid]} computed tokens, "
                        f"past the {end} its last step reached"
                    )
                cached.num_computed_tokens[j] = end
        # The longest sequence as the runner's host copy counts it (max_seq_len).
        sent = zip(cached.req_ids, cached.num_computed_tokens, strict=True)
        counts = {**true, **dict(sent)}
        self.upper = max(
            (
                counts[str(rid)] + q
                for rid, q in zip(inputs.req_ids, inputs.query_lens, strict=True)
            ),
            default=0,
        )
        drafts = out.scheduled_spec_decode_tokens
        self.ran = {
            str(rid): (c + q, bool(drafts.get(str(rid))))
            for rid, c, q in zip(
                inputs.req_ids, inputs.num_computed_tokens, inputs.query_lens, strict=True
            )
        }
        return out


class AsyncRunnerStepEngine(v1.RunnerStepEngine):
    """``vllm-v1``'s three engines, scheduled asynchronously."""

    engine_type = _AsyncEngine

    def __call__(self, inputs: RunnerStepInputs) -> RunnerStepOutputs:
        """``vllm-v1``'s builds of the step; where the runner's upper bound withheld the
        proposal, the fresh engine's draft sub-steps left out (:meth:`withheld`)."""
        out = super().__call__(inputs)
        if not self.withheld(out):
            return out
        kept = tuple(b for b in out.builds if b.how != "fresh" or b.draft is None)
        return dataclasses.replace(out, builds=kept)

    def withheld(self, out: RunnerStepOutputs) -> bool:
        """Whether the eager engine proposed no drafts after the step because its host
        count of the longest sequence, the optimistic one, leaves the drafter no room:
        ``sample_tokens`` proposes only if ``_input_fits_in_drafter``
        (``max_seq_len + num_spec_tokens <= effective_drafter_max_model_len``), and under
        async scheduling ``max_seq_len`` is an upper bound by design
        (``CommonAttentionMetadata.max_seq_len``: "may be an upper bound"; it is taken
        from ``optimistic_seq_lens_cpu``), so near the drafter's limit the engine zeroes
        the drafts a step early. The fresh engine, sent the true counts, proposes: its
        draft sub-steps then have no eager build to be held to. Any other step where
        the eager engine proposes nothing is left as it is, to be judged."""
        eager = self.eager
        if eager is None or eager.runner.speculative_config is None:
            return False
        if any(b.draft is not None for b in out.of("eager")):
            return False
        r = eager.runner
        return eager.upper + r.num_spec_tokens > r.effective_drafter_max_model_len


ENGINE = AsyncRunnerStepEngine()
"""The engine of the implementation ``vllm-v1-async`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``vllm-v1-async`` of ``runner-step``: the step on
    :data:`ENGINE`, kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]


# -- the mutant ---------------------------------------------------------------------------


@contextlib.contextmanager
def _drift_uncorrected() -> Iterator[None]:
    """The defect: ``update_num_computed_tokens_for_batch_change`` taking the host's
    counts for every request, the scheduler's optimistic ones: a request that rejected
    drafts in the step before runs on from past its last accepted token (its positions,
    sequence length and slots, as if every draft had been accepted)."""
    import vllm.v1.worker.gpu_model_runner as gmr

    def uncorrected(num_computed_tokens: torch.Tensor, *args: Any) -> None:
        cpu = args[-1]
        num_computed_tokens[: cpu.shape[0]].copy_(cpu)

    with mock.patch.object(gmr, "update_num_computed_tokens_for_batch_change", uncorrected):
        yield


_MUTATED = v1.Mutated(AsyncRunnerStepEngine(), _drift_uncorrected)


def run_drift_uncorrected(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The mutant ``vllm-v1-async-drift-uncorrected``: ``vllm-v1-async`` with
    :func:`_drift_uncorrected` in force."""
    return _MUTATED(inputs)


run_drift_uncorrected.new_engine = _MUTATED.engine.new_engine  # type: ignore[attr-defined]


# -- the mutant's trigger -------------------------------------------------------------------


def drafted_then_ran(trace: Trace | Case) -> list[tuple[int, int]]:
    """For each request that verified drafts in a step and runs in the next: how many
    tokens its query ran past where it runs on from (its rollback, 0 for none), and its
    query there."""
    c = trace.config
    if c.runner != "v1" or c.num_spec == 0:
        return []
    out = []
    steps = as_trace(trace).steps
    for before, prev, step in zip((None, *steps), steps, steps[1:], strict=False):
        held = set(before.req_ids) if before is not None else set()
        pairs = zip(step.num_computed_tokens, step.q_lens, strict=True)
        now = dict(zip(step.req_ids, pairs, strict=True))
        for rid, computed, q in zip(
            prev.req_ids, prev.num_computed_tokens, prev.q_lens, strict=True
        ):
            # Drafts go to a request the runner holds (scheduled_spec_decode_tokens).
            if rid in held and 1 < q <= 1 + c.num_spec and rid in now:
                runs_from, query = now[rid]
                out.append((computed + q - runs_from, query))
    return out


def _runs_on_after_drafts(trace: Trace | Case) -> list[int]:
    """:func:`drafted_then_ran`'s rollbacks."""
    return [back for back, _ in drafted_then_ran(trace)]


def reach_drift(trace: Trace | Case) -> bool:
    """A request verifies drafts in one step and runs in the next: the scheduler sends
    its optimistic count, which the runner corrects."""
    return bool(_runs_on_after_drafts(trace))


def trigger_drift_uncorrected(trace: Trace | Case) -> bool:
    """Such a request rejected a draft: its optimistic count is past the true one."""
    return any(back > 0 for back in _runs_on_after_drafts(trace))


def smallest_drift_uncorrected() -> Trace:
    """One request of a one-token prompt, then a decode of its token and one draft,
    which the step rejects; the request runs on from 2 computed tokens, where the
    scheduler counts 3. Pages of 16 tokens, as the Triton backend takes on V1."""
    config = EngineConfig(
        max_model_len=16, max_num_seqs=1, max_num_batched_tokens=8, block_size=16, num_spec=1,
        cudagraph_capture_sizes=(2,), cudagraph_mode="NONE", runner="v1",
    )  # fmt: skip
    pages = ((1,),)
    return Trace(
        config,
        (
            Batch((0,), (1,), req_ids=(0,), pages=pages, new_pages=(1,)),
            Batch((1,), (2,), req_ids=(0,), pages=pages, new_pages=(0,), rejected=(1,)),
            Batch((2,), (1,), req_ids=(0,), pages=pages, new_pages=(0,)),
        ),
    )
