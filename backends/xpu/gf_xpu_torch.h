/* The torch half of the XPU backend: what only libtorch (built with XPU) can give: its streams
 * and events, its XPU graph object (capture-time allocations go to the runner's private pool of
 * the caching allocator, and random number generators advance on replay) and its SYCL queue, on
 * whose Level Zero context the C half builds the gather kernel. Compiled only when the torch the
 * build uses has XPU (GF_XPU_WITH_TORCH). Definitions catch every C++ exception and return a
 * status. */
#ifndef GF_XPU_TORCH_H
#define GF_XPU_TORCH_H

#include "gf_backend.h"
#include "gf_status.h"
#include "gf_xpu_level_zero.h"

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Per runner, torch side: the device, a side stream, the one graph pool, the gather kernel as a
 * SYCL kernel, the graph in capture. */
typedef struct gf_xpu_torch_runner gf_xpu_torch_runner;

/* A captured graph: torch's XPU graph and the device table its two gather launches read. */
typedef struct gf_xpu_torch_graph gf_xpu_torch_graph;

/* The backend's per-runner state (the hooks' `state`), shared by both halves. */
typedef struct gf_xpu_runner {
  gf_xpu_torch_runner *torch;
  const gf_xpu_ze *ze;
  int native_graphs; /* SYCL records straight into Level Zero graphs */
} gf_xpu_runner;

/* 1 when device_type (a runner's, as in gf_tensor) is torch's c10::DeviceType::XPU. */
int gf_xpu_torch_is_xpu_device(int device_type);

/* torch's view: XPU available, the device exists, and its SYCL device has the graph aspect. */
int gf_xpu_torch_graphs_supported(int device_index, char *why, size_t why_capacity);

gf_status gf_xpu_torch_runner_create(const gf_xpu_ze *ze, int device_index,
                                     gf_xpu_torch_runner **runner, gf_error *err);
void gf_xpu_torch_runner_destroy(gf_xpu_torch_runner *runner);

/* Whether torch's current stream on the runner's device is recording a graph; in native mode
 * also asks Level Zero about the stream's command list. */
int gf_xpu_torch_outer_capture_active(gf_xpu_torch_runner *runner, int native_graphs);

/* ---- hooks (gf_backend.h signatures; state is a gf_xpu_runner) ----------------------------- */

gf_status gf_xpu_torch_side_stream_begin(void *context, void *state, gf_error *err);
gf_status gf_xpu_torch_side_stream_end(void *context, void *state, gf_error *err);
gf_status gf_xpu_torch_capture_begin(void *context, void *state, gf_error *err);
gf_status gf_xpu_torch_capture_end(void *context, void *state, int ok, void **graph, gf_error *err);
gf_status gf_xpu_torch_capture_copy_node(void *context, void *state, int role,
                                         const gf_copy *copies, size_t count, int *recorded,
                                         gf_error *err);
gf_status gf_xpu_torch_copy_batch(void *context, void *state, const gf_copy *copies, size_t count,
                                  gf_error *err);
gf_status gf_xpu_torch_launch(void *context, void *state, void *graph, gf_error *err);
gf_status gf_xpu_torch_launch_folded(void *context, void *state, void *graph, const gf_copy *inputs,
                                     size_t input_count, const gf_copy *outputs,
                                     size_t output_count, gf_error *err);
void gf_xpu_torch_release_graph(void *context, void *state, void *graph);

#ifdef __cplusplus
}
#endif

#endif /* GF_XPU_TORCH_H */
