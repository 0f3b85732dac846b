// The torch half of the XPU backend (see gf_xpu_torch.h). Compiled only against a torch built with
// XPU; where no such torch exists (this project's CI) it is compile-checked against torch's XPU
// headers and the SYCL headers of the intel-sycl-rt wheel (tests/xpu).
#include "gf_xpu_torch.h"

#include "gf_torch_errors.h"

#include <ATen/ATen.h>
#include <ATen/xpu/XPUContext.h>
#include <ATen/xpu/XPUEvent.h>
#include <ATen/xpu/XPUGraph.h>
#include <c10/xpu/XPUFunctions.h>
#include <c10/xpu/XPUStream.h>

#include <sycl/ext/oneapi/backend/level_zero.hpp>
#include <sycl/sycl.hpp>

#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <optional>
#include <variant>

namespace {

constexpr size_t kTableEntries = 2 * GF_XPU_COPIES_PER_NODE; // input half, then output half
constexpr size_t kTableBytes = kTableEntries * sizeof(gf_xpu_gather_entry);

} // namespace

struct gf_xpu_torch_graph {
  at::xpu::XPUGraph graph{/*keep_graph=*/false};
  at::Tensor table; // device bytes: the two gather launches read their halves of it
  size_t counts[2] = {0, 0};
  bool recorded[2] = {false, false};
};

struct gf_xpu_torch_runner {
  const gf_xpu_ze *ze = nullptr;
  c10::DeviceIndex device = 0;
  std::optional<c10::xpu::XPUStream> side_stream;
  std::optional<c10::xpu::XPUStream> outer_stream; // current before begin, restored at end
  at::xpu::MempoolId_t pool{0, 0};
  gf_xpu_gather gather{}; // module and kernel on the queue's Level Zero context (C half)
  std::optional<sycl::kernel> kernel;
  std::unique_ptr<gf_xpu_torch_graph> capturing;

  ~gf_xpu_torch_runner() {
    kernel.reset(); // SYCL borrows the handles (ownership::keep); the C half releases them
    gf_xpu_gather_destroy(&gather);
  }
};

namespace {

gf_xpu_torch_runner *torch_runner_of(void *state) {
  return static_cast<gf_xpu_runner *>(state)->torch;
}

namespace ze = sycl::ext::oneapi::level_zero;
constexpr auto kLevelZero = sycl::backend::ext_oneapi_level_zero;

// One gather launch on `queue`: the same arguments at every replay; only the table changes.
void submit_gather(gf_xpu_torch_runner *runner, sycl::queue &queue, const void *table,
                   uint32_t count) {
  sycl::kernel &kernel = *runner->kernel;
  const gf_xpu_gather_launch launch = gf_xpu_gather_launch_of(count);
  queue.submit([&](sycl::handler &handler) {
    handler.set_arg(0, table);
    handler.set_arg(1, count);
    // SYCL's last dimension is Level Zero's first: (entries, groups per copy x group size).
    handler.parallel_for(
        sycl::nd_range<2>(
            sycl::range<2>(launch.copies,
                           static_cast<size_t>(launch.groups_per_copy) * launch.group_size),
            sycl::range<2>(1, launch.group_size)),
        kernel);
  });
}

// A pinned host staging buffer from torch's host allocator, which keeps it alive until the
// non-blocking copy that reads it has run, so the next call never overwrites a table in flight.
at::Tensor pinned_staging(size_t bytes) {
  return at::empty({static_cast<int64_t>(bytes)},
                   at::TensorOptions().dtype(at::kByte).pinned_memory(true));
}

gf_status side_stream_begin(gf_xpu_torch_runner *runner, gf_error *err) {
  try {
    c10::xpu::XPUStream outer = c10::xpu::getCurrentXPUStream(runner->device);
    at::xpu::XPUEvent ready;
    ready.record(outer);
    ready.block(*runner->side_stream);
    runner->outer_stream = outer;
    c10::xpu::setCurrentXPUStream(*runner->side_stream);
    return GF_OK;
  } catch (...) {
    return graphed::status_of_current_exception(err,
                                                "graphed: switching to the side stream failed");
  }
}

gf_status side_stream_end(gf_xpu_torch_runner *runner, gf_error *err) {
  try {
    if (!runner->outer_stream.has_value()) {
      return GF_OK;
    }
    c10::xpu::XPUStream outer = *runner->outer_stream;
    runner->outer_stream.reset();
    c10::xpu::setCurrentXPUStream(outer);
    at::xpu::XPUEvent done;
    done.record(*runner->side_stream);
    done.block(outer);
    return GF_OK;
  } catch (...) {
    return graphed::status_of_current_exception(err, "graphed: joining the side stream failed");
  }
}

} // namespace

extern "C" int gf_xpu_torch_is_xpu_device(int device_type) {
  return device_type == static_cast<int>(c10::DeviceType::XPU);
}

extern "C" int gf_xpu_torch_graphs_supported(int device_index, char *why, size_t why_capacity) {
  try {
    if (!at::xpu::is_available()) {
      std::snprintf(why, why_capacity, "torch sees no XPU device");
      return 0;
    }
    int count = static_cast<int>(c10::xpu::device_count());
    if (device_index >= count) {
      std::snprintf(why, why_capacity, "xpu:%d does not exist (%d device(s))", device_index, count);
      return 0;
    }
    c10::DeviceIndex index = device_index >= 0 ? static_cast<c10::DeviceIndex>(device_index)
                                               : c10::xpu::current_device();
    if (!c10::xpu::get_raw_device(index).has(sycl::aspect::ext_oneapi_limited_graph)) {
      std::snprintf(why, why_capacity, "the SYCL runtime has no graph support on xpu:%d",
                    static_cast<int>(index));
      return 0;
    }
    return 1;
  } catch (const std::exception &e) {
    std::snprintf(why, why_capacity, "probing XPU failed: %s", e.what());
    return 0;
  }
}

extern "C" gf_status gf_xpu_torch_runner_create(const gf_xpu_ze *level_zero, int device_index,
                                                gf_xpu_torch_runner **runner, gf_error *err) {
  *runner = nullptr;
  try {
    auto state = std::make_unique<gf_xpu_torch_runner>();
    state->ze = level_zero;
    state->device = device_index >= 0 ? static_cast<c10::DeviceIndex>(device_index)
                                      : c10::xpu::current_device();
    state->side_stream = c10::xpu::getStreamFromPool(false, state->device);
    state->pool = at::xpu::graph_pool_handle();
    // The kernel is built by the C half on the Level Zero context and device behind torch's
    // queue (loader handles: the library SYCL loads is the same loader), then wrapped for SYCL.
    sycl::queue &queue = c10::xpu::getCurrentXPUStream(state->device).queue();
    sycl::context context = queue.get_context();
    auto ze_context = sycl::get_native<kLevelZero>(context);
    auto ze_device = sycl::get_native<kLevelZero>(queue.get_device());
    gf_status status = gf_xpu_gather_create(level_zero, ze_context, ze_device, &state->gather, err);
    if (status != GF_OK) {
      return status;
    }
    auto bundle = sycl::make_kernel_bundle<kLevelZero, sycl::bundle_state::executable>(
        {state->gather.module, ze::ownership::keep}, context);
    state->kernel =
        sycl::make_kernel<kLevelZero>({bundle, state->gather.kernel, ze::ownership::keep}, context);
    *runner = state.release();
    return GF_OK;
  } catch (...) {
    return graphed::status_of_current_exception(err, "graphed: setting up XPU for a runner failed");
  }
}

extern "C" void gf_xpu_torch_runner_destroy(gf_xpu_torch_runner *runner) {
  try {
    delete runner;
  } catch (...) {
    // A destructor that throws has nothing left to release.
  }
}

extern "C" int gf_xpu_torch_outer_capture_active(gf_xpu_torch_runner *runner, int native_graphs) {
  try {
    c10::xpu::XPUStream stream = c10::xpu::getCurrentXPUStream(runner->device);
    if (stream.is_capturing()) {
      return 1;
    }
    if (!native_graphs) {
      return 0;
    }
    auto native = sycl::get_native<kLevelZero>(stream.queue());
    if (auto *list = std::get_if<ze_command_list_handle_t>(&native)) {
      return gf_xpu_ze_list_capturing(runner->ze, *list) == 1;
    }
    return 0;
  } catch (...) {
    return 0;
  }
}

extern "C" gf_status gf_xpu_torch_side_stream_begin(void *, void *state, gf_error *err) {
  return side_stream_begin(torch_runner_of(state), err);
}

extern "C" gf_status gf_xpu_torch_side_stream_end(void *, void *state, gf_error *err) {
  return side_stream_end(torch_runner_of(state), err);
}

extern "C" gf_status gf_xpu_torch_capture_begin(void *, void *state, gf_error *err) {
  gf_xpu_torch_runner *runner = torch_runner_of(state);
  gf_status status = side_stream_begin(runner, err);
  if (status != GF_OK) {
    return status;
  }
  try {
    auto graph = std::make_unique<gf_xpu_torch_graph>();
    // The table is allocated before the capture, from the ordinary pool, and lives with the
    // graph: the captured launches read it at every replay.
    graph->table = at::empty({static_cast<int64_t>(kTableBytes)},
                             at::TensorOptions().dtype(at::kByte).device(at::kXPU, runner->device));
    runner->capturing = std::move(graph);
    runner->capturing->graph.capture_begin(runner->pool);
    return GF_OK;
  } catch (...) {
    runner->capturing.reset();
    status = graphed::status_of_current_exception(
        err, "graphed: beginning the XPU graph capture failed");
    side_stream_end(runner, nullptr);
    return status;
  }
}

extern "C" gf_status gf_xpu_torch_capture_copy_node(void *, void *state, int role, const gf_copy *,
                                                    size_t count, int *recorded, gf_error *err) {
  gf_xpu_torch_runner *runner = torch_runner_of(state);
  *recorded = 0;
  gf_xpu_torch_graph *graph = runner->capturing.get();
  if (graph == nullptr || count == 0 || count > GF_XPU_COPIES_PER_NODE ||
      (role != GF_COPY_INPUTS && role != GF_COPY_OUTPUTS)) {
    return GF_OK; // replays of this graph copy with separate launches
  }
  try {
    const auto *table = static_cast<const gf_xpu_gather_entry *>(graph->table.data_ptr()) +
                        static_cast<size_t>(role) * GF_XPU_COPIES_PER_NODE;
    // Recorded, not run: the table is filled before each replay (launch_folded).
    submit_gather(runner, c10::xpu::getCurrentXPUStream(runner->device).queue(), table,
                  static_cast<uint32_t>(count));
    graph->recorded[role] = true;
    graph->counts[role] = count;
    *recorded = 1;
    return GF_OK;
  } catch (...) {
    return graphed::status_of_current_exception(err, "graphed: recording a copy node failed");
  }
}

extern "C" gf_status gf_xpu_torch_capture_end(void *, void *state, int ok, void **graph,
                                              gf_error *err) {
  gf_xpu_torch_runner *runner = torch_runner_of(state);
  *graph = nullptr;
  gf_status status = GF_OK;
  std::unique_ptr<gf_xpu_torch_graph> captured = std::move(runner->capturing);
  if (captured) {
    try {
      // Ends the recording also after a failed forward; keep_graph=false finalizes it here.
      captured->graph.capture_end();
    } catch (...) {
      status =
          graphed::status_of_current_exception(err, "graphed: ending the XPU graph capture failed");
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

extern "C" gf_status gf_xpu_torch_copy_batch(void *, void *state, const gf_copy *copies,
                                             size_t count, gf_error *err) {
  gf_xpu_torch_runner *runner = torch_runner_of(state);
  try {
    sycl::queue &queue = c10::xpu::getCurrentXPUStream(runner->device).queue();
    for (size_t first = 0; first < count; first += GF_XPU_COPIES_PER_NODE) {
      const size_t per_launch = GF_XPU_COPIES_PER_NODE;
      size_t chunk = count - first < per_launch ? count - first : per_launch;
      size_t bytes = chunk * sizeof(gf_xpu_gather_entry);
      at::Tensor staging = pinned_staging(bytes);
      gf_status status =
          gf_xpu_gather_encode(copies + first, chunk,
                               static_cast<gf_xpu_gather_entry *>(staging.data_ptr()), chunk, err);
      if (status != GF_OK) {
        return status;
      }
      // Freed right after the launch is queued: the caching allocator reuses it only after the
      // work queued on this stream, the launch included.
      at::Tensor table =
          at::empty({static_cast<int64_t>(bytes)},
                    at::TensorOptions().dtype(at::kByte).device(at::kXPU, runner->device));
      table.copy_(staging, /*non_blocking=*/true);
      submit_gather(runner, queue, table.data_ptr(), static_cast<uint32_t>(chunk));
    }
    return GF_OK;
  } catch (...) {
    return graphed::status_of_current_exception(err, "graphed: the batched copy failed");
  }
}

extern "C" gf_status gf_xpu_torch_launch(void *, void *, void *graph, gf_error *err) {
  try {
    static_cast<gf_xpu_torch_graph *>(graph)->graph.replay();
    return GF_OK;
  } catch (...) {
    return graphed::status_of_current_exception(err, "graphed: replaying the XPU graph failed");
  }
}

extern "C" gf_status gf_xpu_torch_launch_folded(void *context, void *state, void *graph,
                                                const gf_copy *inputs, size_t input_count,
                                                const gf_copy *outputs, size_t output_count,
                                                gf_error *err) {
  auto *captured = static_cast<gf_xpu_torch_graph *>(graph);
  if (!captured->recorded[GF_COPY_INPUTS] || !captured->recorded[GF_COPY_OUTPUTS] ||
      captured->counts[GF_COPY_INPUTS] != input_count ||
      captured->counts[GF_COPY_OUTPUTS] != output_count) {
    return GF_ERR_NOT_FOUND;
  }
  try {
    // Submission 1: the whole table (both halves) from pinned staging, on the current stream.
    at::Tensor staging = pinned_staging(kTableBytes);
    auto *entries = static_cast<gf_xpu_gather_entry *>(staging.data_ptr());
    std::memset(entries, 0, kTableBytes);
    gf_status status =
        gf_xpu_gather_encode(inputs, input_count, entries, GF_XPU_COPIES_PER_NODE, err);
    if (status == GF_OK) {
      status = gf_xpu_gather_encode(outputs, output_count, entries + GF_XPU_COPIES_PER_NODE,
                                    GF_XPU_COPIES_PER_NODE, err);
    }
    if (status != GF_OK) {
      return status;
    }
    captured->table.copy_(staging, /*non_blocking=*/true);
  } catch (...) {
    return graphed::status_of_current_exception(err, "graphed: refreshing the gather table failed");
  }
  // Submission 2: the graph, whose gathers read the table the upload wrote (same queue, in order).
  return gf_xpu_torch_launch(context, state, graph, err);
}

extern "C" void gf_xpu_torch_release_graph(void *, void *, void *graph) {
  try {
    delete static_cast<gf_xpu_torch_graph *>(graph);
  } catch (...) {
    // A destructor that throws has nothing left to release.
  }
}
