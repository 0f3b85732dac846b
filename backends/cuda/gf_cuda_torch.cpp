// Why this exists: a runner's torch-side state (its device and its pool reference) and what torch
// says about the runner's device: whether it can hold graphs, which stream is current, and the
// caching allocator's figures for stats. The pool, the probe, the warm-ups and the graphs have
// files of their own (gf_cuda_torch_internal.h lists them).
#include "gf_cuda_torch_internal.h"

#include "gf_torch_errors.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>

#include <cstdio>
#include <exception>

using graphed::cuda::torch_runner_of;

namespace {

// One counter of the caching allocator's stats on the device, every pool counted, as `pick`
// chooses it from them (allocated_bytes: handed out; reserved_bytes: held from the device, what
// torch.cuda.memory_reserved says).
template <typename Pick> int64_t aggregate_bytes(c10::DeviceIndex device, Pick pick) {
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device);
  const auto aggregate = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  return pick(stats)[aggregate].current;
}

// What a memory hook answers: `read` of the runner, or -1 where it throws. The hooks are read for
// stats also on a runner whose device has no graphs (a CPU runner of a CUDA process), which has
// no state: -1 there too.
template <typename Read> int64_t memory_figure(void *state, Read read) {
  if (state == nullptr) {
    return -1;
  }
  try {
    return read(*torch_runner_of(state));
  } catch (...) {
    return -1;
  }
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

extern "C" gf_status gf_cuda_torch_runner_create(int device_index, gf_cuda_torch_pool *pool,
                                                 gf_cuda_torch_runner **runner, gf_error *err) {
  *runner = nullptr;
  try {
    auto state = std::make_unique<gf_cuda_torch_runner>();
    state->device = device_index >= 0 ? static_cast<c10::DeviceIndex>(device_index)
                                      : c10::cuda::current_device();
    if (pool != nullptr) {
      graphed::cuda::retain_pool(pool);
      state->pool = pool;
    } else {
      gf_status status = graphed::cuda::make_pool(state->device, &state->pool, err);
      if (status != GF_OK) {
        return status;
      }
    }
    *runner = state.release();
    return GF_OK;
  } catch (...) {
    return graphed::status_of_current_exception(err,
                                                "graphed: setting up CUDA for a runner failed");
  }
}

extern "C" void gf_cuda_torch_runner_destroy(gf_cuda_torch_runner *runner) {
  if (runner != nullptr) {
    graphed::cuda::release_pool(runner->pool);
  }
  delete runner;
}

extern "C" cudaStream_t gf_cuda_torch_current_stream(const gf_cuda_torch_runner *runner) {
  return c10::cuda::getCurrentCUDAStream(runner->device).stream();
}

extern "C" int64_t gf_cuda_torch_device_bytes_in_use(void *, void *state) {
  return memory_figure(state, [](const gf_cuda_torch_runner &runner) {
    return aggregate_bytes(runner.device, [](const auto &stats) { return stats.allocated_bytes; });
  });
}

extern "C" int64_t gf_cuda_torch_device_bytes_reserved(void *, void *state) {
  return memory_figure(state, [](const gf_cuda_torch_runner &runner) {
    return aggregate_bytes(runner.device, [](const auto &stats) { return stats.reserved_bytes; });
  });
}

// A walk over the allocator's snapshot (every segment of every device): read for stats, never on
// the call path.
extern "C" int64_t gf_cuda_torch_pool_bytes_reserved(void *, void *state) {
  return memory_figure(state, [](const gf_cuda_torch_runner &runner) {
    int64_t total = 0;
    for (const auto &segment : c10::cuda::CUDACachingAllocator::snapshot().segments) {
      if (segment.device == runner.pool->device &&
          segment.owner_private_pool_id == runner.pool->id) {
        total += static_cast<int64_t>(segment.total_size);
      }
    }
    return total;
  });
}
