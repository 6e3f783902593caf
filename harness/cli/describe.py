"""``attnfuzz describe TARGET``: what an implementation receives and what it returns.

An implementation of a target is ``fn(inputs) -> outputs``; both are dataclasses
of the target's reference module, read by ``harness/contract.py`` (their fields,
types, dtypes, shapes, symbols and views, from the type hints and the source's
comments). This command prints them: a table per dataclass, or ``--json``.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

# `name as name` (and source_notes): importable from here still (contract.py's now).
from attnfuzz.harness.contract import FieldDoc as FieldDoc
from attnfuzz.harness.contract import describe_dataclass as describe_dataclass
from attnfuzz.harness.contract import prose
from attnfuzz.harness.contract import source_notes as source_notes
from attnfuzz.harness.definitions import EXIT_OK

HELP = "what an implementation of a target receives and returns"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", metavar="TARGET", help="a target's name (attnfuzz list)")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def command(args: argparse.Namespace) -> int:
    from attnfuzz.harness import catalogue

    # attnfuzz's own target as the catalogue keeps it (no torch), else built.
    contract = catalogue.described(args.target)
    if contract is None:
        from attnfuzz.harness.registry import get_target

        # An unknown name: UsageError, one line, exit 2.
        contract = catalogue.contract_document(get_target(args.target))
    if args.json:
        print(json.dumps(contract["json"], indent=2))
        return EXIT_OK
    _print_text(contract)
    return EXIT_OK


# ---------------------------------------------------------------------------
# Text
# ---------------------------------------------------------------------------


def _flat(field: dict[str, Any]) -> list[dict[str, Any]]:
    """A field of a contract's ``to_json``, then its nested dataclass's, as printed."""
    return [field, *(row for f in field["fields"] for row in _flat(f))]


def _contract_table(contract: dict[str, Any]) -> Any:
    from rich.table import Table
    from rich.text import Text

    table = Table(box=None, pad_edge=False, padding=(0, 1), header_style="bold")
    table.add_column("field", no_wrap=True)
    table.add_column("type")
    table.add_column("dtype", no_wrap=True)
    table.add_column("shape")
    table.add_column("description", ratio=1)
    for row in contract["fields"]:
        for f in _flat(row):
            if f["note"]:  # a comment above the field in the source, printed where it stands
                table.add_row("", "", "", "", Text(f"# {f['note']}", style="dim italic"))
            kind = f"{f['type']} (property)" if f["is_property"] else f["type"]
            description = prose(f["doc"])
            if f["default"] is not None:
                description = f"{description} (default {f['default']})".lstrip()
            table.add_row(
                Text(f["name"]), Text(kind), Text(f["dtype"] or ""), Text(f["shape"] or ""),
                Text(description),
            )  # fmt: skip
    return table


def _print_text(contract: dict[str, Any]) -> None:
    """``contract`` (:func:`~attnfuzz.harness.catalogue.contract_document`) as tables."""
    from attnfuzz.harness.cli.listing import show
    from rich.text import Text

    doc, classes = contract["json"], contract["classes"]
    name, summary = doc["target"], doc["summary"]
    module = classes["module"]
    where = f", from {module}" if module else ""
    graph = (
        "yes: the call is replayed in a CUDA graph and may not allocate (checked: an "
        "allocation during the call is a finding)"
        if doc["graph_safe"]
        else "no: allocations during the call are not checked"
    )
    inputs_name, outputs_name = classes["inputs"] or "?", classes["outputs"] or "?"
    parts: list[Any] = [
        Text(f"{name}: {summary}", style="bold"),
        Text(f"implementation: fn(inputs: {inputs_name}) -> {outputs_name}{where}"),
        Text(f"  attnfuzz run --target {name} --impl module:attribute"),
        Text(f"float dtypes: {', '.join(doc['dtypes'])} (ATTNFUZZ_DTYPE picks another)"),
        Text(f"graph-safe call: {graph}"),
    ]
    symbols = doc["symbols"]
    if symbols:
        defined = ", ".join(f"{s} = {field_name}" for s, field_name in symbols.items())
        parts.append(Text(f"symbols: {defined}"))
    for title, what in (
        ("inputs", "make_inputs declares no dataclass it returns"),
        ("outputs", "neither compare's got nor the reference declares a dataclass"),
    ):
        parts.append(Text(""))
        declared = doc[title]
        if declared is None:
            parts.append(Text(f"{title}: not declared ({what})"))
            continue
        parts.append(Text(f"{title}: {declared['class']}", style="bold"))
        if declared["doc"]:
            parts += [Text(declared["doc"]), Text("")]
        parts.append(_contract_table(declared))
    parts.append(Text(""))
    views = doc["views"]
    if views:
        listed = ", ".join(f"{field_name} (of {of})" for field_name, of in views.items())
        parts.append(Text(f"outputs that must be views of persistent memory: {listed}"))
    else:
        parts.append(Text("outputs that must be views of persistent memory: none documented"))
    show(*parts)
