"""Why this exists: the closing line of scripts/test.sh. Every runner the test command runs (ctest,
pytest, the sanitized ctest and pytest, the fuzz run) leaves a JUnit report; this sums them into
one line a line per runner and a total, so that the counts match what ran and a failing run can
never close on '0 failed': a runner that exited non-zero while its reports show no failure (a
crash, a collection error, a build that never produced a report) counts as one failure of its
own.

Usage: junit_counts.py --runner LABEL EXIT_CODE [REPORT ...] [--runner ...]
                      [--overall LABEL EXIT_CODE]
Prints 'LABEL: N passed, N failed, N skipped' per runner and 'total: ...' last; exits 1 when
anything failed, else 0. --overall names a script that ran several of the runners (their reports
given with exit code 0): its non-zero exit with no failure counted anywhere is one failure.
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

# pytest's exit code when it collected no test: not a failure of the runner (its report says 0).
PYTEST_NO_TESTS = 5


def report_counts(path: Path) -> tuple[int, int, int]:
    """(passed, failed, skipped) summed over the test suites of one JUnit report."""
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    total = failed = skipped = 0
    for suite in suites:
        total += int(suite.get("tests", 0))
        failed += int(suite.get("failures", 0)) + int(suite.get("errors", 0))
        skipped += int(suite.get("skipped", 0)) + int(suite.get("disabled", 0))
    return total - failed - skipped, failed, skipped


def runner_counts(exit_code: int, reports: list[str]) -> tuple[int, int, int, str]:
    """One runner's counts over its reports, and a note where the exit code disagrees."""
    passed = failed = skipped = 0
    missing = []
    for report in reports:
        path = Path(report)
        if not path.is_file():
            missing.append(path.name)
            continue
        try:
            counts = report_counts(path)
        except ET.ParseError:
            missing.append(f"{path.name} (unreadable)")
            continue
        passed, failed, skipped = (
            a + b for a, b in zip((passed, failed, skipped), counts, strict=True)
        )
    note = f" (no report: {', '.join(missing)})" if missing else ""
    if failed == 0 and exit_code not in (0, PYTEST_NO_TESTS):
        failed = 1
        note += f" (exit {exit_code} outside any test)"
    elif failed == 0 and missing:
        failed = 1
    return passed, failed, skipped, note


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--runner",
        nargs="+",
        action="append",
        metavar="LABEL EXIT_CODE REPORT",
        required=True,
        help="a runner's label, its exit code and its JUnit reports",
    )
    parser.add_argument("--overall", nargs=2, action="append", default=[], metavar=("LABEL", "RC"))
    args = parser.parse_args(argv)
    totals = [0, 0, 0]
    for label, exit_code, *reports in args.runner:
        passed, failed, skipped, note = runner_counts(int(exit_code), reports)
        print(f"{label}: {passed} passed, {failed} failed, {skipped} skipped{note}")
        totals = [a + b for a, b in zip(totals, (passed, failed, skipped), strict=True)]
    for label, exit_code in args.overall:
        if int(exit_code) != 0 and totals[1] == 0:
            print(f"{label}: 0 passed, 1 failed, 0 skipped (exit {exit_code} outside any test)")
            totals[1] += 1
    print(f"total: {totals[0]} passed, {totals[1]} failed, {totals[2]} skipped")
    return 1 if totals[1] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
