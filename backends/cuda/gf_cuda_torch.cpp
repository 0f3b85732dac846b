// The torch half of the CUDA backend (see gf_cuda_torch.h).
#include "gf_cuda_torch.h"

#include "gf_cuda_pool_growth.h"
#include "gf_torch_errors.h"

#include <ATen/Context.h>
#include <ATen/core/CachingHostAllocator.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <cstdio>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>

struct gf_cuda_torch_pool {
  c10::DeviceIndex device = 0;
  at::cuda::MempoolId_t id{0, 0};
  std::optional<c10::cuda::CUDAStream> side_stream;
  // Held from a warm-up's or capture's begin to its end: one capture or warm-up into the pool at
  // a time (the allocator routes one pool to one capture). Recursive: a forward may call another
  // runner of the pool, whose warm-ups then nest in the routing already under way.
  std::recursive_mutex capture_mutex;
  int routing_depth = 0; // under capture_mutex: nested warm-ups (see warmup_begin)
  // Under capture_mutex: the pool the warm-ups under way allocate from (see warmup_begin): this
  // pool's own id while it holds no graph, else a scratch pool of their own; {0, 0}: torch's
  // ordinary pool.
  at::cuda::MempoolId_t warmup_pool{0, 0};
  // Under capture_mutex: a scratch pool could not be given back (see warmup_end), so later
  // warm-ups use torch's ordinary pool, whose blocks at least serve one another.
  bool scratch_pools_off = false;
  // The stream the pool's memory was last used on, and the event a switch waits on (recorded on
  // the side stream when a warm-up or capture ends, on any other stream at the switch).
  std::atomic<cudaStream_t> last_stream{nullptr};
  std::mutex order_mutex;
  cudaEvent_t handoff = nullptr;
  std::atomic<int> graphs{0}; // resident graphs captured into it
  std::atomic<int> references{1};
};

struct gf_cuda_torch_graph {
  // keep_graph: the cudaGraph_t outlives instantiation, so the backend can find its copy nodes.
  at::cuda::CUDAGraph graph{/*keep_graph=*/true};
  gf_cuda_torch_pool *pool = nullptr; // counted in pool->graphs while the graph lives
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
  gf_cuda_torch_pool *pool = nullptr;                // one reference held
  std::optional<c10::cuda::CUDAStream> outer_stream; // current before begin, restored at end
  SyncRecorder sync_recorder;
  std::unique_ptr<gf_cuda_torch_graph> capturing;
};

namespace {

gf_cuda_torch_runner *torch_runner_of(void *state) {
  return static_cast<gf_cuda_runner *>(state)->torch;
}

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

namespace {

// torch's pinned host allocator (torch 2.11 and later) counts a graph pool's captures as well, and
// asserts when a capture begins on a pool id whose count went back to zero, as it does when every
// graph of the id is dropped (reset(), a changed module, max_entries=1 churn). The pool holds a
// reference there too, taken the same way, where the allocator has graph pools at all (found at
// compile time, so that a torch without them still builds).
struct NoStream {
  template <typename Stream> bool operator()(Stream) const { return false; }
};

template <typename Allocator>
auto hold_host_pool(Allocator *host, at::cuda::MempoolId_t id, int)
    -> decltype(host->begin_allocate_to_pool(id, NoStream{}), void()) {
  host->begin_allocate_to_pool(id, NoStream{});
  host->end_allocate_to_pool(id);
}
template <typename Allocator> void hold_host_pool(Allocator *, at::cuda::MempoolId_t, long) {}

template <typename Allocator>
auto release_host_pool(Allocator *host, at::cuda::MempoolId_t id, int)
    -> decltype(host->release_pool(id), void()) {
  host->release_pool(id);
}
template <typename Allocator> void release_host_pool(Allocator *, at::cuda::MempoolId_t, long) {}

// The pool's own reference in the caching allocators, taken as torch's own warm-up manager
// (cudagraph_trees' _use_cuda_memory_pool_manager) takes one for a while: begin creates or counts
// the pool, and routes nothing here (the filter matches no stream).
void take_own_reference(c10::DeviceIndex device, at::cuda::MempoolId_t id) {
  c10::cuda::CUDACachingAllocator::beginAllocateToPool(device, id,
                                                       [](cudaStream_t) { return false; });
  c10::cuda::CUDACachingAllocator::endAllocateToPool(device, id);
  hold_host_pool(at::getHostAllocator(at::kCUDA), id, 0);
}

} // namespace

extern "C" gf_status gf_cuda_torch_pool_create(int device_index, gf_cuda_torch_pool **pool,
                                               gf_error *err) {
  *pool = nullptr;
  try {
    // The caching allocator knows no device until torch's CUDA state is initialized (a C++
    // caller may make a runner before its first CUDA tensor): begin/endAllocateToPool below
    // would fail with "Invalid device argument".
    at::globalContext().lazyInitDevice(c10::DeviceType::CUDA);
    auto made = std::make_unique<gf_cuda_torch_pool>();
    made->device = device_index >= 0 ? static_cast<c10::DeviceIndex>(device_index)
                                     : c10::cuda::current_device();
    c10::cuda::CUDAGuard guard(made->device);
    made->side_stream = c10::cuda::getStreamFromPool(false, made->device);
    made->id = at::cuda::graph_pool_handle();
    C10_CUDA_CHECK(cudaEventCreateWithFlags(&made->handoff, cudaEventDisableTiming));
    // The pool's own reference, dropped when the last runner and the Python object let go: each
    // graph holds one more while it lives, so evicting every graph leaves the pool (and its
    // memory) to the next capture instead of freeing it.
    take_own_reference(made->device, made->id);
    *pool = made.release();
    return GF_OK;
  } catch (...) {
    return graphed::status_of_current_exception(err,
                                                "graphed: making a CUDA graph memory pool failed");
  }
}

namespace {

void pool_retain(gf_cuda_torch_pool *pool) { pool->references.fetch_add(1); }

} // namespace

extern "C" void gf_cuda_torch_pool_release(gf_cuda_torch_pool *pool) {
  if (pool == nullptr || pool->references.fetch_sub(1) != 1) {
    return;
  }
  try {
    c10::cuda::CUDACachingAllocator::releasePool(pool->device, pool->id);
    release_host_pool(at::getHostAllocator(at::kCUDA), pool->id, 0);
  } catch (...) {
    // The allocator is gone (interpreter exit): nothing is left to give back.
  }
  if (pool->handoff != nullptr) {
    cudaEventDestroy(pool->handoff);
    cudaGetLastError();
  }
  delete pool;
}

extern "C" gf_status gf_cuda_torch_runner_create(int device_index, gf_cuda_torch_pool *shared_pool,
                                                 gf_cuda_torch_runner **runner, gf_error *err) {
  *runner = nullptr;
  try {
    auto state = std::make_unique<gf_cuda_torch_runner>();
    state->device = device_index >= 0 ? static_cast<c10::DeviceIndex>(device_index)
                                      : c10::cuda::current_device();
    if (shared_pool != nullptr) {
      if (shared_pool->device != state->device) {
        return gf_error_set(err, GF_ERR_INVALID_ARGUMENT,
                            "graphed: the memory pool is on cuda:%d, the runner on cuda:%d; give "
                            "runners a pool of their own device",
                            static_cast<int>(shared_pool->device), static_cast<int>(state->device));
      }
      pool_retain(shared_pool);
      state->pool = shared_pool;
    } else {
      gf_status status = gf_cuda_torch_pool_create(state->device, &state->pool, err);
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
    gf_cuda_torch_pool_release(runner->pool);
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

// Makes `next` wait for the work queued on the pool's last stream, when that is another stream
// (see gf_cuda_torch_order_replay). The side stream's work is in the handoff event already,
// recorded where its warm-up or capture ended: recording on it here could join a capture another
// thread has under way there.
void order_after_last_stream(gf_cuda_torch_pool *pool, cudaStream_t next) {
  std::lock_guard<std::mutex> lock(pool->order_mutex);
  cudaStream_t last = pool->last_stream.load(std::memory_order_relaxed);
  if (last == next) {
    return;
  }
  if (last != nullptr) {
    if (last != pool->side_stream->stream()) {
      C10_CUDA_CHECK(cudaEventRecord(pool->handoff, last));
    }
    C10_CUDA_CHECK(cudaStreamWaitEvent(next, pool->handoff, 0));
  }
  pool->last_stream.store(next, std::memory_order_release);
}

// Marks the pool's memory as last used by the side stream (a warm-up or capture just ended).
void hand_off_from_side_stream(gf_cuda_torch_pool *pool) {
  std::lock_guard<std::mutex> lock(pool->order_mutex);
  C10_CUDA_CHECK(cudaEventRecord(pool->handoff, pool->side_stream->stream()));
  pool->last_stream.store(pool->side_stream->stream(), std::memory_order_release);
}

// Takes the pool's lock (kept until side_stream_end) and makes its side stream current, after
// the current stream's work and the pool's last stream's.
gf_status side_stream_begin(gf_cuda_torch_runner *runner, gf_error *err) {
  gf_cuda_torch_pool *pool = runner->pool;
  pool->capture_mutex.lock();
  try {
    c10::cuda::CUDAStream outer = c10::cuda::getCurrentCUDAStream(runner->device);
    at::cuda::CUDAEvent ready;
    ready.record(outer);
    ready.block(*pool->side_stream);
    order_after_last_stream(pool, pool->side_stream->stream());
    runner->outer_stream = outer;
    c10::cuda::setCurrentCUDAStream(*pool->side_stream);
    graphed::cuda::pool_growth_begin(); // ended in side_stream_end
    return GF_OK;
  } catch (...) {
    pool->capture_mutex.unlock();
    return graphed::status_of_current_exception(err,
                                                "graphed: switching to the side stream failed");
  }
}

gf_status side_stream_end(gf_cuda_torch_runner *runner, gf_error *err) {
  gf_cuda_torch_pool *pool = runner->pool;
  gf_status status = GF_OK;
  graphed::cuda::pool_growth_end();
  try {
    if (runner->outer_stream.has_value()) {
      c10::cuda::CUDAStream outer = *runner->outer_stream;
      runner->outer_stream.reset();
      c10::cuda::setCurrentCUDAStream(outer);
      at::cuda::CUDAEvent done;
      done.record(*pool->side_stream);
      done.block(outer);
      hand_off_from_side_stream(pool);
    }
  } catch (...) {
    status = graphed::status_of_current_exception(err, "graphed: joining the side stream failed");
  }
  pool->capture_mutex.unlock();
  return status;
}

} // namespace

namespace {

// Gives a released scratch pool's cached memory back to the device (cudaFree of its free
// segments), on a torch whose allocator can empty one pool (its emptyCache(MempoolId_t)); false
// on an older one. Found at compile time, as the host pool's reference above. It throws where the
// allocator has a capture or a routing under way elsewhere (it asserts that none is, as it
// synchronises).
template <typename Allocator>
auto empty_one_pool(Allocator *allocator, at::cuda::MempoolId_t id, int)
    -> decltype(allocator->emptyCache(id), bool()) {
  allocator->emptyCache(id);
  return true;
}
template <typename Allocator> bool empty_one_pool(Allocator *, at::cuda::MempoolId_t, long) {
  return false;
}

// This thread's stream capture mode set to relaxed while it lives, put back after.
class RelaxedCaptureMode {
public:
  RelaxedCaptureMode() { cudaThreadExchangeStreamCaptureMode(&mode_); }
  ~RelaxedCaptureMode() { cudaThreadExchangeStreamCaptureMode(&mode_); }
  RelaxedCaptureMode(const RelaxedCaptureMode &) = delete;
  RelaxedCaptureMode &operator=(const RelaxedCaptureMode &) = delete;

private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
};

} // namespace

// Where the warm-ups allocate. While the pool holds no graph, from the pool itself, as CUDAGraph
// Trees route theirs: the capture that follows then reuses the very blocks its warm-ups used.
// Once the pool holds a graph, its free blocks are that graph's scratch memory, which every replay
// of it writes: a tensor a warm-up made and the forward kept (state filled on first use, a cache
// for a new length) could land there and be overwritten. So later warm-ups allocate from a
// scratch pool of their own, made here and given back to the device when they end: a tensor the
// forward kept stays valid in it, and nothing else of it stays reserved. (Before, they used
// torch's ordinary pool, which kept their largest blocks cached beside the graph pool: six
// resident shapes of the Stable Audio Open DiT reserved 562 MiB where the largest alone took 264
// on an H200.) Only allocations on the pool's side stream are routed (the stream filter), so other
// threads' work stays in the ordinary pool. (CUDAGraph Trees can route every warm-up into their
// pool because they track which of its tensors are alive.) Where a scratch pool cannot be given
// back (a torch without emptyCache(MempoolId_t), or a capture or routing under way elsewhere in
// the allocator), its blocks stay cached until torch.cuda.empty_cache() or an out-of-memory retry
// frees them, and the pool's later warm-ups go back to the ordinary pool.
extern "C" gf_status gf_cuda_torch_warmup_begin(void *, void *state, gf_error *err) {
  gf_cuda_torch_runner *runner = torch_runner_of(state);
  gf_status status = side_stream_begin(runner, err);
  if (status != GF_OK) {
    return status;
  }
  gf_cuda_torch_pool *pool = runner->pool;
  try {
    if (pool->routing_depth == 0) {
      const at::cuda::MempoolId_t target = pool->graphs.load() == 0 ? pool->id
                                           : pool->scratch_pools_off
                                               ? at::cuda::MempoolId_t{0, 0}
                                               : at::cuda::graph_pool_handle();
      if (target != at::cuda::MempoolId_t{0, 0}) {
        const cudaStream_t side = pool->side_stream->stream();
        c10::cuda::CUDACachingAllocator::beginAllocateToPool(
            pool->device, target, [side](cudaStream_t stream) { return stream == side; });
      }
      pool->warmup_pool = target;
    }
    pool->routing_depth++;
    return GF_OK;
  } catch (...) {
    status = graphed::status_of_current_exception(
        err, "graphed: routing the warm-ups into a graph pool failed");
    side_stream_end(runner, nullptr);
    return status;
  }
}

extern "C" gf_status gf_cuda_torch_warmup_end(void *, void *state, gf_error *err) {
  gf_cuda_torch_runner *runner = torch_runner_of(state);
  gf_cuda_torch_pool *pool = runner->pool;
  gf_status status = GF_OK;
  try {
    if (--pool->routing_depth == 0) {
      const at::cuda::MempoolId_t routed = pool->warmup_pool;
      pool->warmup_pool = {0, 0};
      if (routed != at::cuda::MempoolId_t{0, 0}) {
        c10::cuda::CUDACachingAllocator::endAllocateToPool(pool->device, routed);
        // begin counted a use of the pool: the graph pool's own reference keeps it; a scratch
        // pool has no other, so its memory can go back to the device now.
        c10::cuda::CUDACachingAllocator::releasePool(pool->device, routed);
        if (routed != pool->id) {
          // cudaFree, which another thread's capture in global mode would otherwise refuse (and
          // be invalidated by): relaxed on this thread for the call, as the scratch pool's memory
          // belongs to no graph.
          RelaxedCaptureMode relaxed;
          try {
            pool->scratch_pools_off =
                !empty_one_pool(c10::cuda::CUDACachingAllocator::get(), routed, 0);
          } catch (...) {
            pool->scratch_pools_off = true; // the warm-ups themselves went well
          }
        }
      }
    }
  } catch (...) {
    status = graphed::status_of_current_exception(
        err, "graphed: ending the warm-ups' routing into a graph pool failed");
  }
  gf_status joined = side_stream_end(runner, status == GF_OK ? err : nullptr);
  return status == GF_OK ? joined : status;
}

extern "C" gf_status gf_cuda_torch_order_replay(gf_cuda_torch_runner *runner, gf_error *err) {
  gf_cuda_torch_pool *pool = runner->pool;
  try {
    const cudaStream_t current = c10::cuda::getCurrentCUDAStream(runner->device).stream();
    if (pool->last_stream.load(std::memory_order_acquire) != current) {
      order_after_last_stream(pool, current);
    }
    return GF_OK;
  } catch (...) {
    return graphed::status_of_current_exception(
        err, "graphed: ordering a replay after the graph pool's last stream failed");
  }
}

extern "C" gf_status gf_cuda_torch_capture_begin(gf_cuda_torch_runner *runner, gf_error *err) {
  gf_status status = side_stream_begin(runner, err);
  if (status != GF_OK) {
    return status;
  }
  try {
    runner->capturing = std::make_unique<gf_cuda_torch_graph>();
    runner->capturing->graph.capture_begin(runner->pool->id);
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
      // A capture that failed to end (one another thread invalidated) can leave its routing into
      // the pool registered in the caching allocator, which would refuse the pool's next routing
      // and every later emptyCache(MempoolId_t); ended here where torch did not (otherwise this
      // throws, and is ignored).
      try {
        c10::cuda::CUDACachingAllocator::endAllocateToPool(runner->pool->device, runner->pool->id);
      } catch (...) {
      }
    }
  }
  gf_status joined = side_stream_end(runner, status == GF_OK ? err : nullptr);
  if (status == GF_OK) {
    status = joined;
  }
  if (status == GF_OK && ok && captured) {
    captured->pool = runner->pool;
    pool_retain(runner->pool);
    runner->pool->graphs.fetch_add(1);
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
  gf_cuda_torch_pool *pool = graph->pool;
  try {
    delete graph;
  } catch (...) {
    // A destructor that throws has nothing left to release.
  }
  if (pool != nullptr) {
    pool->graphs.fetch_sub(1);
    gf_cuda_torch_pool_release(pool);
  }
}
