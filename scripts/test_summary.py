"""The last lines of ``scripts/test.sh``: what each half of the suite ran, and each failure
with its half (the Slurm release) and the first line of its message, read from the halves'
JUnit XML reports (pytest ``--junitxml``). A CI log that keeps only its end still says which
test failed where, and why.

    python scripts/test_summary.py RESULTS_DIR

Each report is named ``unit.xml`` or ``integration-RELEASE.xml``; a missing or damaged one
is said in one line (its half did not finish). Stdlib only; never fails the run itself.
"""

from __future__ import annotations

import contextlib
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

_MAX_FAILURES = 20  # per half: the rest are counted


def _half(path: Path) -> str:
    name = path.stem
    return f"integration on Slurm {name.split('-', 1)[1]}" if "-" in name else name


def _first_line(text: str | None) -> str:
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    return line[:300]


def summarize(path: Path) -> list[str]:
    """The lines for one report."""
    half = _half(path)
    try:
        # pytest's own report, in the private folder test.sh made for this run (mktemp -d)
        root = ET.parse(path).getroot()  # noqa: S314
    except (OSError, ET.ParseError) as exc:
        return [f"{half}: no report ({type(exc).__name__}): it did not finish"]
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    seconds = 0.0
    for suite in suites:
        for key in counts:
            with contextlib.suppress(ValueError):
                counts[key] += int(suite.get(key, "0"))
        with contextlib.suppress(ValueError):
            seconds += float(suite.get("time", "0"))
    failed = counts["failures"] + counts["errors"]
    passed = counts["tests"] - failed - counts["skipped"]
    lines = [f"{half}: {passed} passed, {counts['skipped']} skipped, {failed} failed "
             f"({seconds:.0f} s)"]  # fmt: skip
    shown = 0
    for case in root.iter("testcase"):
        for kind, label in (("failure", "FAILED"), ("error", "ERROR")):
            found = case.find(kind)
            if found is None:
                continue
            shown += 1
            if shown <= _MAX_FAILURES:
                module = case.get("classname", "?").replace(".", "/")
                where = f"{module}.py::{case.get('name', '?')}"
                why = _first_line(found.get("message")) or _first_line(found.text)
                lines.append(f"  {label} {where}: {why}")
    if shown > _MAX_FAILURES:
        lines.append(f"  ... and {shown - _MAX_FAILURES} more")
    return lines


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python scripts/test_summary.py RESULTS_DIR", file=sys.stderr)
        return 2
    reports = sorted(Path(argv[0]).glob("*.xml"), key=lambda p: (p.stem != "unit", p.stem))
    print("== summary: each half of the suite ==")
    if not reports:
        print("no report: no half finished")
    for report in reports:
        for line in summarize(report):
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
