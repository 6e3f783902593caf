"""The zoo's results: the scoreboard (Markdown), ``zoo.json`` and ``zoo.md``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from attnfuzz.harness.definitions import KILLED, ZOO_SCHEMA, markdown_table
from attnfuzz.harness.zoo.scores import COLUMNS, MutantScore


def scoreboard(scores: Sequence[MutantScore]) -> str:
    return markdown_table(COLUMNS, [s.row() for s in scores])


def survivors(scores: Sequence[MutantScore]) -> list[MutantScore]:
    return [s for s in scores if s.arm == "attnfuzz" and s.status != KILLED]


def write_reports(
    scores: Sequence[MutantScore], out: Path, *, seeds: int, budget_s: float, device: str
) -> tuple[Path, Path]:
    """``zoo.json`` (every run, every case) and ``zoo.md`` (the scoreboard) in ``out``."""
    from attnfuzz.harness.casefile import environment

    out.mkdir(parents=True, exist_ok=True)
    doc = {
        "schema": ZOO_SCHEMA,
        "seeds": seeds,
        "budget_s": budget_s,
        "environment": environment(device),
        "mutants": [s.to_dict() for s in scores],
    }
    json_path, md_path = out / "zoo.json", out / "zoo.md"
    json_path.write_text(json.dumps(doc, indent=2) + "\n")
    lost = survivors(scores)
    md_path.write_text(
        f"# Bug zoo\n\n{seeds} seeds, {budget_s:g} s budget per mutant and seed, "
        f"device {device}.\n\n{scoreboard(scores)}\n\n"
        + (
            f"Survived: {', '.join(f'{s.target}/{s.mutant}' for s in lost)}\n"
            if lost
            else "Every mutant killed in every seed.\n"
        )
    )
    return json_path, md_path
