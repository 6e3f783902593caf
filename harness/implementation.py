"""An implementation of a target: any callable ``fn(inputs) -> outputs``, with what
the harness needs to know of it (its kind, its engine, the engine values it fixes,
the cases it declines or that its engine never reaches, and for a mutant what the
zoo measures it by). Targets hold them (:mod:`attnfuzz.harness.target`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from attnfuzz.harness.definitions import Kind
from attnfuzz.harness.errors import UsageError
from attnfuzz.reference.batch import Batch, Case, EngineConfig
from attnfuzz.reference.runner import CG_SUPPORTS
from attnfuzz.strategies.batches import fixes_problems


@dataclass(frozen=True)
class Implementation:
    name: str
    fn: Callable[[Any], Any]
    kind: Kind  # a Kind or its string, made a Kind on construction
    description: str = ""
    # Mutants only, for the zoo's scoreboard: ``reach`` says a case runs the
    # code the bug lives in; ``trigger`` says the case meets the bug's condition.
    trigger: Callable[[Any], bool] | None = None  # of a Case (a Trace when ``traced``)
    reach: Callable[[Any], bool] | None = None
    # The smallest case that triggers the bug, derived by hand (docs/domain.md, section 8,
    # gives each bug's): what a minimized case is measured against.
    smallest: Callable[[], Any] | None = None
    # The engine whose own code this is ("vllm"), None for attnfuzz's own code;
    # ``unavailable()`` says why it cannot run here (an optional install), or None.
    engine: str | None = None
    unavailable: Callable[[], str | None] | None = None
    # The engine-config fields this implementation requires, e.g. ``{"topk": 512,
    # "next_n": 1}`` for a kernel built for one top-k and no native MTP (fields:
    # ``strategies.batches.FIXABLE``). Its cases are drawn with these values at
    # any scale, and ``Target.judge`` refuses a case that differs (InvalidCase).
    fixes: Mapping[str, int | str] = field(default_factory=dict, hash=False)
    # The CUDA-graph support (``AttentionCGSupport`` names) of the engine's backends where
    # narrower than its target's (``Target.cg_supports``), e.g. ``("NEVER",)`` for a model
    # with a layer of no graph support: its cases are drawn with these alone (and the
    # modes they keep), and ``Target.judge`` refuses another (InvalidCase), so that where
    # a finding reaches is planned with the support the engine runs with. None: the
    # target's.
    cg_supports: tuple[str, ...] | None = field(default=None, hash=False)
    # Why the installed engine runs ``case`` through other code than the target's
    # (one line), else None: such cases are not drawn for it, and are refused.
    declines: Callable[[Case], str | None] | None = field(default=None, hash=False)
    # The engine's own limits on what reaches this code, read from the engine's code
    # (per release where they differ): of the target's inputs (what ``fn`` takes), why
    # the engine never gives them (one line naming the engine's code), else None. Cases
    # outside are not drawn for it, shrinking stays inside, and judging one (a replay)
    # is refused as :class:`Unreachable`: a finding there would be of a state the
    # engine never reaches.
    admits: Callable[[Any], str | None] | None = field(default=None, hash=False)
    # Narrower ranges of the target's own integers (``Target.params``: name ->
    # inclusive range, inside the target's), where ``admits`` allows only part of
    # one (a page size): its cases draw each in this range, so that few are rejected.
    # It only narrows the search; ``admits`` is what refuses.
    params: Mapping[str, tuple[int, int]] = field(default_factory=dict, hash=False)
    # Engine code only: of the target's inputs (what ``fn`` takes; for a trace, each
    # step's, in order), the text of a self-contained Python script that imports only
    # the engine and torch, drives the engine's own code with those values and exits 1
    # where the defect shows (``attnfuzz export --standalone``): the reproduction an
    # upstream issue carries.
    standalone: Callable[[Any], str] | None = field(default=None, hash=False)
    # It lives across steps: fuzzed with traces (:meth:`Target.traces`); a mutant's
    # ``reach``, ``trigger`` then read a Trace, and ``smallest`` returns one.
    traced: bool = False
    # Traced only: of an engine config, the KV slots the engine's scheduler reserves past
    # each request's scheduled tokens (its drafter's positions after the step's, e.g.
    # vLLM's ``VllmConfig.num_lookahead_tokens``): a drawn trace gives each request the
    # pages of those too, as the engine's scheduler does, up to ``max_model_len``.
    lookahead: Callable[[EngineConfig], int] | None = field(default=None, hash=False)
    # Traced only: whether the engine prefills a prompt over several steps (vLLM's and
    # SGLang's default, chunked prefill); False for one that prefills it whole, in one
    # step (an encoder-decoder model's): a drawn trace then prefills every prompt whole.
    chunked_prefill: bool = field(default=True, hash=False)
    # Engine code whose engine decides a step's graph mode itself (the runner's own
    # step): of an engine config and a step, the step as its engine runs it (e.g. beside
    # the data-parallel peer its adapter puts there, never forced eager), so that where
    # a finding reaches is planned on what ran (``harness.reachability``); None: as given.
    as_run: Callable[[EngineConfig, Batch], Batch] | None = field(default=None, hash=False)

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "kind", Kind(self.kind))
        except ValueError:
            raise UsageError(
                f"implementation {self.name!r}: kind {self.kind!r} is none of {', '.join(Kind)}"
            ) from None
        problems = fixes_problems(self.fixes)
        if self.cg_supports is not None and (
            not self.cg_supports or not set(self.cg_supports) <= set(CG_SUPPORTS)
        ):
            problems.append(
                f"cg_supports {self.cg_supports!r} must be some of {', '.join(CG_SUPPORTS)}"
            )
        for name, bounds in self.params.items():
            if not (
                isinstance(bounds, tuple)
                and len(bounds) == 2
                and all(isinstance(b, int) and not isinstance(b, bool) for b in bounds)
                and bounds[0] <= bounds[1]
            ):
                problems.append(f"params {name!r} must be a range (lo, hi), lo <= hi")
        if problems:
            raise UsageError(f"implementation {self.name!r}: {'; '.join(problems)}")
        object.__setattr__(self, "fixes", dict(self.fixes))  # a copy the caller cannot change
        object.__setattr__(self, "params", dict(self.params))

    def supports(self, target: tuple[str, ...]) -> tuple[str, ...]:
        """The CUDA-graph supports its cases are drawn with, of its target's ``target``."""
        if self.cg_supports is None:
            return target
        return tuple(s for s in target if s in self.cg_supports)

    def support_violations(self, cg_support: str, target: tuple[str, ...]) -> list[str]:
        """Why a case of ``cg_support`` is not one of its backends' (its target's
        supports ``target``): one line, or none."""
        ours = self.supports(target)
        if cg_support in ours:
            return []
        return [
            f"cg_support {cg_support}: its backends are of AttentionCGSupport {' or '.join(ours)}"
        ]

    @classmethod
    def mutant(
        cls,
        name: str,
        fn: Callable[[Any], Any],
        description: str,
        *,
        reach: Callable[[Any], bool],
        trigger: Callable[[Any], bool],
        smallest: Callable[[], Any],
        **fields: Any,
    ) -> Implementation:
        """A mutant as a target declares it: the bug (``fn``, ``description``) with
        everything the zoo measures it by, none left out: ``reach`` (a case runs
        the code the bug lives in), ``trigger`` (a case meets its condition) and
        ``smallest`` (the smallest triggering case, derived by hand); ``fields``:
        the optional ones (``fixes``, ``cg_supports``, ``declines``, ``admits``, ``params``,
        ``engine``, ``unavailable``, ``traced``: a bug of the engine's life, whose three read and
        give traces)."""
        return cls(name, fn, Kind.MUTANT, description, trigger, reach, smallest, **fields)

    def why_unavailable(self) -> str | None:
        if self.kind != Kind.REFERENCE and (stale := triton_made_for_a_gpu()) is not None:
            return stale
        return self.unavailable() if self.unavailable is not None else None

    def prepare(self) -> None:
        """Import and build what every call shares (an engine's adapter), before a
        judge forks its child; a no-op for plain callables."""
        prepare = getattr(self.fn, "prepare", None)
        if callable(prepare):
            prepare()


def triton_made_for_a_gpu() -> str | None:
    """Why no Triton kernel can run here, or None: with ``TRITON_INTERPRET=1``
    (attnfuzz's default without CUDA) Triton's own ``@jit`` helpers (``tl.cdiv``,
    ``tl.zeros``, ...) must be interpreted ones, but Triton imported before the
    variable was set (by an engine imported before attnfuzz) made them for a GPU:
    every interpreted kernel that calls one raises "Cannot call @triton.jit'd outside
    of the scope of a kernel", which would read as the implementation's exception."""
    import os
    import sys

    if os.environ.get("TRITON_INTERPRET") != "1" or "triton.language" not in sys.modules:
        return None
    from triton.runtime.jit import JITFunction

    if isinstance(getattr(sys.modules["triton.language"], "cdiv", None), JITFunction):
        return (
            "Triton was imported before TRITON_INTERPRET=1 was set, so its kernels are "
            "made for a GPU and cannot run on this CPU: import attnfuzz before any "
            "engine, or set TRITON_INTERPRET=1 before Python starts"
        )
    return None
