/* The CUDA backend: the device hooks of gf_backend.h for CUDA. Capture, streams and sync-debug go
 * through the shim (torch's CUDA graph object and its streams); the batched copy is our own kernel,
 * recorded into each graph as an input node and an output node whose copy tables every replay
 * rewrites, so that a replay is one graph launch whatever the number of tensors.
 * The load-time probe only asks whether the CUDA driver library is installed: it creates no
 * context, so a process that forks before touching CUDA is unaffected. */
#include "gf_backend.h"
#include "gf_backend_probes.h"
#include "gf_cuda_copy.h"
#include "gf_shim_cuda.h"

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

/* Per runner: the shim's state, and which copy nodes the capture in progress recorded. */
typedef struct gf_cuda_runner {
  gf_shim_cuda_runner *shim;
  int recorded[2];
} gf_cuda_runner;

/* A captured graph: torch's graph object, its executable and its copy nodes. */
typedef struct gf_cuda_graph {
  void *torch_graph;
  void *exec;
  int has_copy_nodes;
  gf_cuda_copy_node copy_nodes[2];
} gf_cuda_graph;

static gf_shim_cuda_runner *gf_shim_of(void *state) { return ((gf_cuda_runner *)state)->shim; }

static int gf_cuda_graphs_supported(void *context, int device_type, int device_index, char *why,
                                    size_t why_capacity) {
  (void)context;
  return gf_shim_cuda_graphs_supported(device_type, device_index, why, why_capacity);
}

static gf_status gf_cuda_runner_create(void *context, int device_index, void **state,
                                       gf_error *err) {
  (void)context;
  gf_cuda_runner *runner = calloc(1, sizeof *runner);
  if (runner == NULL) {
    return gf_error_set(err, GF_ERR_NO_MEMORY, "graphed: out of memory for a CUDA runner");
  }
  gf_status status = gf_shim_cuda_runner_create(device_index, &runner->shim, err);
  if (status != GF_OK) {
    free(runner);
    return status;
  }
  *state = runner;
  return GF_OK;
}

static void gf_cuda_runner_destroy(void *context, void *state) {
  (void)context;
  gf_shim_cuda_runner_destroy(gf_shim_of(state));
  free(state);
}

static int gf_cuda_outer_capture_active(void *context, void *state) {
  (void)context;
  enum cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(gf_shim_cuda_current_stream(gf_shim_of(state)), &capture) !=
      cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return capture != cudaStreamCaptureStatusNone;
}

static gf_status gf_cuda_sync_probe_begin(void *context, void *state, gf_error *err) {
  (void)context;
  return gf_shim_cuda_sync_probe_begin(gf_shim_of(state), err);
}

static gf_status gf_cuda_sync_probe_end(void *context, void *state, gf_error *err) {
  (void)context;
  return gf_shim_cuda_sync_probe_end(gf_shim_of(state), err);
}

static gf_status gf_cuda_warmup_begin(void *context, void *state, gf_error *err) {
  (void)context;
  return gf_shim_cuda_side_stream_begin(gf_shim_of(state), err);
}

static gf_status gf_cuda_warmup_end(void *context, void *state, gf_error *err) {
  (void)context;
  return gf_shim_cuda_side_stream_end(gf_shim_of(state), err);
}

static gf_status gf_cuda_capture_begin(void *context, void *state, gf_error *err) {
  (void)context;
  gf_cuda_runner *runner = state;
  runner->recorded[0] = runner->recorded[1] = 0;
  return gf_shim_cuda_capture_begin(runner->shim, err);
}

static gf_status gf_cuda_capture_copy_node(void *context, void *state, int role,
                                           const gf_copy *copies, size_t count, int *recorded,
                                           gf_error *err) {
  (void)context;
  gf_cuda_runner *runner = state;
  *recorded = 0;
  if (count == 0 || count > GF_CUDA_COPIES_PER_LAUNCH || (role != 0 && role != 1)) {
    return GF_OK; /* replays of this graph copy with separate launches */
  }
  int error = gf_cuda_copy_record(role, copies, count, gf_shim_cuda_current_stream(runner->shim));
  if (error != 0) {
    return gf_error_set(err, GF_ERR_BACKEND, "graphed: recording a copy node failed: %s",
                        gf_cuda_error_string(error));
  }
  runner->recorded[role] = 1;
  *recorded = 1;
  return GF_OK;
}

/* Finds the copy nodes the capture recorded; a graph without them replays unfolded. */
static void gf_cuda_find_copy_nodes(gf_cuda_graph *graph, const gf_cuda_runner *runner) {
  void *raw = gf_shim_cuda_graph_raw(graph->torch_graph);
  if (raw == NULL || graph->exec == NULL || !runner->recorded[0] || !runner->recorded[1]) {
    return;
  }
  graph->has_copy_nodes =
      gf_cuda_copy_find_node(raw, GF_COPY_INPUTS, &graph->copy_nodes[GF_COPY_INPUTS]) == 1 &&
      gf_cuda_copy_find_node(raw, GF_COPY_OUTPUTS, &graph->copy_nodes[GF_COPY_OUTPUTS]) == 1;
}

static gf_status gf_cuda_capture_end(void *context, void *state, int ok, void **graph,
                                     gf_error *err) {
  (void)context;
  gf_cuda_runner *runner = state;
  *graph = NULL;
  void *torch_graph = NULL;
  gf_status status = gf_shim_cuda_capture_end(runner->shim, ok, &torch_graph, err);
  if (status != GF_OK || torch_graph == NULL) {
    return status;
  }
  gf_cuda_graph *captured = calloc(1, sizeof *captured);
  if (captured == NULL) {
    gf_shim_cuda_graph_release(torch_graph);
    return gf_error_set(err, GF_ERR_NO_MEMORY, "graphed: out of memory for a CUDA graph");
  }
  captured->torch_graph = torch_graph;
  captured->exec = gf_shim_cuda_graph_exec(torch_graph);
  gf_cuda_find_copy_nodes(captured, runner);
  *graph = captured;
  return GF_OK;
}

static gf_status gf_cuda_copy_batch_hook(void *context, void *state, const gf_copy *copies,
                                         size_t count, gf_error *err) {
  (void)context;
  int error = gf_cuda_copy_batch(copies, count, gf_shim_cuda_current_stream(gf_shim_of(state)));
  if (error != 0) {
    return gf_error_set(err, GF_ERR_BACKEND, "graphed: the batched copy failed to launch: %s",
                        gf_cuda_error_string(error));
  }
  return GF_OK;
}

static gf_status gf_cuda_launch(void *context, void *state, void *graph, gf_error *err) {
  (void)context;
  (void)state;
  return gf_shim_cuda_graph_replay(((gf_cuda_graph *)graph)->torch_graph, err);
}

static gf_status gf_cuda_launch_folded(void *context, void *state, void *graph,
                                       const gf_copy *inputs, size_t input_count,
                                       const gf_copy *outputs, size_t output_count, gf_error *err) {
  gf_cuda_graph *captured = graph;
  if (!captured->has_copy_nodes) {
    return GF_ERR_NOT_FOUND;
  }
  int error = gf_cuda_copy_update(captured->exec, &captured->copy_nodes[GF_COPY_INPUTS], inputs,
                                  input_count);
  if (error == 0) {
    error = gf_cuda_copy_update(captured->exec, &captured->copy_nodes[GF_COPY_OUTPUTS], outputs,
                                output_count);
  }
  if (error != 0) {
    return gf_error_set(err, GF_ERR_BACKEND,
                        "graphed: rewriting the graph's copy tables failed: %s",
                        gf_cuda_error_string(error));
  }
  return gf_cuda_launch(context, state, graph, err);
}

static void gf_cuda_release_graph(void *context, void *state, void *graph) {
  (void)context;
  (void)state;
  gf_shim_cuda_graph_release(((gf_cuda_graph *)graph)->torch_graph);
  free(graph);
}

static const gf_backend gf_cuda_backend = {
    .name = "cuda",
    .context = NULL,
    .graphs_supported = gf_cuda_graphs_supported,
    .runner_create = gf_cuda_runner_create,
    .runner_destroy = gf_cuda_runner_destroy,
    .outer_capture_active = gf_cuda_outer_capture_active,
    .sync_probe_begin = gf_cuda_sync_probe_begin,
    .sync_probe_end = gf_cuda_sync_probe_end,
    .warmup_begin = gf_cuda_warmup_begin,
    .warmup_end = gf_cuda_warmup_end,
    .capture_begin = gf_cuda_capture_begin,
    .capture_end = gf_cuda_capture_end,
    .copy_batch = gf_cuda_copy_batch_hook,
    .launch = gf_cuda_launch,
    .release_graph = gf_cuda_release_graph,
    .capture_copy_node = gf_cuda_capture_copy_node,
    .launch_folded = gf_cuda_launch_folded,
};

const gf_backend *gf_cuda_backend_probe(char *why, size_t why_capacity) {
  void *driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (driver == NULL) {
    snprintf(why, why_capacity, "the CUDA driver library (libcuda.so.1) is not installed");
    return NULL;
  }
  dlclose(driver);
  return &gf_cuda_backend;
}
