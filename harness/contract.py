"""The contract of a target, read off its reference dataclasses.

An implementation of a target is ``fn(inputs) -> outputs``; both are dataclasses
of the target's reference module. They are found from the target's own
signatures (:func:`contract_classes`): ``make_inputs`` returns the inputs;
``compare``'s ``got`` (else the reference implementation's return) is the outputs.

Every field is read off the dataclass (``dataclasses.fields``, its type hints)
and its source, parsed with :mod:`ast` and :mod:`tokenize`: its description is
an attribute docstring (a string right below the field) or the comment on its
line, and a comment block right above it is a note before it, as the source
reads. A description that starts with a dtype and a shape, the reference
modules' convention (``int32 [R_pad]: ...``, ``[T, H, D], fp32``), gives the
field's dtype and its shape in the case's symbols; an integer field whose
description starts with a symbol (``num_reqs: int  # R_pad: ...``) defines it.
One that says ``a view of X`` must be a view of that (persistent) memory, which
the target's ``compare`` checks. Nested dataclasses are listed field by field
(``buffers.context_lens``, ``groups[].block_table``), with their properties.
``attnfuzz describe`` (``harness/cli/describe.py``) prints what this reads.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import tokenize
import types
import typing
from dataclasses import dataclass, field
from functools import cache
from typing import Any

_DTYPE = r"bool|u?int(?:8|16|32|64)|fp(?:16|32|64)|bf16|float(?:16|32|64)|bfloat16"
_DTYPE_NAMES = {"fp16": "float16", "fp32": "float32", "fp64": "float64", "bf16": "bfloat16"}
# "int32 [R_pad]: ...", "[M]", "[T, H, D], fp32 (...)": a dtype and a shape lead the description.
_DTYPE_SHAPE = re.compile(
    rf"^(?:(?P<dtype>{_DTYPE})\s+)?(?P<shape>\[[^\]]*\])(?:,?\s*(?P<after>{_DTYPE})\b)?"
)
_VIEW = re.compile(r"\bviews? (?:at the start )?of (?P<what>``[^`]+``|[^,;:()]+)")
# "R_pad: rows the kernels see", "B, padding requests included", "N_d": a symbol, then words.
_SYMBOL = re.compile(r"^(?P<symbol>[A-Z](?:_[A-Za-z]+)?)(?=$|[\s:,;(])")
_PRAGMA = re.compile(r"^(?:fmt:|noqa|type:|pragma)")


@dataclass
class FieldDoc:
    """One field (or property) as ``describe`` prints it."""

    name: str  # dotted from the top dataclass: buffers.context_lens, groups[].block_table
    type: str  # tensor, ndarray, int | None, list[KVCacheGroup], ...
    annotation: str  # as the source writes it
    doc: str = ""  # attribute docstring and the comment on the field's line
    note: str = ""  # the comment block right above the field
    dtype: str | None = None
    shape: str | None = None
    view_of: str | None = None  # the memory the field must be a view of
    default: str | None = None  # a field the dataclass fills in when left out
    is_property: bool = False
    fields: list[FieldDoc] = field(default_factory=list)  # a nested dataclass's

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["fields"] = [f.to_json() for f in self.fields]
        return out

    def flat(self) -> list[FieldDoc]:
        return [self, *(row for f in self.fields for row in f.flat())]


@dataclass
class ContractDoc:
    """The inputs or the outputs of a target: a dataclass, its docstring, its fields."""

    cls: type
    fields: list[FieldDoc]

    @property
    def qualified_name(self) -> str:
        return f"{self.cls.__module__}.{self.cls.__qualname__}"

    @property
    def doc(self) -> str:
        return inspect.cleandoc(self.cls.__doc__ or "") if _own_docstring(self.cls) else ""

    def to_json(self) -> dict[str, Any]:
        return {
            "class": self.qualified_name,
            "doc": self.doc,
            "fields": [f.to_json() for f in self.fields],
        }


def _hints(fn: Any) -> dict[str, Any]:
    try:  # follows functools.wraps (a make_inputs in the case's dtype) to the module's names
        return typing.get_type_hints(inspect.unwrap(fn))
    except Exception:  # an annotation that names what the module never imports: not declared
        return {}


def contract_classes(target: Any) -> tuple[type | None, type | None]:
    """The dataclasses of ``target``'s inputs and outputs, as its signatures declare them
    (None where they declare none, e.g. a plugin's unannotated target)."""
    inputs = _hints(target.make_inputs).get("return")
    outputs = _hints(target.compare).get("got")
    if not _is_dataclass(outputs):  # ``got`` may be left open (a bare tensor is accepted too)
        reference = [i for i in target.implementations.values() if i.kind == "reference"]
        outputs = _hints(reference[0].fn).get("return") if reference else None
    return (
        inputs if _is_dataclass(inputs) else None,
        outputs if _is_dataclass(outputs) else None,
    )


def _is_dataclass(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _own_docstring(cls: type) -> bool:
    """A class docstring of its own, not the signature ``@dataclass`` writes in its place."""
    doc = cls.__doc__ or ""
    return bool(doc) and not doc.startswith(f"{cls.__name__}(")


@dataclass(frozen=True)
class _SourceNotes:
    """What a class's source says of its attributes, by name."""

    annotations: dict[str, str]
    docs: dict[str, str]
    notes: dict[str, str]


@cache
def _module_comments(filename: str) -> tuple[ast.Module | None, dict[int, str], frozenset[int]]:
    """A module's tree, its comments by line, and the lines that hold only a comment."""
    try:
        with tokenize.open(filename) as f:
            source = f.read()
        tree = ast.parse(source)
        tokens = list(tokenize.generate_tokens(iter(source.splitlines(keepends=True)).__next__))
    except (OSError, SyntaxError, tokenize.TokenError, ValueError):
        return None, {}, frozenset()
    lines = source.splitlines()
    comments: dict[int, str] = {}
    alone: set[int] = set()
    for tok in tokens:
        if tok.type != tokenize.COMMENT:
            continue
        text = tok.string.lstrip("#").strip()
        row, col = tok.start
        if _PRAGMA.match(text):
            continue
        comments[row] = text
        if not lines[row - 1][:col].strip():
            alone.add(row)
    return tree, comments, frozenset(alone)


def _class_node(tree: ast.Module, qualname: str) -> ast.ClassDef | None:
    body: list[ast.stmt] = tree.body
    node: ast.ClassDef | None = None
    for part in qualname.split("."):
        node = next((n for n in body if isinstance(n, ast.ClassDef) and n.name == part), None)
        if node is None:  # defined in a function (<locals>): no source to read
            return None
        body = node.body
    return node


@cache
def source_notes(cls: type) -> _SourceNotes:
    """Each attribute's annotation as written, its description and the note above it."""
    empty = _SourceNotes({}, {}, {})
    try:
        filename = inspect.getsourcefile(cls)
    except TypeError:  # a class without a source file
        return empty
    if filename is None:
        return empty
    tree, comments, alone = _module_comments(filename)
    node = _class_node(tree, cls.__qualname__) if tree is not None else None
    if node is None:
        return empty
    annotations: dict[str, str] = {}
    docs: dict[str, str] = {}
    notes: dict[str, str] = {}
    for index, stmt in enumerate(node.body):
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            name, end = stmt.target.id, stmt.end_lineno or stmt.lineno
            annotations[name] = ast.unparse(stmt.annotation)
        elif isinstance(stmt, ast.FunctionDef) and stmt.decorator_list:
            # A property: its return type as written; its docstring is read at run time.
            annotations[stmt.name] = ast.unparse(stmt.returns) if stmt.returns else ""
            continue
        else:
            continue
        parts = []
        following = node.body[index + 1] if index + 1 < len(node.body) else None
        if (
            isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):  # an attribute docstring, PEP 257's convention
            parts.append(inspect.cleandoc(following.value.value))
        parts += [comments[row] for row in range(stmt.lineno, end + 1) if row in comments]
        docs[name] = " ".join(p for p in parts if p)
        above: list[str] = []
        row = stmt.lineno - 1
        while row in alone:
            above.insert(0, comments[row])
            row -= 1
        if above:
            notes[name] = " ".join(above)
    return _SourceNotes(annotations, docs, notes)


def _type_name(tp: Any) -> str:
    """A type as an implementer reads it: ``tensor``, ``ndarray``, ``int | None``, a class name."""
    if tp is type(None):
        return "None"
    if tp is Any:
        return "Any"
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in args)
    if origin is not None:
        inner = ", ".join("..." if a is Ellipsis else _type_name(a) for a in args)
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{inner}]" if args else name
    if isinstance(tp, type):
        if (tp.__module__, tp.__name__) == ("torch", "Tensor"):
            return "tensor"
        if (tp.__module__, tp.__name__) == ("numpy", "ndarray"):
            return "ndarray"
        return tp.__name__
    return str(tp)


def _nested(tp: Any) -> tuple[type | None, str]:
    """The dataclass a field holds (itself, optional, or in a list, tuple or dict) and the
    suffix its fields are named with: ``""`` or ``"[]"``."""
    if _is_dataclass(tp):
        return tp, ""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        found = [a for a in args if _is_dataclass(a)]
        return (found[0], "") if len(found) == 1 else (None, "")
    if origin in (list, tuple, dict) and args and _is_dataclass(args[-1]):
        return args[-1], "[]"
    return None, ""


def _parse_doc(doc: str) -> tuple[str | None, str | None, str | None]:
    """``(dtype, shape, view_of)`` read off a field's description."""
    dtype = shape = None
    found = _DTYPE_SHAPE.match(doc)
    if found:
        shape = found["shape"]
        written = found["dtype"] or found["after"]
        dtype = _DTYPE_NAMES.get(written, written) if written else None
    view = _VIEW.search(doc)
    view_of = view["what"].strip().strip("`").strip() if view else None
    return dtype, shape, view_of


def _default(f: dataclasses.Field[Any]) -> str | None:
    if f.default is not dataclasses.MISSING:
        return repr(f.default)
    if f.default_factory is not dataclasses.MISSING:
        return f"{getattr(f.default_factory, '__name__', 'factory')}()"
    return None


def describe_dataclass(cls: type, prefix: str = "", within: tuple[type, ...] = ()) -> ContractDoc:
    """``cls``'s fields, then its properties, nested dataclasses expanded (once per path)."""
    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # unresolvable names: the annotations as written
        hints = {}
    notes = source_notes(cls)
    rows: list[FieldDoc] = []
    for f in dataclasses.fields(cls):
        annotation = notes.annotations.get(f.name) or (
            f.type if isinstance(f.type, str) else _type_name(f.type)
        )
        tp = hints.get(f.name)
        doc = notes.docs.get(f.name, "")
        dtype, shape, view_of = _parse_doc(doc)
        row = FieldDoc(
            name=f"{prefix}{f.name}",
            type=_type_name(tp) if tp is not None else annotation,
            annotation=annotation,
            doc=doc,
            note=notes.notes.get(f.name, ""),
            dtype=dtype,
            shape=shape,
            view_of=view_of,
            default=_default(f),
        )
        inner, suffix = _nested(tp)
        if inner is not None and inner not in within:  # a class holding itself stops here
            row.fields = describe_dataclass(inner, f"{row.name}{suffix}.", (*within, cls)).fields
        rows.append(row)
    for name, member in inspect.getmembers(cls, lambda m: isinstance(m, property)):
        if name.startswith("_"):
            continue
        doc = inspect.cleandoc(member.__doc__ or "").split("\n\n")[0].replace("\n", " ")
        returns = _hints(member.fget).get("return")
        written = notes.annotations.get(name, "")
        dtype, shape, view_of = _parse_doc(doc)
        rows.append(
            FieldDoc(
                name=f"{prefix}{name}",
                type=_type_name(returns) if returns is not None else written,
                annotation=written,
                doc=doc,
                dtype=dtype,
                shape=shape,
                view_of=view_of,
                is_property=True,
            )
        )
    return ContractDoc(cls, rows)


def flat_fields(contract: ContractDoc | None) -> list[FieldDoc]:
    """Every field of ``contract``, nested ones after the field that holds them."""
    return [row for f in contract.fields for row in f.flat()] if contract else []


def defined_symbols(rows: list[FieldDoc]) -> dict[str, str]:
    """``symbol -> field``: the integers whose description starts with the symbol they stand
    for (``num_decodes: int  # B``), the first field of each symbol."""
    out: dict[str, str] = {}
    for row in rows:
        found = _SYMBOL.match(row.doc)
        if found and row.type in ("int", "int | None") and found["symbol"] not in ("A", "I"):
            out.setdefault(found["symbol"], row.name)
    return out


def prose(doc: str) -> str:
    """A description without the dtype and shape it starts with (read into their own fields)."""
    found = _DTYPE_SHAPE.match(doc)
    rest = doc[found.end() :] if found else doc
    return rest.lstrip(" ,;:")
