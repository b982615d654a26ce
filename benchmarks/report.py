"""Where a benchmark's figures go: its report as JSON and as Markdown beside it (benchmarks/results/)."""

import json
from pathlib import Path


def write_report(out: Path, report: dict, text: str) -> None:
    """The report as JSON at `out` and its Markdown `text` beside it (.md), which is also printed."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    out.with_suffix(".md").write_text(text)
    print(text)
