"""For test suites that run vLLM's own code: skip, saying why, where vLLM is not installed.

CI installs vLLM (``ATTNFUZZ_VLLM=1 ./setup.sh``) and sets
``ATTNFUZZ_REQUIRE_VLLM=1``: there a missing vLLM fails these tests instead.
"""

from __future__ import annotations

import os

import pytest
from attnfuzz.adapters.vllm import unavailable

_REASON = unavailable()
if _REASON is not None and os.environ.get("ATTNFUZZ_REQUIRE_VLLM") == "1":
    raise RuntimeError(f"ATTNFUZZ_REQUIRE_VLLM=1 but {_REASON}")

requires_vllm = pytest.mark.skipif(_REASON is not None, reason=_REASON or "")
"""Mark a test (or ``pytestmark`` a module) that runs vLLM's own code."""
