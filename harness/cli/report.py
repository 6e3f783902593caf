"""``attnfuzz report``: the regression report of a campaign against a baseline."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "regression report: baseline vs current campaign"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--baseline", type=Path, required=True, help="OLD/campaign.json")
    p.add_argument("--current", type=Path, required=True, help="NEW/campaign.json")
    p.add_argument("--out", type=Path, default=None, help="directory (default: NEW's)")


def command(args: argparse.Namespace) -> int:
    from attnfuzz.reports.regression import main_report

    return main_report(args.baseline, args.current, args.out)
