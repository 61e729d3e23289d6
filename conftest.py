"""For every pytest run in this repository: a closing table of where the time went, per file.

pytest's own ``--durations`` lists single tests (or single notebook cells); a notebook's cost is the
sum of its cells and a module's the sum of its tests and fixtures, which is what one looks at when
a test run grows. The table lists the files that took the most time, setup and teardown included.
"""
from __future__ import annotations

from collections import defaultdict

SHOWN = 15


def pytest_terminal_summary(terminalreporter):
    per_file = defaultdict(float)
    for reports in terminalreporter.stats.values():
        for report in reports:
            duration = getattr(report, "duration", None)
            nodeid = getattr(report, "nodeid", "")
            if duration is None or not nodeid or getattr(report, "when", None) is None:
                continue
            per_file[nodeid.split("::")[0]] += duration
    if not per_file:
        return
    total = sum(per_file.values())
    terminalreporter.write_sep("=", f"time per file (the {min(SHOWN, len(per_file))} slowest of {len(per_file)})")
    for path, seconds in sorted(per_file.items(), key=lambda kv: -kv[1])[:SHOWN]:
        terminalreporter.write_line(f"{seconds:8.1f} s  {100 * seconds / total:5.1f} %  {path}")
    terminalreporter.write_line(f"{total:8.1f} s  in all")
