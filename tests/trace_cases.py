"""A hand-written trace case file, for the tests of what reads case files (campaigns,
reports, export, the pytest plugin): two steps of one ``max-seq-len`` engine, which
``stateful_impl:first_call_buffer`` (tests/stateful_impl.py, its output buffer sized
by its first step) fails at step 1 and the fixed implementation passes.

Import it with this directory on ``sys.path`` (``monkeypatch.syspath_prepend``), as
``stateful_impl`` must be for the implementation to resolve.
"""

from __future__ import annotations

import json
from pathlib import Path

from attnfuzz.harness.casefile import case_document, write_case
from attnfuzz.harness.oracle import Mismatch, Verdict
from attnfuzz.harness.target import Implementation, Kind
from attnfuzz.harness.testing import spec_config
from attnfuzz.reference.batch import Batch
from attnfuzz.reference.trace import Trace

TARGET = "max-seq-len"
STATEFUL = "stateful_impl:first_call_buffer"
FAILS_AT = 1


def two_steps() -> Trace:
    """Step 0: one request prefills; step 1: it decodes and a second one arrives, so
    the step pads to more requests than the first did."""
    config = spec_config(num_spec=0, cudagraph_mode="NONE", cudagraph_capture_sizes=())
    first = Batch((0,), (4,), req_ids=(0,), pages=((1, 2),), new_pages=(2,))
    second = Batch((4, 0), (1, 3), req_ids=(0, 1), pages=((1, 2), (3,)), new_pages=(0, 1))
    return Trace(config, (first, second), (("capturing", 0),))


def stateful_verdict() -> Verdict:
    """The verdict ``stateful_impl:first_call_buffer`` gets on :func:`two_steps`."""
    mismatch = Mismatch("shape", "out", "[2, 2, 4]", "[2, 1, 4]")
    return Verdict([mismatch], step=FAILS_AT)


def trace_document(implementation: str = STATEFUL) -> dict:
    """The trace case file's document, as ``attnfuzz run --trace`` writes it (a JSON
    round trip: as a reader sees it)."""
    doc = case_document(TARGET, implementation, two_steps(), stateful_verdict())
    return json.loads(json.dumps(doc))


def write_trace_case(path: Path, implementation: str = STATEFUL) -> Path:
    """:func:`trace_document` written at ``path``."""
    return write_case(path, trace_document(implementation))


def _traced() -> Implementation:
    from stateful_impl import first_call_buffer

    return Implementation(
        "first_call_buffer",
        first_call_buffer,
        Kind.USER,
        "an output buffer sized by the engine's first step",
        traced=True,
    )


TRACED = _traced()
"""``trace_cases:TRACED``: ``first_call_buffer`` declared as living across steps
(``Implementation.traced``): fuzzed with traces wherever it is fuzzed."""
