/* The torch-side CUDA services that backends/cuda needs and that only libtorch can give: its
 * streams, its sync-debug switch and its CUDA graph object (so that capture-time allocations go
 * to a private pool of the caching allocator and random number generators advance on replay).
 * Plain C declarations; the definitions catch every C++ exception and return a status. */
#ifndef GF_SHIM_CUDA_H
#define GF_SHIM_CUDA_H

#include "gf_status.h"

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gf_shim_cuda_runner gf_shim_cuda_runner;

/* 1 when torch sees a CUDA device of this type and index; else 0 and a sentence in why. */
int gf_shim_cuda_graphs_supported(int device_type, int device_index, char *why,
                                  size_t why_capacity);

/* Per-runner state: the device, a side stream, the one graph memory pool, the graph in capture. */
gf_status gf_shim_cuda_runner_create(int device_index, gf_shim_cuda_runner **runner, gf_error *err);
void gf_shim_cuda_runner_destroy(gf_shim_cuda_runner *runner);

/* The cudaStream_t torch considers current on the runner's device. */
void *gf_shim_cuda_current_stream(gf_shim_cuda_runner *runner);

gf_status gf_shim_cuda_sync_probe_begin(gf_shim_cuda_runner *runner, gf_error *err);
gf_status gf_shim_cuda_sync_probe_end(gf_shim_cuda_runner *runner, gf_error *err);

/* The side stream waits on the current one and becomes current / the current one waits on the
 * side stream and is restored. */
gf_status gf_shim_cuda_side_stream_begin(gf_shim_cuda_runner *runner, gf_error *err);
gf_status gf_shim_cuda_side_stream_end(gf_shim_cuda_runner *runner, gf_error *err);

/* Capture on the side stream into the runner's pool. end returns the graph (NULL when ok is 0 or
 * capture failed); the graph is torch's CUDA graph object, owned by the caller. */
gf_status gf_shim_cuda_capture_begin(gf_shim_cuda_runner *runner, gf_error *err);
gf_status gf_shim_cuda_capture_end(gf_shim_cuda_runner *runner, int ok, void **graph,
                                   gf_error *err);

/* The captured cudaGraph_t (kept for the graph's life, so its nodes can be found) and the
 * instantiated cudaGraphExec_t of a graph from gf_shim_cuda_capture_end. */
void *gf_shim_cuda_graph_raw(void *graph);
void *gf_shim_cuda_graph_exec(void *graph);

/* Replays the graph on the current stream, advancing the random number generators it used. */
gf_status gf_shim_cuda_graph_replay(void *graph, gf_error *err);
void gf_shim_cuda_graph_release(void *graph);

#ifdef __cplusplus
}
#endif

#endif /* GF_SHIM_CUDA_H */
