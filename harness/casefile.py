"""Failing cases as readable, replayable JSON.

A case file holds only printable scalars (the drawn config and batch with its
data seed), never a Hypothesis blob and never code: loading one parses JSON
and checks every field, nothing more. The same file replays the same failure
on another machine and under another Hypothesis version.
"""

from __future__ import annotations

import json
import platform
from collections.abc import Callable
from pathlib import Path
from typing import Any

from attnfuzz.harness.oracle import Verdict
from attnfuzz.harness.target import UsageError
from attnfuzz.reference.batch import (
    Case,
    CommonMetadata,
    DecodeSplit,
    build_common_metadata,
    split_decodes_and_prefills,
)

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
        "derived": derived(case, _describer(target)),
        "environment": environment(device),
    }


def write_case(path: Path, document: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2) + "\n")
    return path


def _require(cond: bool, path: Path | str, what: str) -> None:
    if not cond:
        raise UsageError(f"{path}: {what}")


def load_json(path: Path | str, what: str) -> Any:
    """Read one JSON document; an unreadable, binary or malformed file is a
    one-line :class:`UsageError` that names ``what`` it should have been."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise UsageError(f"cannot read {what} {path}: {err.strerror or err}") from err
    except UnicodeDecodeError as err:
        raise UsageError(f"{path}: not a text file (invalid UTF-8 at byte {err.start})") from err
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise UsageError(f"{path}: not valid JSON ({err.msg} at line {err.lineno})") from err
    except RecursionError as err:  # the parser's own limit, not a file of ours
        raise UsageError(f"{path}: not a {what} (JSON nested too deeply)") from err


def read_case(path: Path | str) -> dict[str, Any]:
    """Parse and check a case file; every problem is a one-line :class:`UsageError`."""
    doc = load_json(path, "case file")
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
        _check_fields(body)
        case = Case.from_dict(body)
        _check_scalars(case)
    except (KeyError, TypeError, ValueError) as err:
        raise UsageError(f"{path}: malformed case ({type(err).__name__}: {err})") from err
    doc["case"] = case
    return doc


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _check_fields(body: dict[str, Any]) -> None:
    """Exact JSON types and no unknown field, before anything is built.

    ``Batch.from_dict`` converts with ``int()``: without this, ``2.7`` or ``"2"``
    would replay silently as another case, and a misspelt field would vanish.
    """
    unknown = sorted(set(body) - {"config", "batch", "params"})
    if unknown:
        raise ValueError(f"unknown field(s) {unknown} in 'case'")
    config, batch = body.get("config"), body.get("batch")
    if not isinstance(config, dict) or not isinstance(batch, dict):
        raise TypeError("'config' and 'batch' must be objects")
    unknown = sorted(set(batch) - {"num_computed_tokens", "q_lens", "seed", "use_cudagraph"})
    if unknown:
        raise ValueError(f"unknown field(s) {unknown} in 'batch'")
    for name in ("num_computed_tokens", "q_lens"):
        value = batch.get(name)
        if not isinstance(value, list) or not all(_is_int(x) for x in value):
            raise TypeError(f"batch.{name} must be a list of integers, got {value!r}")
    if "seed" in batch and not _is_int(batch["seed"]):
        raise TypeError(f"batch.seed must be an integer, got {batch['seed']!r}")
    flag = batch.get("use_cudagraph", True)
    if not isinstance(flag, bool):
        raise TypeError(f"batch.use_cudagraph must be true or false, got {flag!r}")
    for name, value in config.items():
        if name == "cudagraph_capture_sizes":
            ok = isinstance(value, list) and all(_is_int(x) for x in value)
        else:  # decode_threshold may be null: the default, next_n
            ok = _is_int(value) or (name == "decode_threshold" and value is None)
        if not ok:
            raise TypeError(f"config.{name} must be an integer, got {value!r}")
    params = body.get("params", {})
    if not isinstance(params, dict) or not all(_is_int(v) for v in params.values()):
        raise TypeError(f"params must map names to integers, got {params!r}")


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
