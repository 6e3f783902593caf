"""The standalone reproduction of ``vllm-mtp-modules-reprefill-before-prompt``: a script
that imports only torch and vLLM (``attnfuzz export --standalone`` of a runner-step trace).

The finding (docs/findings.md): after a decode step that rejects ``r`` drafts, the
multi-module MTP drafter's ``_prepare_input_buffers_kernel``
(``vllm/v1/worker/gpu/spec_decode/multi_module_mtp/speculator.py``) re-prefills the
``r - 1`` tokens before the query's first at positions ``first_position - (r - 1) + i``,
bounded by nothing else, so a request with fewer tokens before its query than that gets
a draft position below 0. The script calls vLLM's own ``prepare_input_buffers`` (the
kernel's launcher, as ``MultiModuleMTPSpeculator._prepare_inputs`` calls it) on the
witness step's values, written in as literals: each request's target positions and
query, the drafts it rejected, what it sampled. It prints each request's draft
positions and exits 1 where a real row's position is below 0 (0 otherwise). Importing
this module imports nothing of vLLM.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

from attnfuzz.harness.errors import UsageError

if TYPE_CHECKING:
    from attnfuzz.reference.runner_step import RunnerStepInputs

# The kernel's line, and the bound a fix would add (re-prefill no more tokens than the
# request has before its query); the test of this script stands the fix in with it.
LINE = "num_reprefill_tokens = max(0, num_rejected - 1)"

_SCRIPT = '''\
"""vLLM multi-module MTP drafter: re-prefilled draft positions below 0.

After a decode step that rejects r drafts of a request, the draft pass's
_prepare_input_buffers_kernel (v1/worker/gpu/spec_decode/multi_module_mtp/
speculator.py) re-prefills the r - 1 tokens before the query's first token at
positions first_position - (r - 1) + i, where first_position is the number of
tokens before the query. With a prompt shorter than r - 1 tokens (one token,
three drafts, all rejected) the first lands at position -1: the draft model's
rotary position and the slot its KV is written to (compute_slot_mappings).

Reachable on the V2 model runner with speculative method "mtp" and two MTP
modules or more (SpeculativeConfig.use_multi_module_mtp), three speculative
tokens or more, a prompt of num_speculative_tokens - 2 tokens or fewer, and a
first decode that rejects every draft.

Needs only torch and vllm; runs on the CPU (its Triton kernel interpreted).
Calls vLLM's own prepare_input_buffers, as MultiModuleMTPSpeculator._prepare_inputs
does, on the witness step below. Exits 1 where a real row's draft position is
below 0, 0 otherwise.
"""

import os
import sys
from types import SimpleNamespace

import torch

if not torch.cuda.is_available():  # vLLM's CPU platform; its Triton kernels interpreted
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ["TRITON_INTERPRET"] = "1"
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

from vllm.v1.worker.gpu.spec_decode.multi_module_mtp.speculator import (  # noqa: E402
    prepare_input_buffers,
)

# The witness: the step after which the draft pass runs, in the runner's batch order.
NUM_SPEC = {num_spec}  # speculative_config.num_speculative_tokens (MTP modules)
NUM_COMPUTED = {num_computed}  # tokens before each request's query
QUERY_LENS = {query_lens}  # 1 + the drafts verified, for a decode
NUM_REJECTED = {num_rejected}  # drafts the rejection sampler rejected
NUM_SAMPLED = {num_sampled}  # tokens sampled (0 for a prompt chunk that is not its last)
MAX_NUM_REQS = {max_num_reqs}


def i32(values):
    return torch.tensor(values, dtype=torch.int32, device=DEVICE)


num_reqs = len(QUERY_LENS)
query_start_loc = [0]
for q in QUERY_LENS:
    query_start_loc.append(query_start_loc[-1] + q)
num_tokens = query_start_loc[-1]
positions = [c + i for c, q in zip(NUM_COMPUTED, QUERY_LENS) for i in range(q)]

input_batch = SimpleNamespace(
    input_ids=i32([1] * num_tokens),
    positions=torch.tensor(positions, dtype=torch.int64, device=DEVICE),
    idx_mapping=i32(list(range(num_reqs))),
    seq_lens=i32([c + q for c, q in zip(NUM_COMPUTED, QUERY_LENS)]),
)
qsl = torch.zeros(MAX_NUM_REQS + 1, dtype=torch.int32, device=DEVICE)
qsl[: num_reqs + 1] = i32(query_start_loc)  # the target's, copied as propose does
input_buffers = SimpleNamespace(
    input_ids=torch.zeros(num_tokens, dtype=torch.int32, device=DEVICE),
    positions=torch.full((num_tokens,), -7, dtype=torch.int64, device=DEVICE),
    seq_lens=torch.zeros(MAX_NUM_REQS, dtype=torch.int32, device=DEVICE),
    query_start_loc=qsl,
)
prepare_input_buffers(
    num_reqs,
    input_batch,
    torch.zeros(MAX_NUM_REQS, max(NUM_SPEC - 1, 1), dtype=torch.int64, device=DEVICE),
    i32(NUM_SAMPLED),
    i32(NUM_REJECTED),
    torch.zeros(MAX_NUM_REQS, dtype=torch.int64, device=DEVICE),
    torch.zeros(NUM_SPEC, MAX_NUM_REQS, dtype=torch.int32, device=DEVICE),
    torch.full((MAX_NUM_REQS, max(NUM_SPEC - 1, 1)), -1, dtype=torch.int64, device=DEVICE),
    input_buffers,
    last_token_indices := torch.zeros(MAX_NUM_REQS, dtype=torch.int64, device=DEVICE),
    MAX_NUM_REQS,
    NUM_SPEC,
)

below = []
for r in range(num_reqs):
    start = query_start_loc[r]
    # The real rows, as the kernel lays them out: the re-prefilled tokens, then the
    # query's accepted inputs, up to its last token (the one the drafter samples from).
    stop = int(last_token_indices[r]) + 1
    rows = input_buffers.positions[start:stop].tolist()
    print(
        f"request {{r}}: {{NUM_COMPUTED[r]}} tokens before a query of {{QUERY_LENS[r]}}, "
        f"{{NUM_REJECTED[r]}} rejected: draft positions {{rows}}, "
        f"draft seq_len {{int(input_buffers.seq_lens[r])}}"
    )
    below += [(r, p) for p in rows if p < 0]
if below:
    print(f"draft positions below 0 (request, position): {{below}}")
sys.exit(1 if below else 0)
'''


def _witness(steps: Sequence[RunnerStepInputs]) -> RunnerStepInputs:
    """The step the draft pass runs after: the first whose rejections re-prefill before a
    request's first token, else the last step that rejected drafts."""
    rejecting = [s for s in steps if any(s.num_rejected)]
    if not rejecting:
        raise UsageError("no step of the trace rejects drafts: the draft pass re-prefills nothing")
    for step in rejecting:
        if any(r - 1 > c for r, c in zip(step.num_rejected, step.num_computed_tokens, strict=True)):
            return step
    return rejecting[-1]


def mtp_modules_reprefill(steps: Sequence[RunnerStepInputs] | RunnerStepInputs) -> str:
    """The script of ``vllm-mtp-modules-reprefill-before-prompt`` on a trace's steps (each
    step's scheduler output, in order; a case's one step): ``prepare_input_buffers`` on
    the witness step."""
    step = _witness(steps if isinstance(steps, Sequence) else (steps,))
    prompts = step.prompt_lens or (0,) * step.num_reqs
    num_sampled = [
        # A prompt chunk that leaves some of its prompt for later samples nothing.
        0 if c + q < p else q - r
        for c, q, r, p in zip(
            step.num_computed_tokens, step.query_lens, step.num_rejected, prompts, strict=True
        )
    ]
    return _SCRIPT.format(
        num_spec=step.config.num_spec,
        num_computed=json.dumps(list(step.num_computed_tokens)),
        query_lens=json.dumps(list(step.query_lens)),
        num_rejected=json.dumps(list(step.num_rejected)),
        num_sampled=json.dumps(num_sampled),
        max_num_reqs=step.config.max_num_seqs,
    )
