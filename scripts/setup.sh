#!/usr/bin/env bash
# Why this exists: one idempotent step that takes a fresh Debian machine (apt and PyPI reachable)
# to a working graphed checkout: the system packages the build needs, a virtualenv in .venv with
# torch and the build tools, and one build of graphed as a wheel (scikit-build-core over the CMake
# build, kept in build/wheel so later runs are incremental) installed into .venv. Every later
# script (test.sh, demo.sh, .ci/run) starts by running it; when everything is already there it
# only checks and runs a no-op incremental build.
#
# Usage: bash scripts/setup.sh [--tests]
#   --tests  GoogleTest is required (installed when missing); test.sh passes it. Without it the
#            GoogleTest suites are built only when GoogleTest is already installed.
# Environment: PYTHON (the interpreter that creates .venv, default python3),
#              GRAPHED_SETUP_FORCE_CONFIGURE=1 (start the CMake build in build/wheel afresh).
# Outputs: build/dist/graphed-*.whl (the wheel), build/wheel (the CMake build dir, for ctest).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
VENV=$ROOT/.venv
BUILD=$ROOT/build/wheel
DIST=$ROOT/build/dist
PYTHON=${PYTHON:-python3}
TORCH_VERSION=2.14.1
want_tests=0
[[ ${1:-} == --tests ]] && want_tests=1

log() { printf '[setup] %s\n' "$*"; }
die() { printf '[setup] error: %s\n' "$*" >&2; exit 1; }

# Runs a command with its output in a log file; on failure prints the log's tail and fails.
run_logged() {
  local logfile=$1
  shift
  if ! "$@" >"$logfile" 2>&1; then
    printf '[setup] error: %s failed; last lines of %s:\n' "$*" "$logfile" >&2
    tail -n 80 "$logfile" >&2
    exit 1
  fi
}

# -- system packages -----------------------------------------------------------------------------
deb_installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }
have_gtest() { [[ -f /usr/include/gtest/gtest.h || -f /usr/src/googletest/CMakeLists.txt ]]; }

missing=()  # the build cannot do without these
command -v cmake >/dev/null 2>&1 || missing+=(cmake)
command -v g++ >/dev/null 2>&1 || missing+=(g++)
command -v make >/dev/null 2>&1 || missing+=(make)
command -v "$PYTHON" >/dev/null 2>&1 || missing+=(python3)
if [[ ! -x $VENV/bin/python ]] && ! "$PYTHON" -c 'import venv, ensurepip' >/dev/null 2>&1; then
  missing+=(python3-venv)
fi
if ((want_tests)) && ! command -v clang >/dev/null 2>&1; then
  missing+=(clang) # the sanitizer build's libFuzzer target (scripts/sanitize.sh)
fi
if ((want_tests)) && ! have_gtest; then
  missing+=(libgtest-dev)
fi
optional=()  # without these the build goes on and says what it left out
command -v ninja >/dev/null 2>&1 || optional+=(ninja-build)
[[ -f /usr/include/level_zero/ze_api.h ]] || optional+=(libze-dev)
deb_installed libze1 || optional+=(libze1)

if ((${#missing[@]} + ${#optional[@]})); then
  sudo=()
  if ((EUID != 0)); then
    if command -v sudo >/dev/null 2>&1; then
      sudo=(sudo)
    elif ((${#missing[@]})); then
      die "missing ${missing[*]}; run as root, install sudo, or install them yourself:" \
        "apt-get install ${missing[*]} (optional: ${optional[*]:-none})"
    else
      log "note: not root and no sudo; optional ${optional[*]} not installed"
      optional=()
    fi
  fi
  if ((${#missing[@]} + ${#optional[@]})); then
    command -v apt-get >/dev/null 2>&1 ||
      die "missing ${missing[*]} ${optional[*]} and no apt-get; install them yourself"
    export DEBIAN_FRONTEND=noninteractive
    log "apt-get update"
    run_logged /tmp/graphed-apt-update.log "${sudo[@]}" apt-get update -q
    if ((${#missing[@]})); then
      log "apt-get install ${missing[*]}"
      run_logged /tmp/graphed-apt-install.log \
        "${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
    fi
    for package in "${optional[@]}"; do
      "${sudo[@]}" apt-get install -y -q --no-install-recommends "$package" >/dev/null 2>&1 ||
        log "note: $package not installed (optional)"
    done
  fi
fi

# -- virtualenv ----------------------------------------------------------------------------------
if [[ ! -x $VENV/bin/python ]]; then
  rm -rf "$VENV"
  log "creating $VENV with $("$PYTHON" --version 2>&1)"
  "$PYTHON" -m venv "$VENV"
fi

# Checks the installed distributions' metadata without importing torch (fast).
venv_complete() {
  "$VENV/bin/python" - "$TORCH_VERSION" <<'PY' >/dev/null 2>&1
import sys
from importlib import metadata

want_torch = sys.argv[1]
if metadata.version("torch").split("+")[0] != want_torch:
    raise SystemExit(1)
for name in ("pytest", "numpy", "ruff", "scikit-build-core"):
    metadata.version(name)
PY
}

# Free space (GiB, rounded down) on the filesystem that holds $1.
free_gib() { df -Pk "$1" | awk 'NR == 2 { print int($4 / 1048576) }'; }

if ! venv_complete; then
  # A CUDA build of torch unpacks to about 5.5 GB; pip's own message when it runs out is an OSError
  # halfway through, so say it first.
  if (($(free_gib "$VENV") < 6)); then
    die "$(free_gib "$VENV") GiB free under $VENV; torch==$TORCH_VERSION needs about 6: free some space"
  fi
  log "pip install torch==$TORCH_VERSION pytest numpy ruff scikit-build-core" \
    "(torch is large: a few minutes)"
  run_logged "$VENV/pip-install.log" "$VENV/bin/python" -m pip install --disable-pip-version-check \
    --no-cache-dir "torch==$TORCH_VERSION" pytest numpy ruff scikit-build-core
  venv_complete || die "the packages in $VENV are still incomplete after pip install"
fi

# ---- XPU test tools: begin ---------------------------------------------------------------------
# Optional: what the `xpu` ctest label needs besides libze1/libze-dev (above): clang-15 and
# llvm-spirv-15 (the gather kernel's SPIR-V), spirv-tools (spirv-val), the OpenCL ICD loader and
# headers, and in .venv-xpu the PyPI wheels intel-sycl-rt (SYCL headers for the torch half's
# compile check) and intel-opencl-rt (a CPU OpenCL runtime that takes SPIR-V). A failure here
# never fails the setup: the tests that need the missing piece skip and say why.
xpu_debs=()
for pkg in clang-15 llvm-spirv-15 spirv-tools ocl-icd-libopencl1 ocl-icd-opencl-dev opencl-c-headers; do
  deb_installed "$pkg" || xpu_debs+=("$pkg")
done
if ((${#xpu_debs[@]})) && command -v apt-get >/dev/null 2>&1; then
  log "apt-get install ${xpu_debs[*]} (xpu tests)"
  if (export DEBIAN_FRONTEND=noninteractive; apt-get update -q &&
    apt-get install -y -q --no-install-recommends "${xpu_debs[@]}") >/tmp/graphed-apt-xpu.log 2>&1; then
    export GRAPHED_SETUP_FORCE_CONFIGURE=1 # CMake finds the new tools
  else
    log "note: some xpu test tools did not install (see /tmp/graphed-apt-xpu.log); those tests skip"
  fi
fi
XPU_TOOLS=$ROOT/.venv-xpu
if [[ ! -f $XPU_TOOLS/include/sycl/sycl.hpp || ! -f $XPU_TOOLS/lib/libintelocl.so ]] &&
  (($(free_gib "$ROOT") < 4)); then
  log "note: $(free_gib "$ROOT") GiB free; the xpu PyPI tools (1.5 GB) are left out and their tests skip"
elif [[ ! -f $XPU_TOOLS/include/sycl/sycl.hpp || ! -f $XPU_TOOLS/lib/libintelocl.so ]]; then
  log "pip install intel-sycl-rt intel-opencl-rt into $XPU_TOOLS (xpu tests; about 1.5 GB)"
  if (rm -rf "$XPU_TOOLS" && "$PYTHON" -m venv "$XPU_TOOLS" &&
    "$XPU_TOOLS/bin/python" -m pip install -q --disable-pip-version-check --no-cache-dir \
      intel-sycl-rt==2026.2.0 intel-opencl-rt==2026.2.0) >/tmp/graphed-pip-xpu.log 2>&1; then
    export GRAPHED_SETUP_FORCE_CONFIGURE=1
  else
    log "note: the xpu PyPI tools did not install (see /tmp/graphed-pip-xpu.log); those tests skip"
  fi
fi
# ---- XPU test tools: end -----------------------------------------------------------------------

# -- the build: one wheel, one CMake build dir -----------------------------------------------------
# Builds of the old layout wrote the plugin into the source tree; it must not shadow the wheel.
if [[ -d python/graphed/_native ]]; then
  log "removing python/graphed/_native (a build product of the old layout)"
  rm -rf python/graphed/_native
fi
if [[ ${GRAPHED_SETUP_FORCE_CONFIGURE:-0} == 1 ]]; then
  rm -rf "$BUILD"
fi
tests=OFF
if have_gtest; then
  tests=ON
fi
mkdir -p "$BUILD" "$DIST"
rm -f "$DIST"/graphed-*.whl
log "building the wheel (GoogleTest suites: $tests; log: build/setup-build.log)"
run_logged "$ROOT/build/setup-build.log" "$VENV/bin/python" -m pip wheel -v \
  --disable-pip-version-check --no-build-isolation --no-deps --wheel-dir "$DIST" \
  --config-settings=build-dir=build/wheel \
  --config-settings=cmake.define.GRAPHED_BUILD_TESTS=$tests "$ROOT"
grep -E '^ *-- graphed:' "$ROOT/build/setup-build.log" | sed 's/^ *-- /[setup] /' || true
wheel=$(ls "$DIST"/graphed-*.whl)
run_logged "$ROOT/build/setup-install.log" "$VENV/bin/python" -m pip install \
  --disable-pip-version-check --no-deps --force-reinstall "$wheel"
log "ready: $(basename "$wheel") installed into .venv"
