/* The CUDA backend's table and the hooks that need no libtorch: runner state, the copy nodes
 * (our own kernel, recorded into each graph as an input node and an output node whose copy tables
 * every replay rewrites, so that a replay is one graph launch whatever the number of tensors),
 * the graph object and the load-time probe. Streams, sync-debug, torch's CUDA graph object and
 * the shared memory pools are the torch half's (gf_cuda_torch.h); its hook-shaped functions sit
 * in the table directly. */
#include "gf_cuda_backend.h"
#include "gf_cuda_compare.h"
#include "gf_cuda_copy.h"
#include "gf_cuda_torch.h"

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A captured graph: torch's graph object, its executable, its copy nodes and the copy tables last
 * written into them. A replay whose table is the one already in its node (the same live inputs,
 * outputs the caching allocator handed back at the same addresses) skips the rewrite. Measured
 * on an H200 (torch 2.11, A/B in one session, with the lazily reserved vectors of the same
 * change): GraphedForward at K=4 went from 6.4-6.9 to 5.3-6.2 us a call, about 0.5 us for each
 * of the two cudaGraphExecKernelNodeSetParams calls a replay no longer makes; a replay whose
 * addresses all changed costs what it did (7.5-8.0 against 7.5-8.6 us). */
typedef struct gf_cuda_graph {
  gf_cuda_torch_graph *torch_graph;
  cudaGraphExec_t exec;
  int has_copy_nodes;
  gf_cuda_copy_node copy_nodes[2];
  size_t written_count[2]; /* 0: nothing known to be in the node */
  gf_copy written[2][GF_CUDA_COPIES_PER_LAUNCH];
} gf_cuda_graph;

static cudaStream_t gf_cuda_current_stream(void *state) {
  return gf_cuda_torch_current_stream(((gf_cuda_runner *)state)->torch);
}

/* pool: the memory pool the runner shares (gf_cuda_torch_pool_create's), or NULL for a pool of
 * its own. */
static gf_status gf_cuda_runner_create(void *context, int device_index, void *pool, void **state,
                                       gf_error *err) {
  (void)context;
  gf_cuda_runner *runner = calloc(1, sizeof *runner);
  if (runner == NULL) {
    return gf_error_set(err, GF_ERR_NO_MEMORY, "graphed: out of memory for a CUDA runner");
  }
  gf_status status =
      gf_cuda_torch_runner_create(device_index, (gf_cuda_torch_pool *)pool, &runner->torch, err);
  if (status != GF_OK) {
    free(runner);
    return status;
  }
  *state = runner;
  return GF_OK;
}

static void gf_cuda_runner_destroy(void *context, void *state) {
  (void)context;
  gf_cuda_torch_runner_destroy(((gf_cuda_runner *)state)->torch);
  free(state);
}

static int gf_cuda_outer_capture_active(void *context, void *state) {
  (void)context;
  enum cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(gf_cuda_current_stream(state), &capture) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return capture != cudaStreamCaptureStatusNone;
}

static gf_status gf_cuda_capture_begin(void *context, void *state, gf_error *err) {
  (void)context;
  gf_cuda_runner *runner = state;
  runner->recorded[0] = runner->recorded[1] = 0;
  return gf_cuda_torch_capture_begin(runner->torch, err);
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
  int error = gf_cuda_copy_record(role, copies, count, gf_cuda_current_stream(runner));
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
  cudaGraph_t raw = gf_cuda_torch_graph_raw(graph->torch_graph);
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
  gf_cuda_torch_graph *torch_graph = NULL;
  gf_status status = gf_cuda_torch_capture_end(runner->torch, ok, &torch_graph, err);
  if (status != GF_OK || torch_graph == NULL) {
    return status;
  }
  gf_cuda_graph *captured = calloc(1, sizeof *captured);
  if (captured == NULL) {
    gf_cuda_torch_graph_release(torch_graph);
    return gf_error_set(err, GF_ERR_NO_MEMORY, "graphed: out of memory for a CUDA graph");
  }
  captured->torch_graph = torch_graph;
  captured->exec = gf_cuda_torch_graph_exec(torch_graph);
  gf_cuda_find_copy_nodes(captured, runner);
  *graph = captured;
  return GF_OK;
}

static gf_status gf_cuda_copy_batch_hook(void *context, void *state, const gf_copy *copies,
                                         size_t count, gf_error *err) {
  (void)context;
  gf_status ordered = gf_cuda_torch_order_replay(((gf_cuda_runner *)state)->torch, err);
  if (ordered != GF_OK) {
    return ordered;
  }
  int error = gf_cuda_copy_batch(copies, count, gf_cuda_current_stream(state));
  if (error != 0) {
    return gf_error_set(err, GF_ERR_BACKEND, "graphed: the batched copy failed to launch: %s",
                        gf_cuda_error_string(error));
  }
  return GF_OK;
}

static gf_status gf_cuda_launch(void *context, void *state, void *graph, gf_error *err) {
  (void)context;
  gf_status ordered = gf_cuda_torch_order_replay(((gf_cuda_runner *)state)->torch, err);
  if (ordered != GF_OK) {
    return ordered;
  }
  return gf_cuda_torch_graph_replay(((gf_cuda_graph *)graph)->torch_graph, err);
}

/* Rewrites the copy table of one node unless it already holds these copies. 0 or a cudaError_t. */
static int gf_cuda_write_copy_table(gf_cuda_graph *graph, int role, const gf_copy *copies,
                                    size_t count) {
  if (count <= GF_CUDA_COPIES_PER_LAUNCH && graph->written_count[role] == count &&
      memcmp(graph->written[role], copies, count * sizeof *copies) == 0) {
    return 0;
  }
  graph->written_count[role] = 0;
  int error = gf_cuda_copy_update(graph->exec, &graph->copy_nodes[role], copies, count);
  if (error == 0 && count <= GF_CUDA_COPIES_PER_LAUNCH) {
    memcpy(graph->written[role], copies, count * sizeof *copies);
    graph->written_count[role] = count;
  }
  return error;
}

static gf_status gf_cuda_launch_folded(void *context, void *state, void *graph,
                                       const gf_copy *inputs, size_t input_count,
                                       const gf_copy *outputs, size_t output_count, gf_error *err) {
  gf_cuda_graph *captured = graph;
  if (!captured->has_copy_nodes) {
    return GF_ERR_NOT_FOUND;
  }
  /* Before the tables change: a replay of this pool still running on another stream reads them
   * no more once the current stream waits for it (gf_cuda_launch checks again, at no cost). */
  gf_status ordered = gf_cuda_torch_order_replay(((gf_cuda_runner *)state)->torch, err);
  if (ordered != GF_OK) {
    return ordered;
  }
  int error = gf_cuda_write_copy_table(captured, GF_COPY_INPUTS, inputs, input_count);
  if (error == 0) {
    error = gf_cuda_write_copy_table(captured, GF_COPY_OUTPUTS, outputs, output_count);
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
  gf_cuda_torch_graph_release(((gf_cuda_graph *)graph)->torch_graph);
  free(graph);
}

static gf_status gf_cuda_compare_later_hook(void *context, void *state, const gf_copy *pairs,
                                            size_t count, uint8_t *verdict, uint32_t *scratch,
                                            gf_error *err) {
  (void)context;
  int error = gf_cuda_compare_later(pairs, count, verdict, scratch, gf_cuda_current_stream(state));
  if (error == cudaErrorInvalidValue) {
    return gf_error_set(err, GF_ERR_NOT_FOUND,
                        "graphed: the device cannot write the verdict's host byte");
  }
  if (error != 0) {
    return gf_error_set(err, GF_ERR_BACKEND, "graphed: the batched comparison failed: %s",
                        gf_cuda_error_string(error));
  }
  return GF_OK;
}

static const gf_backend gf_cuda_backend = {
    .name = "cuda",
    .context = NULL,
    .graphs_supported = gf_cuda_torch_graphs_supported,
    .runner_create = gf_cuda_runner_create,
    .runner_destroy = gf_cuda_runner_destroy,
    .pool_create = gf_cuda_torch_pool_create,
    .pool_release = gf_cuda_torch_pool_release,
    .outer_capture_active = gf_cuda_outer_capture_active,
    .sync_probe_begin = gf_cuda_torch_sync_probe_begin,
    .sync_probe_end = gf_cuda_torch_sync_probe_end,
    .warmup_begin = gf_cuda_torch_warmup_begin,
    .warmup_end = gf_cuda_torch_warmup_end,
    .caller_stream_begin = gf_cuda_torch_caller_stream_begin,
    .caller_stream_end = gf_cuda_torch_caller_stream_end,
    .capture_begin = gf_cuda_capture_begin,
    .capture_end = gf_cuda_capture_end,
    .copy_batch = gf_cuda_copy_batch_hook,
    .launch = gf_cuda_launch,
    .release_graph = gf_cuda_release_graph,
    .capture_copy_node = gf_cuda_capture_copy_node,
    .launch_folded = gf_cuda_launch_folded,
    .device_bytes_in_use = gf_cuda_torch_device_bytes_in_use,
    .device_bytes_reserved = gf_cuda_torch_device_bytes_reserved,
    .pool_bytes_reserved = gf_cuda_torch_pool_bytes_reserved,
    .give_back_memory = gf_cuda_torch_give_back_memory,
    .compare_later = gf_cuda_compare_later_hook,
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
