/* The recording backend and the malloc host the core suites drive the runner with (see
 * gf_test_fakes.h). Plain host memory stands in for the device: copies are memcpy, a graph is the
 * list of forwards recorded while capturing, and launching it recomputes them in place. */
#include "gf_test_fakes.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the shared event log ---------------------------------------------------------------- */

void gf_fake_log_push(gf_fake_log *log, const char *format, ...) {
  if (log == NULL) {
    return;
  }
  if (log->count == log->capacity) {
    size_t capacity = log->capacity ? 2 * log->capacity : 64;
    void *grown = realloc(log->events, capacity * sizeof *log->events);
    if (grown == NULL) {
      abort();
    }
    log->events = grown;
    log->capacity = capacity;
  }
  va_list args;
  va_start(args, format);
  vsnprintf(log->events[log->count++], GF_FAKE_EVENT_CAPACITY, format, args);
  va_end(args);
}

void gf_fake_log_clear(gf_fake_log *log) { log->count = 0; }

void gf_fake_log_free(gf_fake_log *log) {
  free(log->events);
  *log = (gf_fake_log){0};
}

size_t gf_fake_log_count(const gf_fake_log *log, const char *event) {
  size_t found = 0;
  for (size_t i = 0; i < log->count; ++i) {
    found += strcmp(log->events[i], event) == 0;
  }
  return found;
}

size_t gf_fake_log_count_prefix(const gf_fake_log *log, const char *prefix) {
  size_t found = 0;
  for (size_t i = 0; i < log->count; ++i) {
    found += strncmp(log->events[i], prefix, strlen(prefix)) == 0;
  }
  return found;
}

/* ---- the recording backend --------------------------------------------------------------- */

enum { GF_FAKE_GRAPH_MAGIC = 0x47524150 };

struct gf_fake_graph {
  uint32_t magic;
  gf_fake_backend *owner;
  gf_fake_kernel *kernels;
  size_t count;
  size_t capacity;
  int hide_nodes; /* launch_folded cannot find the copy nodes (fold_hide_nodes at capture) */
};

const char *gf_fake_hook_name(gf_fake_hook hook) {
  static const char *const names[GF_FAKE_HOOK_COUNT] = {
      "none",          "runner_create",     "probe_begin",   "probe_end",        "warmup_begin",
      "warmup_end",    "capture_begin",     "capture_end",   "copy_batch",       "launch",
      "release_graph", "capture_copy_node", "launch_folded", "give_back_memory",
  };
  return hook < GF_FAKE_HOOK_COUNT ? names[hook] : "unknown";
}

static void gf_fake_violation(gf_fake_backend *fake, const char *what) {
  fake->protocol_errors++;
  snprintf(fake->last_protocol_error, sizeof fake->last_protocol_error, "%s", what);
}

static void gf_fake_check_state(gf_fake_backend *fake, void *state) {
  if (state == NULL || state != fake->state) {
    gf_fake_violation(fake, "a hook got a state runner_create did not hand out");
  }
}

/* Counts the call and answers whether this call is the one told to fail. */
static gf_status gf_fake_hook_result(gf_fake_backend *fake, gf_fake_hook hook, gf_error *err) {
  fake->calls[hook]++;
  if (fake->fail_hook != hook) {
    return GF_OK;
  }
  if (fake->fail_skip > 0) {
    fake->fail_skip--;
    return GF_OK;
  }
  return gf_error_set(err, fake->fail_code != GF_OK ? fake->fail_code : GF_ERR_BACKEND, "%s",
                      fake->fail_message);
}

/* Logs the hook and checks the runner is between begin/end pairs that allow it. */
static gf_status gf_fake_enter(gf_fake_backend *fake, gf_fake_hook hook, void *state,
                               gf_error *err) {
  gf_fake_log_push(fake->log, "%s", gf_fake_hook_name(hook));
  gf_fake_check_state(fake, state);
  return gf_fake_hook_result(fake, hook, err);
}

static int gf_fake_graphs_supported(void *context, int device_type, int device_index, char *why,
                                    size_t why_capacity) {
  gf_fake_backend *fake = context;
  (void)device_type;
  (void)device_index;
  if (!fake->supported) {
    snprintf(why, why_capacity, "the fake backend was told graphs are unsupported");
  }
  return fake->supported;
}

static gf_status gf_fake_runner_create(void *context, int device_index, void *pool, void **state,
                                       gf_error *err) {
  gf_fake_backend *fake = context;
  (void)device_index;
  gf_status status = gf_fake_hook_result(fake, GF_FAKE_HOOK_RUNNER_CREATE, err);
  if (status != GF_OK) {
    return status;
  }
  fake->runner_pool = pool;
  if (fake->state != NULL) {
    gf_fake_violation(fake, "runner_create twice on one fake backend");
  }
  fake->state = malloc(1);
  fake->live_states++;
  *state = fake->state;
  return GF_OK;
}

static void gf_fake_runner_destroy(void *context, void *state) {
  gf_fake_backend *fake = context;
  gf_fake_check_state(fake, state);
  if (fake->live_graphs != 0) {
    gf_fake_violation(fake, "runner_destroy while graphs are still alive");
  }
  free(state);
  fake->state = NULL;
  fake->live_states--;
}

static int gf_fake_outer_capture_active(void *context, void *state) {
  gf_fake_backend *fake = context;
  gf_fake_check_state(fake, state);
  return fake->outer_capture_active;
}

static int gf_fake_busy(const gf_fake_backend *fake) {
  return fake->capturing || fake->warming_up || fake->probing;
}

static gf_status gf_fake_probe_begin(void *context, void *state, gf_error *err) {
  gf_fake_backend *fake = context;
  /* The probe is the first warm-up: inside the warm-up pair, outside any other. */
  if (fake->capturing || fake->probing || !fake->warming_up) {
    gf_fake_violation(fake, "probe_begin outside the warm-up pair or inside another pair");
  }
  gf_status status = gf_fake_enter(fake, GF_FAKE_HOOK_PROBE_BEGIN, state, err);
  fake->probing = status == GF_OK;
  return status;
}

static gf_status gf_fake_probe_end(void *context, void *state, gf_error *err) {
  gf_fake_backend *fake = context;
  if (!fake->probing) {
    gf_fake_violation(fake, "probe_end without probe_begin");
  }
  fake->probing = 0;
  return gf_fake_enter(fake, GF_FAKE_HOOK_PROBE_END, state, err);
}

static gf_status gf_fake_warmup_begin(void *context, void *state, gf_error *err) {
  gf_fake_backend *fake = context;
  if (gf_fake_busy(fake)) {
    gf_fake_violation(fake, "warmup_begin inside another begin/end pair");
  }
  gf_status status = gf_fake_enter(fake, GF_FAKE_HOOK_WARMUP_BEGIN, state, err);
  fake->warming_up = status == GF_OK;
  return status;
}

static gf_status gf_fake_warmup_end(void *context, void *state, gf_error *err) {
  gf_fake_backend *fake = context;
  if (!fake->warming_up) {
    gf_fake_violation(fake, "warmup_end without warmup_begin");
  }
  fake->warming_up = 0;
  return gf_fake_enter(fake, GF_FAKE_HOOK_WARMUP_END, state, err);
}

static gf_status gf_fake_capture_begin(void *context, void *state, gf_error *err) {
  gf_fake_backend *fake = context;
  if (gf_fake_busy(fake)) {
    gf_fake_violation(fake, "capture_begin inside another begin/end pair");
  }
  gf_status status = gf_fake_enter(fake, GF_FAKE_HOOK_CAPTURE_BEGIN, state, err);
  if (status != GF_OK) {
    return status;
  }
  fake->pending = calloc(1, sizeof *fake->pending);
  if (fake->pending == NULL) {
    return gf_error_set(err, GF_ERR_NO_MEMORY, "fake backend: out of memory for a graph");
  }
  fake->pending->magic = GF_FAKE_GRAPH_MAGIC;
  fake->pending->owner = fake;
  fake->capturing = 1;
  return GF_OK;
}

static void gf_fake_graph_free(gf_fake_graph *graph) {
  for (size_t i = 0; i < graph->count; ++i) {
    free(graph->kernels[i].inputs);
    free(graph->kernels[i].outputs);
    free(graph->kernels[i].copies);
    free(graph->kernels[i].recorded_copies);
  }
  free(graph->kernels);
  graph->magic = 0;
  free(graph);
}

static gf_status gf_fake_capture_end(void *context, void *state, int ok, void **graph,
                                     gf_error *err) {
  gf_fake_backend *fake = context;
  *graph = NULL;
  if (!fake->capturing) {
    gf_fake_violation(fake, "capture_end without capture_begin");
  }
  fake->capturing = 0;
  gf_fake_graph *captured = fake->pending;
  fake->pending = NULL;
  gf_status status = gf_fake_enter(fake, GF_FAKE_HOOK_CAPTURE_END, state, err);
  if (status != GF_OK || !ok || captured == NULL) {
    if (captured != NULL) {
      gf_fake_graph_free(captured);
    }
    return status;
  }
  captured->hide_nodes = fake->fold_hide_nodes;
  fake->live_graphs++;
  *graph = captured;
  return GF_OK;
}

static gf_status gf_fake_copy_batch(void *context, void *state, const gf_copy *copies, size_t count,
                                    gf_error *err) {
  gf_fake_backend *fake = context;
  if (gf_fake_busy(fake)) {
    gf_fake_violation(fake, "copy_batch inside a begin/end pair");
  }
  gf_fake_log_push(fake->log, "copy_batch(%zu)", count);
  gf_fake_check_state(fake, state);
  gf_status status = gf_fake_hook_result(fake, GF_FAKE_HOOK_COPY_BATCH, err);
  if (status != GF_OK) {
    return status;
  }
  for (size_t i = 0; i < count; ++i) {
    memmove(copies[i].dst, copies[i].src, copies[i].bytes);
  }
  fake->copies_total += count;
  fake->last_batch_size = count;
  return GF_OK;
}

/* Runs what the graph recorded, in order: copy nodes copy their current tables, forwards
 * compute. */
static void gf_fake_graph_run(const gf_fake_graph *graph) {
  for (size_t i = 0; i < graph->count; ++i) {
    const gf_fake_kernel *kernel = &graph->kernels[i];
    if (kernel->is_copy_node) {
      for (size_t c = 0; c < kernel->copy_count; ++c) {
        memmove(kernel->copies[c].dst, kernel->copies[c].src, kernel->copies[c].bytes);
      }
    } else {
      gf_fake_forward_compute(kernel->inputs, kernel->input_count, kernel->outputs,
                              kernel->output_count);
      gf_fake_forward_mutate(kernel->inputs, kernel->input_count, kernel->mutate_input);
    }
  }
}

static int gf_fake_graph_is_live(const gf_fake_backend *fake, const gf_fake_graph *graph) {
  return graph != NULL && graph->magic == GF_FAKE_GRAPH_MAGIC && graph->owner == fake;
}

static gf_status gf_fake_launch(void *context, void *state, void *graph, gf_error *err) {
  gf_fake_backend *fake = context;
  if (gf_fake_busy(fake)) {
    gf_fake_violation(fake, "launch inside a begin/end pair");
  }
  gf_status status = gf_fake_enter(fake, GF_FAKE_HOOK_LAUNCH, state, err);
  if (status != GF_OK) {
    return status;
  }
  gf_fake_graph *replayed = graph;
  if (!gf_fake_graph_is_live(fake, replayed)) {
    gf_fake_violation(fake, "launch of a graph this backend does not hold");
    return gf_error_set(err, GF_ERR_BACKEND, "fake backend: launch of an unknown graph");
  }
  gf_fake_graph_run(replayed);
  return GF_OK;
}

static void gf_fake_release_graph(void *context, void *state, void *graph) {
  gf_fake_backend *fake = context;
  gf_fake_log_push(fake->log, "release_graph");
  gf_fake_check_state(fake, state);
  fake->calls[GF_FAKE_HOOK_RELEASE_GRAPH]++;
  if (!gf_fake_graph_is_live(fake, graph)) {
    gf_fake_violation(fake, "release_graph of a graph this backend does not hold");
    return;
  }
  fake->live_graphs--;
  gf_fake_graph_free(graph);
}

static void gf_fake_give_back_memory(void *context, void *state) {
  gf_fake_backend *fake = context;
  gf_fake_log_push(fake->log, "give_back_memory");
  gf_fake_check_state(fake, state);
  if (gf_fake_busy(fake)) {
    gf_fake_violation(fake, "give_back_memory inside a begin/end pair");
  }
  fake->calls[GF_FAKE_HOOK_GIVE_BACK_MEMORY]++;
}

void gf_fake_backend_init(gf_fake_backend *fake, gf_fake_log *log) {
  *fake = (gf_fake_backend){0};
  fake->log = log;
  fake->supported = 1;
  fake->table = (gf_backend){
      .name = "fake",
      .context = fake,
      .graphs_supported = gf_fake_graphs_supported,
      .runner_create = gf_fake_runner_create,
      .runner_destroy = gf_fake_runner_destroy,
      .outer_capture_active = gf_fake_outer_capture_active,
      .sync_probe_begin = gf_fake_probe_begin,
      .sync_probe_end = gf_fake_probe_end,
      .warmup_begin = gf_fake_warmup_begin,
      .warmup_end = gf_fake_warmup_end,
      .capture_begin = gf_fake_capture_begin,
      .capture_end = gf_fake_capture_end,
      .copy_batch = gf_fake_copy_batch,
      .launch = gf_fake_launch,
      .release_graph = gf_fake_release_graph,
      .give_back_memory = gf_fake_give_back_memory,
  };
}

void gf_fake_backend_fail(gf_fake_backend *fake, gf_fake_hook hook, int skip, const char *message) {
  fake->fail_hook = hook;
  fake->fail_skip = skip;
  snprintf(fake->fail_message, sizeof fake->fail_message, "%s",
           message ? message : "fake hook failure");
}

static gf_tensor *gf_fake_copy_descriptors(const gf_tensor *tensors, size_t count) {
  gf_tensor *copy = malloc((count ? count : 1) * sizeof *copy);
  if (copy != NULL && count > 0) {
    memcpy(copy, tensors, count * sizeof *copy);
  }
  return copy;
}

static void gf_fake_graph_append(gf_fake_graph *graph, const gf_fake_kernel *kernel) {
  if (graph->count == graph->capacity) {
    size_t capacity = graph->capacity ? 2 * graph->capacity : 4;
    void *grown = realloc(graph->kernels, capacity * sizeof *graph->kernels);
    if (grown == NULL) {
      abort();
    }
    graph->kernels = grown;
    graph->capacity = capacity;
  }
  graph->kernels[graph->count++] = *kernel;
}

int gf_fake_backend_record(gf_fake_backend *fake, const gf_tensor *inputs, size_t input_count,
                           const gf_tensor *outputs, size_t output_count, int mutate_input) {
  gf_fake_graph *graph = fake->pending;
  if (!fake->capturing || graph == NULL) {
    return 0;
  }
  gf_fake_kernel kernel = {0};
  kernel.inputs = gf_fake_copy_descriptors(inputs, input_count);
  kernel.input_count = input_count;
  kernel.outputs = gf_fake_copy_descriptors(outputs, output_count);
  kernel.output_count = output_count;
  kernel.mutate_input = mutate_input;
  gf_fake_graph_append(graph, &kernel);
  return 1;
}

/* ---- the folding hooks -------------------------------------------------------------------- */

static const char *gf_fake_role_name(int role) {
  return role == GF_COPY_INPUTS ? "inputs" : role == GF_COPY_OUTPUTS ? "outputs" : "unknown";
}

static const gf_fake_kernel *gf_fake_find_copy_node(const gf_fake_graph *graph, int role) {
  for (size_t i = 0; i < graph->count; ++i) {
    if (graph->kernels[i].is_copy_node && graph->kernels[i].copy_role == role) {
      return &graph->kernels[i];
    }
  }
  return NULL;
}

static gf_status gf_fake_capture_copy_node(void *context, void *state, int role,
                                           const gf_copy *copies, size_t count, int *recorded,
                                           gf_error *err) {
  gf_fake_backend *fake = context;
  *recorded = 0;
  if (!fake->capturing || fake->warming_up || fake->probing) {
    gf_fake_violation(fake, "capture_copy_node outside capture_begin/capture_end");
  }
  if (role != GF_COPY_INPUTS && role != GF_COPY_OUTPUTS) {
    gf_fake_violation(fake, "capture_copy_node of an unknown role");
  }
  gf_fake_log_push(fake->log, "capture_copy_node(%s,%zu)", gf_fake_role_name(role), count);
  gf_fake_check_state(fake, state);
  gf_status status = gf_fake_hook_result(fake, GF_FAKE_HOOK_CAPTURE_COPY_NODE, err);
  gf_fake_graph *graph = fake->pending;
  if (status != GF_OK || !fake->capturing || graph == NULL || count > fake->fold_max_copies) {
    return status; /* refused: *recorded stays 0 */
  }
  if (gf_fake_find_copy_node(graph, role) != NULL) {
    gf_fake_violation(fake, "two copy nodes of one role in one capture");
  }
  if (role == GF_COPY_INPUTS && graph->count != 0) {
    gf_fake_violation(fake, "the input copy node recorded after the forward");
  }
  if (role == GF_COPY_OUTPUTS && graph->count == 0) {
    gf_fake_violation(fake, "the output copy node recorded before the forward");
  }
  gf_fake_kernel kernel = {0};
  kernel.is_copy_node = 1;
  kernel.copy_role = role;
  kernel.copies = malloc((count ? count : 1) * sizeof *kernel.copies);
  kernel.recorded_copies = malloc((count ? count : 1) * sizeof *kernel.recorded_copies);
  if (kernel.copies == NULL || kernel.recorded_copies == NULL) {
    abort();
  }
  if (count > 0) {
    memcpy(kernel.copies, copies, count * sizeof *copies);
    memcpy(kernel.recorded_copies, copies, count * sizeof *copies);
  }
  kernel.copy_count = count;
  gf_fake_graph_append(graph, &kernel);
  *recorded = 1;
  return GF_OK;
}

/* Rewrites a copy node's table. The graph's side of each copy (the destinations of the input
 * copies, the sources of the output copies) is where the recorded kernels read and write, so a
 * new table may change only the caller's side. */
static gf_status gf_fake_rewrite_table(gf_fake_backend *fake, gf_fake_kernel *node,
                                       const gf_copy *copies, size_t count, gf_error *err) {
  if (count != node->copy_count) {
    gf_fake_violation(fake, "launch_folded with a table of another length than its node's");
    return gf_error_set(err, GF_ERR_BACKEND, "fake backend: copy table of the wrong length");
  }
  size_t nonempty = 0;
  size_t bytes = 0;
  for (size_t i = 0; i < count; ++i) {
    const int inputs = node->copy_role == GF_COPY_INPUTS;
    const void *graph_side = inputs ? copies[i].dst : copies[i].src;
    const gf_copy *recorded = &node->recorded_copies[i];
    const void *recorded_side = inputs ? recorded->dst : recorded->src;
    if (graph_side != recorded_side) {
      gf_fake_violation(fake, "launch_folded moved the graph's side of a copy");
    }
    if (copies[i].bytes > recorded->bytes) {
      gf_fake_violation(fake, "launch_folded copies more bytes than the static buffer holds");
    }
    nonempty += copies[i].bytes > 0;
    bytes += copies[i].bytes;
  }
  if (count > 0) {
    memcpy(node->copies, copies, count * sizeof *copies);
  }
  fake->last_folded_count[node->copy_role] = count;
  fake->last_folded_nonempty[node->copy_role] = nonempty;
  fake->last_folded_bytes[node->copy_role] = bytes;
  return GF_OK;
}

static gf_status gf_fake_launch_folded(void *context, void *state, void *graph,
                                       const gf_copy *inputs, size_t input_count,
                                       const gf_copy *outputs, size_t output_count, gf_error *err) {
  gf_fake_backend *fake = context;
  if (gf_fake_busy(fake)) {
    gf_fake_violation(fake, "launch_folded inside a begin/end pair");
  }
  gf_fake_log_push(fake->log, "launch_folded(%zu,%zu)", input_count, output_count);
  gf_fake_check_state(fake, state);
  gf_status status = gf_fake_hook_result(fake, GF_FAKE_HOOK_LAUNCH_FOLDED, err);
  if (status != GF_OK) {
    return status;
  }
  gf_fake_graph *replayed = graph;
  if (!gf_fake_graph_is_live(fake, replayed)) {
    gf_fake_violation(fake, "launch_folded of a graph this backend does not hold");
    return gf_error_set(err, GF_ERR_BACKEND, "fake backend: launch of an unknown graph");
  }
  gf_fake_kernel *input_node = (gf_fake_kernel *)gf_fake_find_copy_node(replayed, GF_COPY_INPUTS);
  gf_fake_kernel *output_node = (gf_fake_kernel *)gf_fake_find_copy_node(replayed, GF_COPY_OUTPUTS);
  if (replayed->hide_nodes || input_node == NULL || output_node == NULL) {
    return GF_ERR_NOT_FOUND; /* launched nothing */
  }
  status = gf_fake_rewrite_table(fake, input_node, inputs, input_count, err);
  if (status == GF_OK) {
    status = gf_fake_rewrite_table(fake, output_node, outputs, output_count, err);
  }
  if (status == GF_OK) {
    gf_fake_graph_run(replayed);
  }
  return status;
}

void gf_fake_backend_enable_folding(gf_fake_backend *fake) {
  fake->fold = 1;
  fake->fold_max_copies = SIZE_MAX;
  fake->table.capture_copy_node = gf_fake_capture_copy_node;
  fake->table.launch_folded = gf_fake_launch_folded;
}

/* ---- the malloc host --------------------------------------------------------------------- */

/* One buffer; a handle is a pointer to its storage and holds one reference. */
struct gf_fake_storage {
  gf_fake_host *owner;
  void *data;
  int64_t refcount;
  gf_fake_storage *next_made;
};

static void gf_fake_fill_contiguous_strides(gf_tensor *t) {
  int64_t stride = 1;
  for (int32_t d = t->ndim - 1; d >= 0; --d) {
    t->strides[d] = stride;
    if (__builtin_mul_overflow(stride, t->sizes[d], &stride)) {
      stride = INT64_MAX; /* huge test sizes: no real stride, but no undefined behaviour */
    }
  }
}

gf_tensor gf_fake_view(float *data, int ndim, const int64_t *sizes) {
  gf_tensor t = {0};
  t.data = data;
  t.dtype = GF_FAKE_DTYPE_FLOAT32;
  t.itemsize = (int32_t)sizeof(float);
  t.device_type = GF_FAKE_DEVICE_TYPE;
  t.device_index = 0;
  t.ndim = ndim;
  for (int d = 0; d < ndim; ++d) {
    t.sizes[d] = sizes[d];
  }
  gf_fake_fill_contiguous_strides(&t);
  return t;
}

/* A fresh owned contiguous tensor with the metadata of like; its bytes are 0xff (NaN floats). */
static gf_status gf_fake_allocate(gf_fake_host *host, const gf_tensor *like, gf_tensor *out,
                                  gf_error *err) {
  *out = *like;
  gf_fake_fill_contiguous_strides(out);
  size_t bytes = (size_t)gf_tensor_nbytes(out);
  gf_fake_storage *storage = calloc(1, sizeof *storage);
  void *data = malloc(bytes ? bytes : 1);
  if (storage == NULL || data == NULL) {
    free(storage);
    free(data);
    return gf_error_set(err, GF_ERR_NO_MEMORY, "fake host: out of memory");
  }
  memset(data, 0xff, bytes);
  storage->owner = host;
  storage->data = data;
  storage->refcount = 1;
  storage->next_made = host->storages;
  host->storages = storage;
  host->live_handles++;
  out->data = data;
  out->handle = storage;
  return GF_OK;
}

gf_tensor gf_fake_host_tensor(gf_fake_host *host, int ndim, const int64_t *sizes,
                              const float *values) {
  gf_tensor like = gf_fake_view(NULL, ndim, sizes);
  gf_tensor out;
  if (gf_fake_allocate(host, &like, &out, NULL) != GF_OK) {
    abort();
  }
  size_t bytes = (size_t)gf_tensor_nbytes(&out);
  if (values != NULL) {
    memcpy(out.data, values, bytes);
  } else {
    memset(out.data, 0, bytes);
  }
  return out;
}

static gf_status gf_fake_clone_static(void *context, const gf_tensor *live, gf_tensor *out,
                                      gf_error *err) {
  gf_fake_host *host = context;
  if (host->clone_out_of_memory) {
    return gf_error_set(err, GF_ERR_DEVICE_MEMORY, "fake host: out of memory for a static copy");
  }
  gf_status status = gf_fake_allocate(host, live, out, err);
  if (status != GF_OK) {
    return status;
  }
  memcpy(out->data, live->data, (size_t)gf_tensor_nbytes(live));
  if (host->clone_calls < GF_FAKE_MAX_CLONES) {
    host->clones[host->clone_calls] = *out;
  }
  host->clone_calls++;
  return GF_OK;
}

static gf_status gf_fake_empty_like(void *context, const gf_tensor *like, gf_tensor *out,
                                    gf_error *err) {
  gf_fake_host *host = context;
  host->empty_calls++;
  return gf_fake_allocate(host, like, out, err);
}

static gf_status gf_fake_retain(void *context, const gf_tensor *tensor, gf_tensor *out,
                                gf_error *err) {
  gf_fake_host *host = context;
  gf_fake_storage *storage = tensor->handle;
  host->retain_calls++;
  if (storage == NULL || storage->owner != host || storage->refcount <= 0) {
    return gf_error_set(err, GF_ERR_INVALID_ARGUMENT,
                        "fake host: retain of a tensor without a live handle");
  }
  storage->refcount++;
  host->live_handles++;
  *out = *tensor;
  return GF_OK;
}

static void gf_fake_release(void *context, void *handle) {
  gf_fake_host *host = context;
  gf_fake_storage *storage = handle;
  if (storage == NULL || storage->owner != host || storage->refcount <= 0) {
    host->bad_releases++;
    return;
  }
  host->live_handles--;
  if (--storage->refcount == 0) {
    free(storage->data);
    storage->data = NULL;
  }
}

void gf_fake_forward_compute(const gf_tensor *inputs, size_t input_count, const gf_tensor *outputs,
                             size_t output_count) {
  for (size_t j = 0; j < output_count; ++j) {
    float *out = outputs[j].data;
    int64_t numel = gf_tensor_numel(&outputs[j]);
    for (int64_t e = 0; e < numel; ++e) {
      float value = 0.0f;
      for (size_t k = 0; k < input_count; ++k) {
        const float *in = inputs[k].data;
        int64_t in_numel = gf_tensor_numel(&inputs[k]);
        if (in_numel == 0) {
          continue;
        }
        float term = in[e % in_numel];
        value += k == 0 ? (float)(2 + j) * term : term;
      }
      out[e] = value;
    }
  }
}

void gf_fake_forward_mutate(const gf_tensor *inputs, size_t input_count, int mutate_input) {
  if (mutate_input < 0 || (size_t)mutate_input >= input_count) {
    return;
  }
  float *data = inputs[mutate_input].data;
  for (int64_t e = 0; e < gf_tensor_numel(&inputs[mutate_input]); ++e) {
    data[e] += 1.0f;
  }
}

static void gf_fake_release_all(gf_fake_host *host, gf_tensor *tensors, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    gf_fake_release(host, tensors[i].handle);
  }
}

static gf_status gf_fake_run_forward(void *context, gf_forward_phase phase, const gf_tensor *inputs,
                                     size_t count, gf_pool *outputs, unsigned char *mutated,
                                     gf_forward_report *report, gf_error *err) {
  gf_fake_host *host = context;
  int capturing = host->backend != NULL && host->backend->capturing;
  host->forward_calls++;
  host->phase_calls[phase & 3]++;
  if (mutated != NULL) {
    for (size_t i = 0; i < count; ++i) {
      mutated[i] = (int)i == host->mutate_input;
    }
  }
  gf_fake_log_push(host->log, "forward");
  if (host->fail_forward || (capturing && host->fail_forward_while_capturing) ||
      host->forward_calls == host->fail_forward_number) {
    /* The fact in the report, a plain failure as the status: the core tells them apart. */
    report->error = host->forward_error_is_own    ? GF_FORWARD_ERROR_OWN
                    : host->forward_out_of_memory ? GF_FORWARD_ERROR_DEVICE_MEMORY
                                                  : GF_FORWARD_ERROR_NONE;
    return gf_error_set(err, GF_ERR_BACKEND, "fake forward failed%s",
                        capturing ? " during capture" : "");
  }
  int64_t scalar_sizes[1] = {1};
  gf_tensor like = count > 0 ? inputs[0] : gf_fake_view(NULL, 0, scalar_sizes);
  gf_tensor made[GF_FAKE_MAX_OUTPUTS];
  size_t made_count = 0;
  gf_status status = GF_OK;
  while (status == GF_OK && made_count < (size_t)host->output_count) {
    status = gf_fake_allocate(host, &like, &made[made_count], err);
    made_count += status == GF_OK;
  }
  if (status == GF_OK) {
    /* While capturing a device forward is only recorded; the graph computes on launch. */
    if (!gf_fake_backend_record(host->backend, inputs, count, made, made_count,
                                host->mutate_input)) {
      gf_fake_forward_compute(inputs, count, made, made_count);
      gf_fake_forward_mutate(inputs, count, host->mutate_input);
    }
  }
  for (size_t j = 0; status == GF_OK && j < made_count; ++j) {
    status = gf_pool_add(outputs, &made[j], err);
    if (status != GF_OK) {
      gf_fake_release_all(host, &made[j], made_count - j);
      return status;
    }
  }
  if (status != GF_OK) {
    gf_fake_release_all(host, made, made_count);
  }
  return status;
}

static int gf_fake_agree(void *context, int ok) {
  gf_fake_host *host = context;
  if (host->agree_calls < GF_FAKE_MAX_AGREEMENTS) {
    host->forwards_at_agreement[host->agree_calls] = host->forward_calls;
    host->ok_at_agreement[host->agree_calls] = ok;
  }
  host->agree_calls++;
  host->last_agree_ok = ok;
  const int forced = host->agree_forced && host->agree_calls >= host->agree_forced_from;
  return forced ? host->agree_value : ok;
}

static void gf_fake_warn(void *context, const char *message) {
  gf_fake_host *host = context;
  if (host->warn_count < GF_FAKE_MAX_WARNINGS) {
    snprintf(host->warnings[host->warn_count], sizeof host->warnings[0], "%s", message);
  }
  host->warn_count++;
}

static void gf_fake_notify(void *context, const gf_event *event) {
  gf_fake_host *host = context;
  const int kind = (int)event->kind;
  if (kind < 0 || kind >= GF_EVENT_KINDS) {
    host->unknown_events++;
    return;
  }
  host->events[kind]++;
  host->last_event[kind] = *event;
  snprintf(host->last_message[kind], sizeof host->last_message[kind], "%s", event->message);
  host->last_event[kind].message = host->last_message[kind];
}

static void gf_fake_destroy(void *context) {
  gf_fake_host *host = context;
  host->destroyed++;
}

void gf_fake_host_init(gf_fake_host *host, gf_fake_log *log, gf_fake_backend *backend) {
  *host = (gf_fake_host){0};
  host->log = log;
  host->backend = backend;
  host->output_count = 1;
  host->mutate_input = -1;
}

gf_host gf_fake_host_table(gf_fake_host *host) {
  return (gf_host){
      .context = host,
      .clone_static = gf_fake_clone_static,
      .empty_like = gf_fake_empty_like,
      .retain = gf_fake_retain,
      .run_forward = gf_fake_run_forward,
      .agree = host->no_group ? NULL : gf_fake_agree,
      .release = gf_fake_release,
      .warn = gf_fake_warn,
      .notify = host->observe ? gf_fake_notify : NULL,
      .destroy = gf_fake_destroy,
  };
}

void gf_fake_host_release_pool(gf_fake_host *host, gf_pool *pool) {
  gf_pool_release(pool, gf_fake_release, host);
}

void gf_fake_host_free(gf_fake_host *host) {
  gf_fake_storage *storage = host->storages;
  while (storage != NULL) {
    gf_fake_storage *next = storage->next_made;
    free(storage->data);
    free(storage);
    storage = next;
  }
  host->storages = NULL;
}
