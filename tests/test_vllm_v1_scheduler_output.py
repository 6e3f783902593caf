"""Traces on which ``vllm-v1``'s adapter once raised a false history-invariance alarm:
its scheduler output was not the one vLLM's scheduler sends, so its eager engine and
its fresh engine disagreed where vLLM's do not. Each holds every property now.

- ``output_tokens_dropped``: the adapter sent ``num_output_tokens`` 0 for a running
  request, where ``Scheduler._make_cached_request_data`` sends the request's count;
  ``GPUModelRunner._update_states`` then dropped its sampled tokens
  (``del output_token_ids[num_output_tokens:]``, ``num_tokens_no_spec`` back to the
  prompt's), and the next verify read a draft id from a row a previous request left
  (the eager engine's ``RejectionSampler`` got drafts ``[0, 1]``, the fresh one's
  ``[0, 0]``).
- ``prompt_past_first_chunk``: the adapter told vLLM that a new request's prompt was its
  first chunk (the step did not carry prompt lengths; ``prompt_lens`` says them now), so
  a second chunk ran past the request's tokens, which vLLM's scheduler never schedules;
  the verify after it read draft ids from positions no token was written to."""

from __future__ import annotations

import pytest
from attnfuzz.adapters.vllm.testing import requires_vllm
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.trace import Trace

pytestmark = requires_vllm

_CONFIG = {"decode_threshold": None, "topk": 1, "num_heads": 1, "head_dim": 1,
           "cudagraph_mode": "FULL_AND_PIECEWISE", "cg_support": "UNIFORM_BATCH",
           "runner": "v1", "varlen_decode": False, "separate_kv_update": False}  # fmt: skip


def _step(computed, q_lens, req_ids, pages, new_pages, **more):
    return {"num_computed_tokens": computed, "q_lens": q_lens, "seed": 0, "req_ids": req_ids,
            "pages": pages, "new_pages": new_pages, **more}  # fmt: skip


TRACES = {
    # Request 0 prefills 3 tokens and is left out; request 1 takes its row with a prompt
    # of one token, then verifies 2 drafts.
    "output_tokens_dropped": {
        "config": {
            **_CONFIG,
            "max_model_len": 145,
            "max_num_seqs": 1,
            "max_num_batched_tokens": 3,
            "block_size": 64,
            "num_spec": 2,
            "cudagraph_capture_sizes": [3],
        },  # fmt: skip
        "steps": [
            _step([0], [3], [0], [[1]], [1]),
            _step([0], [1], [1], [[1]], [1]),
            _step([1], [3], [1], [[1]], [0]),
        ],
    },
    # Request 3's prompt of 17 tokens in chunks of 8 and 9, then a decode and a verify
    # of 3 drafts, beside requests 0, 2 and 6 (0 and 2 finish on the way).
    "prompt_past_first_chunk": {
        "config": {
            **_CONFIG,
            "max_model_len": 209,
            "max_num_seqs": 10,
            "max_num_batched_tokens": 111,
            "block_size": 64,
            "num_spec": 3,
            "cudagraph_capture_sizes": [8, 56],
            "separate_kv_update": True,
        },  # fmt: skip
        "steps": [
            _step(
                [0, 0, 0, 0],
                [70, 19, 8, 14],
                [0, 2, 3, 6],
                [[1, 2], [4], [5], [9]],
                [2, 1, 1, 1],
                prompt_lens=[70, 63, 17, 43],
            ),  # fmt: skip
            _step(
                [19, 8, 14],
                [44, 9, 29],
                [2, 3, 6],
                [[4, 8], [5], [9]],
                [1, 0, 0],
                finished=[0],
                prompt_lens=[63, 17, 43],
            ),  # fmt: skip
            _step([17, 43], [1, 1], [3, 6], [[5], [9]], [0, 0], finished=[2], prompt_lens=[17, 43]),
            _step([18, 44], [4, 4], [3, 6], [[5], [9]], [0, 0], prompt_lens=[17, 43]),
        ],
    },
}


@pytest.mark.parametrize("name", sorted(TRACES))
def test_vllm_v1_holds_every_property_on_the_trace(name):
    from attnfuzz.adapters.vllm import runner_step_v1

    trace = Trace.from_dict(TRACES[name])
    runner_step_v1.run.new_engine()
    found = [
        v
        for case in trace.cases()
        for v in ref.violations(runner_step_v1.run(ref.make_inputs(case)))
    ]
    assert found == []
