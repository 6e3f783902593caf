"""User implementations of ``indexer-decode`` that misbehave on some cases only.

Each is the reference on every case with at most one decode request, and on
the others raises, exits, hangs, aborts or segfaults: what a campaign must
survive and report as a finding with its case. Named on the command line as
``campaign_impls:<name>`` (this directory on the import path).
"""

from __future__ import annotations

import ctypes
import os
import sys
import time

import torch
from attnfuzz.harness.target import Implementation
from attnfuzz.harness.targets.indexer_decode import reference_impl
from attnfuzz.reference import indexer_decode as ref
from attnfuzz.reference.batch import Case


def misbehaves(case: Case) -> bool:
    """The condition every implementation here misbehaves on: two decodes or more."""
    return ref.describe(case)[1].num_decodes >= 2


def _bad(inp: ref.IndexerDecodeInputs) -> bool:
    return inp.num_decodes >= 2


def raises(inp: ref.IndexerDecodeInputs) -> ref.IndexerDecodeOutputs:
    if _bad(inp):
        raise ValueError(f"refusing {inp.num_decodes} decodes")
    return reference_impl(inp)


def exits(inp: ref.IndexerDecodeInputs) -> ref.IndexerDecodeOutputs:
    if _bad(inp):
        sys.exit(3)
    return reference_impl(inp)


def hangs(inp: ref.IndexerDecodeInputs) -> ref.IndexerDecodeOutputs:
    while _bad(inp):
        time.sleep(3600)
    return reference_impl(inp)


def aborts(inp: ref.IndexerDecodeInputs) -> ref.IndexerDecodeOutputs:
    if _bad(inp):
        os.abort()
    return reference_impl(inp)


def segfaults(inp: ref.IndexerDecodeInputs) -> ref.IndexerDecodeOutputs:
    if _bad(inp):
        ctypes.string_at(0)  # reads address 0: SIGSEGV
    return reference_impl(inp)


def interrupts(inp: ref.IndexerDecodeInputs) -> ref.IndexerDecodeOutputs:
    """Raises ``KeyboardInterrupt`` itself: no signal was delivered, so it is a finding."""
    if _bad(inp):
        raise KeyboardInterrupt
    return reference_impl(inp)


def exits_hard(inp: ref.IndexerDecodeInputs) -> ref.IndexerDecodeOutputs:
    if _bad(inp):
        os._exit(7)  # no exception, no clean-up: the process is gone
    return reference_impl(inp)


class _Unreadable:
    """An output whose every attribute raises."""

    def __getattr__(self, name: str):
        raise RuntimeError(f"no {name} here")


def unreadable(inp: ref.IndexerDecodeInputs):
    if _bad(inp):
        return _Unreadable()
    return reference_impl(inp)


def malformed(inp: ref.IndexerDecodeInputs):
    if _bad(inp):
        return {"logits": "not a tensor"}
    return reference_impl(inp)


def allocates(inp: ref.IndexerDecodeInputs) -> ref.IndexerDecodeOutputs:
    """Asks for a terabyte, touching it: fails under an address-space cap."""
    if _bad(inp):
        torch.ones(1 << 40, dtype=torch.uint8)
    return reference_impl(inp)


def floods(inp: ref.IndexerDecodeInputs) -> ref.IndexerDecodeOutputs:
    """Prints a megabyte on every call, and is otherwise correct."""
    print("flood " * 200_000, flush=True)
    print("flood " * 200_000, file=sys.stderr, flush=True)
    return reference_impl(inp)


def wanders(inp: ref.IndexerDecodeInputs) -> ref.IndexerDecodeOutputs:
    """Changes the working directory on every call, and raises on the bad cases."""
    os.chdir("/")
    if _bad(inp):
        raise ValueError(f"refusing {inp.num_decodes} decodes")
    return reference_impl(inp)


def raises_slowly(inp: ref.IndexerDecodeInputs) -> ref.IndexerDecodeOutputs:
    """Raises on the bad cases after half a second, first touching the file named by
    ``ATTNFUZZ_TEST_MARKER``: a test sees the search has found it and is shrinking."""
    if _bad(inp):
        marker = os.environ.get("ATTNFUZZ_TEST_MARKER")
        if marker:
            open(marker, "a").close()
        time.sleep(0.5)
        raise ValueError(f"refusing {inp.num_decodes} decodes")
    return reference_impl(inp)


def marks_its_first_call(inp: ref.IndexerDecodeInputs) -> ref.IndexerDecodeOutputs:
    """The reference, first touching the file named by ``ATTNFUZZ_TEST_MARKER``: a
    test sees the search has begun (the command's own signal handling is in place)."""
    marker = os.environ.get("ATTNFUZZ_TEST_MARKER")
    if marker:
        open(marker, "a").close()
    return reference_impl(inp)


def raises_on_padding_requests(inp: ref.IndexerDecodeInputs) -> ref.IndexerDecodeOutputs:
    """Trips on zero-length padding requests, as bug A's write-back does: only steps
    padded for a FULL graph replay have them."""
    lens = inp.query_start_loc[1:] - inp.query_start_loc[:-1]
    if bool((lens == 0).any()):
        raise ValueError("a zero-length request")
    return reference_impl(inp)


def _engine(name: str, fn) -> Implementation:
    """``fn`` declared as forward code of an engine (as the vLLM adapters declare
    theirs): its findings say where the engine can meet them."""
    return Implementation(name, fn, "engine", f"engine code: {name}", engine="vllm")


# Findings with a reachability: live (eager steps of two decodes fail), latent.
engine_live = _engine("engine_live", raises)
engine_latent = _engine("engine_latent", raises_on_padding_requests)


def _user_mutants() -> list:
    from attnfuzz.harness.registry import mutant

    return [
        mutant(
            "indexer-decode",
            "user-raises",
            raises,
            description="a user's known bug: raises on two decodes or more",
            trigger=misbehaves,
        )
    ]


# ``--mutants campaign_impls`` (the default attribute) and ``campaign_impls:MUTANTS`` alike.
MUTANTS = _user_mutants()
