"""Failing cases as readable, replayable JSON.

A case file holds only printable scalars (the drawn config and batch with its
data seed), never a Hypothesis blob and never code: loading one parses JSON
and checks every field, nothing more. The same file replays the same failure
on another machine and under another Hypothesis version.
"""

from __future__ import annotations

import json
import platform
from pathlib import Path
from typing import Any

from attnfuzz.harness.oracle import Verdict
from attnfuzz.harness.target import UsageError
from attnfuzz.reference.batch import Case, build_common_metadata, split_decodes_and_prefills

SCHEMA = "attnfuzz.case/1"


def environment(device: str = "cpu") -> dict[str, str]:
    import attnfuzz
    import hypothesis
    import torch

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:  # pragma: no cover - triton is a dependency on Linux
        triton_version = "absent"
    return {
        "attnfuzz": attnfuzz.__version__,
        "torch": torch.__version__,
        "triton": triton_version,
        "hypothesis": hypothesis.__version__,
        "python": platform.python_version(),
        "device": device,
    }


def derived(case: Case) -> dict[str, Any]:
    """The quantities a reader checks the trigger against (not read back on load)."""
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


def case_document(
    target: str, implementation: str, case: Case, verdict: Verdict, device: str = "cpu"
) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "target": target,
        "implementation": implementation,
        "case": case.to_dict(),
        "verdict": {
            "key": verdict.key,
            "mismatches": [m.to_dict() for m in verdict.mismatches],
        },
        "derived": derived(case),
        "environment": environment(device),
    }


def write_case(path: Path, document: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2) + "\n")
    return path


def _require(cond: bool, path: Path | str, what: str) -> None:
    if not cond:
        raise UsageError(f"{path}: {what}")


def read_case(path: Path | str) -> dict[str, Any]:
    """Parse and check a case file; every problem is a one-line :class:`UsageError`."""
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise UsageError(f"cannot read case file {path}: {err.strerror or err}") from err
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        raise UsageError(f"{path}: not valid JSON ({err.msg} at line {err.lineno})") from err
    _require(isinstance(doc, dict), path, "a case file holds one JSON object")
    _require(
        doc.get("schema") == SCHEMA,
        path,
        f"unsupported schema {doc.get('schema')!r} (this attnfuzz reads {SCHEMA!r})",
    )
    for key in ("target", "implementation"):
        _require(isinstance(doc.get(key), str), path, f"missing or non-string {key!r}")
    body = doc.get("case")
    _require(isinstance(body, dict), path, "missing 'case' object")
    try:
        case = Case.from_dict(body)
        _check_scalars(case)
    except (KeyError, TypeError, ValueError) as err:
        raise UsageError(f"{path}: malformed case ({type(err).__name__}: {err})") from err
    doc["case"] = case
    return doc


def _check_scalars(case: Case) -> None:
    values = list(case.config.to_dict().values()) + list(case.batch.to_dict().values())
    values += [v for _, v in case.params]
    for v in values:
        items = v if isinstance(v, list) else [v]
        for x in items:
            if x is not None and not isinstance(x, bool | int):
                raise TypeError(f"expected integers, got {x!r}")


def replay_command(path: Path | str) -> str:
    return f"attnfuzz repro {path}"
