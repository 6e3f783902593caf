"""The differential oracle: one comparison per property, clear mismatch messages.

Each ``expect_*`` function compares what an implementation produced with what
the reference says and returns a list of :class:`Mismatch` (empty when they
agree). None of them loosens anything: integers compare exactly, floats with
``torch.testing.assert_close`` defaults for their dtype, NaN never passes, and
top-k rows compare as *sets up to ties at the k-th value*, which is exactly the
freedom the contract grants and no more.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from enum import StrEnum

import numpy as np
import torch

try:  # private to torch; should it move, a message falls back to assert_close's own words
    from torch.testing._comparison import default_tolerances
except ImportError:  # pragma: no cover - torch 2.4 to 2.9 have it
    default_tolerances = None


class Check(StrEnum):
    """The names of the oracle's checks, as case files and reports write them.

    A :class:`StrEnum`: each member *is* its string (``Check.VALUES == "values"``,
    ``json.dumps`` writes ``"values"``), so files written before it read the same.
    The generic checks come first; a target's own checks follow (a target may
    still name a check of its own with a plain string).
    """

    # what an implementation returned, compared with the reference (this module)
    TYPE = "type"
    SHAPE = "shape"
    DTYPE = "dtype"
    STRIDE = "stride"
    CONTIGUOUS = "contiguous"
    VIEW = "view"
    GRAPH = "graph"
    VALUES = "values"
    UNCHANGED = "unchanged"
    TOPK_FILL = "topk.fill"
    TOPK_UNIQUE = "topk.unique"
    TOPK_VISIBLE = "topk.visible"
    TOPK_VALUES = "topk.values"
    # how the call ended, when it did not return (this module and harness/isolation.py)
    EXCEPTION = "exception"
    OUTPUT = "output"
    TIMEOUT = "timeout"
    CRASH = "crash"
    # targets' own (harness/targets/*.py)
    CONSUMER = "consumer"
    COUNT = "count"
    INVARIANT = "invariant"
    MASK_DUPLICATE = "mask.duplicate"
    MAX_SEQ_LEN = "max_seq_len"
    METADATA = "metadata"
    PADDING = "padding"
    PAGE_BOUNDS = "page_bounds"
    PATH = "path"
    WALK = "walk"
    ZEROED = "zeroed"


UNSHRUNK_CHECKS = frozenset({Check.CRASH, Check.TIMEOUT})
"""Checks of a call whose process died or hung: its case is the one that was
running, never shrunk (shrinking would re-run what kills or hangs)."""


@dataclass(frozen=True)
class Mismatch:
    """One failed check: which, where, what was expected and what came."""

    check: str  # a Check (a str), or a target's own check name
    where: str
    expected: str
    got: str

    def __str__(self) -> str:
        return f"[{self.check}] {self.where}: expected {self.expected}, got {self.got}"

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Verdict:
    """The outcome of one case: no mismatch means the implementation agreed."""

    mismatches: list[Mismatch] = field(default_factory=list)
    # Counts the target reports of the implementation's work on this case
    # (e.g. pages walked vs pages needed); informative, never a verdict.
    statistics: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.mismatches

    @property
    def key(self) -> str:
        """What deduplicates findings: the first failing check (and exception type)."""
        if self.ok:
            return "ok"
        first = self.mismatches[0]
        if first.check == Check.EXCEPTION:
            return f"exception:{first.got.split(':', 1)[0]}"
        return first.check

    def __str__(self) -> str:
        if self.ok:
            return "PASS"
        lines = [f"FAIL ({self.key})"] + [f"  {m}" for m in self.mismatches[:8]]
        if len(self.mismatches) > 8:
            lines.append(f"  ... and {len(self.mismatches) - 8} more")
        return "\n".join(lines)


def _short(x: object, limit: int = 160) -> str:
    s = str(x)
    return s if len(s) <= limit else s[: limit - 3] + "..."


def expect_meta(name: str, got: object, shape: Sequence[int], dtype: torch.dtype) -> list[Mismatch]:
    """Exact shape and dtype; a non-tensor is a mismatch of its own."""
    if not isinstance(got, torch.Tensor):
        return [Mismatch(Check.TYPE, name, "a torch.Tensor", type(got).__name__)]
    out = []
    if tuple(got.shape) != tuple(shape):
        out.append(Mismatch(Check.SHAPE, name, str(list(shape)), str(list(got.shape))))
    if got.dtype != dtype:
        out.append(Mismatch(Check.DTYPE, name, str(dtype), str(got.dtype)))
    return out


Part = int | slice | tuple[int | slice, ...]
"""Where compared tensors sit in the tensor a message names: the index that took
them out of it (``np.s_[4:]``, ``(path,)``, ``np.s_[:, 0]``), so that a message
writes the named tensor's own index (``slot_mapping_buffer[5]``, not ``[4:][1]``)."""


def _parts(at: Part) -> tuple[int | slice, ...]:
    parts = at if isinstance(at, tuple) else (at,)
    for p in parts:  # anything else (-1, ::2, ...) would need the named tensor's shape
        ok = isinstance(p, int) and p >= 0
        ok |= isinstance(p, slice) and (p.start or 0) >= 0 and p.step in (None, 1)
        if not ok:
            raise ValueError(f"at: integers and step-1 slices from 0 on, not {p!r}")
    return parts


def _format_part(at: Part) -> str:
    """``np.s_[4:]`` as ``4:``, ``(1, slice(None))`` as ``1, :`` (how the index is written)."""
    out = []
    for p in _parts(at):
        if isinstance(p, slice):
            out.append(f"{'' if p.start is None else p.start}:{'' if p.stop is None else p.stop}")
        else:
            out.append(str(p))
    return ", ".join(out)


def _named(name: str, at: Part, label: str) -> str:
    """The name of a compared part: ``slot_mapping_buffer[4:]``, ``out[1] (draft)``."""
    where = f"{name}[{_format_part(at)}]" if _parts(at) else name
    return f"{where} ({label})" if label else where


def _full_index(at: Part, index: tuple[int, ...]) -> tuple[int, ...]:
    """An element's index in the compared part, as an index into the named tensor."""
    out, k = [], 0
    for p in _parts(at):
        if isinstance(p, slice):
            out.append(int(p.start or 0) + index[k])
            k += 1
        else:
            out.append(int(p))  # a NumPy integer would print as np.int64(...)
    return (*out, *index[k:])


def _value(x: object) -> str:
    """One element, written short: ``7``, ``-1``, ``0.1`` (a float in its own precision)."""
    if isinstance(x, np.floating):
        return str(x)
    return str(x.item() if isinstance(x, np.generic) else x)


def value_mismatch(
    check: str,
    name: str,
    expected: np.ndarray,
    got: np.ndarray,
    wrong: np.ndarray,
    *,
    compared: int | None = None,
    at: Part = (),
    label: str = "",
    rtol: float = 0,
    atol: float = 0,
) -> Mismatch:
    """The one message of a value comparison that failed, in the form of
    ``torch.testing.assert_close``'s, on one line.

    ``wrong`` flags the elements that failed (as the comparison judged them: this
    only describes them); ``compared`` is how many elements were compared (all,
    when ``None``). ``where`` is the first wrong element as an index into the
    named tensor, ``expected``/``got`` its two values, and ``got`` goes on with
    the count and the greatest difference (relative too, for floats), with the
    tolerances of the comparison::

        [padding] slot_mapping_buffer[5]: expected -1, got 7; Mismatched elements:
        2 / 4 (50.0%); Greatest absolute difference: 9 at index (6,) (up to 0 allowed)
    """
    wrong = np.asarray(wrong, dtype=bool)
    e = np.broadcast_to(np.asarray(expected), wrong.shape)
    g = np.broadcast_to(np.asarray(got), wrong.shape)
    total = wrong.size if compared is None else compared
    n = int(wrong.sum())
    if not n:
        raise ValueError("value_mismatch: no element flagged wrong")
    first = tuple(int(i) for i in np.argwhere(wrong)[0])
    index = _full_index(at, first)
    where = f"{name}[{', '.join(map(str, index))}]" if index else name
    where = f"{where} ({label})" if label else where
    lines = [
        f"{_value(g[first])}",
        f"Mismatched elements: {n} / {total} ({n / max(total, 1):.1%})",
    ]
    dtype = np.result_type(g.dtype, e.dtype)
    floating = np.issubdtype(dtype, np.floating)
    # Differences in float64 (integers too: no wrap-around), only over wrong elements.
    with np.errstate(all="ignore"):
        e64, g64 = e.astype(np.float64), g.astype(np.float64)
        diff = np.where(wrong, np.abs(g64 - e64), 0.0)
        diffs = [("absolute", diff, atol)]
        if floating:
            diffs.append(("relative", np.where(wrong, diff / np.abs(e64), 0.0), rtol))
    for kind, values, tol in diffs:
        i = np.unravel_index(int(np.argmax(values)), wrong.shape)  # NaN first, as torch
        if floating:  # in the precision compared
            shown = _value(dtype.type(values[i]))
        else:  # the exact integer difference
            shown = str(abs(int(g[i]) - int(e[i])))
        full = _full_index(at, tuple(int(j) for j in i))
        lines.append(f"Greatest {kind} difference: {shown} at index {full} (up to {tol:g} allowed)")
    return Mismatch(check, where, _value(e[first]), "; ".join(lines))


def expect_equal(
    name: str,
    got: torch.Tensor,
    expected: np.ndarray,
    rows: np.ndarray | None = None,
    check: str = Check.VALUES,
    *,
    at: Part = (),
    label: str = "",
) -> list[Mismatch]:
    """Exact equality, optionally on a boolean mask of rows; reports the first wrong
    element, how many are wrong and the greatest difference (:func:`value_mismatch`).
    ``got``/``expected`` are ``name[at]`` (``label`` names which, if ``at`` is not enough)."""
    g = got.detach().cpu().numpy()
    e = np.asarray(expected)
    if g.shape != e.shape:
        where = _named(name, at, label)
        return [Mismatch(Check.SHAPE, where, str(list(e.shape)), str(list(g.shape)))]
    bad = (g != e).any(axis=tuple(range(1, g.ndim)))  # one flag per row
    if rows is not None:
        bad &= rows
    if not bad.any():
        return []
    wrong = g != e
    compared = None
    if rows is not None:  # the rows not compared hold no mismatch
        keep = np.asarray(rows, dtype=bool).reshape(-1, *[1] * (g.ndim - 1))
        wrong = wrong & keep
        compared = int(np.broadcast_to(keep, g.shape).sum())
    return [value_mismatch(check, name, e, g, wrong, compared=compared, at=at, label=label)]


def _numpy(t: torch.Tensor) -> np.ndarray:
    """A host tensor as NumPy: the dtypes NumPy lacks (bfloat16, ...) as float32."""
    try:
        return t.numpy()
    except TypeError:
        return t.float().numpy()


def expect_close(
    name: str,
    got: torch.Tensor,
    expected: np.ndarray,
    rows: np.ndarray | None = None,
    *,
    at: Part = (),
    label: str = "",
) -> list[Mismatch]:
    """``torch.testing.assert_close`` semantics (default tolerances, NaN never equal).
    ``got``/``expected`` are ``name[at]`` (``label`` names which, if ``at`` is not enough)."""
    g = got.detach().cpu()
    e = torch.as_tensor(np.asarray(expected))
    if tuple(g.shape) != tuple(e.shape):
        where = _named(name, at, label)
        return [Mismatch(Check.SHAPE, where, str(list(e.shape)), str(list(g.shape)))]
    full_g, full_e = g, e.to(g.dtype)
    if rows is not None:
        keep = torch.as_tensor(rows)
        g, e = g[keep], e[keep]
    try:
        torch.testing.assert_close(g, e.to(g.dtype), equal_nan=False)
    except AssertionError as err:  # turned into a finding, never swallowed
        return [_close_mismatch(name, full_g, full_e, rows, err, at, label)]
    return []


def _close_mismatch(
    name: str,
    got: torch.Tensor,
    expected: torch.Tensor,
    rows: np.ndarray | None,
    err: AssertionError,
    at: Part,
    label: str,
) -> Mismatch:
    """What :func:`expect_close`'s failed ``assert_close`` found, described again
    element by element with the same tolerances (the judgment stays ``assert_close``'s)."""
    wrong, compared = np.zeros(tuple(got.shape), dtype=bool), None
    rtol = atol = 0.0
    if default_tolerances is not None:
        rtol, atol = default_tolerances(got, expected)  # those assert_close took
        try:
            wrong = ~torch.isclose(got, expected, rtol=rtol, atol=atol, equal_nan=False).numpy()
        except (RuntimeError, TypeError):  # a dtype isclose refuses: described as below
            pass
    if rows is not None:
        keep = np.asarray(rows, dtype=bool).reshape(-1, *[1] * (got.dim() - 1))
        wrong &= keep
        compared = int(np.broadcast_to(keep, wrong.shape).sum())
    if not wrong.any():  # it failed on something else: its own words
        detail = _short(" ".join(str(err).split()), 400)
        where = _named(name, at, label)
        return Mismatch(Check.VALUES, where, "values close to the reference", detail)
    e, g = _numpy(expected), _numpy(got)
    return value_mismatch(
        Check.VALUES, name, e, g, wrong, compared=compared, at=at, label=label, rtol=rtol, atol=atol
    )


def expect_topk_rows(
    name: str,
    got: torch.Tensor,
    logits: np.ndarray,
    context_lens: np.ndarray,
    k: int,
    row_ids: Sequence[int] | None = None,
) -> list[Mismatch]:
    """Each row is a valid top-k of its logits, judged tie-robustly.

    For row ``i`` with ``n = min(k, context_lens[i])`` visible candidates the
    row must hold ``n`` distinct indices in ``[0, context_lens[i])`` and
    ``k - n`` entries ``-1``, and the multiset of logits it selects must equal
    that of the ``n`` largest visible logits. Two correct answers differ only by
    which of several equal logits at the k-th value they kept.
    """
    g = got.detach().cpu().numpy()
    out = []
    for i in range(g.shape[0]):
        rid = row_ids[i] if row_ids is not None else i
        where = f"{name}[{rid}]"
        row, ctx = g[i], int(context_lens[i])
        n = min(k, ctx)
        chosen = row[row != -1]
        if int((row == -1).sum()) != k - n:
            out.append(
                Mismatch(Check.TOPK_FILL, where, f"{k - n} entries -1", _short(row.tolist()))
            )
        elif len(set(chosen.tolist())) != len(chosen):
            out.append(Mismatch(Check.TOPK_UNIQUE, where, "distinct indices", _short(row.tolist())))
        elif ((chosen < 0) | (chosen >= ctx)).any():
            out.append(
                Mismatch(Check.TOPK_VISIBLE, where, f"indices in [0, {ctx})", _short(row.tolist()))
            )
        else:
            want = np.sort(logits[i, :ctx])[::-1][:n]
            have = np.sort(logits[i, chosen])[::-1]
            if not np.array_equal(want, have):
                out.append(
                    Mismatch(
                        Check.TOPK_VALUES,
                        where,
                        f"selected logits {_short(want.tolist())}",
                        f"{_short(have.tolist())} (indices {_short(row.tolist())})",
                    )
                )
        if len(out) >= 8:
            break
    return out


def _describe(err: BaseException) -> str:
    """``Type: message`` on one line, whatever the exception's ``__str__`` does."""
    try:
        msg = " ".join(str(err).split())
    except BaseException:  # noqa: BLE001 - a user's exception whose __str__ raises
        msg = "<message unprintable>"
    return _short(f"{type(err).__name__}: {msg}", 400)


def exception_mismatch(where: str, err: BaseException) -> Mismatch:
    """An exception raised on a valid case is a finding: keep its type and message."""
    return Mismatch(Check.EXCEPTION, where, "no exception", _describe(err))


def output_mismatch(where: str, err: BaseException) -> Mismatch:
    """Outputs the oracle could not read (reading them raised): a finding of their own."""
    return Mismatch(Check.OUTPUT, where, "outputs the oracle can read", _describe(err))


def expect_strides(name: str, got: torch.Tensor, strides: Sequence[int]) -> list[Mismatch]:
    """Exact strides of every dimension longer than 1 (a consumer indexing with its
    own strides reads wrong elements); the stride of a dimension of size 0 or 1
    is never used to address anything, as ``torch.Tensor.is_contiguous`` agrees."""
    used = [i for i, n in enumerate(got.shape) if n > 1]
    if [got.stride(i) for i in used] != [strides[i] for i in used]:
        return [Mismatch(Check.STRIDE, name, str(tuple(strides)), str(tuple(got.stride())))]
    return []


def expect_contiguous(name: str, got: torch.Tensor) -> list[Mismatch]:
    if not got.is_contiguous():
        return [
            Mismatch(
                Check.CONTIGUOUS,
                name,
                "a contiguous tensor",
                f"shape {list(got.shape)} with strides {tuple(got.stride())}",
            )
        ]
    return []


def expect_view_of(
    name: str, got: torch.Tensor, buffer: torch.Tensor, offset: int = 0
) -> list[Mismatch]:
    """``got`` lives inside ``buffer``'s storage, starting ``offset`` elements in."""
    if got.untyped_storage().data_ptr() != buffer.untyped_storage().data_ptr():
        return [Mismatch(Check.VIEW, name, "a view of the preallocated buffer", "new storage")]
    start = got.storage_offset() - buffer.storage_offset()
    if start != offset:
        return [Mismatch(Check.VIEW, name, f"a view at element {offset}", f"element {start}")]
    return []


def expect_no_allocation(name: str, allocated: Sequence[str]) -> list[Mismatch]:
    """Graph safety: nothing allocated inside the call."""
    if allocated:
        listed = "; ".join(allocated[:3]) + (" ..." if len(allocated) > 3 else "")
        return [
            Mismatch(
                Check.GRAPH, name, "no allocation, no host read (graph-safe)", _short(listed, 300)
            )
        ]
    return []


def _element_offsets(t: torch.Tensor) -> np.ndarray:
    """Storage offsets (in elements) of every element of ``t``."""
    offsets = np.full((), t.storage_offset(), dtype=np.int64)
    for size, stride in zip(t.shape, t.stride(), strict=True):
        offsets = offsets[..., None] + np.arange(size, dtype=np.int64) * stride
    return offsets.reshape(-1)


def expect_inside(name: str, got: torch.Tensor, buffer: torch.Tensor) -> list[Mismatch]:
    """``got`` is a view whose every element lies inside the preallocated ``buffer``."""
    if got.untyped_storage().data_ptr() != buffer.untyped_storage().data_ptr():
        return [Mismatch(Check.VIEW, name, "a view of the preallocated buffer", "new storage")]
    offsets = _element_offsets(got)
    lo, hi = buffer.storage_offset(), buffer.storage_offset() + buffer.numel()
    if offsets.size and (offsets.min() < lo or offsets.max() >= hi):
        return [
            Mismatch(
                Check.VIEW,
                name,
                f"elements inside the buffer [{lo}, {hi})",
                f"elements [{offsets.min()}, {offsets.max()}]",
            )
        ]
    return []


def expect_untouched_outside(
    name: str, buffer: torch.Tensor, before: np.ndarray, view: torch.Tensor
) -> list[Mismatch]:
    """Every element of the (contiguous) ``buffer`` outside ``view`` still holds ``before``."""
    after = buffer.detach().cpu().numpy().reshape(-1)
    owned = np.zeros(after.shape, dtype=bool)
    if view.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr():
        offsets = _element_offsets(view) - buffer.storage_offset()
        owned[offsets[(offsets >= 0) & (offsets < after.size)]] = True
    was = np.asarray(before).reshape(-1)
    bad = np.flatnonzero((after != was) & ~owned)
    if not len(bad):
        return []
    shape = tuple(buffer.shape)  # the message indexes the buffer as its user does
    wrong = ((after != was) & ~owned).reshape(shape)
    e, g, compared = was.reshape(shape), after.reshape(shape), int((~owned).sum())
    return [value_mismatch(Check.UNCHANGED, name, e, g, wrong, compared=compared)]
