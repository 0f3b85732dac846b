/* The torch half of the CUDA backend: what only libtorch can give (its streams, its sync-debug
 * switch, and its CUDA graph object, so that capture-time allocations go to a private pool of the
 * caching allocator and random number generators advance on replay). Hooks that need nothing but
 * torch have the hook signature of gf_backend.h and sit in the backend's table directly; the rest
 * are typed helpers the C half calls. Definitions catch every C++ exception and return a status. */
#ifndef GF_CUDA_TORCH_H
#define GF_CUDA_TORCH_H

#include "gf_status.h"

#include <cuda_runtime_api.h>

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Per runner, torch side: the device, a side stream, the one graph memory pool, the graph in
 * capture. */
typedef struct gf_cuda_torch_runner gf_cuda_torch_runner;

/* A captured graph: torch's CUDA graph object (its cudaGraph_t is kept, so nodes can be found). */
typedef struct gf_cuda_torch_graph gf_cuda_torch_graph;

/* The backend's per-runner state (the hooks' `state`), shared by both halves. */
typedef struct gf_cuda_runner {
  gf_cuda_torch_runner *torch;
  int recorded[2]; /* which copy nodes the capture in progress recorded */
} gf_cuda_runner;

/* ---- hooks (gf_backend.h signatures; state is a gf_cuda_runner) ---------------------------- */

int gf_cuda_torch_graphs_supported(void *context, int device_type, int device_index, char *why,
                                   size_t why_capacity);
gf_status gf_cuda_torch_sync_probe_begin(void *context, void *state, gf_error *err);
gf_status gf_cuda_torch_sync_probe_end(void *context, void *state, gf_error *err);
/* The side stream waits on the current one and becomes current / the current one waits on the
 * side stream and is restored. */
gf_status gf_cuda_torch_side_stream_begin(void *context, void *state, gf_error *err);
gf_status gf_cuda_torch_side_stream_end(void *context, void *state, gf_error *err);

/* Bytes the caching allocator has handed out on the runner's device (graph pools included). */
int64_t gf_cuda_torch_device_bytes_in_use(void *context, void *state);

/* ---- helpers of the C half ---------------------------------------------------------------- */

gf_status gf_cuda_torch_runner_create(int device_index, gf_cuda_torch_runner **runner,
                                      gf_error *err);
void gf_cuda_torch_runner_destroy(gf_cuda_torch_runner *runner);

/* The stream torch considers current on the runner's device. */
cudaStream_t gf_cuda_torch_current_stream(const gf_cuda_torch_runner *runner);

/* Capture on the side stream into the runner's pool. end returns the graph (NULL when ok is 0 or
 * capture failed), owned by the caller. */
gf_status gf_cuda_torch_capture_begin(gf_cuda_torch_runner *runner, gf_error *err);
gf_status gf_cuda_torch_capture_end(gf_cuda_torch_runner *runner, int ok,
                                    gf_cuda_torch_graph **graph, gf_error *err);

/* The captured graph and its instantiated executable; NULL when torch has none. */
cudaGraph_t gf_cuda_torch_graph_raw(gf_cuda_torch_graph *graph);
cudaGraphExec_t gf_cuda_torch_graph_exec(gf_cuda_torch_graph *graph);

/* Replays the graph on the current stream, advancing the random number generators it used. */
gf_status gf_cuda_torch_graph_replay(gf_cuda_torch_graph *graph, gf_error *err);
void gf_cuda_torch_graph_release(gf_cuda_torch_graph *graph);

#ifdef __cplusplus
}
#endif

#endif /* GF_CUDA_TORCH_H */
