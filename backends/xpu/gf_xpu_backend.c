/* The Level Zero (Intel GPU) backend's table and its load-time probe. The loader is opened with
 * dlopen (gf_xpu_level_zero.c), so a machine without it loads graphed all the same and pays one
 * failed dlopen. The probe initialises the loader for GPU drivers, checks the driver's API
 * version and finds its devices; it accepts only when this build also has the torch half
 * (gf_xpu_torch.cpp, built when torch has XPU), since capture goes through torch's XPU graph.
 *
 * Hooks: graphs_supported asks Level Zero (device, compute engine, SPIR-V, and the graph flag
 * when native recording is asked for) and then torch (the SYCL graph aspect). The sync probe hooks
 * are left to the core's default (nothing to switch): torch has no sync-debug mode for XPU (nothing
 * in c10/xpu matches SyncDebug), so a synchronising operator in a forward is caught only when it
 * fails during capture. Copies are one gather kernel per node reading a table the entry owns,
 * refreshed before each replay: a folded replay is two submissions (the table upload, the graph),
 * whatever the number of tensors. */
#include "gf_xpu_backend.h"
#include "gf_xpu_level_zero.h"
#ifdef GF_XPU_WITH_TORCH
#include "gf_xpu_torch.h"
#endif

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static gf_xpu_ze gf_xpu_level_zero;

#ifdef GF_XPU_WITH_TORCH

/* SYCL records straight into Level Zero graphs when this is set (intel/llvm), and then the
 * device must report graph support. */
static int gf_xpu_native_recording(void) {
  const char *value = getenv("SYCL_GRAPH_FORCE_NATIVE_RECORDING");
  return value != NULL && value[0] != '\0' && strcmp(value, "0") != 0;
}

static int gf_xpu_backend_device_usable(const gf_xpu_ze *ze, int device_type, int device_index,
                                        char *why, size_t why_capacity) {
  if (!gf_xpu_torch_is_xpu_device(device_type)) {
    snprintf(why, why_capacity, "the runner's device is not an XPU device");
    return 0;
  }
  return gf_xpu_ze_device_usable(ze, device_index < 0 ? 0 : device_index, gf_xpu_native_recording(),
                                 why, why_capacity);
}

static int gf_xpu_graphs_supported(void *context, int device_type, int device_index, char *why,
                                   size_t why_capacity) {
  return gf_xpu_backend_device_usable(context, device_type, device_index, why, why_capacity) &&
         gf_xpu_torch_graphs_supported(device_index, why, why_capacity);
}

/* pool is always NULL: the XPU backend makes no shared pools (no pool_create), so each runner
 * keeps the graph pool of its own that the torch half makes. */
static gf_status gf_xpu_runner_create(void *context, int device_index, void *pool, void **state,
                                      gf_error *err) {
  (void)pool;
  gf_xpu_runner *runner = calloc(1, sizeof *runner);
  if (runner == NULL) {
    return gf_error_set(err, GF_ERR_NO_MEMORY, "graphed: out of memory for an XPU runner");
  }
  runner->ze = context;
  runner->native_graphs = gf_xpu_native_recording();
  gf_status status = gf_xpu_torch_runner_create(runner->ze, device_index, &runner->torch, err);
  if (status != GF_OK) {
    free(runner);
    return status;
  }
  *state = runner;
  return GF_OK;
}

static void gf_xpu_runner_destroy(void *context, void *state) {
  (void)context;
  gf_xpu_torch_runner_destroy(((gf_xpu_runner *)state)->torch);
  free(state);
}

static int gf_xpu_outer_capture_active(void *context, void *state) {
  (void)context;
  gf_xpu_runner *runner = state;
  return gf_xpu_torch_outer_capture_active(runner->torch, runner->native_graphs);
}

static const gf_backend gf_xpu_backend = {
    .name = "xpu",
    .context = &gf_xpu_level_zero,
    .graphs_supported = gf_xpu_graphs_supported,
    .runner_create = gf_xpu_runner_create,
    .runner_destroy = gf_xpu_runner_destroy,
    .outer_capture_active = gf_xpu_outer_capture_active,
    /* No sync-debug mode exists for XPU: sync_probe_begin/end keep the core's default. */
    .warmup_begin = gf_xpu_torch_side_stream_begin,
    .warmup_end = gf_xpu_torch_side_stream_end,
    .capture_begin = gf_xpu_torch_capture_begin,
    .capture_end = gf_xpu_torch_capture_end,
    .copy_batch = gf_xpu_torch_copy_batch,
    .launch = gf_xpu_torch_launch,
    .release_graph = gf_xpu_torch_release_graph,
    .capture_copy_node = gf_xpu_torch_capture_copy_node,
    .launch_folded = gf_xpu_torch_launch_folded,
};

#endif /* GF_XPU_WITH_TORCH */

const gf_backend *gf_xpu_backend_probe(char *why, size_t why_capacity) {
  gf_error err = {0};
  if (gf_xpu_ze_open("libze_loader.so.1", &gf_xpu_level_zero, &err) != GF_OK) {
    snprintf(why, why_capacity, "%s", err.message);
    return NULL;
  }
#ifdef GF_XPU_WITH_TORCH
  return &gf_xpu_backend;
#else
  snprintf(why, why_capacity,
           "Level Zero finds %u GPU device(s) (driver API %u.%u), but this build's torch has no "
           "XPU, so graphed's XPU torch half is not built",
           (unsigned)gf_xpu_level_zero.device_count, (unsigned)gf_xpu_level_zero.api_version >> 16,
           (unsigned)gf_xpu_level_zero.api_version & 0xffffu);
  return NULL;
#endif
}
