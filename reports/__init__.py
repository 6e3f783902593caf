"""Campaign reports: JUnit XML, a Markdown summary, a self-contained HTML page.

:func:`write_reports` renders all three from a campaign document (see
:mod:`attnfuzz.reports.document`); :mod:`attnfuzz.reports.regression`
compares two campaigns.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from attnfuzz.reports.document import check_campaign, load_campaign
from attnfuzz.reports.html import report_html
from attnfuzz.reports.junit import junit_xml
from attnfuzz.reports.markdown import summary_markdown

__all__ = ["check_campaign", "load_campaign", "write_reports"]


def write_reports(campaign: Mapping[str, Any], out: Path) -> list[Path]:
    """Write ``junit.xml``, ``summary.md`` and ``report.html`` into ``out``; returns their paths.

    The campaign is checked first (a malformed one is a one-line
    :class:`~attnfuzz.harness.target.UsageError`), and each file is rendered
    completely before it is written.
    """
    check_campaign(campaign)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rendered = {
        "junit.xml": junit_xml(campaign),
        "summary.md": summary_markdown(campaign),
        "report.html": report_html(campaign),
    }
    paths = []
    for name, text in rendered.items():
        path = out / name
        path.write_text(text, encoding="utf-8")
        paths.append(path)
    return paths
