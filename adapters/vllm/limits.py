"""vLLM's own limits on the steps an implementation of it is given, read from its code.

Imports no vLLM: the plugin declares these limits when it loads, and
the strategies draw inside them (``Implementation.admits``), so a witness of a vLLM
implementation is a state that vLLM reaches.
"""

from __future__ import annotations

import functools
from typing import Any

from attnfuzz.adapters.vllm.lookahead import (
    Lookahead,
    dflash_num_lookahead_tokens,
    num_lookahead_tokens,
)
from attnfuzz.reference.batch import EngineConfig


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


def config_admits(config: EngineConfig, lookahead: Lookahead | None) -> str | None:
    """The engine-config checks of vLLM 0.33.0 that the drawn configs can fail (a
    served engine refuses to start on them): a step budget below ``max_num_seqs``
    (``config/scheduler.py``, ``SchedulerConfig.verify_max_model_len``), and under
    drafts a budget not above the drafter's lookahead (``config/vllm.py``,
    ``VllmConfig._set_max_num_scheduled_tokens``: no slot left for a scheduled
    token). ``lookahead`` is ``VllmConfig.num_lookahead_tokens`` of the
    implementation's drafter (None: it reserves none)."""
    budget = config.max_num_batched_tokens
    if budget < config.max_num_seqs:
        return (
            f"max_num_batched_tokens {budget} < max_num_seqs {config.max_num_seqs}: "
            "vLLM refuses the config (config/scheduler.py: "
            "SchedulerConfig.verify_max_model_len)"
        )
    reserved = lookahead(config) if lookahead is not None and config.num_spec else 0
    if reserved and budget <= reserved:
        return (
            f"max_num_batched_tokens {budget} <= the drafter's lookahead of {reserved}: "
            "vLLM refuses the config (config/vllm.py: "
            "VllmConfig._set_max_num_scheduled_tokens)"
        )
    return None


def admits_under(inputs: Any, lookahead: Lookahead | None) -> str | None:
    """:func:`config_admits` of the step's engine, then :func:`step_admits`'s limit on
    its positions."""
    return config_admits(inputs.config, lookahead) or _positions_admit(inputs)


def step_admits(inputs: Any) -> str | None:
    """The limits of a step of an engine whose drafter (if any) has a forward of its own
    (EAGLE, MTP, a draft model): :func:`admits_under` its lookahead."""
    return admits_under(inputs, num_lookahead_tokens)


dflash_step_admits = functools.partial(admits_under, lookahead=dflash_num_lookahead_tokens)
"""The limits of a step of an engine with a DFlash drafter (a bonus query and one a
draft reserved)."""

DRAFT_SLOTS = 1
"""``SpeculativeConfig.max_num_new_slots_for_drafting`` of a draft model without
parallel drafting (``config/speculative.py``): the bonus token's row."""


def draft_slots_declines(num_tokens: int, num_reqs: int, budget: int) -> str | None:
    """A step whose tokens and one drafting slot a request pass the step budget:
    ``Scheduler.schedule`` (``v1/core/sched/scheduler.py``) takes ``num_new_tokens +
    draft_slots`` from its ``input_budget`` (``max_num_batched_tokens``) for each request
    it schedules, so vLLM never schedules such a step under a draft model (whose
    proposer's buffers, of ``max_num_batched_tokens`` rows, hold what it does
    schedule and the slots)."""
    need = num_tokens + DRAFT_SLOTS * num_reqs
    if need > budget:
        return (
            f"{num_tokens} tokens and {DRAFT_SLOTS} drafting slot a request for "
            f"{num_reqs} requests ({need}) pass max_num_batched_tokens {budget}: vLLM's "
            "scheduler reserves max_num_new_slots_for_drafting a request "
            "(v1/core/sched/scheduler.py: Scheduler.schedule)"
        )
    return None


def draft_model_declines(case: Any) -> str | None:
    """Why an engine with a draft-model drafter does not run ``case``'s step: no
    drafts to run, or no room for the drafting slots (:func:`draft_slots_declines`)."""
    if case.config.num_spec == 0:
        return "no speculative config: no drafter to run"
    b = case.batch
    return draft_slots_declines(sum(b.q_lens), len(b.q_lens), case.config.max_num_batched_tokens)


def draft_model_step_admits(inputs: Any) -> str | None:
    """The limits of a step of an engine with a draft-model drafter: :func:`step_admits`
    and the scheduler's drafting slots (:func:`draft_slots_declines`)."""
    return step_admits(inputs) or draft_slots_declines(
        int(sum(inputs.query_lens)), len(inputs.query_lens), inputs.config.max_num_batched_tokens
    )


ngram_step_admits = functools.partial(admits_under, lookahead=None)
"""The limits of a step of an engine with an n-gram drafter (it reserves no lookahead)."""


def _positions_admit(inputs: Any) -> str | None:
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
