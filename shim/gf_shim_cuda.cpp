// The torch-side CUDA services for backends/cuda (see gf_shim_cuda.h).
#include "gf_shim_cuda.h"

#include "gf_shim_errors.h"

#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <cstdio>
#include <exception>
#include <memory>
#include <optional>

struct gf_shim_cuda_runner {
  c10::DeviceIndex device = 0;
  std::optional<c10::cuda::CUDAStream> side_stream;
  std::optional<c10::cuda::CUDAStream> outer_stream; // current before begin, restored at end
  at::cuda::MempoolId_t pool{0, 0};
  c10::cuda::SyncDebugMode saved_sync_mode = c10::cuda::SyncDebugMode::L_DISABLED;
  std::unique_ptr<at::cuda::CUDAGraph> capturing;
};

extern "C" int gf_shim_cuda_graphs_supported(int device_type, int device_index, char *why,
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

extern "C" gf_status gf_shim_cuda_runner_create(int device_index, gf_shim_cuda_runner **runner,
                                                gf_error *err) {
  *runner = nullptr;
  try {
    auto state = std::make_unique<gf_shim_cuda_runner>();
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

extern "C" void gf_shim_cuda_runner_destroy(gf_shim_cuda_runner *runner) { delete runner; }

extern "C" void *gf_shim_cuda_current_stream(gf_shim_cuda_runner *runner) {
  return c10::cuda::getCurrentCUDAStream(runner->device).stream();
}

extern "C" gf_status gf_shim_cuda_sync_probe_begin(gf_shim_cuda_runner *runner, gf_error *err) {
  (void)err;
  auto &state = c10::cuda::warning_state();
  runner->saved_sync_mode = state.get_sync_debug_mode();
  state.set_sync_debug_mode(c10::cuda::SyncDebugMode::L_ERROR);
  return GF_OK;
}

extern "C" gf_status gf_shim_cuda_sync_probe_end(gf_shim_cuda_runner *runner, gf_error *err) {
  (void)err;
  c10::cuda::warning_state().set_sync_debug_mode(runner->saved_sync_mode);
  return GF_OK;
}

extern "C" gf_status gf_shim_cuda_side_stream_begin(gf_shim_cuda_runner *runner, gf_error *err) {
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

extern "C" gf_status gf_shim_cuda_side_stream_end(gf_shim_cuda_runner *runner, gf_error *err) {
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

extern "C" gf_status gf_shim_cuda_capture_begin(gf_shim_cuda_runner *runner, gf_error *err) {
  gf_status status = gf_shim_cuda_side_stream_begin(runner, err);
  if (status != GF_OK) {
    return status;
  }
  try {
    // keep_graph: the cudaGraph_t outlives instantiation, so the backend can find its copy nodes.
    runner->capturing = std::make_unique<at::cuda::CUDAGraph>(/*keep_graph=*/true);
    runner->capturing->capture_begin(runner->pool);
    return GF_OK;
  } catch (...) {
    runner->capturing.reset();
    status = graphed::status_of_current_exception(
        err, "graphed: beginning the CUDA graph capture failed");
    gf_shim_cuda_side_stream_end(runner, nullptr);
    return status;
  }
}

extern "C" gf_status gf_shim_cuda_capture_end(gf_shim_cuda_runner *runner, int ok, void **graph,
                                              gf_error *err) {
  *graph = nullptr;
  gf_status status = GF_OK;
  std::unique_ptr<at::cuda::CUDAGraph> captured = std::move(runner->capturing);
  if (captured) {
    try {
      // Ends the capture also after a failed forward, so the stream leaves capture mode; a
      // capture the forward invalidated throws here and is dropped.
      captured->capture_end();
      if (ok) {
        captured->instantiate();
      }
    } catch (...) {
      status = graphed::status_of_current_exception(
          err, "graphed: ending the CUDA graph capture failed");
      captured.reset();
    }
  }
  gf_status joined = gf_shim_cuda_side_stream_end(runner, status == GF_OK ? err : nullptr);
  if (status == GF_OK) {
    status = joined;
  }
  if (status == GF_OK && ok && captured) {
    *graph = captured.release();
  }
  return status;
}

extern "C" void *gf_shim_cuda_graph_raw(void *graph) {
  try {
    return static_cast<at::cuda::CUDAGraph *>(graph)->raw_cuda_graph();
  } catch (...) {
    return nullptr;
  }
}

extern "C" void *gf_shim_cuda_graph_exec(void *graph) {
  try {
    return static_cast<at::cuda::CUDAGraph *>(graph)->raw_cuda_graph_exec();
  } catch (...) {
    return nullptr;
  }
}

extern "C" gf_status gf_shim_cuda_graph_replay(void *graph, gf_error *err) {
  try {
    static_cast<at::cuda::CUDAGraph *>(graph)->replay();
    return GF_OK;
  } catch (...) {
    return graphed::status_of_current_exception(err, "graphed: replaying the CUDA graph failed");
  }
}

extern "C" void gf_shim_cuda_graph_release(void *graph) {
  try {
    delete static_cast<at::cuda::CUDAGraph *>(graph);
  } catch (...) {
    // A destructor that throws has nothing left to release.
  }
}
