/* The emulated backend and the test plugin's registration (see gf_emulated_backend.h). Only the
 * hooks a host-memory device needs are filled; the optional begin/end hooks keep the core's
 * defaults (gf_backend.h), but for the caller-stream pair, which has one stream to switch to and
 * answers a key's first call from its last warm-up only while the hand-over switch is on. */
#include "gf_emulated_backend.h"

#include "gf_backend.h"
#include "gf_backend_registry.h"

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#if defined(__GNUC__)
#define GF_EMULATED_EXPORT __attribute__((visibility("default")))
#else
#define GF_EMULATED_EXPORT
#endif

static int gf_emulated_token;
static atomic_int gf_emulated_failing;

static atomic_int gf_emulated_handing_over;

GF_EMULATED_EXPORT void gf_emulated_fail_captures(int fail) {
  atomic_store(&gf_emulated_failing, fail != 0);
}

GF_EMULATED_EXPORT void gf_emulated_hand_over_warm_ups(int hand_over) {
  atomic_store(&gf_emulated_handing_over, hand_over != 0);
}

static gf_status gf_emulated_caller_stream_begin(void *context, void *state, gf_error *err) {
  (void)context;
  (void)state;
  if (!atomic_load(&gf_emulated_handing_over)) {
    return gf_error_set(err, GF_ERR_NOT_FOUND, "graphed: the emulated hand-over switch is off");
  }
  return GF_OK;
}

static gf_status gf_emulated_caller_stream_end(void *context, void *state, gf_error *err) {
  (void)context;
  (void)state;
  (void)err;
  return GF_OK;
}

static int gf_emulated_graphs_supported(void *context, int device_type, int device_index, char *why,
                                        size_t why_capacity) {
  (void)context;
  (void)device_type;
  (void)device_index;
  (void)why;
  (void)why_capacity;
  return 1;
}

static gf_status gf_emulated_capture_end(void *context, void *state, int ok, void **graph,
                                         gf_error *err) {
  (void)context;
  (void)state;
  *graph = NULL;
  if (atomic_load(&gf_emulated_failing)) {
    return gf_error_set(err, GF_ERR_CAPTURE, "graphed: emulated capture failure");
  }
  if (ok) {
    *graph = &gf_emulated_token;
  }
  return GF_OK;
}

static gf_status gf_emulated_copy_batch(void *context, void *state, const gf_copy *copies,
                                        size_t count, gf_error *err) {
  (void)context;
  (void)state;
  (void)err;
  for (size_t i = 0; i < count; ++i) {
    if (copies[i].bytes > 0) { /* a zero-size tensor's data may be NULL, which memmove forbids */
      memmove(copies[i].dst, copies[i].src, copies[i].bytes);
    }
  }
  return GF_OK;
}

/* Folding: the copy nodes are remembered by nothing but the token; a folded launch runs the input
 * copies, the (empty) graph and the output copies, in that order, as the device would. */
static gf_status gf_emulated_capture_copy_node(void *context, void *state, int role,
                                               const gf_copy *copies, size_t count, int *recorded,
                                               gf_error *err) {
  (void)role;
  *recorded = 1;
  return gf_emulated_copy_batch(context, state, copies, count, err);
}

static gf_status gf_emulated_launch(void *context, void *state, void *graph, gf_error *err);

static gf_status gf_emulated_launch_folded(void *context, void *state, void *graph,
                                           const gf_copy *inputs, size_t input_count,
                                           const gf_copy *outputs, size_t output_count,
                                           gf_error *err) {
  gf_status status = gf_emulated_launch(context, state, graph, err);
  if (status == GF_OK) {
    status = gf_emulated_copy_batch(context, state, inputs, input_count, err);
  }
  if (status == GF_OK) {
    status = gf_emulated_copy_batch(context, state, outputs, output_count, err);
  }
  return status;
}

static gf_status gf_emulated_launch(void *context, void *state, void *graph, gf_error *err) {
  (void)context;
  (void)state;
  if (graph != &gf_emulated_token) {
    return gf_error_set(err, GF_ERR_BACKEND, "graphed: emulated launch of an unknown graph");
  }
  return GF_OK;
}

/* Verify mode's comparison, made at once on the host (the CPU's work is done as it is queued):
 * the verdict is written before the call returns. */
static gf_status gf_emulated_compare_later(void *context, void *state, const gf_copy *pairs,
                                           size_t count, uint8_t *verdict, uint32_t *scratch,
                                           gf_error *err) {
  (void)context;
  (void)state;
  (void)scratch;
  (void)err;
  uint8_t differs = 0;
  for (size_t i = 0; i < count && !differs; ++i) {
    differs = memcmp(pairs[i].dst, pairs[i].src, pairs[i].bytes) != 0;
  }
  *verdict = differs;
  return GF_OK;
}

static const gf_backend gf_emulated_backend = {
    .name = "emulated",
    .graphs_supported = gf_emulated_graphs_supported,
    .caller_stream_begin = gf_emulated_caller_stream_begin,
    .caller_stream_end = gf_emulated_caller_stream_end,
    .capture_end = gf_emulated_capture_end,
    .copy_batch = gf_emulated_copy_batch,
    .launch = gf_emulated_launch,
    .capture_copy_node = gf_emulated_capture_copy_node,
    .launch_folded = gf_emulated_launch_folded,
    .compare_later = gf_emulated_compare_later,
};

static const gf_backend *gf_emulated_backend_probe(char *why, size_t why_capacity) {
  (void)why;
  (void)why_capacity;
  return &gf_emulated_backend;
}

/* Runs when the plugin is loaded: the registry and gf_backend_register are the product library's
 * own, reached through its exported symbols, so this is a backend registered from outside it. */
__attribute__((constructor)) static void gf_emulated_register_at_load(void) {
  gf_error err = {0};
  if (gf_backend_register("emulated", GF_BACKEND_BY_NAME_ONLY, gf_emulated_backend_probe, &err) !=
      GF_OK) {
    fprintf(stderr, "graphed testing plugin: %s\n", err.message);
  }
}
