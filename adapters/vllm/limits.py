"""vLLM's own limits on the steps an implementation of it is given, read from its code.

Imports neither vLLM nor torch: the plugin declares these limits when it loads, and
the strategies draw inside them (``Implementation.admits``), so a witness of a vLLM
implementation is a state that vLLM reaches.
"""

from __future__ import annotations

from typing import Any


def drafter_admits(inputs: Any) -> str | None:
    """A drafter's metadata is built only under a speculative config, and vLLM 0.33.0
    refuses one without a speculative token (``vllm/config/speculative.py``,
    ``SpeculativeConfig._verify_args``: ``num_speculative_tokens`` must be greater
    than zero). A step of ``num_spec = 0`` is no step any drafter sees."""
    if inputs.config.num_spec < 1:
        return (
            "num_spec = 0: vLLM runs a drafter only with num_speculative_tokens > 0 "
            "(config/speculative.py: SpeculativeConfig._verify_args)"
        )
    return None
