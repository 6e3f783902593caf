"""Implementations whose fault is attnfuzz's own: code "in" an adapter's module.

Where an exception was raised is read from the globals' ``__name__`` of the
frame that raised it (``harness/blame.py``), so this function, compiled with
an adapter's module name, reads as attnfuzz's glue in any process that imports
this module (a campaign's workers too). Named ``blame_probe:glue``.
"""

from __future__ import annotations

GLUE = """
def glue(inputs):
    return inputs.config.max_num_blocks_per_req  # an API the installed release lacks
"""

_namespace: dict = {"__name__": "attnfuzz.adapters.vllm._probe"}
exec(compile(GLUE, "adapters/vllm/_probe.py", "exec"), _namespace)  # noqa: S102
glue = _namespace["glue"]
