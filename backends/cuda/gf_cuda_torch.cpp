// The torch half of the CUDA backend (see gf_cuda_torch.h).
#include "gf_cuda_torch.h"

#include "gf_torch_errors.h"

#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>

#include <cstdio>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>

struct gf_cuda_torch_graph {
  // keep_graph: the cudaGraph_t outlives instantiation, so the backend can find its copy nodes.
  at::cuda::CUDAGraph graph{/*keep_graph=*/true};
};

namespace {

// The sync probe's ear: torch's sync-debug mode "warn" reports each synchronizing operator as a
// warning, which this handler (installed on the probing thread) counts instead of passing on.
// Mode "error" would raise in the middle of the forward, leaving the collectives after that point
// unrun on this rank while its peers run them; "warn" lets the forward finish. Operators called
// from Python report to Python's warnings instead (its bindings install their own handler), where
// graphed's Python layer listens during the probe.
constexpr const char *kSyncWarning = "called a synchronizing CUDA operation";

class SyncRecorder final : public c10::WarningHandler {
public:
  void process(const c10::Warning &warning) override {
    if (warning.msg().rfind(kSyncWarning, 0) == 0) {
      ++syncs;
      return;
    }
    if (passed_on != nullptr) {
      passed_on->process(warning);
    }
  }

  c10::WarningHandler *passed_on = nullptr;
  int syncs = 0;
};

} // namespace

struct gf_cuda_torch_runner {
  c10::DeviceIndex device = 0;
  std::optional<c10::cuda::CUDAStream> side_stream;
  std::optional<c10::cuda::CUDAStream> outer_stream; // current before begin, restored at end
  at::cuda::MempoolId_t pool{0, 0};
  SyncRecorder sync_recorder;
  std::unique_ptr<gf_cuda_torch_graph> capturing;
};

namespace {

gf_cuda_torch_runner *torch_runner_of(void *state) {
  return static_cast<gf_cuda_runner *>(state)->torch;
}

} // namespace

extern "C" int gf_cuda_torch_graphs_supported(void *, int device_type, int device_index, char *why,
                                              size_t why_capacity) {
  try {
    if (device_type != static_cast<int>(c10::DeviceType::CUDA)) {
      std::snprintf(why, why_capacity, "the runner's device is not a CUDA device");
      return 0;
    }
    if (!at::cuda::is_available()) {
      std::snprintf(why, why_capacity, "torch sees no CUDA device");
      return 0;
    }
    int count = static_cast<int>(c10::cuda::device_count());
    if (device_index >= count) {
      std::snprintf(why, why_capacity, "cuda:%d does not exist (%d device(s))", device_index,
                    count);
      return 0;
    }
    return 1;
  } catch (const std::exception &e) {
    std::snprintf(why, why_capacity, "probing CUDA failed: %s", e.what());
    return 0;
  }
}

extern "C" gf_status gf_cuda_torch_runner_create(int device_index, gf_cuda_torch_runner **runner,
                                                 gf_error *err) {
  *runner = nullptr;
  try {
    auto state = std::make_unique<gf_cuda_torch_runner>();
    state->device = device_index >= 0 ? static_cast<c10::DeviceIndex>(device_index)
                                      : c10::cuda::current_device();
    c10::cuda::CUDAGuard guard(state->device);
    state->side_stream = c10::cuda::getStreamFromPool(false, state->device);
    state->pool = at::cuda::graph_pool_handle();
    *runner = state.release();
    return GF_OK;
  } catch (...) {
    return graphed::status_of_current_exception(err,
                                                "graphed: setting up CUDA for a runner failed");
  }
}

extern "C" void gf_cuda_torch_runner_destroy(gf_cuda_torch_runner *runner) { delete runner; }

extern "C" cudaStream_t gf_cuda_torch_current_stream(const gf_cuda_torch_runner *runner) {
  return c10::cuda::getCurrentCUDAStream(runner->device).stream();
}

extern "C" int64_t gf_cuda_torch_device_bytes_in_use(void *, void *state) {
  try {
    const auto stats =
        c10::cuda::CUDACachingAllocator::getDeviceStats(torch_runner_of(state)->device);
    const auto aggregate = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    return stats.allocated_bytes[aggregate].current;
  } catch (...) {
    return -1;
  }
}

namespace {

// torch's sync-debug mode is one setting for the process, while probes run per runner and may
// overlap on several threads: the first probe to begin saves the mode and sets "warn", the last
// to end puts the saved mode back.
std::mutex probes_mutex;
int probes_running = 0;
c10::cuda::SyncDebugMode mode_before_probes = c10::cuda::SyncDebugMode::L_DISABLED;

} // namespace

extern "C" gf_status gf_cuda_torch_sync_probe_begin(void *, void *state, gf_error *err) {
  gf_cuda_torch_runner *runner = torch_runner_of(state);
  try {
    std::lock_guard<std::mutex> lock(probes_mutex);
    auto &warnings = c10::cuda::warning_state();
    if (probes_running++ == 0) {
      mode_before_probes = warnings.get_sync_debug_mode();
      warnings.set_sync_debug_mode(c10::cuda::SyncDebugMode::L_WARN);
    }
  } catch (...) {
    return graphed::status_of_current_exception(err, "graphed: starting the sync probe failed");
  }
  runner->sync_recorder.syncs = 0;
  runner->sync_recorder.passed_on = c10::WarningUtils::get_warning_handler();
  c10::WarningUtils::set_warning_handler(&runner->sync_recorder);
  return GF_OK;
}

extern "C" gf_status gf_cuda_torch_sync_probe_end(void *, void *state, gf_error *err) {
  gf_cuda_torch_runner *runner = torch_runner_of(state);
  c10::WarningUtils::set_warning_handler(runner->sync_recorder.passed_on);
  try {
    std::lock_guard<std::mutex> lock(probes_mutex);
    if (--probes_running == 0) {
      c10::cuda::warning_state().set_sync_debug_mode(mode_before_probes);
    }
  } catch (...) {
    return graphed::status_of_current_exception(err, "graphed: ending the sync probe failed");
  }
  runner->sync_recorder.passed_on = nullptr;
  if (runner->sync_recorder.syncs > 0) {
    return gf_error_set(err, GF_ERR_CAPTURE,
                        "graphed: the forward %s (%d time(s) during graphed's sync probe); a "
                        "captured graph cannot hold a host synchronization: take it out of the "
                        "forward, or leave this module eager",
                        kSyncWarning, runner->sync_recorder.syncs);
  }
  return GF_OK;
}

namespace {

gf_status side_stream_begin(gf_cuda_torch_runner *runner, gf_error *err) {
  try {
    c10::cuda::CUDAStream outer = c10::cuda::getCurrentCUDAStream(runner->device);
    at::cuda::CUDAEvent ready;
    ready.record(outer);
    ready.block(*runner->side_stream);
    runner->outer_stream = outer;
    c10::cuda::setCurrentCUDAStream(*runner->side_stream);
    return GF_OK;
  } catch (...) {
    return graphed::status_of_current_exception(err,
                                                "graphed: switching to the side stream failed");
  }
}

gf_status side_stream_end(gf_cuda_torch_runner *runner, gf_error *err) {
  try {
    if (!runner->outer_stream.has_value()) {
      return GF_OK;
    }
    c10::cuda::CUDAStream outer = *runner->outer_stream;
    runner->outer_stream.reset();
    c10::cuda::setCurrentCUDAStream(outer);
    at::cuda::CUDAEvent done;
    done.record(*runner->side_stream);
    done.block(outer);
    return GF_OK;
  } catch (...) {
    return graphed::status_of_current_exception(err, "graphed: joining the side stream failed");
  }
}

} // namespace

extern "C" gf_status gf_cuda_torch_side_stream_begin(void *, void *state, gf_error *err) {
  return side_stream_begin(torch_runner_of(state), err);
}

extern "C" gf_status gf_cuda_torch_side_stream_end(void *, void *state, gf_error *err) {
  return side_stream_end(torch_runner_of(state), err);
}

extern "C" gf_status gf_cuda_torch_capture_begin(gf_cuda_torch_runner *runner, gf_error *err) {
  gf_status status = side_stream_begin(runner, err);
  if (status != GF_OK) {
    return status;
  }
  try {
    runner->capturing = std::make_unique<gf_cuda_torch_graph>();
    runner->capturing->graph.capture_begin(runner->pool);
    return GF_OK;
  } catch (...) {
    runner->capturing.reset();
    status = graphed::status_of_current_exception(
        err, "graphed: beginning the CUDA graph capture failed");
    side_stream_end(runner, nullptr);
    return status;
  }
}

extern "C" gf_status gf_cuda_torch_capture_end(gf_cuda_torch_runner *runner, int ok,
                                               gf_cuda_torch_graph **graph, gf_error *err) {
  *graph = nullptr;
  gf_status status = GF_OK;
  std::unique_ptr<gf_cuda_torch_graph> captured = std::move(runner->capturing);
  if (captured) {
    try {
      // Ends the capture also after a failed forward, so the stream leaves capture mode; a
      // capture the forward invalidated throws here and is dropped.
      captured->graph.capture_end();
      if (ok) {
        captured->graph.instantiate();
      }
    } catch (...) {
      status = graphed::status_of_current_exception(
          err, "graphed: ending the CUDA graph capture failed");
      captured.reset();
    }
  }
  gf_status joined = side_stream_end(runner, status == GF_OK ? err : nullptr);
  if (status == GF_OK) {
    status = joined;
  }
  if (status == GF_OK && ok && captured) {
    *graph = captured.release();
  }
  return status;
}

extern "C" cudaGraph_t gf_cuda_torch_graph_raw(gf_cuda_torch_graph *graph) {
  try {
    return graph->graph.raw_cuda_graph();
  } catch (...) {
    return nullptr;
  }
}

extern "C" cudaGraphExec_t gf_cuda_torch_graph_exec(gf_cuda_torch_graph *graph) {
  try {
    return graph->graph.raw_cuda_graph_exec();
  } catch (...) {
    return nullptr;
  }
}

extern "C" gf_status gf_cuda_torch_graph_replay(gf_cuda_torch_graph *graph, gf_error *err) {
  try {
    graph->graph.replay();
    return GF_OK;
  } catch (...) {
    return graphed::status_of_current_exception(err, "graphed: replaying the CUDA graph failed");
  }
}

extern "C" void gf_cuda_torch_graph_release(gf_cuda_torch_graph *graph) {
  try {
    delete graph;
  } catch (...) {
    // A destructor that throws has nothing left to release.
  }
}
