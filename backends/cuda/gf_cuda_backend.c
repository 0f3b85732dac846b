/* The CUDA backend: the device hooks of gf_backend.h for CUDA. Capture, streams and sync-debug go
 * through the shim (torch's CUDA graph object and its streams); the batched copy is our own kernel.
 * The load-time probe only asks whether the CUDA driver library is installed: it creates no
 * context, so a process that forks before touching CUDA is unaffected. */
#include "gf_backend.h"
#include "gf_backend_probes.h"
#include "gf_cuda_copy.h"
#include "gf_shim_cuda.h"

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <stdio.h>

static int gf_cuda_graphs_supported(void *context, int device_type, int device_index, char *why,
                                    size_t why_capacity) {
  (void)context;
  return gf_shim_cuda_graphs_supported(device_type, device_index, why, why_capacity);
}

static gf_status gf_cuda_runner_create(void *context, int device_index, void **state,
                                       gf_error *err) {
  (void)context;
  return gf_shim_cuda_runner_create(device_index, (gf_shim_cuda_runner **)state, err);
}

static void gf_cuda_runner_destroy(void *context, void *state) {
  (void)context;
  gf_shim_cuda_runner_destroy(state);
}

static int gf_cuda_outer_capture_active(void *context, void *state) {
  (void)context;
  enum cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(gf_shim_cuda_current_stream(state), &capture) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return capture != cudaStreamCaptureStatusNone;
}

static gf_status gf_cuda_sync_probe_begin(void *context, void *state, gf_error *err) {
  (void)context;
  return gf_shim_cuda_sync_probe_begin(state, err);
}

static gf_status gf_cuda_sync_probe_end(void *context, void *state, gf_error *err) {
  (void)context;
  return gf_shim_cuda_sync_probe_end(state, err);
}

static gf_status gf_cuda_warmup_begin(void *context, void *state, gf_error *err) {
  (void)context;
  return gf_shim_cuda_side_stream_begin(state, err);
}

static gf_status gf_cuda_warmup_end(void *context, void *state, gf_error *err) {
  (void)context;
  return gf_shim_cuda_side_stream_end(state, err);
}

static gf_status gf_cuda_capture_begin(void *context, void *state, gf_error *err) {
  (void)context;
  return gf_shim_cuda_capture_begin(state, err);
}

static gf_status gf_cuda_capture_end(void *context, void *state, int ok, void **graph,
                                     gf_error *err) {
  (void)context;
  return gf_shim_cuda_capture_end(state, ok, graph, err);
}

static gf_status gf_cuda_copy_batch_hook(void *context, void *state, const gf_copy *copies,
                                         size_t count, gf_error *err) {
  (void)context;
  int error = gf_cuda_copy_batch(copies, count, gf_shim_cuda_current_stream(state));
  if (error != 0) {
    return gf_error_set(err, GF_ERR_BACKEND, "graphed: the batched copy failed to launch: %s",
                        gf_cuda_error_string(error));
  }
  return GF_OK;
}

static gf_status gf_cuda_launch(void *context, void *state, void *graph, gf_error *err) {
  (void)context;
  (void)state;
  return gf_shim_cuda_graph_replay(graph, err);
}

static void gf_cuda_release_graph(void *context, void *state, void *graph) {
  (void)context;
  (void)state;
  gf_shim_cuda_graph_release(graph);
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
