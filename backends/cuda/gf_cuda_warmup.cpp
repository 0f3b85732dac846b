// Why this exists: where the warm-ups allocate, which decides what a graph pool reserves. While
// the pool holds no graph, from the pool itself, as CUDAGraph Trees route theirs: the capture that
// follows then reuses the very blocks its warm-ups used. Once the pool holds a graph, its free
// blocks are that graph's scratch memory, which every replay of it writes: a tensor a warm-up made
// and the forward kept (state filled on first use, a cache for a new length) could land there and
// be overwritten. So later warm-ups allocate from a scratch pool of their own, made here and given
// back to the device when they end: a tensor the forward kept stays valid in it, and nothing else
// of it stays reserved. (Before, they used torch's ordinary pool, which kept their largest blocks
// cached beside the graph pool: six resident shapes of the Stable Audio Open DiT reserved 562 MiB
// where the largest alone took 264 on an H200.) Only allocations on the pool's side stream are
// routed (the stream filter), so other threads' work stays in the ordinary pool. (CUDAGraph Trees
// can route every warm-up into their pool because they track which of its tensors are alive.)
// Where a scratch pool cannot be given back (a torch without emptyCache(MempoolId_t), or a capture
// or routing under way elsewhere in the allocator), its blocks stay cached until
// torch.cuda.empty_cache() or an out-of-memory retry frees them, and the pool's later warm-ups go
// back to the ordinary pool. The pool's whole lifecycle: gf_cuda_torch_internal.h.
// The copies of the last warm-up's outputs that answer a key's first call (Note [The first call
// from its last warm-up], ops/gf_warm_up_answer.c) are the caller's tensors, so they are made on
// the caller's stream, which no routing filter takes, with the growth window closed: they come from
// torch's ordinary pool, as a replay's outputs do.
#include "gf_cuda_torch_internal.h"

#include "gf_cuda_pool_growth.h"
#include "gf_torch_errors.h"

#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>

using graphed::cuda::torch_runner_of;

extern "C" gf_status gf_cuda_torch_warmup_begin(void *, void *state, gf_error *err) {
  gf_cuda_torch_runner *runner = torch_runner_of(state);
  gf_status status = graphed::cuda::side_stream_begin(runner, err);
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
    graphed::cuda::side_stream_end(runner, nullptr);
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
          try {
            pool->scratch_pools_off = !graphed::cuda::empty_released_pool(routed);
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
  gf_status joined = graphed::cuda::side_stream_end(runner, status == GF_OK ? err : nullptr);
  return status == GF_OK ? joined : status;
}

extern "C" gf_status gf_cuda_torch_caller_stream_begin(void *, void *state, gf_error *err) {
  gf_cuda_torch_runner *runner = torch_runner_of(state);
  gf_cuda_torch_pool *pool = runner->pool;
  if (!runner->outer_stream.has_value() || *runner->outer_stream == *pool->side_stream) {
    // A warm-up nested in another of this pool's: its caller's stream is the side stream, whose
    // allocations are routed into the pool.
    return gf_error_set(err, GF_ERR_NOT_FOUND, "graphed: the caller runs on the side stream");
  }
  try {
    const c10::cuda::CUDAStream caller = *runner->outer_stream;
    at::cuda::CUDAEvent warmed_up;
    warmed_up.record(*pool->side_stream);
    warmed_up.block(caller);
    c10::cuda::setCurrentCUDAStream(caller);
    graphed::cuda::pool_growth_end(); // begun again in caller_stream_end
    return GF_OK;
  } catch (...) {
    return graphed::status_of_current_exception(
        err, "graphed: switching to the caller's stream for the first call's outputs failed");
  }
}

extern "C" gf_status gf_cuda_torch_caller_stream_end(void *, void *state, gf_error *err) {
  gf_cuda_torch_runner *runner = torch_runner_of(state);
  gf_cuda_torch_pool *pool = runner->pool;
  graphed::cuda::pool_growth_begin();
  try {
    c10::cuda::setCurrentCUDAStream(*pool->side_stream);
    at::cuda::CUDAEvent copied;
    copied.record(*runner->outer_stream);
    copied.block(*pool->side_stream);
    return GF_OK;
  } catch (...) {
    return graphed::status_of_current_exception(
        err, "graphed: making the side stream wait for the first call's outputs failed");
  }
}
