// Why this exists: the torch half of the CUDA backend is one file per concern (gf_cuda_torch.cpp:
// runner state and device figures; gf_cuda_pool.cpp: pool life and stream ordering;
// gf_cuda_warmup.cpp: where warm-ups allocate; gf_cuda_probe.cpp: the sync probe;
// gf_cuda_graph.cpp: capture and replay), and those files share three structs and a few helpers.
// This header is private to backends/cuda's C++ files, as gf_runner_internal.h is to ops/; the C
// half sees only gf_cuda_torch.h. Nothing here throws across an extern "C" function: each
// definition there catches.
#pragma once

#include "gf_cuda_torch.h"

#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>

// Note [Memory pools]
// A graph memory pool: a private pool of torch's caching allocator (`id`) and the one side stream
// every warm-up and capture into it runs on (the allocator reuses a freed block only on the stream
// it was freed on, so graphs of one pool share memory only through one stream).
//
// The lifecycle of a pool:
// - Is made by make_pool, through the pool_create hook for a graphed.MemoryPool (whose slot in
//   the shim holds that reference) or by gf_cuda_torch_runner_create for a runner given none (the
//   runner holds it): a fresh id, a side stream from torch's stream pool, the handoff event. It
//   takes a reference of its own to the id in the caching allocator and in torch's pinned host
//   allocator, which (torch 2.11 on) counts a graph pool's captures too and asserts when a capture
//   begins on an id whose count went back to zero. So evicting every graph (reset(), a changed
//   module, max_entries=1 churn) leaves the id, and the memory it holds, to the next capture
//   instead of freeing it.
// - Each runner made on it holds a reference (runner_create, runner_destroy), and each graph
//   captured into it one more while it lives, also counted in `graphs` (capture_end,
//   graph_release).
// - A warm-up or a capture (side_stream_begin/end) takes capture_mutex, makes the side stream
//   wait for the caller's stream and the pool's last stream, makes it current and opens a growth
//   window (expandable segments where the user's settings allow, gf_cuda_pool_growth.h); its end
//   closes the window, makes the caller's stream wait for the side stream, records `handoff` there
//   and makes the side stream the pool's last.
// - Warm-ups allocate from the pool itself while it holds no graph, as CUDAGraph Trees' do, so the
//   capture that follows reuses the very blocks they used; once it holds a graph, its free blocks
//   are that graph's scratch memory, which every replay writes, so later warm-ups allocate from a
//   scratch pool given back to the device when they end (gf_cuda_warmup.cpp: why, and what it
//   saves). Only the side stream's allocations are routed: other threads' stay in the ordinary
//   pool.
// - A capture allocates from `id` (torch's CUDAGraph::capture_begin(id)): blocks one graph freed
//   serve the pool's next captures, which is the sharing.
// - A replay (gf_cuda_torch_order_replay) on another stream than the pool's last first makes that
//   stream wait for the work queued on the last one: graphs of one pool share memory, so their
//   replays must not overlap. Replays from several streams follow each other, never refused.
// - A capture that ran out of device memory while the pool holds no graph leaves the pool's
//   cached blocks (its warm-ups' allocations) to no one: the pool takes a fresh id and gives the
//   old one's memory back to the device before the call runs eager (give_back_memory).
// - When the last reference goes, the allocators' references go too and the pool's memory returns
//   to the caching allocator (torch.cuda.empty_cache() then gives it back to the device).
//
// A cuBLAS workspace a warm-up leaves in the pool is safe here. torch allocates one per cuBLAS
// handle and stream from the caching allocator at the stream's first matmul, so the side stream's
// may come from the pool, and it lives in torch's workspace table for the rest of the process.
// CUDAGraph Trees clear those workspaces around their warm-ups and recordings
// (clear_cublass_cache) because a new run of theirs frees the previous generation's blocks
// wholesale (the pool rewound to a checkpoint), which would hand the workspace's block out again
// while cuBLAS still uses it. graphed never rewinds a pool: the block stays allocated, no tensor
// ever gets it, and every warm-up, capture and replay that uses it is ordered by the pool's lock
// and stream ordering above; it costs each pool one workspace, counted in its reserved bytes. Only
// torch._C._cuda_clearCublasWorkspaces() (which Trees call) frees it while graphs still use it, and
// it is then a free block of the pool like the intermediates those graphs freed, which the pool's
// later captures reuse by design. (Graphs of two pools whose side streams are one stream of torch's
// pool share that stream's workspace too, as any two torch graphs captured on one stream do: their
// replays are not ordered by graphed.)
struct gf_cuda_torch_pool {
  c10::DeviceIndex device = 0;
  at::cuda::MempoolId_t id{0, 0};
  std::optional<c10::cuda::CUDAStream> side_stream;
  // Held from a warm-up's or capture's begin to its end: one capture or warm-up into the pool at
  // a time (the allocator routes one pool to one capture). Recursive: a forward may call another
  // runner of the pool, whose warm-ups then nest in the routing already under way.
  std::recursive_mutex capture_mutex;
  int routing_depth = 0; // under capture_mutex: nested warm-ups
  // Under capture_mutex: the pool the warm-ups under way allocate from: this pool's own id while
  // it holds no graph, else a scratch pool of their own; {0, 0}: torch's ordinary pool.
  at::cuda::MempoolId_t warmup_pool{0, 0};
  // Under capture_mutex: a scratch pool could not be given back, so later warm-ups use torch's
  // ordinary pool, whose blocks at least serve one another.
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

namespace graphed::cuda {

// The sync probe's ear (gf_cuda_probe.cpp): counts the warnings of torch's sync-debug mode
// "warn" on the probing thread and passes every other warning on.
class SyncRecorder final : public c10::WarningHandler {
public:
  void process(const c10::Warning &warning) override;

  c10::WarningHandler *passed_on = nullptr;
  int syncs = 0;
};

} // namespace graphed::cuda

struct gf_cuda_torch_runner {
  c10::DeviceIndex device = 0;
  gf_cuda_torch_pool *pool = nullptr;                // one reference held
  std::optional<c10::cuda::CUDAStream> outer_stream; // current before begin, restored at end
  graphed::cuda::SyncRecorder sync_recorder;
  std::unique_ptr<gf_cuda_torch_graph> capturing;
};

namespace graphed::cuda {

inline gf_cuda_torch_runner *torch_runner_of(void *state) {
  return static_cast<gf_cuda_runner *>(state)->torch;
}

// ---- gf_cuda_pool.cpp ----------------------------------------------------------------------

// A new pool on device_index (-1: the current device) holding one reference.
gf_status make_pool(int device_index, gf_cuda_torch_pool **pool, gf_error *err);
void retain_pool(gf_cuda_torch_pool *pool);
// Drops one reference; the last frees the pool. NULL is nothing. Never throws.
void release_pool(gf_cuda_torch_pool *pool) noexcept;

// The window of a warm-up or capture (see the lifecycle above): begin takes the pool's lock,
// kept until end, which releases it also when it fails. On a failed begin nothing is held.
gf_status side_stream_begin(gf_cuda_torch_runner *runner, gf_error *err);
gf_status side_stream_end(gf_cuda_torch_runner *runner, gf_error *err);

// Gives the cached memory of a pool whose every reference was released back to the device
// (cudaFree of its free segments), on a torch whose allocator can empty one pool (its
// emptyCache(MempoolId_t)); false on an older one, whose out-of-memory retry frees such a pool
// instead. Throws where the allocator has a capture or a routing under way elsewhere (it asserts
// that none is, as it synchronises).
bool empty_released_pool(at::cuda::MempoolId_t id);

} // namespace graphed::cuda
