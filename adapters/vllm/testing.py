"""For test suites that run vLLM's own code: skip, saying why, where vLLM is not installed.

CI installs vLLM (``ATTNFUZZ_VLLM=1 ./setup.sh``) and sets
``ATTNFUZZ_REQUIRE_VLLM=1``: there a missing vLLM fails these tests instead.
"""

from __future__ import annotations

import collections
import os
from typing import Any

import pytest
from attnfuzz.adapters.vllm import ENGINE, unavailable
from attnfuzz.harness.testing import require_variable

_REASON = unavailable()
if _REASON is not None and os.environ.get(require_variable(ENGINE)) == "1":
    raise RuntimeError(f"{require_variable(ENGINE)}=1 but {_REASON}")

requires_vllm = [pytest.mark.vllm, pytest.mark.skipif(_REASON is not None, reason=_REASON or "")]
"""``pytestmark`` of a module that runs vLLM's own code: marked ``vllm`` (``-m vllm``
selects it), skipped where vLLM is not installed."""


class Calls(collections.Counter[str]):
    """How many times each function a test wraps (by name) was called while it ran; the
    wrapping is the test's ``monkeypatch``'s, undone at its end."""

    def __init__(self, monkeypatch: Any) -> None:
        super().__init__()
        self._monkeypatch = monkeypatch

    def count(self, owner: object, *names: str) -> None:
        """Count the calls of each of ``names``, attributes of ``owner``, from now on."""
        for name in names:
            original = getattr(owner, name)

            def counted(
                *args: Any, _name: str = name, _original: Any = original, **kwargs: Any
            ) -> Any:
                self[_name] += 1
                return _original(*args, **kwargs)

            self._monkeypatch.setattr(owner, name, counted)


def run_trace(trace: Any, run: Any) -> list[Any]:
    """Every step of ``trace`` (a ``Trace``) on a new engine of ``run`` (an implementation
    of ``runner-step`` with ``new_engine``), its outputs in order."""
    from attnfuzz.reference.runner_step import make_inputs

    run.new_engine()
    return [run(make_inputs(case)) for case in trace.cases()]


def own(out: Any, how: str) -> list[Any]:
    """The builds ``how`` of the step's own forward (the drafter's sub-steps left out)."""
    return [b for b in out.of(how) if b.draft is None]


def values(build: Any, name: str) -> list:
    """Field ``name`` of ``build``, as a list."""
    return build.field(name).values.tolist()


def kept_apart_verdict(fixed: str, kept: str, witness: Any) -> Any:
    """The ``runner-step`` verdict of the kept-apart entry ``kept`` on ``witness``, after
    asserting that the implementation ``fixed`` passes it and ``kept`` does not."""
    from attnfuzz.harness.registry import get_target

    target = get_target("runner-step")
    assert target.judge_trace(target.resolve(fixed), witness).ok
    verdict = target.judge_trace(target.resolve(kept), witness)
    assert not verdict.ok
    return verdict
