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

from attnfuzz.harness.contract import (
    ContractDoc,
    contract_classes,
    defined_symbols,
    describe_dataclass,
    flat_fields,
    prose,
)

# `name as name`: still importable from here (what describe reads is contract.py's now).
from attnfuzz.harness.contract import FieldDoc as FieldDoc
from attnfuzz.harness.contract import source_notes as source_notes
from attnfuzz.harness.definitions import EXIT_OK

HELP = "what an implementation of a target receives and returns"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", metavar="TARGET", help="a target's name (attnfuzz list)")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def command(args: argparse.Namespace) -> int:
    from attnfuzz.harness.registry import get_target

    target = get_target(args.target)  # an unknown name: UsageError, one line, exit 2
    inputs_cls, outputs_cls = contract_classes(target)
    inputs = describe_dataclass(inputs_cls) if inputs_cls is not None else None
    outputs = describe_dataclass(outputs_cls) if outputs_cls is not None else None
    views = [(f.name, f.view_of) for f in flat_fields(outputs) if f.view_of]
    symbols = defined_symbols([*flat_fields(inputs), *flat_fields(outputs)])
    if args.json:
        doc = {
            "target": target.name,
            "summary": target.summary,
            "graph_safe": target.graph_safe,
            "dtypes": target.dtype_names,
            "symbols": symbols,
            "inputs": inputs.to_json() if inputs else None,
            "outputs": outputs.to_json() if outputs else None,
            "views": dict(views),
        }
        print(json.dumps(doc, indent=2))
        return EXIT_OK
    _print_text(target, inputs, outputs, views, symbols)
    return EXIT_OK


# ---------------------------------------------------------------------------
# Text
# ---------------------------------------------------------------------------


def _contract_table(contract: ContractDoc) -> Any:
    from rich.table import Table
    from rich.text import Text

    table = Table(box=None, pad_edge=False, padding=(0, 1), header_style="bold")
    table.add_column("field", no_wrap=True)
    table.add_column("type")
    table.add_column("dtype", no_wrap=True)
    table.add_column("shape")
    table.add_column("description", ratio=1)
    for row in contract.fields:
        for f in row.flat():
            if f.note:  # a comment above the field in the source, printed where it stands
                table.add_row("", "", "", "", Text(f"# {f.note}", style="dim italic"))
            kind = f"{f.type} (property)" if f.is_property else f.type
            description = prose(f.doc)
            if f.default is not None:
                description = f"{description} (default {f.default})".lstrip()
            table.add_row(
                Text(f.name), Text(kind), Text(f.dtype or ""), Text(f.shape or ""),
                Text(description),
            )  # fmt: skip
    return table


def _print_text(
    target: Any,
    inputs: ContractDoc | None,
    outputs: ContractDoc | None,
    views: list[tuple[str, str | None]],
    symbols: dict[str, str],
) -> None:
    from attnfuzz.harness.cli.listing import show
    from rich.text import Text

    def name(contract: ContractDoc | None) -> str:
        return contract.cls.__name__ if contract else "?"

    module = inputs.cls.__module__ if inputs else outputs.cls.__module__ if outputs else None
    where = f", from {module}" if module else ""
    graph = (
        "yes: the call is replayed in a CUDA graph and may not allocate (checked: an "
        "allocation during the call is a finding)"
        if target.graph_safe
        else "no: allocations during the call are not checked"
    )
    parts: list[Any] = [
        Text(f"{target.name}: {target.summary}", style="bold"),
        Text(f"implementation: fn(inputs: {name(inputs)}) -> {name(outputs)}{where}"),
        Text(f"  attnfuzz run --target {target.name} --impl module:attribute"),
        Text(f"float dtypes: {', '.join(target.dtype_names)} (ATTNFUZZ_DTYPE picks another)"),
        Text(f"graph-safe call: {graph}"),
    ]
    if symbols:
        defined = ", ".join(f"{s} = {field_name}" for s, field_name in symbols.items())
        parts.append(Text(f"symbols: {defined}"))
    for title, contract, what in (
        ("inputs", inputs, "make_inputs declares no dataclass it returns"),
        ("outputs", outputs, "neither compare's got nor the reference declares a dataclass"),
    ):
        parts.append(Text(""))
        if contract is None:
            parts.append(Text(f"{title}: not declared ({what})"))
            continue
        parts.append(Text(f"{title}: {contract.qualified_name}", style="bold"))
        if contract.doc:
            parts += [Text(contract.doc), Text("")]
        parts.append(_contract_table(contract))
    parts.append(Text(""))
    if views:
        listed = ", ".join(f"{field_name} (of {of})" for field_name, of in views)
        parts.append(Text(f"outputs that must be views of persistent memory: {listed}"))
    else:
        parts.append(Text("outputs that must be views of persistent memory: none documented"))
    show(*parts)
