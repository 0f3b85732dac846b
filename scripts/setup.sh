#!/usr/bin/env bash
# Why this exists: one idempotent step that takes a fresh Debian machine (root, apt and PyPI
# reachable) to a working graphed checkout: the system packages the build needs, a virtualenv in
# .venv with torch, and the CMake build in build/ (the plugin lands in python/graphed/_native).
# Every later script (test.sh, demo.sh, .ci/run) starts by running it; when everything is already
# there it only checks and runs a no-op incremental build.
#
# Environment: PYTHON (the interpreter that creates .venv, default python3),
#              GRAPHED_SETUP_FORCE_CONFIGURE=1 (re-run the CMake configure step).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
VENV=$ROOT/.venv
BUILD=$ROOT/build
PYTHON=${PYTHON:-python3}
TORCH_VERSION=2.14.1

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

missing=()
command -v cmake >/dev/null 2>&1 || missing+=(cmake)
command -v g++ >/dev/null 2>&1 || missing+=(g++)
command -v make >/dev/null 2>&1 || missing+=(make)
deb_installed libgtest-dev || [[ -f /usr/include/gtest/gtest.h ]] || missing+=(libgtest-dev)
deb_installed libze-dev || [[ -f /usr/include/level_zero/ze_api.h ]] || missing+=(libze-dev)
deb_installed libze1 || missing+=(libze1)
command -v "$PYTHON" >/dev/null 2>&1 || missing+=(python3)
if [[ ! -x $VENV/bin/python ]] && ! "$PYTHON" -c 'import venv, ensurepip' >/dev/null 2>&1; then
  missing+=(python3-venv)
fi
optional=()
command -v ninja >/dev/null 2>&1 || optional+=(ninja-build)

if ((${#missing[@]} + ${#optional[@]})); then
  command -v apt-get >/dev/null 2>&1 || die "missing ${missing[*]} ${optional[*]} and no apt-get"
  export DEBIAN_FRONTEND=noninteractive
  log "apt-get update"
  run_logged /tmp/graphed-apt-update.log apt-get update -q
  if ((${#missing[@]})); then
    log "apt-get install ${missing[*]}"
    run_logged /tmp/graphed-apt-install.log \
      apt-get install -y -q --no-install-recommends "${missing[@]}"
  fi
  if ((${#optional[@]})); then
    apt-get install -y -q --no-install-recommends "${optional[@]}" >/dev/null 2>&1 ||
      log "note: ${optional[*]} not installed (optional); building with make"
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
  "$VENV/bin/python" - "$TORCH_VERSION" <<'EOF' >/dev/null 2>&1
import sys
from importlib import metadata

want_torch = sys.argv[1]
if metadata.version("torch").split("+")[0] != want_torch:
    raise SystemExit(1)
for name in ("pytest", "numpy", "ruff"):
    metadata.version(name)
EOF
}

if ! venv_complete; then
  log "pip install torch==$TORCH_VERSION pytest numpy ruff (torch is large: a few minutes)"
  run_logged "$VENV/pip-install.log" "$VENV/bin/python" -m pip install --disable-pip-version-check \
    "torch==$TORCH_VERSION" pytest numpy ruff
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
if [[ ! -f $XPU_TOOLS/include/sycl/sycl.hpp || ! -f $XPU_TOOLS/lib/libintelocl.so ]]; then
  log "pip install intel-sycl-rt intel-opencl-rt into $XPU_TOOLS (xpu tests; about 1.5 GB)"
  if (rm -rf "$XPU_TOOLS" && "$PYTHON" -m venv "$XPU_TOOLS" &&
    "$XPU_TOOLS/bin/python" -m pip install -q --disable-pip-version-check \
      intel-sycl-rt==2026.2.0 intel-opencl-rt==2026.2.0) >/tmp/graphed-pip-xpu.log 2>&1; then
    export GRAPHED_SETUP_FORCE_CONFIGURE=1
  else
    log "note: the xpu PyPI tools did not install (see /tmp/graphed-pip-xpu.log); those tests skip"
  fi
fi
# ---- XPU test tools: end -----------------------------------------------------------------------

# -- CMake build ---------------------------------------------------------------------------------
cache=$BUILD/CMakeCache.txt
configure=0
if [[ ! -f $cache || ${GRAPHED_SETUP_FORCE_CONFIGURE:-0} == 1 ]]; then
  configure=1
elif [[ ! -f $BUILD/build.ninja && ! -f $BUILD/Makefile ]]; then
  configure=1 # an earlier configure stopped before generating
elif ! grep -qxF "Python3_EXECUTABLE:FILEPATH=$VENV/bin/python" "$cache" \
  && ! grep -qxF "Python3_EXECUTABLE:UNINITIALIZED=$VENV/bin/python" "$cache"; then
  configure=1
fi
if ((configure)); then
  generator=()
  if [[ ! -f $cache ]] && command -v ninja >/dev/null 2>&1; then
    generator=(-G Ninja)
  fi
  mkdir -p "$BUILD"
  log "configuring $BUILD"
  run_logged "$BUILD/setup-configure.log" \
    cmake -S "$ROOT" -B "$BUILD" "${generator[@]}" -DPython3_EXECUTABLE="$VENV/bin/python"
  grep -E '^-- graphed:' "$BUILD/setup-configure.log" | sed 's/^-- /[setup] /' || true
fi

log "building (log: build/setup-build.log)"
run_logged "$BUILD/setup-build.log" cmake --build "$BUILD" -j2
log "ready"
