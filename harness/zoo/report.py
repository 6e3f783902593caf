"""The zoo's results: the scoreboard (Markdown), ``zoo.json``, ``zoo.md`` and the exit status."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from attnfuzz.harness.definitions import (
    CAMPAIGN_FAIL,
    CAMPAIGN_INCOMPLETE,
    CAMPAIGN_PASS,
    EXIT_FOUND,
    EXIT_INCOMPLETE,
    EXIT_OK,
    INCOMPLETE,
    SURVIVED,
    ZOO_SCHEMA,
    markdown_table,
)
from attnfuzz.harness.zoo.scores import COLUMNS, TIME_COLUMNS, MutantScore


def scoreboard(scores: Sequence[MutantScore], *, times: bool = True) -> str:
    """The scoreboard; without ``times``, no wall-clock column: the same table every run
    of a zoo whose seeds are counted in examples (``--max-examples``)."""
    keep = [i for i, c in enumerate(COLUMNS) if times or c not in TIME_COLUMNS]
    rows = [[row[i] for i in keep] for row in (s.row() for s in scores)]
    return markdown_table([COLUMNS[i] for i in keep], rows)


# What the scoreboard's columns count, printed under it wherever it is shown.
LEGEND = (
    "detected: seeds that found the mutant. reached / triggered: search examples, up to "
    "each seed's first detection, that run the code the bug lives in / meet the bug's "
    "condition, of all examples searched. median / worst ex (s): examples (wall-clock "
    "time) to the first detection, a miss counting as infinite. reported case (worst): the size "
    "of the worst seed's reported case (req requests, tok tokens, next_n, len "
    "max_model_len; (cut): its shrinking was cut); smallest by hand: the smallest "
    "trigger derived by hand; gap: reported minus by hand, per field (negative: the "
    "shrinker traded that field for another, or the hand-derived trigger is not the "
    "smallest there). meets trigger: reported cases that meet the bug's condition."
)


def survivors(scores: Sequence[MutantScore]) -> list[MutantScore]:
    """Mutants some seed of the attnfuzz arm searched to the floor and missed."""
    return [s for s in scores if s.arm == "attnfuzz" and s.status == SURVIVED]


def incomplete(scores: Sequence[MutantScore]) -> list[MutantScore]:
    """Mutants of the attnfuzz arm whose every miss was cut short of the floor."""
    return [s for s in scores if s.arm == "attnfuzz" and s.status == INCOMPLETE]


def exit_status(scores: Sequence[MutantScore]) -> int:
    """1 if a mutant survived; else 3 if one is incomplete (no verdict); else 0."""
    if survivors(scores):
        return EXIT_FOUND
    return EXIT_INCOMPLETE if incomplete(scores) else EXIT_OK


def zoo_verdict(scores: Sequence[MutantScore]) -> str:
    """The whole zoo's word, as a campaign's: ``FAIL``, ``INCOMPLETE`` or ``PASS``."""
    return {EXIT_FOUND: CAMPAIGN_FAIL, EXIT_INCOMPLETE: CAMPAIGN_INCOMPLETE}.get(
        exit_status(scores), CAMPAIGN_PASS
    )


def budget_line(
    seeds: int, budget_s: float | None, max_examples: int | None, min_examples: int
) -> str:
    """``5 seeds, 10 s budget per mutant and seed, floor 200 examples``."""
    parts = [f"{seeds} seeds"]
    if budget_s is not None:
        parts.append(f"{budget_s:g} s budget per mutant and seed")
    if max_examples is not None:
        parts.append(f"{max_examples} examples per mutant and seed")
    parts.append(f"floor {min_examples} examples")
    return ", ".join(parts)


def verdict_lines(scores: Sequence[MutantScore]) -> list[str]:
    """The console's last lines: survivors, then incomplete mutants, or all killed."""
    lost, cut = survivors(scores), incomplete(scores)
    lines = []
    if lost:
        lines.append(
            "SURVIVED: "
            + ", ".join(f"{s.target}/{s.mutant} ({s.found}/{len(s.runs)})" for s in lost)
        )
    if cut:
        lines.append(
            f"{INCOMPLETE}: "
            + ", ".join(
                f"{s.target}/{s.mutant} ({s.found}/{len(s.runs)} detected; "
                + "; ".join(f"seed {r.seed}: {r.why_incomplete()}" for r in s.incomplete_runs)
                + ")"
                for s in cut
            )
        )
    if not lost and not cut:
        lines.append(f"every mutant killed in every seed ({len(scores)} mutants)")
    return lines


def write_reports(
    scores: Sequence[MutantScore],
    out: Path,
    *,
    seeds: int,
    budget_s: float | None,
    device: str,
    max_examples: int | None = None,
    min_examples: int = 0,
    interrupted: bool = False,
) -> tuple[Path, Path]:
    """``zoo.json`` (every run, every case) and ``zoo.md`` (the scoreboard) in ``out``.

    With ``max_examples`` the scoreboard leaves out its wall-clock columns (see
    :func:`scoreboard`); ``zoo.json`` keeps every seed's seconds."""
    from attnfuzz.harness.casefile import environment

    out.mkdir(parents=True, exist_ok=True)
    doc = {
        "schema": ZOO_SCHEMA,
        "seeds": seeds,
        "budget_s": budget_s,
        "max_examples": max_examples,
        "min_examples": min_examples,
        "verdict": zoo_verdict(scores),
        "interrupted": interrupted,  # Ctrl-C or SIGTERM: the mutants after it never ran
        "environment": environment(device),
        "mutants": [s.to_dict() for s in scores],
    }
    json_path, md_path = out / "zoo.json", out / "zoo.md"
    json_path.write_text(json.dumps(doc, indent=2) + "\n")
    board = scoreboard(scores, times=max_examples is None)
    stopped = (
        "\n\n**Interrupted**: the mutants after the last row never ran." if interrupted else ""
    )
    md_path.write_text(
        f"# Bug zoo\n\n{budget_line(seeds, budget_s, max_examples, min_examples)}, "
        f"device {device}.{stopped}\n\n{board}\n\n{LEGEND}\n\n"
        + "\n".join(verdict_lines(scores))
        + "\n"
    )
    return json_path, md_path
