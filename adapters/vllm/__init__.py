"""vLLM's own metadata code as implementations (``--impl vllm``) of attnfuzz's targets.

vLLM is an optional install (``ATTNFUZZ_VLLM=1 ./setup.sh``, see docs/vllm.md,
"Fuzzing vLLM itself"): nothing here imports it until an adapter is called,
so ``attnfuzz list`` and the default commands work without it, and an
implementation of this engine that cannot run says why
(:func:`unavailable`).

One module per target (``mtp_seq_lens.py`` adapts ``mtp-seq-lens``), each with
a ``run(inputs)`` that calls vLLM's functions unchanged and, where a
historical bug lived in vLLM, ``upstream_*`` functions: the real function with
its fix reverted (the pre-fix lines as they were, cited by pull request),
called through the same adapter. :mod:`._engine` builds vLLM's objects
(configs, KV-cache specs, ``CommonAttentionMetadata``) from a case.
:mod:`.plugin` declares them all to attnfuzz, as the ``attnfuzz.engines``
entry point ``vllm``.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnfuzz.adapters import binding

if TYPE_CHECKING:  # torch: ``attnfuzz list`` asks unavailable() and status() without it
    from attnfuzz.harness.target import Implementation

ENGINE = "vllm"
VERSION = "0.33.0"
"""The release the adapters were written against and CI runs."""
INSTALL = "ATTNFUZZ_VLLM=1 ./setup.sh"
REQUIREMENTS = Path(__file__).with_name("requirements-cpu.txt")
"""The pinned list setup.sh installs, shipped with attnfuzz: a pip install has no setup.sh."""


def installed_version() -> str | None:
    """The installed vLLM's version, or None (looked up without importing it)."""
    from attnfuzz.adapters.vllm import compat

    return compat.installed_version()


def unavailable() -> str | None:
    """Why no vLLM implementation can run here (not installed, or a release outside
    the supported range), or None; each implementation adds what its adapter calls
    (:func:`attnfuzz.adapters.vllm.compat.binding_problem`)."""
    from attnfuzz.adapters.vllm import compat

    version = installed_version()
    if version is not None:
        return compat.range_problem(version)
    how = f"{INSTALL} in a checkout"
    if REQUIREMENTS.is_file():  # package data of attnfuzz, in a pip install too
        how += f", or pip install --no-deps -r {shlex.quote(str(REQUIREMENTS))}"
    return f"vLLM is not installed; install vLLM {VERSION} with: {how}"


def status() -> str:
    """One line for ``attnfuzz list``: the installed vLLM and the supported range."""
    from attnfuzz.adapters.vllm import compat

    version = installed_version()
    if version is None:
        return f"vLLM: not installed ({INSTALL} installs {VERSION}, the default release)"
    problem = compat.range_problem(version)
    if problem is not None:
        return f"vLLM: {problem}"
    from attnfuzz.harness.provenance import source_text

    return (
        f"vLLM {version} installed, from {source_text('vllm')} (attnfuzz supports "
        f"{compat.OLDEST} to {compat.NEWEST}; each implementation binds to the APIs this "
        "release offers)"
    )


def planner_problem() -> str | None:
    """Why reachability cannot drive the installed vLLM's own step planning
    (:mod:`.runner_modes`), or None when it can (or vLLM is not installed)."""
    from attnfuzz.adapters.vllm import compat

    version = installed_version()
    if version is None:
        return None
    return compat.binding_problem("runner_modes", "engine_step_plan", version)


class EngineCall(binding.EngineCall):
    """``adapters.vllm.<module>.<attr>(inputs)``, imported on first use; binds by
    :func:`attnfuzz.adapters.vllm.compat.binding_problem`."""

    def __init__(self, module: str, attr: str):
        super().__init__(__name__, module, attr, self._binding_problem)

    def _binding_problem(self) -> str | None:
        from attnfuzz.adapters.vllm import compat

        version = installed_version()
        if version is None:
            return unavailable()
        return compat.binding_problem(self.module, self.attr, version)


def implementation(
    module: str,
    attr: str = "run",
    *,
    name: str = ENGINE,
    description: str,
    kind: str = "engine",
    declines: str | None = None,
    **mutant: Any,
) -> Implementation:
    """An implementation of a target by vLLM's code (``kind="mutant"`` for an upstream
    mutant, with ``trigger``, ``reach`` and ``smallest`` as for a re-created one).
    ``declines``: the module's function that says which cases the installed release
    runs through other code (:attr:`Implementation.declines`)."""
    from attnfuzz.harness.target import Implementation

    call = EngineCall(module, attr)
    declined = EngineCall(module, declines) if declines is not None else None
    return Implementation(
        name, call, kind, description, engine=ENGINE, unavailable=call.unavailable,
        declines=declined, **mutant,
    )  # fmt: skip
