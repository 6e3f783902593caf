"""vLLM's own decode/prefill splitters as the implementation ``vllm`` of ``decode-split``.

Calls, unchanged, ``split_decodes_and_prefills`` and
``split_decodes_prefills_and_extends`` of ``vllm/v1/attention/backends/utils.py``
(0.33.0) on vLLM's ``CommonAttentionMetadata`` of the step, built by
:func:`attnfuzz.adapters.vllm._engine.common_attn_metadata` with the
``is_prefilling`` rows the model runner would set. Both are plain host code: nothing
runs interpreted.
"""

from __future__ import annotations

from typing import Any

import torch
from attnfuzz.adapters.vllm import _engine
from attnfuzz.harness.blame import under_test
from attnfuzz.reference.decode_split import DecodeSplitInputs, DecodeSplitOutputs


def prepare() -> None:
    _engine.prepare()
    import vllm.v1.attention.backends.utils  # noqa: F401


def _metadata(inputs: DecodeSplitInputs) -> Any:
    common = _engine.common_attn_metadata(
        inputs.meta, "cpu", seq_lens_cpu_upper_bound=inputs.seq_lens_upper_bound
    )
    # gpu_model_runner._build_attention_metadata: num_computed < num_prompt, padding rows False
    common.is_prefilling = torch.as_tensor(inputs.is_prefilling.copy())
    return common


def _run(inputs: DecodeSplitInputs, split_fn: Any) -> DecodeSplitOutputs:
    from vllm.v1.attention.backends.utils import split_decodes_prefills_and_extends

    common = _metadata(inputs)
    split = split_fn(
        common,
        decode_threshold=inputs.decode_threshold,
        require_uniform=inputs.require_uniform,
        treat_short_extends_as_decodes=inputs.treat_short_extends_as_decodes,
    )
    extends = split_decodes_prefills_and_extends(common, decode_threshold=inputs.decode_threshold)
    return DecodeSplitOutputs(tuple(split), tuple(extends))


def run(inputs: DecodeSplitInputs) -> DecodeSplitOutputs:
    from vllm.v1.attention.backends.utils import split_decodes_and_prefills

    return _run(inputs, split_decodes_and_prefills)


@under_test  # the engine's code with a fix reverted: its exceptions are the mutant's
def split_decodes_and_prefills_pre_pr29644(
    common_attn_metadata: Any,
    decode_threshold: int = 1,
    require_uniform: bool = False,
    treat_short_extends_as_decodes: bool = True,
) -> tuple[int, int, int, int]:
    """vLLM 0.33.0's ``split_decodes_and_prefills`` with the uniform branch of before #29644.

    Differs from 0.33.0 only inside ``if require_uniform:``. 0.33.0 has::

        if treat_short_extends_as_decodes and torch.all(
            (query_lens == query_lens[0]) | (query_lens == 0)
        ):
            return num_reqs, 0, num_tokens, 0  # all decodes
        is_prefill = (query_lens != query_lens[0]) & (query_lens != 0)

    Before #29644 ("Make split_decodes_and_prefills(..., require_uniform=True)
    support padding") the branch was the one line::

        is_prefill = query_lens != query_lens[0]

    so the zero-length padding requests of a padded uniform decode step were
    prefills and ``num_decodes`` was not the captured size. (The same PR also
    dropped ``| (query_lens == 0)`` from the ragged rule, where the fast path
    ``max_query_len <= decode_threshold`` returns before it on every padded step
    the model runner produces; it is left as in 0.33.0.)
    """
    max_query_len = common_attn_metadata.max_query_len
    num_reqs = common_attn_metadata.num_reqs
    num_tokens = common_attn_metadata.num_actual_tokens
    query_start_loc = common_attn_metadata.query_start_loc_cpu

    if (
        max_query_len <= decode_threshold
        and (not require_uniform or decode_threshold <= 1)
        and treat_short_extends_as_decodes
    ):
        return num_reqs, 0, num_tokens, 0

    query_lens = query_start_loc[1:] - query_start_loc[:-1]
    if query_lens[0].item() > decode_threshold:
        # first request is not decode, so no decode requests
        return 0, num_reqs, 0, num_tokens

    if require_uniform:
        is_prefill = query_lens != query_lens[0]  # the pre-#29644 line
    else:
        is_prefill = query_lens > decode_threshold

    if not treat_short_extends_as_decodes:
        assert common_attn_metadata.is_prefilling is not None
        is_prefill |= common_attn_metadata.is_prefilling

    if not torch.any(is_prefill):
        return num_reqs, 0, num_tokens, 0

    first_prefill = is_prefill.int().argmax(dim=-1).item()
    num_decodes = first_prefill
    num_prefills = num_reqs - num_decodes
    num_decode_tokens = query_start_loc[first_prefill].item()
    num_prefill_tokens = num_tokens - num_decode_tokens
    return (num_decodes, num_prefills, num_decode_tokens, num_prefill_tokens)


def upstream_padding_as_prefills(inputs: DecodeSplitInputs) -> DecodeSplitOutputs:
    """#29644 reverted: padding requests of a uniform decode step are prefills."""
    return _run(inputs, split_decodes_and_prefills_pre_pr29644)
