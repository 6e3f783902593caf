"""A campaign spends its budget first on giving every run a verdict.

Each unit gets a share of the time left; a slow target (draft-block-tables
judges about 15 examples a second here) used to end its share short of the
example floor, INCOMPLETE, while faster units finished early. A shard now
goes on past its share until it reaches its part of the floor, up to the
campaign's own deadline.
"""

from __future__ import annotations

import pytest
from attnfuzz.harness.campaign.budget import shard_floor, share_spent

SHARE, END = 100.0, 200.0


@pytest.mark.parametrize(
    "now, examples, found, spent",
    [
        (50.0, 0, False, False),  # inside its share
        (150.0, 199, False, False),  # past its share, short of the floor: goes on
        (150.0, 200, False, True),  # past its share, floor reached
        (150.0, 3, True, True),  # a finding is a verdict at any count
        (200.0, 10, False, True),  # the campaign's deadline is hard
    ],
)
def test_a_share_is_soft_below_the_floor(now, examples, found, spent):
    assert share_spent(now, SHARE, END, examples, 200, found) is spent


def test_without_a_budget_nothing_is_spent():
    assert share_spent(1e9, None, None, 0, 200, False) is False


def test_each_shard_carries_its_part_of_the_floor_and_a_capped_run_none():
    items = [{"unit": 0, "max_examples": None}, {"unit": 0, "max_examples": None}]
    plan = {"items": items + [{"unit": 1, "max_examples": None}], "min_examples": 201}
    assert shard_floor(plan, items[0]) == 101
    assert shard_floor(plan, plan["items"][2]) == 201
    assert shard_floor(plan, {"unit": 0, "max_examples": 50}) == 0


@pytest.mark.slow
def test_without_a_budget_asked_for_every_run_judges_its_floor(tmp_path, monkeypatch, capsys):
    """The profile's default budget is a target, not a limit: here 1 s, less than the
    workers take to start, and still each run judges its floor: the verdict does not
    depend on the machine's speed. Asked for, the same budget is a limit: no verdict."""
    import dataclasses
    import json

    from attnfuzz.harness.campaign import worker as campaign_worker
    from attnfuzz.harness.cli import main

    dev = campaign_worker.PROFILES["dev"]
    monkeypatch.setitem(campaign_worker.PROFILES, "dev", dataclasses.replace(dev, budget_s=1.0))
    args = ["campaign", "--targets", "mtp-seq-lens", "--profile", "dev", "--min-examples", "30",
            "-n", "1", "--db", str(tmp_path / "db")]  # fmt: skip
    assert main([*args, "--out", str(tmp_path / "soft")]) == 0
    assert "budget 1s (each run judges its floor first)" in capsys.readouterr().out
    (run,) = json.loads((tmp_path / "soft" / "campaign.json").read_text())["runs"]
    assert run["examples"] >= 30 and run["status"] == "pass"
    assert main([*args, "--budget", "1", "--out", str(tmp_path / "hard")]) == 3
