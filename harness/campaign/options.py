"""What a campaign is asked to do: plain values (the command line builds them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from attnfuzz.harness.definitions import DEFAULT_DB, DEFAULT_MIN_EXAMPLES, DEFAULT_OUT


@dataclass
class Options:
    """A campaign's settings; ``None`` means the profile's (or every target's) default."""

    targets: list[str] | None = None
    impls: list[str] | None = None
    zoo: bool = False
    budget_s: float | None = None
    max_examples: int | None = None
    min_examples: int = DEFAULT_MIN_EXAMPLES  # the floor of a pass or a survivor, per run
    workers: int = 1
    database: str = str(DEFAULT_DB)  # --db takes a directory or a URL: a string
    out: Path = DEFAULT_OUT
    seed: int | None = None
    profile: str | None = None
    example_timeout_s: float | None = None
    scale: str = "small"
    device: str | None = None
    quiet: bool = False
    # Fuzz every selected implementation with traces of one engine's steps (one that
    # lives across steps, ``Implementation.traced``, always is).
    trace: bool = False
    # MODULE[:ATTRIBUTE] specs of a user's mutants (registry.add_mutants): registered
    # here and in every worker, and run on the selected targets
    mutants: list[str] = field(default_factory=list)
