// Why this exists: torch's CUDA graph object, wrapped for the C half. Capture runs on the pool's
// side stream into the pool's id (the window of gf_cuda_pool.cpp), so that the graph allocates
// from the memory its pool shares; torch's CUDAGraph rather than raw stream capture, so that the
// random number generators a graph uses advance on every replay. A graph holds a reference to its
// pool while it lives (the lifecycle: gf_cuda_torch_internal.h).
#include "gf_cuda_torch_internal.h"

#include "gf_torch_errors.h"

#include <c10/cuda/CUDACachingAllocator.h>

extern "C" gf_status gf_cuda_torch_capture_begin(gf_cuda_torch_runner *runner, gf_error *err) {
  gf_status status = graphed::cuda::side_stream_begin(runner, err);
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
    graphed::cuda::side_stream_end(runner, nullptr);
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
  gf_status joined = graphed::cuda::side_stream_end(runner, status == GF_OK ? err : nullptr);
  if (status == GF_OK) {
    status = joined;
  }
  if (status == GF_OK && ok && captured) {
    captured->pool = runner->pool;
    graphed::cuda::retain_pool(runner->pool);
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
    graphed::cuda::release_pool(pool);
  }
}
