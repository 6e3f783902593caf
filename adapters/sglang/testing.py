"""For test suites that run SGLang's own code: skip, saying why, where SGLang is not installed.

CI installs SGLang (``ATTNFUZZ_SGLANG=1 ./setup.sh``) and sets
``ATTNFUZZ_REQUIRE_SGLANG=1``: there a missing SGLang fails these tests instead.
"""

from __future__ import annotations

import os

import pytest
from attnfuzz.adapters.sglang import ENGINE, unavailable
from attnfuzz.harness.testing import require_variable

_REASON = unavailable()
if _REASON is not None and os.environ.get(require_variable(ENGINE)) == "1":
    raise RuntimeError(f"{require_variable(ENGINE)}=1 but {_REASON}")

requires_sglang = [
    pytest.mark.sglang,
    pytest.mark.skipif(_REASON is not None, reason=_REASON or ""),
]
"""``pytestmark`` of a module that runs SGLang's own code: marked ``sglang`` (``-m sglang``
selects it), skipped where SGLang is not installed."""
