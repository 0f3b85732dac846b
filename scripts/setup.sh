#!/usr/bin/env bash
# Why this exists: one idempotent step that takes a fresh Debian machine (apt and PyPI reachable)
# to a working graphed checkout: the system packages the build needs, a virtualenv in .venv with
# torch and the build tools, and one build of graphed as a wheel (scikit-build-core over the CMake
# build, kept in build/wheel so later runs are incremental) installed into .venv. Every later
# script (test.sh, demo.sh, .ci/run) starts by running it; when everything is already there it
# only checks and runs a no-op incremental build.
#
# Usage: bash scripts/setup.sh [--tests]
#   --tests  what only the tests need as well (test.sh passes it): GoogleTest, clang's fuzzer and
#            sanitizer runtimes, the pinned diffusers and transformers the third-party model tests
#            run (and their newest releases in .venv-newest, about 0.2 GB), and the XPU test
#            tools. Without it (the demo) none of these is installed, and the GoogleTest suites
#            are built only when GoogleTest is already there. The tests after the demo keep the
#            demo's CMake build (build/wheel) and compile only what they add.
# CUDA: the CUDA backend needs an nvcc of torch's exact CUDA major.minor (torch 2.14.1: CUDA 13.0),
# which Debian does not ship. Where none is found (the PATH, CUDA_HOME, /usr/local/cuda), the
# nvcc wheels of torch's CUDA version come from PyPI into .venv and the build uses them; no GPU is
# needed to build the backend (a machine without one runs eager).
# Footprint on a fresh Debian 12: apt packages about 0.4 GB (1.0 GB with --tests); .venv about
# 6.1 GB (a CUDA build of torch, 0.3 GB of it the nvcc wheels), .venv-xpu 1.5 GB (--tests, when
# there is room); build/ (the CMake build and the wheel) about 20 MB. apt-get runs as root
# (through sudo when you are not root).
# Environment: PYTHON (the interpreter that creates .venv, default python3),
#              GRAPHED_CUDA_ARCHITECTURES (the CUDA architectures to build for, a CMake list such
#              as "90" or "80;90;100"; default 80;90),
#              GRAPHED_SETUP_FORCE_CONFIGURE=1 (start the CMake build in build/wheel afresh),
#              GRAPHED_SETUP_TORCH=2.15.0 (another torch beside the tests' own: its virtualenv is
#              .venv-torch-2.15.0, its build build/torch-2.15.0/{wheel,dist,setup-logs}; test.sh
#              makes one of the newest supported torch, NEWEST_TORCH below, and runs part of the
#              suite on it. Use it without --tests: the test packages stay .venv's).
# Outputs: build/dist/graphed-*.whl (the wheel), build/wheel (the CMake build dir, for ctest), the
# logs of every step in build/setup-logs/.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
VENV=$ROOT/.venv
BUILD=$ROOT/build/wheel
DIST=$ROOT/build/dist
LOGS=$ROOT/build/setup-logs
PYTHON=${PYTHON:-python3}
TORCH_VERSION=2.14.1
# The newest torch graphed supports (install/torch_pin.py); test.sh builds against it too.
NEWEST_TORCH=2.15.0
want_tests=0
[[ ${1:-} == --tests ]] && want_tests=1
log() { printf '[setup] %s\n' "$*"; }
die() { printf '[setup] error: %s\n' "$*" >&2; exit 1; }
if [[ ${1:-} == --print-newest-torch ]]; then
  echo "$NEWEST_TORCH"
  exit 0
fi
if [[ -n ${GRAPHED_SETUP_TORCH:-} ]]; then
  [[ $GRAPHED_SETUP_TORCH =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] ||
    die "GRAPHED_SETUP_TORCH='$GRAPHED_SETUP_TORCH' is not a release such as 2.15.0"
  ((want_tests == 0)) ||
    die "GRAPHED_SETUP_TORCH goes without --tests (the test packages are .venv's)"
  TORCH_VERSION=$GRAPHED_SETUP_TORCH
  VENV=$ROOT/.venv-torch-$TORCH_VERSION
  BUILD=$ROOT/build/torch-$TORCH_VERSION/wheel
  DIST=$ROOT/build/torch-$TORCH_VERSION/dist
  LOGS=$ROOT/build/torch-$TORCH_VERSION/setup-logs
fi

# The pip calls below that install torch, or packages beside it, name its release (TORCH_VERSION),
# so a machine-wide pip constraint file that caps torch (at the release a machine keeps on its
# disk, say) would refuse the newer one a second virtualenv exists for, and the nvcc wheels pinned
# beside it: they follow no constraint file.
export PIP_CONSTRAINT=/dev/null

mkdir -p "$LOGS"
# Where the logs were before build/setup-logs.
rm -f "$ROOT/build/setup-build.log" "$ROOT/build/setup-install.log" "$VENV"/pip-install*.log

# Runs a command with its output in a log file, saying every 30 s that it is still at work; on
# failure prints the log's tail and fails.
run_logged() {
  local logfile=$1
  shift
  "$@" >"$logfile" 2>&1 &
  local pid=$! started=$SECONDS rc=0 next=30
  while kill -0 "$pid" 2>/dev/null; do
    sleep 1
    if ((SECONDS - started >= next)) && kill -0 "$pid" 2>/dev/null; then
      log "  ... still at it ($((SECONDS - started)) s; log: ${logfile#"$ROOT"/})"
      next=$((next + 30))
    fi
  done
  wait "$pid" || rc=$?
  if ((rc != 0)); then
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
# The CPython extension compiles against the interpreter's headers (Debian: python3-dev).
python_headers() {
  "$PYTHON" -c 'import os, sysconfig, sys; sys.exit(not os.path.isfile(os.path.join(
    sysconfig.get_paths()["include"], "Python.h")))' >/dev/null 2>&1
}
python_headers || missing+=(python3-dev)
# The fuzz run (scripts/sanitize.sh) links clang's libFuzzer, ASan and UBSan runtimes: compiler-rt,
# which Debian ships apart from clang (libclang-rt-dev) and --no-install-recommends leaves out.
# Checked by the file the link needs, not by the compiler's name.
fuzzer_runtime() {
  command -v clang >/dev/null 2>&1 &&
    [[ -f "$(clang -print-resource-dir)/lib/linux/libclang_rt.fuzzer-$(uname -m).a" ]]
}
if ((want_tests)) && ! fuzzer_runtime; then
  missing+=(clang libclang-rt-dev)
fi
if ((want_tests)) && ! have_gtest; then
  missing+=(libgtest-dev)
fi
optional=()  # without these the build goes on and says what it left out
command -v ninja >/dev/null 2>&1 || optional+=(ninja-build)
if ((want_tests)); then # the Level Zero backend's build and its tests; the demo needs neither
  [[ -f /usr/include/level_zero/ze_api.h ]] || optional+=(libze-dev)
  deb_installed libze1 || optional+=(libze1)
fi

# apt-get runs as root: directly when this is root, else through sudo where there is one; the
# package lists are updated once per run.
sudo=()
apt_updated=0
if ((EUID != 0)) && command -v sudo >/dev/null 2>&1; then
  sudo=(sudo)
fi
if ((${#missing[@]} + ${#optional[@]})); then
  if ((EUID != 0)); then
    if ((${#sudo[@]})); then
      :
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
    run_logged "$LOGS/apt-update.log" "${sudo[@]}" apt-get update -q
    apt_updated=1
    if ((${#missing[@]})); then
      log "apt-get install ${missing[*]}"
      run_logged "$LOGS/apt-install.log" \
        "${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
    fi
    for package in "${optional[@]}"; do
      "${sudo[@]}" apt-get install -y -q --no-install-recommends "$package" \
        >>"$LOGS/apt-install.log" 2>&1 || log "note: $package not installed (optional)"
    done
  fi
fi

if ((want_tests)) && ! fuzzer_runtime; then
  die "clang's libFuzzer runtime is still missing after the install" \
    "($(clang -print-resource-dir 2>/dev/null)/lib/linux/libclang_rt.fuzzer-$(uname -m).a);" \
    "install Debian's libclang-rt-dev for the clang on the PATH"
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
    die "$(free_gib "$VENV") GiB free under $VENV; torch==$TORCH_VERSION needs about 6:" \
      "free some space"
  fi
  log "pip install torch==$TORCH_VERSION pytest numpy ruff scikit-build-core" \
    "(torch is large: a few minutes)"
  run_logged "$LOGS/pip-install.log" "$VENV/bin/python" -m pip install --disable-pip-version-check \
    --no-cache-dir "torch==$TORCH_VERSION" pytest numpy ruff scikit-build-core
  venv_complete || die "the packages in $VENV are still incomplete after pip install"
fi

# The third-party model tests (tests/python/test_third_party_models.py, accelerate's offload
# hooks in test_changed_state.py, peft's LoRA adapters in test_lora.py) run these, pinned, on the
# emulated backend in every test run; their own dependencies come with them.
TEST_PACKAGES=(diffusers==0.42.1 transformers==5.17.0 accelerate==1.15.0 peft==0.21.2)
# The newest releases of the same four (transformers 5.25.0 brings kernels>=0.19.1 with it):
# test.sh runs the third-party tests on them too, so that what users install today is tested beside the pins. They go into .venv-newest, a
# virtualenv that sees .venv's packages (torch, graphed) through a .pth file, so that only what
# differs is installed (about 0.2 GB, not a second torch). Raise these pins when a newer release
# appears.
NEWEST_PACKAGES=(diffusers==0.42.1 transformers==5.25.0 accelerate==1.16.0 peft==0.21.2)
NEWEST=$ROOT/.venv-newest
# Succeeds when interpreter $1 has the versions named in $2... ("name==1.2.3" exactly, or
# "name==13.0.*" any release of 13.0).
packages_complete() {
  "$1" - "${@:2}" <<'PY' >/dev/null 2>&1
import sys
from importlib import metadata

for pinned in sys.argv[1:]:
    name, version = pinned.split("==")
    have = metadata.version(name)
    if not (have.startswith(version[:-1]) if version.endswith(".*") else have == version):
        raise SystemExit(1)
PY
}
# pip-installs the pins $2... with interpreter $1 where they are not all there yet (torch kept at
# its pin) and checks that they are; says what is missing and fails otherwise.
install_pinned() {
  local python=$1
  shift
  packages_complete "$python" "$@" && return 0
  "$python" -m pip install --disable-pip-version-check --no-cache-dir "$@" \
    "torch==$TORCH_VERSION" || return 1
  packages_complete "$python" "$@" ||
    { echo "$* are still missing after pip install ($python)"; return 1; }
}
site_of() { "$1" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }
if ((want_tests)); then
  # Made again when .venv was made anew with another Python; the .pth is written every run.
  if [[ -x $NEWEST/bin/python ]] &&
    [[ $("$NEWEST/bin/python" -V 2>&1) != $("$VENV/bin/python" -V 2>&1) ]]; then
    rm -rf "$NEWEST"
  fi
  if [[ ! -x $NEWEST/bin/python ]]; then
    rm -rf "$NEWEST"
    "$VENV/bin/python" -m venv "$NEWEST"
  fi
  # Its own site-packages first, then .venv's: a newer dependency installed here shadows .venv's.
  site_of "$VENV/bin/python" >"$(site_of "$NEWEST/bin/python")/zz-graphed-base.pth"
fi
# Both installs, one after the other; run in the background while the XPU tools and the build go
# on (they are mostly downloads, the build is compiles: about a minute less on two cores). Nothing
# the build reads changes (torch is pinned); pip touches .venv again only once this is done.
third_party_installs() {
  install_pinned "$VENV/bin/python" "${TEST_PACKAGES[@]}" &&
    install_pinned "$NEWEST/bin/python" "${NEWEST_PACKAGES[@]}"
}
third_party_pid=""
if ((want_tests)) && { ! packages_complete "$VENV/bin/python" "${TEST_PACKAGES[@]}" ||
  ! packages_complete "$NEWEST/bin/python" "${NEWEST_PACKAGES[@]}"; }; then
  log "pip install ${TEST_PACKAGES[*]}, and ${NEWEST_PACKAGES[*]} into .venv-newest, in the" \
    "background (the third-party tests; log: build/setup-logs/pip-install-tests.log)"
  third_party_installs >"$LOGS/pip-install-tests.log" 2>&1 &
  third_party_pid=$!
fi
# Waits for the background installs; fails setup as run_logged does when they failed.
wait_for_third_party_installs() {
  [[ -n $third_party_pid ]] || return 0
  local rc=0
  wait "$third_party_pid" || rc=$?
  third_party_pid=""
  if ((rc != 0)); then
    printf '[setup] error: the third-party test packages did not install; last lines of %s:\n' \
      "$LOGS/pip-install-tests.log" >&2
    tail -n 80 "$LOGS/pip-install-tests.log" >&2
    exit 1
  fi
  log "the third-party test packages are installed"
}

# ---- XPU test tools: begin ---------------------------------------------------------------------
# Only with --tests (the demo never uses them). What the `xpu` ctest label needs besides
# libze1/libze-dev (above): clang-15 and llvm-spirv-15 (the gather kernel's SPIR-V), spirv-tools
# (spirv-val), the OpenCL ICD loader and headers, and in .venv-xpu the PyPI wheels intel-sycl-rt
# (SYCL headers for the torch half's compile check) and intel-opencl-rt (a CPU OpenCL runtime that
# takes SPIR-V). A failure here never fails the setup: the tests that need the missing piece skip
# and say why.
install_xpu_test_tools() {
  local xpu_debs=() pkg
  for pkg in clang-15 llvm-spirv-15 spirv-tools ocl-icd-libopencl1 ocl-icd-opencl-dev \
    opencl-c-headers; do
    deb_installed "$pkg" || xpu_debs+=("$pkg")
  done
  if ((${#xpu_debs[@]})) && command -v apt-get >/dev/null 2>&1; then
    log "apt-get install ${xpu_debs[*]} (xpu tests)"
    if (export DEBIAN_FRONTEND=noninteractive
      { ((apt_updated)) || "${sudo[@]}" apt-get update -q; } &&
      "${sudo[@]}" apt-get install -y -q --no-install-recommends "${xpu_debs[@]}") \
      >"$LOGS/apt-xpu.log" 2>&1; then
      xpu_tools_new=1 # CMake looks for the tools again
    else
      log "note: some xpu test tools did not install (see build/setup-logs/apt-xpu.log);" \
        "those tests skip"
    fi
  fi
  local tools=$ROOT/.venv-xpu
  if [[ -f $tools/include/sycl/sycl.hpp && -f $tools/lib/libintelocl.so ]]; then
    return
  fi
  if (($(free_gib "$ROOT") < 4)); then
    log "note: $(free_gib "$ROOT") GiB free; the xpu PyPI tools (1.5 GB) are left out and" \
      "their tests skip"
    return
  fi
  log "pip install intel-sycl-rt intel-opencl-rt into $tools (xpu tests; about 1.5 GB)"
  if (rm -rf "$tools" && "$PYTHON" -m venv "$tools" &&
    "$tools/bin/python" -m pip install -q --disable-pip-version-check --no-cache-dir \
      intel-sycl-rt==2026.2.0 intel-opencl-rt==2026.2.0) >"$LOGS/pip-xpu.log" 2>&1; then
    xpu_tools_new=1
  else
    log "note: the xpu PyPI tools did not install (see build/setup-logs/pip-xpu.log);" \
      "those tests skip"
  fi
}
xpu_tools_new=0
if ((want_tests)); then
  install_xpu_test_tools
fi
# ---- XPU test tools: end -----------------------------------------------------------------------

# -- nvcc for the CUDA backend ---------------------------------------------------------------------
# The CUDA backend is built only with an nvcc of torch's exact CUDA "major.minor" (torch's own
# CMake config refuses any other). Where the PATH, CUDA_HOME and /usr/local/cuda hold none, the
# nvcc wheels of torch's CUDA release (nvcc, the NVVM compiler it runs, the CUDA headers torch's
# own wheels leave out; install/nvcc_wheels.py names them) come from PyPI into .venv,
# about 270 MB. They unpack to site-packages/nvidia/cu<major>, where
# cmake/GraphedTorchCudaHints.cmake finds them; the build is also pointed there (CUDA_HOME).
# A failure here never fails the setup: graphed then builds without its CUDA backend (eager).
# Prints "<torch.version.cuda> <site-packages>" without importing torch (fast); nothing for a torch
# without CUDA.
torch_cuda_and_site() {
  "$VENV/bin/python" - <<'PY' 2>/dev/null || true
import importlib.util
import pathlib
import re

torch_dir = pathlib.Path(importlib.util.find_spec("torch").origin).parent
text = (torch_dir / "version.py").read_text()
found = re.search(r"^cuda\b[^=]*=\s*['\"]([0-9.]+)['\"]", text, re.M)
if found:
    print(found.group(1), torch_dir.parent)
PY
}
# The CUDA release ("13.0") of the nvcc at $1; nothing when there is none.
nvcc_release() {
  if [[ -n $1 && -x $1 ]]; then
    { "$1" --version 2>/dev/null || true; } |
      sed -n 's/.*release \([0-9]*\.[0-9]*\).*/\1/p' | head -n 1
  fi
}
build_env=()
torch_cuda_site=$(torch_cuda_and_site)
if [[ -n $torch_cuda_site ]]; then
  torch_cuda=${torch_cuda_site%% *}
  cuda_major=${torch_cuda%%.*}
  cuda_release=$(cut -d. -f1,2 <<<"$torch_cuda")
  pypi_toolkit=${torch_cuda_site#* }/nvidia/cu$cuda_major
  system_nvcc=""
  for candidate in "$(command -v nvcc || true)" "${CUDA_HOME:+$CUDA_HOME/bin/nvcc}" \
    /usr/local/cuda/bin/nvcc; do
    release=$(nvcc_release "$candidate")
    if [[ -n $release && $release == "$cuda_release" ]]; then
      system_nvcc="$candidate (CUDA $release)"
      break
    fi
  done
  if [[ -n $system_nvcc ]]; then
    log "nvcc for torch's CUDA $torch_cuda: $system_nvcc"
  elif ((cuda_major < 13)); then
    log "note: no nvcc of CUDA $cuda_release found, and PyPI's have another layout: graphed" \
      "builds without its CUDA backend (set CUDA_HOME to a CUDA $cuda_release toolkit)"
  else
    mapfile -t pins < <("$VENV/bin/python" "$ROOT/install/nvcc_wheels.py" 2>/dev/null)
    if ((${#pins[@]})) && ! packages_complete "$VENV/bin/python" "${pins[@]}"; then
      wait_for_third_party_installs # one pip at a time in .venv
      log "pip install ${pins[*]} (no nvcc of CUDA $cuda_release found; about 270 MB)"
      if "$VENV/bin/python" -m pip install --disable-pip-version-check --no-cache-dir \
        "${pins[@]}" "torch==$TORCH_VERSION" >"$LOGS/pip-nvcc.log" 2>&1; then
        export GRAPHED_SETUP_FORCE_CONFIGURE=1 # configure afresh with the new toolkit
      else
        log "note: the nvcc wheels did not install (see build/setup-logs/pip-nvcc.log);" \
          "graphed builds without its CUDA backend"
      fi
    fi
    if [[ -x $pypi_toolkit/bin/nvcc ]]; then
      log "nvcc for torch's CUDA $torch_cuda: PyPI's, in .venv (CUDA" \
        "$(nvcc_release "$pypi_toolkit/bin/nvcc"))"
      build_env=("CUDA_HOME=$pypi_toolkit")
    fi
  fi
fi

# -- the build: one wheel, one CMake build dir -----------------------------------------------------
# Builds of the old layout wrote the plugin into the source tree; it must not shadow the wheel.
if [[ -d python/graphed/_native ]]; then
  log "removing python/graphed/_native (a build product of the old layout)"
  rm -rf python/graphed/_native
fi
if [[ ${GRAPHED_SETUP_FORCE_CONFIGURE:-0} == 1 ]]; then
  rm -rf "$BUILD"
elif ((xpu_tools_new)) && [[ -f $BUILD/CMakeCache.txt ]]; then
  # New XPU test tools (the tests after the demo's build, say): the build dir is kept, so that only
  # what they change is compiled again (the demo's build is reused; a fresh configure recompiled
  # everything, about 3.5 minutes on two cores). CMake searches again for what it did not find,
  # but keeps what it found (clang where clang-15 is now there too): every tool and header path
  # it cached is dropped from the cache, and the configure looks for each anew.
  log "XPU test tools installed: the CMake build in build/wheel looks for its tools again"
  # Each entry goes with the "//" lines that document it: CMake refuses a comment left alone.
  awk '
    /^\/\// { doc = doc $0 "\n"; next }
    /^GRAPHED_[A-Z0-9_]+:(FILE)?PATH=/ { doc = ""; next }
    { printf "%s%s\n", doc, $0; doc = "" }
  ' "$BUILD/CMakeCache.txt" >"$BUILD/CMakeCache.txt.new"
  mv "$BUILD/CMakeCache.txt.new" "$BUILD/CMakeCache.txt"
fi
tests=OFF
if have_gtest; then
  tests=ON
fi
mkdir -p "$BUILD" "$DIST"
rm -f "$DIST"/graphed-*.whl
log "building the wheel against torch $TORCH_VERSION (GoogleTest suites: $tests; log:" \
  "${LOGS#"$ROOT"/}/build.log)"
# GRAPHED_CUDA_ARCHITECTURES goes to every build, empty for CMake's default, so that a run without
# it goes back to the default.
run_logged "$LOGS/build.log" env "${build_env[@]}" "$VENV/bin/python" -m pip wheel -v \
  --disable-pip-version-check --no-build-isolation --no-deps --wheel-dir "$DIST" \
  "--config-settings=build-dir=$BUILD" \
  --config-settings=cmake.define.GRAPHED_BUILD_TESTS=$tests \
  "--config-settings=cmake.define.GRAPHED_CUDA_ARCHITECTURES=${GRAPHED_CUDA_ARCHITECTURES:-}" \
  "$ROOT"
grep -E '^ *-- graphed:' "$LOGS/build.log" | sed 's/^ *-- /[setup] /' || true
wheel=$(ls "$DIST"/graphed-*.whl)
wait_for_third_party_installs # one pip at a time in .venv
run_logged "$LOGS/install.log" "$VENV/bin/python" -m pip install \
  --disable-pip-version-check --no-deps --force-reinstall "$wheel"
log "ready: $(basename "$wheel") installed into ${VENV#"$ROOT"/}"
