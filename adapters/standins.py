"""Stand-ins both engines' adapters share: what an engine does for the machine, not for
the metadata it computes."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from unittest import mock


@contextlib.contextmanager
def no_collections() -> Iterator[None]:
    """``gc.collect`` a no-op while an engine starts: its memory profiler and its graph
    capture's heap freezing (vLLM's ``DeviceMemoryProfiler`` and
    ``freeze_gc_for_cudagraph_capture``, SGLang's ``freeze_gc``) each run a full
    collection, over a process that holds the engine, torch and Triton: most of an
    engine's start on a CPU. A collection only frees host memory; nothing the engine
    computes reads what it frees (vLLM's own piecewise capture turns it off likewise,
    ``compilation/cuda_graph.py``)."""
    with mock.patch.object(gc, "collect", lambda *args, **kwargs: 0):
        yield
