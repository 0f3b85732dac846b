// Why this exists: the graph memory pool's life and its stream ordering, in one place: making a
// pool and the references that keep its id valid (in torch's caching allocator and its pinned host
// allocator), the backend's pool hooks, the side-stream window every warm-up and capture opens
// (with the pool-growth calls), and the ordering of replays across streams. The lifecycle these
// steps make up is listed once, at the struct (gf_cuda_torch_internal.h).
#include "gf_cuda_torch_internal.h"

#include "gf_cuda_pool_growth.h"
#include "gf_torch_errors.h"

#include <ATen/Context.h>
#include <ATen/core/CachingHostAllocator.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>

namespace {

// The pinned host allocator's graph pools (torch 2.11 and later), found at compile time, so that
// a torch without them still builds: the pool's reference there is taken and dropped the same way
// as in the caching allocator.
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

// Gives a released pool's cached memory back to the device; false on a torch without
// emptyCache(MempoolId_t). Found at compile time, so that an older torch still builds.
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

} // namespace

namespace graphed::cuda {

gf_status make_pool(int device_index, gf_cuda_torch_pool **pool, gf_error *err) {
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
    take_own_reference(made->device, made->id);
    *pool = made.release();
    return GF_OK;
  } catch (...) {
    return graphed::status_of_current_exception(err,
                                                "graphed: making a CUDA graph memory pool failed");
  }
}

void retain_pool(gf_cuda_torch_pool *pool) { pool->references.fetch_add(1); }

void release_pool(gf_cuda_torch_pool *pool) noexcept {
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

bool empty_released_pool(at::cuda::MempoolId_t id) {
  // cudaFree, which another thread's capture in global mode would otherwise refuse (and be
  // invalidated by): relaxed on this thread for the call, as a released pool's memory belongs to
  // no graph.
  RelaxedCaptureMode relaxed;
  return empty_one_pool(c10::cuda::CUDACachingAllocator::get(), id, 0);
}

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
    pool_growth_begin(); // ended in side_stream_end
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
  pool_growth_end();
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

} // namespace graphed::cuda

extern "C" gf_status gf_cuda_torch_pool_create(void *, int device_type, int device_index,
                                               void **pool, gf_error *err) {
  *pool = nullptr;
  if (device_type != static_cast<int>(c10::DeviceType::CUDA)) {
    return GF_OK; // no pools to share on another kind of device
  }
  gf_cuda_torch_pool *made = nullptr;
  gf_status status = graphed::cuda::make_pool(device_index, &made, err);
  *pool = made;
  return status;
}

extern "C" void gf_cuda_torch_pool_release(void *, void *pool) {
  graphed::cuda::release_pool(static_cast<gf_cuda_torch_pool *>(pool));
}

extern "C" void gf_cuda_torch_give_back_memory(void *, void *state) {
  gf_cuda_torch_pool *pool = graphed::cuda::torch_runner_of(state)->pool;
  // Not while a warm-up or capture of the pool is under way (a forward that calls another runner
  // of the pool, whose capture failed inside this one's): the routing holds the id.
  std::unique_lock<std::recursive_mutex> lock(pool->capture_mutex, std::try_to_lock);
  if (!lock.owns_lock() || pool->routing_depth != 0 || pool->graphs.load() != 0) {
    return;
  }
  try {
    const at::cuda::MempoolId_t old = pool->id;
    const at::cuda::MempoolId_t fresh = at::cuda::graph_pool_handle();
    take_own_reference(pool->device, fresh);
    pool->id = fresh;
    // The old id's last reference: its blocks still in use (a tensor a warm-up made and the
    // forward kept) stay valid and come back to it when freed; the free ones go to the device.
    c10::cuda::CUDACachingAllocator::releasePool(pool->device, old);
    release_host_pool(at::getHostAllocator(at::kCUDA), old, 0);
    graphed::cuda::empty_released_pool(old);
  } catch (...) {
    // Left to torch's out-of-memory retry, which frees a released pool's cached blocks.
  }
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
