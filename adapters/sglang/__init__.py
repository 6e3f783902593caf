"""SGLang's own metadata code as implementations (``--impl sglang-*``) of attnfuzz's targets.

SGLang is an optional install (``ATTNFUZZ_SGLANG=1 ./setup.sh``, see
docs/sglang.md, "Fuzzing SGLang itself"): nothing here imports it until an
adapter is called, so ``attnfuzz list`` and the default commands work without
it, and an implementation that cannot run says why (:func:`unavailable`).

One module per target, each with functions that build SGLang's own objects
from a case, call SGLang's functions unchanged and return the outputs; and,
where a historical bug lived in SGLang, ``upstream_*`` functions: the real
function with its fix reverted (the pre-fix lines as they were, cited by pull
request). :mod:`._engine` holds the environment every adapter shares;
:mod:`.plugin` declares them all to attnfuzz, as the ``attnfuzz.engines``
entry point ``sglang``.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnfuzz.adapters import binding

if TYPE_CHECKING:  # torch: ``attnfuzz list`` asks unavailable() and status() without it
    from attnfuzz.harness.target import Implementation

ENGINE = "sglang"
VERSION = "0.5.23"
"""The release the adapters were written against and CI runs."""
INSTALL = "ATTNFUZZ_SGLANG=1 ./setup.sh"
REQUIREMENTS = Path(__file__).with_name("requirements-cpu.txt")
"""The pinned list setup.sh installs, shipped with attnfuzz: a pip install has no setup.sh."""


def installed_version() -> str | None:
    """The installed SGLang's version, or None (looked up without importing it)."""
    from attnfuzz.adapters.sglang import compat

    return compat.installed_version()


def unavailable() -> str | None:
    """Why no SGLang implementation can run here (not installed, or a release
    outside the supported range), or None; each implementation adds what its
    adapter calls (:func:`attnfuzz.adapters.sglang.compat.binding_problem`)."""
    from attnfuzz.adapters.sglang import compat

    version = installed_version()
    if version is not None:
        return compat.range_problem(version)
    how = f"{INSTALL} in a checkout"
    if REQUIREMENTS.is_file():  # package data of attnfuzz, in a pip install too
        how += f", or pip install --no-deps -r {shlex.quote(str(REQUIREMENTS))}"
    return f"SGLang is not installed; install SGLang {VERSION} with: {how}"


def status() -> str:
    """One line for ``attnfuzz list``: the installed SGLang and the supported range."""
    from attnfuzz.adapters.sglang import compat

    version = installed_version()
    if version is None:
        return f"SGLang: not installed ({INSTALL} installs {VERSION}, the default release)"
    problem = compat.range_problem(version)
    if problem is not None:
        return f"SGLang: {problem}"
    from attnfuzz.harness.provenance import source_text

    return (
        f"SGLang {version} installed, from {source_text('sglang')} (attnfuzz supports "
        f"{compat.OLDEST} to {compat.NEWEST}; each implementation binds to the APIs this "
        "release offers)"
    )


class EngineCall(binding.EngineCall):
    """``adapters.sglang.<module>.<attr>(inputs)``, imported on first use; binds by
    :func:`attnfuzz.adapters.sglang.compat.binding_problem`."""

    def __init__(self, module: str, attr: str):
        super().__init__(__name__, module, attr, self._binding_problem)

    def _binding_problem(self) -> str | None:
        from attnfuzz.adapters.sglang import compat

        version = installed_version()
        if version is None:
            return unavailable()
        return compat.binding_problem(self.module, self.attr, version)


def implementation(
    module: str,
    attr: str,
    *,
    name: str,
    description: str,
    kind: str = "engine",
    **mutant: Any,
) -> Implementation:
    """An implementation of a target by SGLang's code (``kind="mutant"`` for an
    upstream mutant, with ``trigger``, ``reach`` and ``smallest`` as for a
    re-created one)."""
    from attnfuzz.harness.target import Implementation

    call = EngineCall(module, attr)
    return Implementation(
        name, call, kind, description, engine=ENGINE, unavailable=call.unavailable, **mutant
    )
