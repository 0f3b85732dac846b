/* The backend of a machine with no graph-capable device: it supports nothing, so every runner is
 * disabled with the reason the load-time choice gave, and every call runs eager. */
#include "gf_backend.h"

#include <stdio.h>

static int gf_none_graphs_supported(void *context, int device_type, int device_index, char *why,
                                    size_t why_capacity) {
  (void)context;
  (void)device_type;
  (void)device_index;
  snprintf(why, why_capacity, "%s", gf_backend_choice_reason());
  return 0;
}

static gf_status gf_none_unsupported(void *context, void *state, gf_error *err) {
  (void)context;
  (void)state;
  return gf_error_set(err, GF_ERR_BACKEND, "graphed: no graph backend on this machine");
}

static gf_status gf_none_capture_end(void *context, void *state, int ok, void **graph,
                                     gf_error *err) {
  (void)ok;
  *graph = NULL;
  return gf_none_unsupported(context, state, err);
}

static gf_status gf_none_copy_batch(void *context, void *state, const gf_copy *copies, size_t count,
                                    gf_error *err) {
  (void)copies;
  (void)count;
  return gf_none_unsupported(context, state, err);
}

static gf_status gf_none_launch(void *context, void *state, void *graph, gf_error *err) {
  (void)graph;
  return gf_none_unsupported(context, state, err);
}

static const gf_backend gf_none_backend = {
    .name = "none",
    .context = NULL,
    .graphs_supported = gf_none_graphs_supported,
    .runner_create = NULL,
    .runner_destroy = NULL,
    .outer_capture_active = NULL,
    .sync_probe_begin = gf_none_unsupported,
    .sync_probe_end = gf_none_unsupported,
    .warmup_begin = gf_none_unsupported,
    .warmup_end = gf_none_unsupported,
    .capture_begin = gf_none_unsupported,
    .capture_end = gf_none_capture_end,
    .copy_batch = gf_none_copy_batch,
    .launch = gf_none_launch,
    .release_graph = NULL,
};

const gf_backend *gf_backend_none(void) { return &gf_none_backend; }
