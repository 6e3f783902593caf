"""For test suites that run vLLM's own code: skip, saying why, where vLLM is not installed.

CI installs vLLM (``ATTNFUZZ_VLLM=1 ./setup.sh``) and sets
``ATTNFUZZ_REQUIRE_VLLM=1``: there a missing vLLM fails these tests instead.
"""

from __future__ import annotations

import os

import pytest
from attnfuzz.adapters.vllm import ENGINE, unavailable
from attnfuzz.harness.testing import require_variable

_REASON = unavailable()
if _REASON is not None and os.environ.get(require_variable(ENGINE)) == "1":
    raise RuntimeError(f"{require_variable(ENGINE)}=1 but {_REASON}")

requires_vllm = [pytest.mark.vllm, pytest.mark.skipif(_REASON is not None, reason=_REASON or "")]
"""``pytestmark`` of a module that runs vLLM's own code: marked ``vllm`` (``-m vllm``
selects it), skipped where vLLM is not installed."""
