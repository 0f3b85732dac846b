#!/usr/bin/env bash
# Why this exists: the core, the operator tests and the plugin built with AddressSanitizer and
# UndefinedBehaviorSanitizer in a build of their own (a copy of the tree under build/sanitize/,
# installed into build/sanitize/site, apart from the wheel the tests use), then ctest and the
# Python suite on the emulated backend against that build, and a short libFuzzer run over
# the signature, the cache and the pools (tests/fuzz/). Prints 'N passed, N failed' for each,
# leaves a JUnit report per step in $SANITIZE_REPORTS (default build/sanitize/reports; the build
# and the fuzz run write a one-case report of their own, so scripts/test.sh counts every step) and
# exits non-zero if any failed. Usage: bash scripts/sanitize.sh [FUZZ_SECONDS (default 60)]
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
FUZZ_SECONDS=${1:-60}
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
OUT=${SANITIZE_DIR:-$ROOT/build/sanitize}
SRC=$OUT/src
REPORTS=${SANITIZE_REPORTS:-$OUT/reports}
status=0
mkdir -p "$REPORTS"
rm -f "$REPORTS"/sanitized-*.xml

# A JUnit report of one case for a step that is not a test runner (the build, the fuzz run).
one_case_report() {
  local file=$1 name=$2 failed=$3 message=${4:-}
  local failure=""
  ((failed)) && failure="<failure message=\"${message//\"/&quot;}\"/>"
  printf '<testsuite name="%s" tests="1" failures="%s"><testcase name="%s">%s</testcase></testsuite>\n' \
    "$name" "$failed" "$name" "$failure" >"$file"
}

# The working tree as it is (tracked and new files), copied: the plugin lands inside the tree.
rm -rf "$SRC"
mkdir -p "$SRC"
git ls-files -co --exclude-standard -z | grep -zv '^build' |
  tar --null -T - -cf - | tar -xf - -C "$SRC"

SAN="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

echo "== sanitizer build (address, undefined) =="
cmake -S "$SRC" -B "$OUT/obj" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
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
  echo "sanitizer build: 0 passed, 1 failed"
  exit 1
fi

echo
echo "== ctest under ASan/UBSan =="
# Leak detection stays on for the core (no torch); the operator tests load libtorch, whose
# process-lifetime allocations LeakSanitizer would report as leaks.
ctest_passed=0
ctest_failed=0
for pattern in core ForwardOp; do
  leaks=1
  [[ $pattern == ForwardOp ]] && leaks=0
  log=$OUT/ctest-$leaks.log
  select=(-E ForwardOp)
  [[ $pattern == ForwardOp ]] && select=(-R ForwardOp)
  ASAN_OPTIONS=detect_leaks=$leaks ctest --test-dir "$OUT/obj" "${select[@]}" -j2 \
    --timeout 600 --output-on-failure --output-junit "$REPORTS/sanitized-ctest-$pattern.xml" \
    >"$log" 2>&1
  passed=$(grep -Eo '[0-9]+ tests passed|[0-9]+% tests passed, [0-9]+ tests failed out of [0-9]+' \
    "$log" | tail -1)
  total=$(sed -nE 's/.*tests failed out of ([0-9]+).*/\1/p' "$log" | tail -1)
  failed=$(sed -nE 's/.*passed, ([0-9]+) tests failed out of.*/\1/p' "$log" | tail -1)
  total=${total:-0}
  failed=${failed:-1}
  ctest_passed=$((ctest_passed + total - failed))
  ctest_failed=$((ctest_failed + failed))
  ((failed > 0)) && grep -E "ERROR: |runtime error|Failed|\*\*\*" "$log" | head -20
done
echo "ctest (sanitized): $ctest_passed passed, $ctest_failed failed"
((ctest_failed == 0)) || status=1

echo
echo "== pytest under ASan/UBSan (emulated backend) =="
ASAN_LIB=$(${CC:-cc} -print-file-name=libasan.so)
UBSAN_LIB=$(${CC:-cc} -print-file-name=libubsan.so)
# The interpreter is not instrumented: the runtimes are preloaded, leaks are not checked (CPython
# and torch keep allocations for the life of the process).
LD_PRELOAD="$ASAN_LIB $UBSAN_LIB" \
  ASAN_OPTIONS=detect_leaks=0:protect_shadow_gap=0:allocator_may_return_null=1 \
  PYTHONPATH="$OUT/site" "$PYTHON" -m pytest "$SRC/tests/python" -q -p no:cacheprovider \
  -m "not gpu and not many_processes" -x --junitxml="$REPORTS/sanitized-pytest.xml" >"$OUT/pytest.log" 2>&1
pytest_rc=$?
tail -3 "$OUT/pytest.log"
py_passed=$(grep -Eo '[0-9]+ passed' "$OUT/pytest.log" | tail -1 | grep -Eo '[0-9]+')
py_failed=$(grep -Eo '[0-9]+ failed' "$OUT/pytest.log" | tail -1 | grep -Eo '[0-9]+')
py_failed=${py_failed:-0}
if ((pytest_rc != 0 && py_failed == 0)); then
  py_failed=1 # the process died (a sanitizer report) or pytest failed outside a test
  grep -E "ERROR: AddressSanitizer|runtime error" -A12 "$OUT/pytest.log" | head -40
fi
echo "pytest (sanitized): ${py_passed:-0} passed, $py_failed failed"
((py_failed == 0)) || status=1

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
echo "fuzz: $((1 - fuzz_failed)) passed, $fuzz_failed failed"
((fuzz_failed == 0)) || status=1

exit $status
