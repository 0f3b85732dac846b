#!/usr/bin/env bash
# Why this exists: the one command that runs every graphed test: it sets up (scripts/setup.sh
# --tests: one CMake build, packed as a wheel and pip-installed into .venv), runs the
# GoogleTest suites through ctest from the wheel's build dir and the Python suite through pytest
# against the installed package, prints each runner's counts and a combined closing line, and
# exits non-zero if either runner failed. It also runs scripts/sanitize.sh (ASan+UBSan, a fuzz run).
# CI runs it through .ci/run. Extra arguments go to pytest (for example -k NAME or -m gpu).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD

bash scripts/setup.sh --tests

# -- the installed package -----------------------------------------------------------------------
# setup.sh installed the wheel into .venv with pip, as a user would into theirs. One virtualenv on
# purpose: a CUDA build of torch takes about 5.5 GB, and a second copy of it once filled CI's disk.
VENV=$ROOT/.venv

# From here on the cwd is build/, where no graphed source is importable: `import graphed` must
# find the installed one.
cd "$ROOT/build"
"$VENV/bin/python" - "$VENV" <<'EOF'
import sys
from pathlib import Path

import graphed

where = Path(graphed.__file__).resolve()
if not where.is_relative_to(Path(sys.argv[1]).resolve()):
    raise SystemExit(f"[test] error: graphed was imported from {where}, not .venv")
print(f"[test] graphed {graphed.__version__} from .venv; backend {graphed.backend()[0]}")
EOF

reports=$ROOT/build/test-reports
rm -rf "$reports"
mkdir -p "$reports"

status=0

echo
echo "== GoogleTest (ctest) =="
ctest_rc=0
ctest --test-dir "$ROOT/build/wheel" --output-on-failure --timeout 300 -j2 \
  --output-junit "$reports/ctest.xml" || ctest_rc=$?
if ((ctest_rc != 0)); then
  status=1
fi

echo
echo "== pytest =="
pytest_rc=0
GRAPHED_EXPECT_INSTALLED=1 "$VENV/bin/python" -m pytest "$ROOT/tests/python" \
  --rootdir "$ROOT" -c "$ROOT/pyproject.toml" -p no:cacheprovider -v -rs \
  --junitxml="$reports/pytest.xml" "$@" || pytest_rc=$?
if ((pytest_rc == 5)); then
  echo "[test] pytest collected no tests"
elif ((pytest_rc != 0)); then
  status=1
fi

# The core, the op tests and the Python suite again under ASan+UBSan, and a short fuzz run.
echo
echo "== sanitizers and fuzzing =="
sanitize_rc=0
(cd "$ROOT" && bash scripts/sanitize.sh 60) || sanitize_rc=$?
if ((sanitize_rc != 0)); then
  status=1
fi

# The counts, read from the runners' JUnit reports.
echo
"$VENV/bin/python" - "$reports/ctest.xml" "$reports/pytest.xml" "$ctest_rc" "$pytest_rc" <<'EOF'
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def counts(path):
    """(passed, failed, skipped) summed over the report's test suites, or None."""
    if not Path(path).is_file():
        return None
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else root.iter("testsuite")
    total = failed = skipped = 0
    for suite in suites:
        total += int(suite.get("tests", 0))
        failed += int(suite.get("failures", 0)) + int(suite.get("errors", 0))
        skipped += int(suite.get("skipped", 0)) + int(suite.get("disabled", 0))
    return total - failed - skipped, failed, skipped


totals = [0, 0, 0]
runs = (("GoogleTest", sys.argv[1], sys.argv[3]), ("pytest", sys.argv[2], sys.argv[4]))
for label, path, rc in runs:
    found = counts(path)
    if found is None:
        print(f"{label}: no report (exit {rc})")
        totals[1] += 1 if rc != "0" else 0
        continue
    passed, failed, skipped = found
    if failed == 0 and rc not in ("0", "5"):
        failed = 1  # the runner failed outside any test (a crash, a collection error)
    print(f"{label}: {passed} passed, {failed} failed, {skipped} skipped")
    totals = [a + b for a, b in zip(totals, (passed, failed, skipped))]
print(f"total: {totals[0]} passed, {totals[1]} failed, {totals[2]} skipped")
EOF

exit "$status"
