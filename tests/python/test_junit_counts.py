"""The closing line of scripts/test.sh (scripts/junit_counts.py) counts every runner's JUnit
report and can never say '0 failed' on a failing run: a failure inside a report, a runner that
exited non-zero outside any test, a missing report and a failing script that ran several runners
each count."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

# No native code of its own: it runs a Python script on JUnit files; the sanitized run
# (scripts/sanitize.sh) leaves it out.
pytestmark = pytest.mark.pure_python

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "junit_counts.py"


def _report(path: Path, tests: int, failures: int = 0, skipped: int = 0) -> str:
    path.write_text(
        f'<testsuites><testsuite name="s" tests="{tests}" failures="{failures}" errors="0" '
        f'skipped="{skipped}"/></testsuites>'
    )
    return str(path)


def _counts(*arguments: str) -> tuple[int, list[str]]:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *arguments], capture_output=True, text=True, check=False
    )
    return done.returncode, done.stdout.strip().splitlines()


def test_passing_runners_sum_into_the_closing_line(tmp_path):
    a = _report(tmp_path / "a.xml", tests=5, skipped=1)
    b = _report(tmp_path / "b.xml", tests=3)
    code, lines = _counts("--runner", "ctest", "0", a, "--runner", "fuzz", "0", b)
    assert code == 0
    assert lines == [
        "ctest: 4 passed, 0 failed, 1 skipped",
        "fuzz: 3 passed, 0 failed, 0 skipped",
        "total: 7 passed, 0 failed, 1 skipped",
    ]


def test_a_failure_in_a_report_fails_the_total(tmp_path):
    a = _report(tmp_path / "a.xml", tests=4, failures=2)
    code, lines = _counts("--runner", "pytest", "1", a)
    assert code == 1
    assert lines[-1] == "total: 2 passed, 2 failed, 0 skipped"


def test_a_runner_that_failed_outside_any_test_counts_one_failure(tmp_path):
    a = _report(tmp_path / "a.xml", tests=4)
    code, lines = _counts("--runner", "pytest", "2", a)
    assert code == 1
    assert "exit 2 outside any test" in lines[0]
    assert lines[-1] == "total: 4 passed, 1 failed, 0 skipped"


def test_pytest_collecting_nothing_is_not_a_failure(tmp_path):
    a = _report(tmp_path / "a.xml", tests=0)
    code, lines = _counts("--runner", "pytest", "5", a)
    assert code == 0
    assert lines[-1] == "total: 0 passed, 0 failed, 0 skipped"


def test_a_missing_report_is_a_failure_even_with_exit_code_zero(tmp_path):
    code, lines = _counts("--runner", "fuzz", "0", str(tmp_path / "never-written.xml"))
    assert code == 1
    assert "no report: never-written.xml" in lines[0]
    assert lines[-1] == "total: 0 passed, 1 failed, 0 skipped"


def test_a_failing_script_with_clean_reports_is_one_failure(tmp_path):
    a = _report(tmp_path / "a.xml", tests=2)
    code, lines = _counts("--runner", "fuzz", "0", a, "--overall", "sanitize.sh", "1")
    assert code == 1
    assert lines[-1] == "total: 2 passed, 1 failed, 0 skipped"


def test_a_failing_script_whose_failure_is_counted_is_not_counted_twice(tmp_path):
    a = _report(tmp_path / "a.xml", tests=2, failures=1)
    code, lines = _counts("--runner", "fuzz", "0", a, "--overall", "sanitize.sh", "1")
    assert code == 1
    assert lines[-1] == "total: 1 passed, 1 failed, 0 skipped"
