"""The pytest plugin a campaign runs under: work units as pytest items.

``attnfuzz campaign`` starts ``pytest <scratch>/plan.json -p
attnfuzz.harness.campaign.plugin -n N``; this plugin collects the plan as one
item per work unit (target x implementation x shard), and pytest-xdist
shares them among N worker processes. An item runs
:func:`attnfuzz.harness.campaign.worker.run_item`; findings are not test
failures (they are the campaign's output, kept on disk); an item fails only
when the harness could not go on.

In the xdist controller the plugin marks an item whose worker died while
running it (``crashed/<id>``): the controller of the campaign turns that
item's in-flight case into a ``crash`` finding.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from attnfuzz.harness.lifetime import die_with_parent

_config: pytest.Config | None = None

# The pid of the pytest run's controller, for its workers: the parent each dies with.
CONTROLLER_PID = "ATTNFUZZ_CAMPAIGN_CONTROLLER_PID"


def pytest_configure(config: pytest.Config) -> None:
    global _config
    _config = config
    if not hasattr(config, "workerinput"):  # the controller: its workers start after this
        os.environ[CONTROLLER_PID] = str(os.getpid())
        return
    # An xdist worker. Its controller killed, nothing else would stop it mid-unit.
    die_with_parent(int(os.environ.get(CONTROLLER_PID, os.getppid())))
    import torch

    torch.set_num_threads(1)  # examples are tiny tensors
    # The first assert_close imports torch.distributed.tensor (half a second,
    # more on a busy machine): not something a per-example timeout should time.
    torch.testing.assert_close(torch.zeros(1), torch.zeros(1))


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    from attnfuzz.harness.campaign.worker import PLAN

    if file_path.name == PLAN:
        return PlanFile.from_parent(parent, path=file_path)
    return None


class PlanFile(pytest.File):
    """The campaign's plan: one item per work unit."""

    def collect(self) -> Iterator[pytest.Item]:
        plan = json.loads(self.path.read_text())
        for item in plan["items"]:
            yield UnitItem.from_parent(self, name=item["id"], plan=plan, spec=item)


class UnitItem(pytest.Item):
    def __init__(self, *, plan: dict[str, Any], spec: dict[str, Any], **kwargs: Any):
        super().__init__(**kwargs)
        self.plan, self.spec = plan, spec

    def runtest(self) -> None:
        from attnfuzz.harness.campaign.worker import run_item

        run_item(self.path.parent, self.plan, self.spec)

    def reportinfo(self) -> tuple[Path, int, str]:
        s = self.spec
        return self.path, 0, f"{s['target']} / {s['impl']} (shard {s['shard']})"


@pytest.hookimpl(optionalhook=True)
def pytest_handlecrashitem(crashitem: str, report: pytest.TestReport, sched: Any) -> None:
    """xdist says the worker running ``crashitem`` died: leave a mark for the controller."""
    if _config is None:
        return
    item_id = crashitem.rsplit("::", 1)[-1]
    marker = _config.rootpath / "crashed" / item_id
    marker.parent.mkdir(exist_ok=True)
    marker.touch()
