"""vLLM's own limits on the steps an implementation of it is given, read from its code.

Imports neither vLLM nor torch: the plugin declares these limits when it loads, and
the strategies draw inside them (``Implementation.admits``), so a witness of a vLLM
implementation is a state that vLLM reaches.
"""

from __future__ import annotations

from typing import Any


def drafter_admits(inputs: Any) -> str | None:
    """A drafter's metadata is built only under a speculative config, and vLLM 0.33.0
    refuses one without a speculative token (``vllm/config/speculative.py``,
    ``SpeculativeConfig._verify_args``: ``num_speculative_tokens`` must be greater
    than zero). A step of ``num_spec = 0`` is no step any drafter sees."""
    if inputs.config.num_spec < 1:
        return (
            "num_spec = 0: vLLM runs a drafter only with num_speculative_tokens > 0 "
            "(config/speculative.py: SpeculativeConfig._verify_args)"
        )
    return None


def step_admits(inputs: Any) -> str | None:
    """vLLM 0.33.0 never schedules a token at the model's last position: a prompt of
    ``max_model_len`` tokens is refused (``v1/engine/input_processor.py``,
    ``InputProcessor._validate_model_input``: the prompt plus at least one output must
    fit), and ``Scheduler.schedule`` caps a running request's tokens, drafts included,
    at ``max_model_len - num_computed_tokens - num_sampled_tokens_per_step`` (one for a
    generating model: the token the step samples). So every request of a step ends at
    ``max_model_len - 1`` at most."""
    top = inputs.config.max_model_len - 1
    for r, (computed, q) in enumerate(
        zip(inputs.num_computed_tokens, inputs.query_lens, strict=True)
    ):
        if computed + q > top:
            return (
                f"request {r} reaches {computed + q} tokens > max_model_len - 1 = {top}: "
                "vLLM's scheduler keeps a slot for the sampled token "
                "(v1/core/sched/scheduler.py: Scheduler.schedule)"
            )
    return None
