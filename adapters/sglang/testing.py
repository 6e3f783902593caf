"""For test suites that run SGLang's own code: skip, saying why, where SGLang is not installed.

CI installs SGLang (``ATTNFUZZ_SGLANG=1 ./setup.sh``) and sets
``ATTNFUZZ_REQUIRE_SGLANG=1``: there a missing SGLang fails these tests instead.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import pytest
from attnfuzz.adapters.sglang import ENGINE, unavailable
from attnfuzz.harness.testing import require_variable, spec_config
from attnfuzz.reference.batch import Batch, EngineConfig
from attnfuzz.reference.runner_step import RunnerStepOutputs, make_inputs, violations
from attnfuzz.reference.trace import Trace

_REASON = unavailable()
if _REASON is not None and os.environ.get(require_variable(ENGINE)) == "1":
    raise RuntimeError(f"{require_variable(ENGINE)}=1 but {_REASON}")

requires_sglang = [
    pytest.mark.sglang,
    pytest.mark.skipif(_REASON is not None, reason=_REASON or ""),
]
"""``pytestmark`` of a module that runs SGLang's own code: marked ``sglang`` (``-m sglang``
selects it), skipped where SGLang is not installed."""


# -- traces the runner-step tests of every SGLang backend share ----------------------------


def scheduled(computed, q_lens, req_ids, pages, new_pages) -> Batch:
    """A step of a trace: the requests' computed tokens and query lengths, ids, pages,
    and the pages each gained this step."""
    return Batch(computed, q_lens, 0, True, req_ids=req_ids, pages=pages, new_pages=new_pages)


def life(run: Any, trace: Trace) -> list[RunnerStepOutputs]:
    """Every step of ``trace`` on one new engine of ``run`` (an implementation of
    ``runner-step``, with its ``new_engine``)."""
    run.new_engine()
    return [run(make_inputs(case)) for case in trace.cases()]


def arrive_then_decode(num_spec: int) -> Trace:
    """Three requests arrive (an extend), then decode (or verify) together: three
    requests in the graph of four."""
    config = spec_config(num_spec=num_spec, max_num_seqs=8, cudagraph_capture_sizes=(2, 4, 8, 16))
    w = config.next_n
    pages = ((1, 2), (3, 4), (5,))
    return Trace(
        config,
        (
            scheduled((0, 0, 0), (5, 3, 1), (0, 1, 2), pages, (2, 2, 1)),
            scheduled((5, 3, 1), (w, w, w), (0, 1, 2), pages, (0, 0, 0)),
        ),
    )


def arrive_past_the_window_then_decode(num_spec: int) -> Trace:
    """DeepSeek-V4's pages of 256: three requests arrive (150, 3 and 1 tokens: the first
    past the window of 128), then decode (or verify) together: three requests in the
    graph of four. Pages of 256: a page each."""
    w = num_spec + 1
    config = EngineConfig(max_model_len=200, max_num_seqs=4, max_num_batched_tokens=256,
                          block_size=256, num_spec=num_spec,
                          cudagraph_capture_sizes=(2 * w, 4 * w))  # fmt: skip
    pages = ((1,), (2,), (3,))
    return Trace(
        config,
        (
            scheduled((0, 0, 0), (150, 3, 1), (0, 1, 2), pages, (1, 1, 1)),
            scheduled((150, 3, 1), (w, w, w), (0, 1, 2), pages, (0, 0, 0)),
        ),
    )


def deepseek_v4_swa_slot(page: int, offset: int, pages: int = 7) -> int:
    """The SWA slot of full page ``page``'s ``offset`` in DeepSeek-V4's engines: they pair
    page ``p`` with SWA page ``pages - p`` (``runner_step.pool_pages``: 4 requests of a
    page, and 3)."""
    return (pages - page) * 256 + offset


def violations_found(out: RunnerStepOutputs) -> set[tuple[str, str, str]]:
    """Each violation of ``out`` as (property, build, field)."""
    return {(v.prop, v.build, v.field) for v in violations(out)}


def arrive_chunk_decode() -> Trace:
    """A linear backend's life: two requests arrive (the second's prompt in two
    chunks) and run on together, both from their states; they decode in the graph of
    two, then the second decodes alone, padded to it. Pages of one token (what SGLang
    runs a hybrid model with)."""
    from attnfuzz.reference.batch import EngineConfig

    config = EngineConfig(max_model_len=16, max_num_seqs=4, max_num_batched_tokens=16,
                          block_size=1, num_spec=0, cudagraph_capture_sizes=(2, 4))  # fmt: skip
    return Trace(
        config,
        (
            scheduled((0, 0), (3, 2), (0, 1), ((1, 2, 3), (6, 7)), (3, 2)),
            scheduled((3, 2), (1, 2), (0, 1), ((1, 2, 3, 4), (6, 7, 8, 9)), (1, 2)),
            scheduled((4, 4), (1, 1), (0, 1), ((1, 2, 3, 4, 5), (6, 7, 8, 9, 10)), (1, 1)),
            scheduled((5,), (1,), (1,), ((6, 7, 8, 9, 10, 11),), (1,)),
        ),
    )


def sglang_test(test: Any) -> Any:
    """A test of SGLang's own code in a module whose other tests run without it (a
    stand-in's contract): marked ``sglang``, skipped where SGLang is not installed."""
    for mark in requires_sglang:
        test = mark(test)
    return test


def field_values(out: RunnerStepOutputs, how: str, name: str) -> list:
    """The values of field ``name`` of ``out``'s one build ``how``."""
    (build,) = out.of(how)
    f = build.field(name)
    assert f is not None, name
    return f.values.tolist()


@contextlib.contextmanager
def calls_counted(watched: list[tuple[type, str]]) -> Iterator[dict[str, int]]:
    """While the block runs, each call of a method of ``watched`` (``(class, name)``
    pairs) counted, by ``Class.name``; the methods restored after."""
    calls: dict[str, int] = {}
    with pytest.MonkeyPatch.context() as mp:
        for owner, name in watched:
            own = getattr(owner, name)

            def counted(*args: Any, _own: Any = own, _name: str = f"{owner.__name__}.{name}",
                        **kwargs: Any) -> Any:  # fmt: skip
                calls[_name] = calls.get(_name, 0) + 1
                return _own(*args, **kwargs)

            mp.setattr(owner, name, counted)
        yield calls


def eagle_worker_life(
    run: Any, worker_class: type, trace: Trace, monkeypatch: Any, recompiled: bool = False
) -> tuple[list[RunnerStepOutputs], list[list[int]], list[str]]:
    """Every step of ``trace`` on one new engine of ``run``, an implementation of
    ``runner-step`` that runs ``worker_class``'s own step (an EAGLE v2 worker of
    ``sglang.srt.speculative``); with each verify's accept lengths (the bonus token
    included) as ``run_eagle_verify`` returns them, eager pass first, and the forward
    mode of each batch the worker's step was handed. ``recompiled``: ``run`` is a mutant
    that recompiles the step from SGLang's source, whose batches are not seen."""
    import importlib
    import sys

    common = importlib.import_module("sglang.srt.speculative.eagle_worker_common")
    own, accepted = common.run_eagle_verify, []

    def recorded(*args: Any, **kwargs: Any) -> Any:
        result = own(*args, **kwargs)
        accepted.append(result.accept_lens.tolist())
        return result

    monkeypatch.setattr(common, "run_eagle_verify", recorded)
    # The worker's verify calls it by its own module's name.
    monkeypatch.setattr(sys.modules[worker_class.__module__], "run_eagle_verify", recorded)
    step, modes = worker_class.forward_batch_generation, []

    def stepped(self: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
        modes.append(batch.forward_mode.name)
        return step(self, batch, *args, **kwargs)

    if not recompiled:
        monkeypatch.setattr(worker_class, "forward_batch_generation", stepped)
    return life(run, trace), accepted, modes
