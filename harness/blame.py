"""Whose fault an exception raised while judging is: attnfuzz's own, or the code under test's.

An implementation's exception is a finding only when the code under test
raised it. Where attnfuzz's own code raised it (an engine adapter's glue, a
vendor stand-in, the harness), it says nothing about the implementation: it is
an attnfuzz error, reported with the file and line in attnfuzz, never written
as a case that blames the engine (an adapter calling an API another vLLM
release lacks raises ``AttributeError`` in the adapter, not in vLLM).

The rule reads the traceback from its innermost frame outwards, skipping the
frames of libraries both sides call (the standard library, torch, numpy,
Triton, anything installed that is not an engine); the first frame left
decides:

- an engine's package (``vllm``, ``sglang``), the user's code, or attnfuzz code
  that *is* under test (``attnfuzz.kernels``: our implementations and
  re-created mutants; engine code with a fix reverted, marked with
  :func:`under_test`): a finding;
- any other attnfuzz module: attnfuzz's fault.

A stand-in that refuses arguments its vendor operation refuses raises
:class:`ContractError` on purpose: that is the engine's misuse of the
vendor's contract, a finding wherever it is raised. A call that an attnfuzz
function's own signature refuses (``TypeError: f() got an unexpected keyword
argument``: Python raises it in the caller's frame, before the callee runs) is
attnfuzz's fault: a stand-in that lacks a parameter its vendor's function
takes says nothing of the engine that passed it.
"""

from __future__ import annotations

import re
import sys
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import CodeType, FrameType, TracebackType
from typing import TypeVar

from attnfuzz.harness.errors import ContractError
from attnfuzz.reference.history import FieldHistory

# The packages whose code is an engine under test: their exceptions are findings.
ENGINES = frozenset({"vllm", "sglang"})
# attnfuzz's modules whose code is itself under test (implementations, mutants).
_UNDER_TEST_MODULES = ("attnfuzz.kernels",)
_PACKAGE_ROOT = Path(__file__).resolve().parent.parent  # the folder `attnfuzz` installs from
_LIBRARY_ROOTS = tuple(
    str(Path(p).resolve())
    for p in {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
)
_under_test_code: set[CodeType] = set()
# A public dataclass's missing-field lookup raises for whoever read the field.
_transparent_code: set[CodeType] = {FieldHistory.__getattr__.__code__}

T = TypeVar("T")


def _codes(obj: object) -> Iterator[CodeType]:
    members = vars(obj).values() if isinstance(obj, type) else [obj]
    for member in members:
        # A function, a classmethod/staticmethod, a property, a Triton kernel's body.
        wrapped = ("__func__", "fget", "fn")
        for fn in (member, *(getattr(member, name, None) for name in wrapped)):
            code = getattr(fn, "__code__", None)
            if isinstance(code, CodeType):
                yield code


def under_test(obj: T) -> T:
    """Mark a function, or every function of a class, as code under test: an
    engine function with its fix reverted (an upstream mutant) lives in an
    adapter's file, yet its exceptions are the mutant's, not attnfuzz's."""
    _under_test_code.update(_codes(obj))
    return obj


def transparent(obj: T) -> T:
    """Mark harness code that stands between the code under test and what it
    calls (a dispatch mode that watches every aten op, a wrapper around Triton
    launches) as a library's: an op that raises through it was called by the
    code under test."""
    _transparent_code.update(_codes(obj))
    return obj


@dataclass(frozen=True)
class Fault:
    """attnfuzz's own code raised ``error`` at ``file:line`` (relative to the package)."""

    file: str
    line: int
    function: str
    error: str

    def __str__(self) -> str:
        return f"attnfuzz error at {self.file}:{self.line} in {self.function}: {self.error}"


def _frames(tb: TracebackType | None) -> Iterator[tuple[FrameType, int]]:
    while tb is not None:
        yield tb.tb_frame, tb.tb_lineno
        tb = tb.tb_next


def _owner(frame: FrameType) -> str:
    """``attnfuzz``, ``under test`` (engine, user, or attnfuzz code under test) or ``library``."""
    module = str(frame.f_globals.get("__name__") or "")
    if frame.f_code in _under_test_code:
        return "under test"
    if frame.f_code in _transparent_code:
        return "library"
    if module == "attnfuzz" or module.startswith("attnfuzz."):
        return "under test" if module.startswith(_UNDER_TEST_MODULES) else "attnfuzz"
    if module.partition(".")[0] in ENGINES:
        return "under test"
    filename = frame.f_code.co_filename
    if filename.startswith("<frozen ") or module.partition(".")[0] in sys.stdlib_module_names:
        return "library"
    path = str(Path(filename).resolve()) if not filename.startswith("<") else filename
    if path.startswith(_LIBRARY_ROOTS):
        return "library"
    return "under test"  # the user's own code (a module:attribute, a test file)


# What Python says of a call its callee's signature refuses, naming the callee.
_SIGNATURE = re.compile(
    r"^(?P<name>[\w.]+)\(\) (got an unexpected keyword argument|got multiple values for "
    r"argument|takes \d+ positional argument|takes from \d+ to \d+ positional|missing \d+ "
    r"required)"
)


def _refusing_callee(err: BaseException, frame: FrameType) -> object | None:
    """The attnfuzz function whose signature refused the call ``frame`` made (``err``
    a binding ``TypeError`` naming it), found among the names the frame sees and their
    attributes; None where it is no attnfuzz function."""
    match = _SIGNATURE.match(str(err)) if type(err) is TypeError else None
    if match is None:
        return None
    name = match["name"].rpartition(".")[2]
    seen = [*frame.f_locals.values(), *frame.f_globals.values()]
    for obj in seen + [_attribute(o, name) for o in seen if not isinstance(o, str)]:
        fn = _attribute(obj, "__func__") or obj
        module = str(_attribute(fn, "__module__") or "")
        code = _attribute(fn, "__code__")
        if _attribute(fn, "__name__") == name and module.startswith("attnfuzz.") and code:
            return fn
    return None


def _attribute(obj: object, name: str) -> object | None:
    """``obj.name``, or None where reading it raises anything (a lazy module's, a
    stand-in's ``__getattr__``): blame only reads, and must not fail while reading."""
    try:
        return getattr(obj, name, None)
    except Exception:  # noqa: BLE001 - an attribute blame cannot read is one it does not use
        return None


def attnfuzz_fault(err: BaseException, tb: TracebackType | None) -> Fault | None:
    """The :class:`Fault` when attnfuzz's own code raised ``err``, else None (a finding).

    ``tb`` is the part of ``err``'s traceback below the call of the code under
    test (the judge's own frame left out).
    """
    if isinstance(err, ContractError):
        return None
    for frame, line in reversed(list(_frames(tb))):
        owner = _owner(frame)
        if owner == "library":
            continue
        code = frame.f_code
        if owner == "under test":
            callee = _refusing_callee(err, frame)
            if callee is None:
                return None
            code = callee.__code__  # the stand-in's definition is the fault's place
            line = code.co_firstlineno
        path = Path(code.co_filename).resolve()
        try:
            file = path.relative_to(_PACKAGE_ROOT).as_posix()
        except ValueError:
            file = path.name
        text = str(err).strip().splitlines()
        error = f"{type(err).__name__}: {text[0]}" if text else type(err).__name__
        return Fault(file, line, code.co_name, error)
    return None
