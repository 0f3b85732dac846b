#!/usr/bin/env bash
# Why this exists: the core, the operator tests and the plugin built with AddressSanitizer and
# UndefinedBehaviorSanitizer in a build of their own (a copy of the tree under build/sanitize/,
# installed into build/sanitize/site, apart from the wheel the tests use), then ctest and the
# Python suite on the emulated backend against that build, and a short libFuzzer run over
# the signature, the cache and the pools (tests/fuzz/). Prints 'N passed, N failed, N skipped'
# for each (ctest's and pytest's read from their JUnit reports by scripts/junit_counts.py, as the
# closing line of scripts/test.sh reads them), leaves a JUnit report per step in
# $SANITIZE_REPORTS (default build/sanitize/reports; the build and the fuzz run write a one-case
# report of their own, so scripts/test.sh counts every step) and exits non-zero if any failed.
# Usage: bash scripts/sanitize.sh [FUZZ_SECONDS (default 60)]
# SANITIZE_PHASE=build copies the tree and builds only (exit status: the build's); =run runs on the
# build a build phase left (scripts/test.sh builds while the plain pytest runs, whose tests mostly
# keep one of two cores busy, then runs); unset or =all does both.
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
FUZZ_SECONDS=${1:-60}
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
OUT=${SANITIZE_DIR:-$ROOT/build/sanitize}
SRC=$OUT/src
REPORTS=${SANITIZE_REPORTS:-$OUT/reports}
PHASE=${SANITIZE_PHASE:-all}
case $PHASE in all | build | run) ;; *)
  echo "SANITIZE_PHASE must be build, run or all, got '$PHASE'" >&2
  exit 2
  ;;
esac
status=0
mkdir -p "$REPORTS"
if [[ $PHASE != run ]]; then
  rm -f "$REPORTS"/sanitized-*.xml
fi

# A JUnit report of one case for a step that is not a test runner (the build, the fuzz run).
one_case_report() {
  local file=$1 name=$2 failed=$3 message=${4:-}
  local failure=""
  ((failed)) && failure="<failure message=\"${message//\"/&quot;}\"/>"
  printf '<testsuite name="%s" tests="1" failures="%s"><testcase name="%s">%s</testcase></testsuite>\n' \
    "$name" "$failed" "$name" "$failure" >"$file"
}

# One runner's 'LABEL: N passed, N failed, N skipped' from its exit code and JUnit reports, counted
# as the closing line counts them (a non-zero exit outside any test, or a missing report, is a
# failure); returns non-zero when anything failed.
runner_counts() {
  "$PYTHON" "$ROOT/scripts/junit_counts.py" --runner "$@" | sed -n 1p
  return "${PIPESTATUS[0]}"
}

export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

# -- the build: a copy of the tree, configured and built with both sanitizers ---------------------
build() {
  # The working tree as it is (tracked and new files), copied: the plugin lands inside the tree.
  rm -rf "$SRC"
  mkdir -p "$SRC"
  git ls-files -co --exclude-standard -z | grep -zv '^build' |
    tar --null -T - -cf - | tar -xf - -C "$SRC"

  SAN="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
  # -O1 -g1 in place of RelWithDebInfo's -O2 -g: under both sanitizers the compile costs about half
  # (the GoogleTest files of tests/core most), the sanitizers still see every access, and -g1 keeps
  # the function names and lines of their stack traces.
  OPT="-O1 -g1 -DNDEBUG"

  echo "== sanitizer build (address, undefined; $OPT) =="
  cmake -S "$SRC" -B "$OUT/obj" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_FLAGS_RELWITHDEBINFO="$OPT" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$OPT" \
    -DPython3_EXECUTABLE="$PYTHON" -DGRAPHED_WITH_CUDA=OFF -DGRAPHED_WITH_XPU=OFF \
    -DGRAPHED_BUILD_TESTS=ON \
    -DCMAKE_C_FLAGS="$SAN" -DCMAKE_CXX_FLAGS="$SAN" \
    -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" \
    -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined" \
    -DCMAKE_MODULE_LINKER_FLAGS="-fsanitize=address,undefined" >"$OUT/cmake.log" 2>&1 &&
    cmake --build "$OUT/obj" -j2 >>"$OUT/cmake.log" 2>&1 &&
    rm -rf "$OUT/site" && cmake --install "$OUT/obj" --prefix "$OUT/site" >>"$OUT/cmake.log" 2>&1
  build_rc=$?
  if ((build_rc != 0)); then
    tail -40 "$OUT/cmake.log"
    one_case_report "$REPORTS/sanitized-build.xml" sanitizer_build 1 "the sanitizer build failed"
    echo "sanitizer build: 0 passed, 1 failed, 0 skipped"
    return 1
  fi
  touch "$OUT/site/.built"
}

if [[ $PHASE != run ]]; then
  rm -f "$OUT/site/.built"
  build || exit 1
  [[ $PHASE == build ]] && exit 0
elif [[ ! -f $OUT/site/.built ]]; then
  # The build phase failed (its report says so) or never ran.
  [[ -f $REPORTS/sanitized-build.xml ]] ||
    one_case_report "$REPORTS/sanitized-build.xml" sanitizer_build 1 "no sanitizer build to run on"
  echo "sanitizer build: 0 passed, 1 failed, 0 skipped (no build to run on)"
  exit 1
fi

echo
echo "== ctest under ASan/UBSan =="
# Leak detection stays on for the core (no torch); the operator tests load libtorch, whose
# process-lifetime allocations LeakSanitizer would report as leaks.
ctest_rc=0
for pattern in core ForwardOp; do
  leaks=1
  [[ $pattern == ForwardOp ]] && leaks=0
  log=$OUT/ctest-$leaks.log
  select=(-E ForwardOp)
  [[ $pattern == ForwardOp ]] && select=(-R ForwardOp)
  rc=0
  ASAN_OPTIONS=detect_leaks=$leaks ctest --test-dir "$OUT/obj" "${select[@]}" -j2 \
    --timeout 600 --output-on-failure --output-junit "$REPORTS/sanitized-ctest-$pattern.xml" \
    >"$log" 2>&1 || rc=$?
  if ((rc != 0)); then
    ctest_rc=$rc
    grep -E "ERROR: |runtime error|Failed|\*\*\*" "$log" | head -20
  fi
done
runner_counts "ctest (sanitized)" "$ctest_rc" "$REPORTS/sanitized-ctest-core.xml" \
  "$REPORTS/sanitized-ctest-ForwardOp.xml" || status=1

echo
echo "== pytest under ASan/UBSan (emulated backend) =="
ASAN_LIB=$(${CC:-cc} -print-file-name=libasan.so)
UBSAN_LIB=$(${CC:-cc} -print-file-name=libubsan.so)
# The interpreter is not instrumented: the runtimes are preloaded, leaks are not checked (CPython
# and torch keep allocations for the life of the process).
# The pure-Python files (marker pure_python) have no native code of their own to sanitize. No -x:
# every failure is reported, not only the first.
pytest_rc=0
LD_PRELOAD="$ASAN_LIB $UBSAN_LIB" \
  ASAN_OPTIONS=detect_leaks=0:protect_shadow_gap=0:allocator_may_return_null=1 \
  PYTHONPATH="$OUT/site" "$PYTHON" -m pytest "$SRC/tests/python" -q -p no:cacheprovider \
  -m "not gpu and not many_processes and not pure_python" \
  --junitxml="$REPORTS/sanitized-pytest.xml" >"$OUT/pytest.log" 2>&1 || pytest_rc=$?
tail -3 "$OUT/pytest.log"
if ((pytest_rc != 0)); then
  # A sanitizer report kills the process before pytest writes its report: show it.
  grep -E "ERROR: AddressSanitizer|runtime error" -A12 "$OUT/pytest.log" | head -40
fi
runner_counts "pytest (sanitized)" "$pytest_rc" "$REPORTS/sanitized-pytest.xml" || status=1

echo
echo "== libFuzzer: signature, cache, pools (${FUZZ_SECONDS}s) =="
FUZZ=$OUT/fuzz_signature_cache
fuzz_failed=1
if clang -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -I"$SRC/ops" "$SRC/tests/fuzz/fuzz_signature_cache.c" "$SRC"/ops/gf_status.c \
  "$SRC"/ops/gf_tensor.c "$SRC"/ops/gf_signature.c "$SRC"/ops/gf_pool.c "$SRC"/ops/gf_cache.c \
  -o "$FUZZ" >"$OUT/fuzz-build.log" 2>&1; then
  rm -rf "$OUT/corpus" && mkdir -p "$OUT/corpus"
  # New inputs go to a scratch corpus; the committed seeds are read only.
  "$FUZZ" -max_total_time="$FUZZ_SECONDS" -max_len=4096 -print_final_stats=1 \
    -artifact_prefix="$OUT/" \
    "$OUT/corpus" "$SRC/tests/fuzz/corpus" >"$OUT/fuzz.log" 2>&1 && fuzz_failed=0
  grep -E "stat::number_of_executed_units|Done [0-9]+ runs" "$OUT/fuzz.log" | tail -2
  ((fuzz_failed)) && grep -E "ERROR|runtime error|deadly" -A20 "$OUT/fuzz.log" | head -40
else
  tail -20 "$OUT/fuzz-build.log"
fi
one_case_report "$REPORTS/sanitized-fuzz.xml" fuzz_signature_cache "$fuzz_failed" \
  "the fuzz run failed to build or found a crash (build/sanitize/fuzz*.log)"
echo "fuzz: $((1 - fuzz_failed)) passed, $fuzz_failed failed, 0 skipped"
((fuzz_failed == 0)) || status=1

exit $status
