"""The differential oracle: one comparison per property, clear mismatch messages.

Each ``expect_*`` function compares what an implementation produced with what
the reference says and returns a list of :class:`Mismatch` (empty when they
agree). None of them loosens anything: integers compare exactly, floats with
``torch.testing.assert_close`` defaults for their dtype, NaN never passes, and
top-k rows compare as *sets up to ties at the k-th value*, which is exactly the
freedom the contract grants and no more. What a failed comparison says, in
``torch.testing.assert_close``'s form, is written by ``harness/mismatch.py``.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import EnumType, StrEnum

import numpy as np
import torch

# Mismatch lives with its message; it is imported from here still (targets, the public API).
from attnfuzz.harness.mismatch import (
    Mismatch,
    Part,
    close_mismatch,
    part_name,
    short,
    value_mismatch,
)

# The members a target's own check had in ``Check`` before each target declared
# its own (``Target.checks``): reading one still gives its string, with a
# DeprecationWarning, for one release; they are no members (``Check("walk")``
# raises, iterating ``Check`` gives the generic checks only).
_MOVED_TO_TARGETS = {
    "CONSUMER": ("consumer", "mtp-seq-lens"),
    "COUNT": ("count", "flex-block-mask"),
    "MASK_DUPLICATE": ("mask.duplicate", "flex-block-mask"),
    "MAX_SEQ_LEN": ("max_seq_len", "max-seq-len"),
    "METADATA": ("metadata", "flatten-decode"),
    "PADDING": ("padding", "slot-mapping"),
    "PAGE_BOUNDS": ("page_bounds", "max-seq-len"),
    "PATH": ("path", "mtp-seq-lens"),
    "WALK": ("walk", "max-seq-len"),
    "ZEROED": ("zeroed", "flatten-decode"),
}


class _CheckType(EnumType):
    def __getattr__(cls, name: str) -> object:
        if name in _MOVED_TO_TARGETS:
            value, target = _MOVED_TO_TARGETS[name]
            warnings.warn(
                f"Check.{name} is deprecated: {value!r} is a check of target {target}, "
                f"declared in its Target.checks; write the string {value!r}",
                DeprecationWarning,
                stacklevel=2,
            )
            return value
        try:  # what EnumType.__getattr__ did where it has one
            return cls._member_map_[name]
        except KeyError:
            raise AttributeError(
                f"type object {cls.__name__!r} has no attribute {name!r}"
            ) from None


class Check(StrEnum, metaclass=_CheckType):
    """The names of the oracle's generic checks, as case files and reports write them.

    A :class:`StrEnum`: each member *is* its string (``Check.VALUES == "values"``,
    ``json.dumps`` writes ``"values"``), so files written before it read the same.
    These are the checks any target may report; a target's own checks are
    declared by the target (``Target.checks``) and written as plain strings.
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
    INVARIANT = "invariant"  # a relation among the outputs themselves (counts that sum up)
    TOPK_FILL = "topk.fill"
    TOPK_UNIQUE = "topk.unique"
    TOPK_VISIBLE = "topk.visible"
    TOPK_VALUES = "topk.values"
    # how the call ended, when it did not return (this module and harness/isolation.py)
    EXCEPTION = "exception"
    OUTPUT = "output"
    TIMEOUT = "timeout"
    CRASH = "crash"


UNSHRUNK_CHECKS = frozenset({Check.TIMEOUT})
"""Checks that end a search with the case that was running, never shrunk: each
shrinking step of a hang would cost a whole timeout. A crash is shrunk (each
case is judged in a child, and a new child is cheap)."""


@dataclass
class Verdict:
    """The outcome of one case: no mismatch means the implementation agreed."""

    mismatches: list[Mismatch] = field(default_factory=list)
    # Counts the target reports of the implementation's work on this case
    # (e.g. pages walked vs pages needed); informative, never a verdict.
    statistics: dict[str, int] = field(default_factory=dict)
    # A trace's verdict: the step (0-based) it failed at; None for a case on its own.
    step: int | None = None

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
        at = f" at step {self.step}" if self.step is not None else ""
        lines = [f"FAIL ({self.key}){at}"] + [f"  {m}" for m in self.mismatches[:8]]
        if len(self.mismatches) > 8:
            lines.append(f"  ... and {len(self.mismatches) - 8} more")
        return "\n".join(lines)


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
        where = part_name(name, at, label)
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
        where = part_name(name, at, label)
        return [Mismatch(Check.SHAPE, where, str(list(e.shape)), str(list(g.shape)))]
    full_g, full_e = g, e.to(g.dtype)
    if rows is not None:
        keep = torch.as_tensor(rows)
        g, e = g[keep], e[keep]
    try:
        torch.testing.assert_close(g, e.to(g.dtype), equal_nan=False)
    except AssertionError as err:  # turned into a finding, never swallowed
        return [close_mismatch(Check.VALUES, name, full_g, full_e, rows, err, at, label)]
    return []


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
            out.append(Mismatch(Check.TOPK_FILL, where, f"{k - n} entries -1", short(row.tolist())))
        elif len(set(chosen.tolist())) != len(chosen):
            out.append(Mismatch(Check.TOPK_UNIQUE, where, "distinct indices", short(row.tolist())))
        elif ((chosen < 0) | (chosen >= ctx)).any():
            out.append(
                Mismatch(Check.TOPK_VISIBLE, where, f"indices in [0, {ctx})", short(row.tolist()))
            )
        else:
            want = np.sort(logits[i, :ctx])[::-1][:n]
            have = np.sort(logits[i, chosen])[::-1]
            if not np.array_equal(want, have):
                out.append(
                    Mismatch(
                        Check.TOPK_VALUES,
                        where,
                        f"selected logits {short(want.tolist())}",
                        f"{short(have.tolist())} (indices {short(row.tolist())})",
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
    return short(f"{type(err).__name__}: {msg}", 400)


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
                Check.GRAPH, name, "no allocation, no host read (graph-safe)", short(listed, 300)
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
