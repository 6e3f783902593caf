"""Reading a case file (and other JSON input): every field checked, within fixed limits.

A file is data: reading one parses JSON and checks it, nothing more (no import,
no code), and every refusal is a one-line :class:`UsageError` naming the file.
"""

from __future__ import annotations

import json
import reprlib
import stat
from pathlib import Path
from typing import Any

from attnfuzz.harness.definitions import CASE_SCHEMA
from attnfuzz.harness.errors import CaseTooLarge, UsageError
from attnfuzz.harness.schemas import validate
from attnfuzz.reference.batch import (
    Case,
    cdiv,
)
from attnfuzz.reference.invariants import batch_violations, config_violations
from attnfuzz.reference.trace import Trace

# What a case file may hold (fields, types, int32 ranges, name lengths, the
# per-example timeout) is its published schema (harness/schemas/case.schema.json);
# these are the limits a schema cannot state, checked before or beside it.
MAX_CASE_BYTES = 1 << 20
"""A case file is a few kilobytes; a larger one is refused unread."""
MAX_JSON_BYTES = 256 << 20
"""Other JSON documents read with :func:`load_json` (``campaign.json``)."""
MAX_CASE_DEPTH = 8
"""Nesting of a case file (its deepest is 4: ``verdict.mismatches[i].got``)."""
MAX_JSON_DEPTH = 64
MAX_INT_DIGITS = 40
"""Longer integers are refused while parsing: none of a case's needs 20 digits."""
MAX_CASE_ELEMENTS = 2**33
"""A case replays only if each array its metadata and inputs need (block table,
KV pages, tokens x heads x head_dim, ...) holds at most this many elements."""
MAX_KEY_CHARS = 40
"""Object keys in a case file (its own are field names), so that an exported
test lays every ``key: value`` out within 88 columns."""


def _require(cond: bool, path: Path | str, what: str) -> None:
    if not cond:
        raise UsageError(f"{path}: {what}")


_SHORT = reprlib.Repr()  # Python 3.11's takes no arguments
_SHORT.maxlevel, _SHORT.maxlist, _SHORT.maxdict = 3, 8, 8
_SHORT.maxstring, _SHORT.maxlong, _SHORT.maxother = 60, 40, 60


def short(value: object) -> str:
    """``repr`` of a value read from a file, cut short: a message quotes it, never
    the whole of it (strings are ``repr``-escaped, control characters included)."""
    return _SHORT.repr(value)


class _LongInteger(ValueError):
    def __init__(self, digits: int):
        super().__init__(digits)
        self.digits = digits


def _bounded_int(text: str) -> int:
    """``json``'s ``parse_int``: refuse what Python's int-string limit would, and far less."""
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        raise _LongInteger(digits)
    return int(text)


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}".replace(".0 ", " ")
    return f"{n} bytes"


def _long_key(doc: Any, limit: int) -> str | None:
    """The first object key in ``doc`` longer than ``limit`` characters, if any."""
    stack = [doc]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            for key in value:
                if len(key) > limit:
                    return key
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return None


def _depth_over(doc: Any, limit: int) -> bool:
    """Whether ``doc`` nests lists and objects more than ``limit`` deep (no recursion)."""
    stack = [(doc, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict | list):
            if depth > limit:
                return True
            items = value.values() if isinstance(value, dict) else value
            stack.extend((v, depth + 1) for v in items)
    return False


def load_json(
    path: Path | str,
    what: str,
    *,
    max_bytes: int = MAX_JSON_BYTES,
    max_depth: int = MAX_JSON_DEPTH,
) -> Any:
    """Read one JSON document; an unreadable, binary or malformed file is a
    one-line :class:`UsageError` that names ``what`` it should have been.

    No more than ``max_bytes`` are read: a larger file (or anything but a
    regular file: a directory, a FIFO, a device) is refused, and so are
    integers of more than :data:`MAX_INT_DIGITS` digits and documents nested
    more than ``max_depth`` deep.
    """
    file = Path(path)
    try:
        info = file.stat()  # through symlinks: a dangling one is a missing file
    except (OSError, ValueError) as err:  # ValueError: a NUL byte in the name
        reason = err.strerror if isinstance(err, OSError) and err.strerror else err
        raise UsageError(f"cannot read {what} {path}: {reason}") from err
    if stat.S_ISDIR(info.st_mode):
        raise UsageError(f"cannot read {what} {path}: it is a directory")
    if not stat.S_ISREG(info.st_mode):
        raise UsageError(f"cannot read {what} {path}: not a regular file")
    too_large = f"{path}: {{}} is too large for a {what} (at most {_size(max_bytes)}); not read"
    if info.st_size > max_bytes:
        raise UsageError(too_large.format(_size(info.st_size)))
    try:
        with file.open("rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as err:
        raise UsageError(f"cannot read {what} {path}: {err.strerror or err}") from err
    if len(data) > max_bytes:  # it grew since
        raise UsageError(too_large.format(f"over {_size(max_bytes)}"))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise UsageError(f"{path}: not a text file (invalid UTF-8 at byte {err.start})") from err
    if not text.strip():
        raise UsageError(f"{path}: not a {what}: the file is empty")
    try:
        doc = json.loads(text, parse_int=_bounded_int)
    except json.JSONDecodeError as err:
        where = f"line {err.lineno}, column {err.colno}"
        raise UsageError(f"{path}: not valid JSON ({err.msg} at {where})") from err
    except _LongInteger as err:
        raise UsageError(
            f"{path}: not a {what} (an integer of {err.digits} digits; "
            f"at most {MAX_INT_DIGITS} are read)"
        ) from err
    except RecursionError as err:  # the parser's own limit, not a file of ours
        raise UsageError(f"{path}: not a {what} (JSON nested too deeply)") from err
    except ValueError as err:  # anything else the parser refuses, in one line
        raise UsageError(f"{path}: not valid JSON ({short(str(err))})") from err
    if _depth_over(doc, max_depth):
        raise UsageError(f"{path}: not a {what} (JSON nested too deeply: over {max_depth} levels)")
    return doc


def read_case(path: Path | str) -> dict[str, Any]:
    """Parse and check a case file; every problem is a one-line :class:`UsageError`.

    The case comes back as ``doc["case"]``, a :class:`Case` as it was drawn (a
    trace case file's: a :class:`~attnfuzz.reference.trace.Trace`, its failing
    step in ``doc["step"]``),
    and ``doc["settings"]["dtype"]`` is the float dtype it was found in
    (``float32`` for files written before dtypes were recorded): replay builds
    its inputs in that one (see :func:`attnfuzz.harness.casefile.load.resolve_case`).
    """
    doc = load_json(path, "case file", max_bytes=MAX_CASE_BYTES, max_depth=MAX_CASE_DEPTH)
    _require(isinstance(doc, dict), path, "a case file holds one JSON object")
    key = _long_key(doc, MAX_KEY_CHARS)
    _require(key is None, path, f"key {short(key)} is longer than {MAX_KEY_CHARS} characters")
    _require(
        doc.get("schema") == CASE_SCHEMA,
        path,
        f"unsupported schema {short(doc.get('schema'))} (this attnfuzz reads {CASE_SCHEMA!r})",
    )
    # Which of the two a file holds, said before the schema's check (which would
    # quote the document first, then say only that its oneOf failed).
    held = "both case and trace" if "case" in doc else "neither case nor trace"
    _require(
        ("case" in doc) != ("trace" in doc),
        path,
        f"holds {held}; a case file holds one: case (a step on its own) or trace "
        "(one engine's steps)",
    )
    _require(
        "step" not in doc or "trace" in doc,
        path,
        "holds step beside case; step is the step a trace fails at, and a case on its "
        "own has no steps (a trace case file holds trace and step)",
    )
    # Types, fields, ranges (int32), names, settings: the published schema says them all.
    validate(doc, "case", str(path))
    settings = doc.get("settings", {})
    timeout = settings.get("example_timeout")
    dtype = settings.get("dtype", "float32")  # older files: float32
    doc["settings"] = {"dtype": dtype} | ({} if timeout is None else {"example_timeout": timeout})
    if "trace" in doc:  # one engine's steps: each step is checked as a case is
        try:
            trace = Trace.from_dict(doc["trace"])
        except (KeyError, TypeError, ValueError) as err:
            raise UsageError(f"{path}: malformed trace ({type(err).__name__}: {err})") from err
        _require(
            doc.get("step", 0) < len(trace.steps),
            path,
            f"step {doc.get('step')} of a trace of {len(trace.steps)} steps",
        )
        for k in range(len(trace.steps)):
            _refuse_too_large(trace.case(k), path)
        doc["case"] = trace
        return doc
    try:
        case = Case.from_dict(doc["case"])
    except (KeyError, TypeError, ValueError) as err:
        raise UsageError(f"{path}: malformed case ({type(err).__name__}: {err})") from err
    _refuse_too_large(case, path)
    doc["case"] = case
    return doc


def _refuse_too_large(case: Case, path: Path | str) -> None:
    """:class:`CaseTooLarge` for a case whose arrays would hold more than
    :data:`MAX_CASE_ELEMENTS` elements, counted with integers before anything is
    built. A case the invariants refuse is left to them (they say why)."""
    config, batch = case.config, case.batch
    if config_violations(config) or batch_violations(config, batch):
        return
    bs, width = config.block_size, config.max_blocks_per_seq
    pages = sum(cdiv(s, bs) for s in batch.seq_lens) + 2
    if batch.pages:  # a trace's step: the cache holds every page id it names
        pages = max(pages, max(max(row, default=0) for row in batch.pages) + 3)
    tokens = max(sum(batch.q_lens), max(config.cudagraph_capture_sizes, default=0))
    sizes = {
        "block table": max(batch.num_reqs, config.max_num_seqs) * width,
        "KV cache": pages * bs * config.head_dim,
        "queries": tokens * config.num_heads * config.head_dim,
        "per-token buffers": config.max_num_batched_tokens * max(config.topk, width),
    }
    what, elements = max(sizes.items(), key=lambda item: item[1])
    if elements > MAX_CASE_ELEMENTS:
        raise CaseTooLarge(
            f"{path}: the case is too large to replay: its {what} alone would hold "
            f"{elements:.3g} elements (at most 2**33); draw smaller cases (--scale small)"
        )
