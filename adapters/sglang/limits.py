"""SGLang's own limits on the steps its attention backends are given (``Implementation.admits``).

A backend's metadata code may be wrong on steps SGLang never builds; a finding
there is of no state the engine reaches. Each function here says, of a
target's inputs, why SGLang never gives them to the backend (one line naming
SGLang's code), else None. Read from SGLang 0.5.23's source, the release the
adapters were written against and CI runs; not checked against the older
releases the adapters also bind (0.5.9 to 0.5.22). Importing this module
imports nothing of SGLang.

TRT-LLM MLA (``mla-block-table``):

- **Page size 32 or 64.** ``arg_groups/overrides.py:_mla_backend_page_constraints``
  changes any other ``page_size`` to 64 when ``trtllm_mla`` is the attention or
  the decode backend ("TensorRT-LLM MLA only supports page_size of 32 or 64").
- **The longest prefix.** A step's KV is a prefix of committed tokens and the
  ``N`` tokens of the step (the forward's ``seq_len`` in target verify, ``seq_len
  - N`` in draft extend). ``managers/tp_worker.py:TpModelWorker.get_worker_info``
  sets ``max_req_len = context_len - 1``;
  ``managers/scheduler.py:Scheduler.init_req_max_new_tokens`` caps
  ``max_new_tokens`` at ``max_req_len - input_len - 1``; and a request is
  finished (``managers/schedule_batch.py:Req.update_finish_state``) once its
  ``output_ids`` reach ``max_new_tokens``. Spec v2's prefix is ``input_len +
  len(output_ids) - 1`` (the bonus token is verified with the drafts:
  ``speculative/eagle_worker_v2.py:EAGLEWorkerV2._forward_prefill_batch``,
  "batch.seq_lens = length BEFORE this iter's tokens";
  ``speculative/eagle_worker_common.py:run_eagle_verify``, ``new_seq_lens =
  batch.seq_lens + accept_lens``). So a request still running
  verifies a prefix of at most ``context_len - 4``. With an overlap scheduler a
  step is launched before the previous step's result is processed, so the
  previous verify's ``S`` accepted tokens (``1..N``, the bonus included) land
  before the length check: a prefix of at most ``context_len - 4 + S``. (The
  plain overlap loop, ``Scheduler.event_loop_overlap``, also leaves out a request
  whose in-flight result commits its last token (``_reqs_finishing_inflight``),
  one token tighter; the disaggregated decode loop,
  ``disaggregation/decode.py:SchedulerDisaggregationDecodeMixin.event_loop_overlap_disagg_decode``,
  does not, so
  ``context_len - 4 + S`` is reached.) A case carries ``S`` for a target verify:
  its accept count is the tokens the verify before accepted
  (:mod:`attnfuzz.reference.mla_block_table`). A draft extend's accept count is
  its own step's, not the previous one's, so there ``S`` is taken at its most,
  ``N`` (EAGLE's accept length is at most ``speculative_num_draft_tokens``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from attnfuzz.reference.mla_block_table import MlaBlockTableInputs

TRTLLM_MLA_PAGE_SIZES = (32, 64)
"""``_mla_backend_page_constraints``: the page sizes SGLang runs TRT-LLM MLA with."""
TRTLLM_MLA_PAGE_LOG2 = (5, 6)
"""``mla_page_log2``'s range for them: the draws of SGLang's implementations."""
SCHEDULER_MARGIN = 4
"""``context_len - 4``: the longest prefix a running request verifies (module docstring)."""


FLASHMLA_PAGE_LOG2 = (6, 6)
"""FlashMLA's one page size, 64 (``_mla_backend_page_constraints``; ``flashmla_backend.py``
``PAGE_SIZE``): the draws of SGLang's FlashMLA implementations."""


def trtllm_mla_admits(inputs: MlaBlockTableInputs) -> str | None:
    """Why SGLang never gives TRT-LLM MLA this step (module docstring), else None."""
    if inputs.page_size not in TRTLLM_MLA_PAGE_SIZES:
        return (
            f"page size {inputs.page_size}: SGLang runs TRT-LLM MLA with pages of 32 or 64 "
            "tokens only (arg_groups/overrides.py: _mla_backend_page_constraints)"
        )
    return _scheduled_prefix(inputs)


def flashmla_admits(inputs: MlaBlockTableInputs) -> str | None:
    """Why SGLang never gives FlashMLA this step: pages other than 64, or a prefix past
    what its scheduler lets a request reach (module docstring), else None."""
    if inputs.page_size != 64:
        return (
            f"page size {inputs.page_size}: SGLang runs FlashMLA with pages of 64 tokens "
            "only (arg_groups/overrides.py: _mla_backend_page_constraints)"
        )
    return _scheduled_prefix(inputs)


def _scheduled_prefix(inputs: MlaBlockTableInputs) -> str | None:
    """Why no running request of SGLang's verifies this step's prefix, else None."""
    from attnfuzz.reference.mla_block_table import TARGET_VERIFY

    N, context_len = inputs.next_n, inputs.context_len
    verify = inputs.phase == TARGET_VERIFY
    seq_lens = [int(x) for x in inputs.seq_lens.cpu()]
    accepted = [int(x) for x in inputs.accept_lens.cpu()]
    for r, (seq_len, accept) in enumerate(zip(seq_lens, accepted, strict=True)):
        prefix = seq_len if verify else seq_len - N
        S = accept if verify else N  # a draft extend's count is of its own step
        limit = context_len - SCHEDULER_MARGIN + S
        if prefix > limit:
            whose = "the verify before accepted" if verify else "a verify accepts at most (N)"
            return (
                f"request {r} verifies a prefix of {prefix} tokens, past {limit}: context_len "
                f"- {SCHEDULER_MARGIN} (tp_worker.py max_req_len = context_len - 1; "
                "scheduler.py Scheduler.init_req_max_new_tokens) + the S = "
                f"{S} tokens {whose}, landed before an overlapped step's length check"
            )
    return None
