"""A work unit's share of the campaign's time budget.

Each unit (an item of the campaign's pytest run) gets a share of what is left
of the budget when it starts (:func:`item_deadline`); the share is soft below
the unit's part of its run's example floor (:func:`share_spent`), so that the
budget gives every run a verdict before it gives any run more examples.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any


def item_deadline(scratch: Path, plan: dict[str, Any], item: dict[str, Any]) -> float | None:
    """This unit's share of what is left of the budget.

    With ``k`` units not yet started (this one included) on ``N`` workers, each
    worker has about ``ceil(k / N)`` units to go: this one gets that fraction
    of the time left, so that every worker stays busy until the deadline even
    when units end early (a crash, a caught mutant).
    """
    marker = scratch / "started" / item["id"]
    marker.touch()
    deadline = plan["deadline"]
    if deadline is None:
        return None
    started = sum(1 for _ in marker.parent.iterdir())
    left = max(1, len(plan["items"]) - started + 1)
    now = time.time()
    share = (deadline - now) / math.ceil(left / plan["workers"])
    return min(deadline, now + max(share, 0.0))


def shard_floor(plan: dict[str, Any], item: dict[str, Any]) -> int:
    """This shard's part of its run's example floor (none for a run capped by --max-examples)."""
    if item["max_examples"] is not None:
        return 0
    shards = sum(1 for other in plan["items"] if other["unit"] == item["unit"])
    return -(-plan.get("min_examples", 0) // shards)


def share_spent(
    now: float,
    share_deadline: float | None,
    campaign_deadline: float | None,
    examples: int,
    floor: int,
    found: bool,
) -> bool:
    """Whether a shard stops: its share of the budget is soft below its floor.

    A shard that found nothing short of its floor goes on past its share (the
    units after it get what is left, see :func:`item_deadline`), up to the
    campaign's own deadline: the budget is spent first on giving every run a
    verdict, and a slow target is not left INCOMPLETE while fast ones idle.
    """
    if share_deadline is None or now < share_deadline:
        return False
    if campaign_deadline is not None and now >= campaign_deadline:
        return True
    return examples >= floor or found
