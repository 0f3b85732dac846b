#!/usr/bin/env bash
# One call on a GPU machine: configure against that machine's own torch, build, run ctest, pytest
# and the benchmark, and write every log under $OUT (default: ./device-logs). The machine needs
# torch with CUDA under `python3`, nvcc, cmake and GoogleTest (a package or its sources).
# It has no network, so it does not go through pip (scikit-build-core may be absent): it builds
# with plain CMake (tests ON) and `cmake --install`s the package into build-device/site, which is
# then the only graphed on PYTHONPATH (the same files, RUNPATH and build info a wheel holds).
# The pytest run leaves out the many_processes tests (the gloo exit soak, CPU only, run by every CI
# run; its full size, GRAPHED_EXIT_RUNS=200,50, would pass the device's 10-minute limit).
# Usage: bash scripts/device_check.sh [all|build|test|bench|group|pipelines|memory|generate|traffic|regions|compiled] [extra pytest args...]
#        (compiled [--models llama,qwen3,gemma3]: graphed over torch.compile, its GPU tests,
#        bench/compiled_decode_bench.py at the public configs' sizes and bench/compiled_flux_bench.py
#        (diffusers from a carried wheel); after a build without the C++ tests. One call rarely
#        holds all: COMPILED_TESTS=0 leaves the tests out, --models fewer decoders)
#        (group: on two GPUs, the process-group tests and bench/sp_bench.py, after a build
#        without the C++ tests)
#        (pipelines: the Stable Audio Open DiT in its pipeline's loop at 108 and 1024 frames and
#        transformers' generate(), each with the torch.compile rows, after a build without the C++
#        tests: the rows bench/run.py --quick leaves out)
#        (memory: bench/memory_shapes.py, extra args going to it, e.g. --quick, --methods compile,
#        --jobs 8 --deadline-s 420; then the host cost alone (bench/host_cost_only.py) where the
#        call's time allows; after a build without the C++ tests)
#        (generate [SITE...]: transformers' generate() through graph_generation: tests/python/
#        test_generate.py and bench/generate_bench.py with the machine's transformers, then again
#        with each SITE folder (other package versions, e.g. the newest transformers installed with
#        pip --target) first on PYTHONPATH; after a build without the C++ tests)
#        (traffic: adapters, state and traffic on the device: the GPU cases of test_lora.py,
#        test_changed_state.py and test_churn.py, bench/lora_workflow.py's table and
#        bench/churn_bench.py's storms; after a build without the C++ tests; diffusers must be
#        installed, e.g. from a carried wheel)
#        (regions: graphs of a forward's parts and this round's targets: the GPU cases of
#        test_regions.py and test_churn.py, bench/regions_bench.py (the guarded 24-block model, a
#        diffusers transformer, generate()), then bench/run.py --quick (host cost, storms, first
#        call); after a build without the C++ tests; diffusers from a carried wheel)
#        bash scripts/device_check.sh compare BASELINE_TREE   (host cost of this tree against an
#        older checkout's, built and timed in the same call, in rounds A/B, B/A, A/B)
set -uo pipefail
cd "$(dirname "$0")/.."
what="${1:-all}"
shift || true
OUT="${OUT:-$PWD/device-logs}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
PY="$(command -v python3)"
BUILD=build-device
SITE=$PWD/$BUILD/site
# Folders the caller put on PYTHONPATH (packages carried as wheels and installed with pip --target,
# e.g. diffusers) stay on it, after the graphed just built.
CALLER_PATH=${PYTHONPATH:+:$PYTHONPATH}
status=0

{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
  "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'devices', torch.cuda.device_count())"
  nvcc --version | tail -1
} 2>&1 | tee "$OUT/env.txt"

if [[ "$what" == all || "$what" == build || "$what" == test || "$what" == bench || "$what" == compare \
      || "$what" == group || "$what" == pipelines || "$what" == memory || "$what" == generate \
      || "$what" == traffic || "$what" == regions || "$what" == compiled ]]; then
  # group runs the gloo tests too, whose emulated backend is the test plugin the tests build.
  cxx_tests=$([[ "$what" == bench || "$what" == compare || "$what" == pipelines || "$what" == memory \
    || "$what" == generate || "$what" == traffic || "$what" == regions || "$what" == compiled ]] \
    && echo OFF || echo ON)
  if ! { cmake -S . -B "$BUILD" -G Ninja -DPython3_EXECUTABLE="$PY" -DGRAPHED_CUDA_ARCHITECTURES=90 \
        -DGRAPHED_BUILD_TESTS="$cxx_tests" && cmake --build "$BUILD" -j"$(nproc)" \
        && rm -rf "$SITE" && cmake --install "$BUILD" --prefix "$SITE"; } > "$OUT/build.log" 2>&1; then
    echo "BUILD FAILED"; tail -40 "$OUT/build.log"; exit 1
  fi
  grep -E "warning" "$OUT/build.log" | grep -v "^ninja" | head -20
  echo "build ok"
fi

if [[ "$what" == all || "$what" == test ]]; then
  ctest --test-dir "$BUILD" --output-on-failure > "$OUT/ctest.log" 2>&1 || status=1
  tail -5 "$OUT/ctest.log"
  grep -E "Skipped|Failed|\*\*\*" "$OUT/ctest.log" | head -30
  (cd "$BUILD" && PYTHONPATH="$SITE$CALLER_PATH" "$PY" -m pytest ../tests/python --rootdir .. -c ../pyproject.toml \
    -p no:cacheprovider -v -rs -m "not many_processes" "$@") > "$OUT/pytest.log" 2>&1 || status=1
  grep -E "PASSED|FAILED|ERROR|SKIPPED" "$OUT/pytest.log" | grep -v "PASSED" | head -40
  tail -3 "$OUT/pytest.log"
fi

if [[ "$what" == group ]]; then
  (cd "$BUILD" && PYTHONPATH="$SITE$CALLER_PATH" timeout 420 "$PY" -m pytest ../tests/python/test_sequence_parallel.py \
    ../tests/python/test_agreement.py ../tests/python/test_patterns_cpu.py --rootdir .. \
    -c ../pyproject.toml -p no:cacheprovider -v -rs "$@") > "$OUT/pytest-group.log" 2>&1 || status=1
  grep -E "PASSED|FAILED|ERROR|SKIPPED" "$OUT/pytest-group.log" | head -40
  tail -3 "$OUT/pytest-group.log"
fi
if [[ "$what" == all || "$what" == bench || "$what" == group ]]; then
  PYTHONPATH="$SITE:bench$CALLER_PATH" timeout 300 "$PY" bench/sp_bench.py --out "$OUT" > "$OUT/sp_bench.log" 2>&1 \
    || status=1
  tail -8 "$OUT/sp_bench.log"
fi
if [[ "$what" == all || "$what" == bench ]]; then
  PYTHONPATH="$SITE:bench$CALLER_PATH" "$PY" bench/run.py --out "$OUT" > "$OUT/bench.log" 2>&1 || status=1
  tail -60 "$OUT/bench.log"
  PYTHONPATH="$SITE:bench$CALLER_PATH" "$PY" bench/host_breakdown.py > "$OUT/host_breakdown.log" 2>&1 || status=1
  tail -20 "$OUT/host_breakdown.log"
fi
if [[ "$what" == pipelines ]]; then
  PYTHONPATH="$SITE:bench$CALLER_PATH" timeout 420 "$PY" bench/audio_pipeline.py --out "$OUT" \
    > "$OUT/audio_pipeline.log" 2>&1 || status=1
  tail -20 "$OUT/audio_pipeline.log"
  PYTHONPATH="$SITE:bench$CALLER_PATH" timeout 100 "$PY" bench/generate_bench.py --out "$OUT" \
    > "$OUT/generate.log" 2>&1 || status=1
  tail -20 "$OUT/generate.log"
fi
if [[ "$what" == generate ]]; then
  # The tests need the emulated backend only on the CPU; its plugin is not built here, so they
  # run the GPU cases and whatever needs no plugin.
  for site in "" "$@"; do
    label=$([[ -z "$site" ]] && echo machine || basename "$site")
    path="${site:+$site:}$SITE"
    PYTHONPATH="$path" "$PY" -c "import transformers; print('transformers', transformers.__version__)" \
      2>&1 | tee -a "$OUT/generate-$label.log"
    (cd "$BUILD" && PYTHONPATH="$path" timeout 240 "$PY" -m pytest ../tests/python/test_generate.py \
      --rootdir .. -c ../pyproject.toml -p no:cacheprovider -v -rs -m gpu) \
      >> "$OUT/generate-$label.log" 2>&1 || status=1
    grep -E "PASSED|FAILED|ERROR" "$OUT/generate-$label.log" | head -20
    tail -2 "$OUT/generate-$label.log"
    PYTHONPATH="$path:bench" timeout 150 "$PY" bench/generate_bench.py --out "$OUT/$label" \
      >> "$OUT/generate-$label.log" 2>&1 || status=1
    tail -12 "$OUT/generate-$label.log"
  done
fi
if [[ "$what" == traffic ]]; then
  (cd "$BUILD" && PYTHONPATH="$SITE$CALLER_PATH" timeout 240 "$PY" -m pytest ../tests/python/test_lora.py \
    ../tests/python/test_changed_state.py ../tests/python/test_churn.py --rootdir .. \
    -c ../pyproject.toml -p no:cacheprovider -v -rs -m gpu "$@") > "$OUT/pytest-traffic.log" 2>&1 \
    || status=1
  grep -E "PASSED|FAILED|ERROR" "$OUT/pytest-traffic.log" | head -40
  tail -2 "$OUT/pytest-traffic.log"
  PYTHONPATH="$SITE:bench$CALLER_PATH" timeout 120 "$PY" bench/lora_workflow.py > "$OUT/lora_workflow.log" 2>&1 \
    || status=1
  grep -v -i "warn\|float32" "$OUT/lora_workflow.log" | tail -30
  PYTHONPATH="$SITE:bench$CALLER_PATH" timeout 120 "$PY" bench/churn_bench.py --out "$OUT" \
    > "$OUT/churn_bench.log" 2>&1 || status=1
  tail -12 "$OUT/churn_bench.log"
fi
if [[ "$what" == regions ]]; then
  (cd "$BUILD" && PYTHONPATH="$SITE$CALLER_PATH" timeout 200 "$PY" -m pytest ../tests/python/test_regions.py \
    ../tests/python/test_churn.py --rootdir .. -c ../pyproject.toml -p no:cacheprovider -v -rs -m gpu "$@") \
    > "$OUT/pytest-regions.log" 2>&1 || status=1
  grep -E "PASSED|FAILED|ERROR" "$OUT/pytest-regions.log" | head -40
  tail -2 "$OUT/pytest-regions.log"
  PYTHONPATH="$SITE:bench$CALLER_PATH" timeout 150 "$PY" bench/regions_bench.py --out "$OUT" \
    > "$OUT/regions_bench.log" 2>&1 || status=1
  grep -v "^graphed: runner" "$OUT/regions_bench.log" | tail -20
  PYTHONPATH="$SITE:bench$CALLER_PATH" timeout $((560 - SECONDS)) "$PY" bench/run.py --quick --out "$OUT" \
    > "$OUT/bench.log" 2>&1 || status=1
  tail -40 "$OUT/bench.log"
fi
if [[ "$what" == memory ]]; then
  PYTHONPATH="$SITE:bench$CALLER_PATH" timeout 540 "$PY" bench/memory_shapes.py --out "$OUT" "$@" \
    > "$OUT/memory_shapes.log" 2>&1 || status=1
  tail -40 "$OUT/memory_shapes.log"
  if ((SECONDS < 400)); then  # a device command has 600 s
    PYTHONPATH="$SITE:bench$CALLER_PATH" timeout 120 "$PY" bench/host_cost_only.py --label memory \
      --json "$OUT/host_cost.jsonl" > "$OUT/host_cost.log" 2>&1 || status=1
    tail -12 "$OUT/host_cost.log"
  else
    echo "host cost not timed: the memory rows left too little of the call's 600 s"
  fi
fi
if [[ "$what" == compiled ]]; then
  # graphed over torch.compile: the GPU cases of test_compose_compile.py and
  # test_generate_compiled.py (inductor, nothing compiled by hand; skipped with COMPILED_TESTS=0),
  # then bench/compiled_decode_bench.py on the models named (default all three; --models x,y).
  if [[ "${COMPILED_TESTS:-1}" == 1 ]]; then
    (cd "$BUILD" && PYTHONPATH="$SITE$CALLER_PATH" timeout 300 "$PY" -m pytest \
      ../tests/python/test_compose_compile.py ../tests/python/test_generate_compiled.py --rootdir .. \
      -c ../pyproject.toml -p no:cacheprovider -v -rs -m gpu ${COMPILED_PYTEST:-}) > "$OUT/pytest-compiled.log" 2>&1 \
      || status=1
    grep -E "PASSED|FAILED|ERROR" "$OUT/pytest-compiled.log" | head -30
    grep -E "^E " "$OUT/pytest-compiled.log" | head -30
    tail -2 "$OUT/pytest-compiled.log"
  fi
  PYTHONPATH="$SITE:bench$CALLER_PATH" timeout $((440 - SECONDS)) "$PY" bench/compiled_decode_bench.py \
    --out "$OUT" "$@" > "$OUT/compiled_decode.log" 2>&1 || status=1
  grep -v -i "warn" "$OUT/compiled_decode.log" | tail -30
  # The diffusers row (diffusers from a carried wheel): a Flux transformer over regional compile.
  PYTHONPATH="$SITE:bench$CALLER_PATH" timeout $((590 - SECONDS)) "$PY" bench/compiled_flux_bench.py \
    > "$OUT/compiled_flux.log" 2>&1 || status=1
  grep -v -i "warn" "$OUT/compiled_flux.log" | tail -8
fi
if [[ "$what" == compare ]]; then
  baseline="${1:?compare needs the folder of the baseline checkout}"
  if ! { cmake -S "$baseline" -B "$baseline/$BUILD" -G Ninja -DPython3_EXECUTABLE="$PY" \
        -DGRAPHED_CUDA_ARCHITECTURES=90 -DGRAPHED_BUILD_TESTS=OFF \
        && cmake --build "$baseline/$BUILD" -j"$(nproc)"; } > "$OUT/build-baseline.log" 2>&1; then
    echo "BASELINE BUILD FAILED"; tail -40 "$OUT/build-baseline.log"; exit 1
  fi
  # A baseline of this layout installs its package (0.2's built into its python/ folder).
  rm -rf "$baseline/$BUILD/site"
  cmake --install "$baseline/$BUILD" --prefix "$baseline/$BUILD/site" >> "$OUT/build-baseline.log" 2>&1 || true
  # A/B, B/A, A/B: a build that runs second in a round (a warmer or busier host) is not always
  # the same one.
  for round in 1 2 3; do
    order=("$baseline" "$PWD")
    [[ $round == 2 ]] && order=("$PWD" "$baseline")
    for tree in "${order[@]}"; do
      label=$([[ "$tree" == "$PWD" ]] && echo this || echo baseline)
      pkg="$SITE"
      if [[ "$tree" != "$PWD" ]]; then
        pkg=$([[ -d "$tree/$BUILD/site/graphed" ]] && echo "$tree/$BUILD/site" || echo "$tree/python")
      fi
      PYTHONPATH="$pkg:bench" "$PY" bench/host_cost_only.py --label "$label-$round" \
        --json "$OUT/compare.jsonl" 2>&1 | tee -a "$OUT/compare.log" || status=1
    done
  done
fi
exit $status
