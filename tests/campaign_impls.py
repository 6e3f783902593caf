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
