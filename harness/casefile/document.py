"""Writing a case file: the document of a finding, with the environment it was found in."""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Callable
from pathlib import Path
from typing import Any

from attnfuzz.harness import engines
from attnfuzz.harness.definitions import CASE_SCHEMA, VERSION
from attnfuzz.harness.errors import UsageError
from attnfuzz.harness.oracle import Verdict
from attnfuzz.reference.batch import (
    Case,
    CommonMetadata,
    DecodeSplit,
    build_common_metadata,
    float_dtype_name,
    split_decodes_and_prefills,
)
from attnfuzz.reference.trace import Trace, step_summary


def environment(device: str = "cpu") -> dict[str, str]:
    import hypothesis
    import torch

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:  # pragma: no cover - triton is a dependency on Linux
        triton_version = "absent"
    out = {
        "attnfuzz": VERSION,
        "torch": torch.__version__,
        "triton": triton_version,
        "hypothesis": hypothesis.__version__,
        "python": platform.python_version(),
        "device": device,
    }
    for name, version in engine_versions().items():  # the engines under test, when installed
        out[name] = version
    return out


def engine_versions() -> dict[str, str]:
    """The installed version of each engine attnfuzz has a plugin for (looked up, not imported)."""
    return engines.installed_versions()


def engine_record(target: str, implementation: str) -> dict[str, str] | None:
    """``{"name", "version"}`` of the engine whose own code ``implementation`` is, or None."""
    from attnfuzz.harness.registry import get_target

    try:
        impl = get_target(target).implementations.get(implementation)
    except UsageError:
        return None
    if impl is None or impl.engine is None:
        return None
    return {"name": impl.engine, "version": engine_versions().get(impl.engine, "absent")}


def derived(
    case: Case, describe: Callable[[Case], tuple[CommonMetadata, DecodeSplit]] | None = None
) -> dict[str, Any]:
    """The quantities a reader checks the trigger against (not read back on load).

    ``describe`` is the target's own view of the step (its metadata and its
    decode split); by default the ragged rule's.
    """
    if describe is not None:
        meta, split = describe(case)
    else:
        meta = build_common_metadata(case.config, case.batch)
        split = split_decodes_and_prefills(meta, case.config.threshold)
    return {
        "next_n": case.config.next_n,
        "num_reqs": meta.num_reqs,
        "num_real_reqs": meta.num_real_reqs,
        "num_actual_tokens": meta.num_actual_tokens,
        "num_real_tokens": meta.num_real_tokens,
        "padded": meta.padded,
        "query_start_loc": meta.query_start_loc.tolist(),
        "seq_lens": meta.seq_lens.tolist(),
        "num_decodes": split.num_decodes,
        "num_decode_tokens": split.num_decode_tokens,
        "decode_lens": list(split.decode_lens),
        "max_decode_len": split.max_decode_len,
        "requires_padding": split.requires_padding,
        "num_prefills": split.num_prefills,
    }


def _describer(target: str) -> Callable[[Case], tuple[CommonMetadata, DecodeSplit]] | None:
    from attnfuzz.harness.registry import get_target  # targets import kernels: only when asked

    try:
        return get_target(target).describe
    except UsageError:  # an unknown target has no view of its own
        return None


def case_document(
    target: str,
    implementation: str,
    case: Case | Trace,
    verdict: Verdict,
    device: str = "cpu",
    dtype: str | None = None,
    example_timeout: float | None = None,
) -> dict[str, Any]:
    """The case file of a finding.

    ``settings.dtype`` records the float dtype the inputs were built in, so that
    the case replays in it: ``dtype`` if given, else the case's own, else the
    setting in force (``ATTNFUZZ_DTYPE``, ``float32`` when unset).
    ``settings.example_timeout`` (seconds), when given, is the per-example
    timeout the case was judged under: ``repro`` replays it with the same one.

    A trace (:class:`~attnfuzz.reference.trace.Trace`) is written as ``trace``
    with the ``step`` it fails at; ``derived`` is then its failing step's, with
    one line per step of what the scheduler did (``derived.steps``).
    """
    settings: dict[str, Any] = {"dtype": dtype or case.dtype or float_dtype_name()}
    if example_timeout is not None:
        settings["example_timeout"] = example_timeout
    body = case.to_dict()
    body.pop("dtype", None)  # a setting, recorded under "settings"
    engine = engine_record(target, implementation)
    if isinstance(case, Trace):
        step = verdict.step if verdict.step is not None else len(case.steps) - 1
        shown = derived(case.case(step), _describer(target))
        shown["steps"] = [
            step_summary(case.steps[k - 1] if k else None, case.steps[k])
            for k in range(len(case.steps))
        ]
        found: dict[str, Any] = {"trace": body, "step": step}
    else:
        shown = derived(case, _describer(target))
        found = {"case": body}
    return {
        "schema": CASE_SCHEMA,
        "target": target,
        "implementation": implementation,
        # The engine under test and its version, for a finding on an engine's own code.
        **({} if engine is None else {"engine": engine}),
        **found,
        "settings": settings,
        "verdict": {
            "key": verdict.key,
            "mismatches": [m.to_dict() for m in verdict.mismatches],
        },
        "derived": shown,
        "environment": environment(device),
    }


def write_case(path: Path, document: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2) + "\n")
    return path


# What a case file says of its finding, not what replays it: two documents that
# differ only here hold the same case (found again, elsewhere or later).
DESCRIBES = frozenset({"environment", "engine", "verdict", "derived", "reachability"})


def write_new_case(out: Path, name: str, document: dict[str, Any]) -> Path:
    """Write ``document`` as ``<out>/<name>.json``, or ``<name>-2.json``, ``-3``, ...
    when that name holds another case; returns the path written.

    Each file is created exclusively (``O_EXCL``): processes that write findings
    into one directory at once (pytest-xdist's workers, two ``attnfuzz run``)
    never overwrite each other's case, even of the same finding. A file that holds
    the same case (every key but :data:`DESCRIBES` equal) is replaced by this one,
    atomically: a finding found again is not written twice. A file that cannot be
    read as one (another process is writing it) is another case.
    """
    out.mkdir(parents=True, exist_ok=True)
    text = json.dumps(document, indent=2) + "\n"
    n = 1
    while True:
        path = out / (f"{name}.json" if n == 1 else f"{name}-{n}.json")
        try:
            with path.open("x", encoding="utf-8") as f:
                f.write(text)
            return path
        except FileExistsError:
            if _same_case(path, document):
                tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
                try:
                    tmp.write_text(text, encoding="utf-8")
                    os.replace(tmp, path)
                finally:
                    tmp.unlink(missing_ok=True)
                return path
        n += 1


def _same_case(path: Path, document: dict[str, Any]) -> bool:
    from attnfuzz.harness.casefile.read import MAX_CASE_BYTES

    try:
        with path.open("rb") as f:
            held = json.loads(f.read(MAX_CASE_BYTES + 1))
    except (OSError, ValueError):  # a directory, a file half written, not JSON
        return False
    if not isinstance(held, dict):
        return False

    def replayed(doc: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in doc.items() if k not in DESCRIBES}

    return replayed(held) == replayed(json.loads(json.dumps(document)))
