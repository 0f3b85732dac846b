#!/usr/bin/env bash
# Why this exists: the one command that runs every graphed test: it sets up (scripts/setup.sh
# --tests: one CMake build, packed as a wheel and pip-installed into .venv), runs the
# GoogleTest suites through ctest from the wheel's build dir and the Python suite through pytest
# against the installed package, prints each runner's counts and a combined closing line, and
# exits non-zero if any runner failed. The third-party tests run a second time on the newest
# transformers, diffusers and accelerate (.venv-newest), and part of the suite runs again against
# the newest torch graphed supports (its own build, .venv-torch-<version>). It also runs
# scripts/sanitize.sh
# (ASan+UBSan, a fuzz run), whose steps are counted in the closing line with the rest
# (scripts/junit_counts.py).
# CI runs it through .ci/run. Extra arguments go to pytest (for example -k NAME or -m gpu).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD

# Waits for background process $1 (what it does: $2, its log: $3), saying every 30 s, as setup.sh
# does, what it is still waiting for and, for a CMake build, how far it is ([done/all] steps);
# returns the process's exit status. $3 may be a folder (logs of several steps).
wait_saying() {
  local pid=$1 what=$2 logfile=$3 started=$SECONDS next=30 at rc=0
  while kill -0 "$pid" 2>/dev/null; do
    sleep 1
    if ((SECONDS - started >= next)) && kill -0 "$pid" 2>/dev/null; then
      at=$(grep -Eo '^\[[0-9]+/[0-9]+\]' "$logfile" 2>/dev/null | tail -n 1 || true)
      echo "[test] ... waiting for $what ($((SECONDS - started)) s${at:+, at $at};" \
        "log: ${logfile#"$ROOT"/})"
      next=$((next + 30))
    fi
  done
  wait "$pid" || rc=$?
  return "$rc"
}

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

# The sanitizer build (scripts/sanitize.sh's build phase) goes on in the background, at a lower
# priority, while pytest runs: most of pytest keeps one of the two cores busy, and the build's
# compiles take the other (about a minute and a half less on two cores). Its log is printed below.
sanitize_build_log=$ROOT/build/sanitize-build.log
mkdir -p "$ROOT/build/sanitize"
(cd "$ROOT" && SANITIZE_PHASE=build SANITIZE_REPORTS=$reports nice -n 10 bash scripts/sanitize.sh \
  >"$sanitize_build_log" 2>&1) &
sanitize_build_pid=$!

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

# The tests that drive transformers, diffusers and accelerate through their own call sites, again
# on the newest releases of the four (setup.sh's .venv-newest: those packages over .venv's torch
# and graphed), so that a release users install today is tested as well as the pins.
echo
echo "== pytest: third-party tests on the newest transformers, diffusers, accelerate, peft =="
THIRD_PARTY_TESTS=(test_generate.py test_generate_compiled.py test_third_party_models.py test_diffusers_pipelines.py
  test_changed_state.py test_owned_cache.py test_containers.py test_lora.py
  test_host_constant_models.py)
newest_rc=0
GRAPHED_EXPECT_INSTALLED=1 "$ROOT/.venv-newest/bin/python" -m pytest \
  "${THIRD_PARTY_TESTS[@]/#/$ROOT/tests/python/}" -m "not gpu" \
  --rootdir "$ROOT" -c "$ROOT/pyproject.toml" -p no:cacheprovider -q -rs \
  --junitxml="$reports/pytest-newest.xml" "$@" || newest_rc=$?
if ((newest_rc == 5)); then
  echo "[test] pytest (newest packages) collected no tests"
  newest_rc=0
elif ((newest_rc != 0)); then
  status=1
fi

# The newest torch graphed supports (setup.sh's NEWEST_TORCH, beside .venv's pinned one): graphed
# built against it as a user builds it (its own virtualenv and wheel; the nvcc of its CUDA
# release), then the GoogleTest suites and the Python tests of the core, the C entry, the install,
# the switches, regions and the module's watch (not the third-party models, whose packages are
# .venv's, nor the tests of hundreds of processes): about a fifth of pytest's time. The whole
# suite passes on it too; this keeps CI within its time.
echo
torch_newest=$(bash "$ROOT/scripts/setup.sh" --print-newest-torch)
echo "== the newest torch: $torch_newest (setup, build, ctest, part of pytest) =="
TORCH_NEWEST_TESTS=(test_install.py test_torch_pin.py test_graphed_cpu.py test_positional.py
  test_inputs.py test_runner_api.py test_switches.py test_tree.py test_walker.py test_first_call.py
  test_agreement.py test_changed_state.py test_verify_compare.py test_readme_use.py test_regions.py
  test_observe.py test_module_methods.py test_churn.py test_forward_host.py test_memory.py
  test_containers.py test_inventory.py test_compile.py test_sizes.py test_layering.py)
newest_torch_build=$ROOT/build/torch-$torch_newest/wheel
newest_torch_setup_rc=0
newest_torch_ctest_rc=0
newest_torch_pytest_rc=0
(cd "$ROOT" && GRAPHED_SETUP_TORCH=$torch_newest bash scripts/setup.sh) || newest_torch_setup_rc=$?
if ((newest_torch_setup_rc == 0)); then
  ctest --test-dir "$newest_torch_build" --output-on-failure --timeout 300 -j2 \
    --output-junit "$reports/ctest-torch-newest.xml" >"$reports/ctest-torch-newest.log" 2>&1 ||
    newest_torch_ctest_rc=$?
  grep -E "tests passed|tests failed|\*\*\*Failed|Errors while" "$reports/ctest-torch-newest.log" ||
    tail -n 20 "$reports/ctest-torch-newest.log"
  GRAPHED_EXPECT_INSTALLED=1 \
    GRAPHED_TESTING_PLUGIN=$newest_torch_build/tests/plugin/libgraphed_testing.so \
    "$ROOT/.venv-torch-$torch_newest/bin/python" -m pytest \
    "${TORCH_NEWEST_TESTS[@]/#/$ROOT/tests/python/}" -m "not gpu" \
    --rootdir "$ROOT" -c "$ROOT/pyproject.toml" -p no:cacheprovider -q -rs \
    --junitxml="$reports/pytest-torch-newest.xml" "$@" || newest_torch_pytest_rc=$?
  ((newest_torch_pytest_rc == 5)) && newest_torch_pytest_rc=0
else
  echo "[test] error: setting up torch $torch_newest failed (above); its tests did not run"
  newest_torch_ctest_rc=$newest_torch_setup_rc
  newest_torch_pytest_rc=$newest_torch_setup_rc
fi
if ((newest_torch_ctest_rc != 0 || newest_torch_pytest_rc != 0)); then
  status=1
fi

# The core, the op tests and the Python suite again under ASan+UBSan, and a short fuzz run.
echo
echo "== sanitizers and fuzzing =="
sanitize_rc=0
if kill -0 "$sanitize_build_pid" 2>/dev/null; then
  echo "[test] the sanitizer build (started before pytest) is still compiling; its tests follow"
fi
wait_saying "$sanitize_build_pid" "the sanitizer build" "$ROOT/build/sanitize/cmake.log" ||
  sanitize_rc=$?
cat "$sanitize_build_log"
if ((sanitize_rc == 0)); then
  # Its steps print their counts only when each ends: said every 30 s meanwhile.
  (cd "$ROOT" && SANITIZE_PHASE=run SANITIZE_REPORTS=$reports bash scripts/sanitize.sh 60) &
  wait_saying $! "the sanitized ctest, pytest and fuzz runs" "$ROOT/build/sanitize/" ||
    sanitize_rc=$?
fi
if ((sanitize_rc != 0)); then
  status=1
fi

# The counts of every runner, read from their JUnit reports (scripts/junit_counts.py): the closing
# line counts what ran and says a failure wherever a runner failed, inside a test or not.
echo
counts_rc=0
"$VENV/bin/python" "$ROOT/scripts/junit_counts.py" \
  --runner ctest "$ctest_rc" "$reports/ctest.xml" \
  --runner pytest "$pytest_rc" "$reports/pytest.xml" \
  --runner pytest-newest "$newest_rc" "$reports/pytest-newest.xml" \
  --runner "ctest-torch-$torch_newest" "$newest_torch_ctest_rc" "$reports/ctest-torch-newest.xml" \
  --runner "pytest-torch-$torch_newest" "$newest_torch_pytest_rc" \
  "$reports/pytest-torch-newest.xml" \
  --runner ctest-sanitized 0 "$reports/sanitized-ctest-core.xml" \
  "$reports/sanitized-ctest-ForwardOp.xml" \
  --runner pytest-sanitized 0 "$reports/sanitized-pytest.xml" \
  --runner fuzz 0 "$reports/sanitized-fuzz.xml" \
  --overall sanitize.sh "$sanitize_rc" || counts_rc=$?
if ((counts_rc != 0)); then
  status=1
fi

exit "$status"
