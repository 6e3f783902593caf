"""A mismatch and its message: what one failed check of the oracle says.

:class:`Mismatch` is one failed check. :func:`value_mismatch` writes the one
message of a value comparison that failed, in the form of
``torch.testing.assert_close``'s on one line: the first wrong element as an
index into the tensor the message names, how many are wrong, the greatest
differences and the tolerances they were judged with. It only describes: which
elements are wrong is always the comparison's judgment (``harness/oracle.py``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch

try:  # private to torch; should it move, a message falls back to assert_close's own words
    from torch.testing._comparison import default_tolerances
except ImportError:  # pragma: no cover - torch 2.4 to 2.9 have it
    default_tolerances = None


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


def short(x: object, limit: int = 160) -> str:
    """``x`` as a string of at most ``limit`` characters."""
    s = str(x)
    return s if len(s) <= limit else s[: limit - 3] + "..."


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


def part_name(name: str, at: Part, label: str) -> str:
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


def _numpy(t: torch.Tensor) -> np.ndarray:
    """A host tensor as NumPy: the dtypes NumPy lacks (bfloat16, ...) as float32."""
    try:
        return t.numpy()
    except TypeError:
        return t.float().numpy()


def close_mismatch(
    check: str,
    name: str,
    got: torch.Tensor,
    expected: torch.Tensor,
    rows: np.ndarray | None,
    err: AssertionError,
    at: Part,
    label: str,
) -> Mismatch:
    """What a failed ``assert_close`` found, described again element by element
    with the same tolerances (the judgment stays ``assert_close``'s)."""
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
        detail = short(" ".join(str(err).split()), 400)
        return Mismatch(check, part_name(name, at, label), "values close to the reference", detail)
    e, g = _numpy(expected), _numpy(got)
    return value_mismatch(
        check, name, e, g, wrong, compared=compared, at=at, label=label, rtol=rtol, atol=atol
    )
