/* The torch half of the CUDA backend: what only libtorch can give (its streams, its sync-debug
 * switch, its CUDA graph object, so that random number generators advance on replay, and the
 * caching allocator's private pools, which warm-ups and captures allocate from). Hooks that need
 * nothing but torch have the hook signature of gf_backend.h and sit in the backend's table
 * directly; the rest are typed helpers the C half calls. Definitions catch every C++ exception and
 * return a status. One file per concern defines them, as the sections below say; they share
 * gf_cuda_torch_internal.h. */
#ifndef GF_CUDA_TORCH_H
#define GF_CUDA_TORCH_H

#include "gf_status.h"

#include <cuda_runtime_api.h>

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Per runner, torch side: the device, its graph memory pool, the graph in capture. */
typedef struct gf_cuda_torch_runner gf_cuda_torch_runner;

/* A graph memory pool: a private pool of torch's caching allocator that the graphs of its runners
 * share, with the side stream they warm up and capture on. Counted by reference: a runner made
 * without a shared pool has its own. Its lifecycle is listed at the struct
 * (gf_cuda_torch_internal.h). */
typedef struct gf_cuda_torch_pool gf_cuda_torch_pool;

/* A captured graph: torch's CUDA graph object (its cudaGraph_t is kept, so nodes can be found). */
typedef struct gf_cuda_torch_graph gf_cuda_torch_graph;

/* The backend's per-runner state (the hooks' `state`), shared by both halves. */
typedef struct gf_cuda_runner {
  gf_cuda_torch_runner *torch;
  int recorded[2]; /* which copy nodes the capture in progress recorded */
} gf_cuda_runner;

/* ---- hooks (gf_backend.h signatures; state is a gf_cuda_runner) ---------------------------- */

/* gf_cuda_torch.cpp: the device, and what the caching allocator holds on it. */
int gf_cuda_torch_graphs_supported(void *context, int device_type, int device_index, char *why,
                                   size_t why_capacity);
/* Bytes the caching allocator has handed out on the runner's device (graph pools included). */
int64_t gf_cuda_torch_device_bytes_in_use(void *context, void *state);
/* Bytes the caching allocator holds on the runner's device (torch.cuda.memory_reserved). */
int64_t gf_cuda_torch_device_bytes_reserved(void *context, void *state);
/* Bytes of the segments the runner's graph pool holds (shared by the runners of one pool). */
int64_t gf_cuda_torch_pool_bytes_reserved(void *context, void *state);

/* gf_cuda_pool.cpp: a pool on a CUDA device (-1: the current one) holding one reference, *pool a
 * gf_cuda_torch_pool; on another kind of device none (*pool NULL). release drops one reference,
 * and the last frees the pool (its memory goes back to the caching allocator). */
gf_status gf_cuda_torch_pool_create(void *context, int device_type, int device_index, void **pool,
                                    gf_error *err);
void gf_cuda_torch_pool_release(void *context, void *pool);
/* gf_cuda_pool.cpp: after a capture ran out of device memory (gf_backend.h's give_back_memory):
 * a pool that holds no graph takes a fresh id, and the old one's cached blocks (what the failed
 * attempt's warm-ups and capture allocated there) go back to the device. */
void gf_cuda_torch_give_back_memory(void *context, void *state);

/* gf_cuda_probe.cpp: torch's sync-debug mode "warn" around the first validated forward. */
gf_status gf_cuda_torch_sync_probe_begin(void *context, void *state, gf_error *err);
gf_status gf_cuda_torch_sync_probe_end(void *context, void *state, gf_error *err);

/* gf_cuda_warmup.cpp: the warm-ups: the pool's side stream waits on the current one (and on the
 * pool's last stream) and becomes current, every allocation on it routed into the pool (into a
 * scratch pool, given back to the device at the end, once the pool holds a graph), with the
 * pool's lock held / the routing ends, the current stream waits on the side stream and is
 * restored. */
gf_status gf_cuda_torch_warmup_begin(void *context, void *state, gf_error *err);
gf_status gf_cuda_torch_warmup_end(void *context, void *state, gf_error *err);
/* Between those: the caller's stream, waiting for the side stream, current and unrouted for the
 * copies that answer a key's first call / the side stream current again, waiting for them
 * (gf_backend.h's caller_stream_begin/end). */
gf_status gf_cuda_torch_caller_stream_begin(void *context, void *state, gf_error *err);
gf_status gf_cuda_torch_caller_stream_end(void *context, void *state, gf_error *err);

/* ---- helpers of the C half ---------------------------------------------------------------- */

/* gf_cuda_torch.cpp: a runner on pool (which it holds a reference to), or on a pool of its own
 * when NULL. The pool is on the runner's device: the caller checked (the shim's pool table). */
gf_status gf_cuda_torch_runner_create(int device_index, gf_cuda_torch_pool *pool,
                                      gf_cuda_torch_runner **runner, gf_error *err);
void gf_cuda_torch_runner_destroy(gf_cuda_torch_runner *runner);

/* gf_cuda_torch.cpp: the stream torch considers current on the runner's device. */
cudaStream_t gf_cuda_torch_current_stream(const gf_cuda_torch_runner *runner);

/* gf_cuda_pool.cpp: before a replay's first launch on the current stream: when the runner's pool
 * was last used on another stream, the current one waits for what was queued there (graphs of one
 * pool share memory, so their replays must not overlap). Costs a comparison when the stream is
 * the same. */
gf_status gf_cuda_torch_order_replay(gf_cuda_torch_runner *runner, gf_error *err);

/* gf_cuda_graph.cpp: capture on the side stream into the runner's pool. end returns the graph
 * (NULL when ok is 0 or capture failed), owned by the caller. */
gf_status gf_cuda_torch_capture_begin(gf_cuda_torch_runner *runner, gf_error *err);
gf_status gf_cuda_torch_capture_end(gf_cuda_torch_runner *runner, int ok,
                                    gf_cuda_torch_graph **graph, gf_error *err);

/* gf_cuda_graph.cpp: the captured graph and its instantiated executable; NULL when torch has
 * none. */
cudaGraph_t gf_cuda_torch_graph_raw(gf_cuda_torch_graph *graph);
cudaGraphExec_t gf_cuda_torch_graph_exec(gf_cuda_torch_graph *graph);

/* gf_cuda_graph.cpp: replays the graph on the current stream, advancing the random number
 * generators it used. */
gf_status gf_cuda_torch_graph_replay(gf_cuda_torch_graph *graph, gf_error *err);
void gf_cuda_torch_graph_release(gf_cuda_torch_graph *graph);

#ifdef __cplusplus
}
#endif

#endif /* GF_CUDA_TORCH_H */
