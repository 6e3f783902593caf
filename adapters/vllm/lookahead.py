"""vLLM's scheduler lookahead: the KV slots ``Scheduler.schedule`` reserves past each
request's scheduled tokens (``KVCacheManager.allocate_slots(num_lookahead_tokens=
VllmConfig.num_lookahead_tokens)``, up to ``max_model_len``), where the drafter's
steps write and read the positions after the step's.

How many a drafter reserves is written here once: the plugin declares it as each
runner-step implementation's ``Implementation.lookahead`` (so a drawn trace's requests
hold those pages), and the adapters decline a hand-written or replayed step that lacks
them (:func:`declines`). Neither vLLM nor torch is imported.
"""

from __future__ import annotations

from collections.abc import Callable

from attnfuzz.reference.batch import Case, EngineConfig, cdiv

Lookahead = Callable[[EngineConfig], int]
"""How many tokens a drafter of an engine config reserves (``Implementation.lookahead``)."""


def num_lookahead_tokens(config: EngineConfig) -> int:
    """``VllmConfig.num_lookahead_tokens`` (config/vllm.py) of a drafter with a forward
    of its own (EAGLE, MTP, a draft model): ``num_spec``; none without drafts."""
    return config.num_spec


def dflash_num_lookahead_tokens(config: EngineConfig) -> int:
    """``VllmConfig.num_lookahead_tokens`` of DFlash: a bonus query and one a draft."""
    return config.num_spec + 1 if config.num_spec else 0


def declines(case: Case, tokens: int) -> str | None:
    """A request of the step whose pages do not hold a lookahead of ``tokens``: a draft
    position past them would read a block-table entry the request does not own, a state
    vLLM's scheduler never builds, declined rather than judged."""
    c, b = case.config, case.batch
    if tokens <= 0 or not b.pages:
        return None  # a lone step (pages drawn from its seed): no later step judges its drafts
    for rid, computed, q, pages in zip(
        b.req_ids, b.num_computed_tokens, b.q_lens, b.pages, strict=True
    ):
        need = cdiv(min(computed + q + tokens, c.max_model_len), c.block_size)
        if len(pages) < need:
            return (
                f"request {rid} holds {len(pages)} pages, fewer than the {need} vLLM's "
                f"scheduler reserves with the drafter's lookahead of {tokens} tokens"
            )
    return None
