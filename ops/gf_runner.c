/* The runner (see gf_runner.h): the replay path for a cache hit and the capture protocol for a
 * miss, driven through the backend's device hooks and the host's tensor hooks. */
#include "gf_runner.h"

#include "gf_backend_registry.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum {
  GF_REASON_CAPACITY = 512,
  GF_CHURN_FACTOR = 4 /* captures past this many times max_entries, with evictions, are churn */
};

struct gf_runner {
  gf_runner_config config;
  gf_host host;
  const gf_backend *backend;
  void *backend_state;
  gf_cache cache;
  gf_signature scratch_signature;
  gf_copy *scratch_copies;
  size_t scratch_copies_capacity;
  int sync_probe_done;
  int enabled;
  int evicting;   /* entries released now are evictions (told to the host as such) */
  int churn_said; /* the churn event is sent once */
  char disabled_reason[GF_REASON_CAPACITY];
  uint64_t captures;
  uint64_t replays;
  uint64_t eager_calls;
  int64_t pool_bytes;
  int64_t graph_bytes;
};

static void gf_runner_release_handle(void *context, void *handle) {
  gf_runner *runner = context;
  runner->host.release(runner->host.context, handle);
}

static void gf_runner_notify(const gf_runner *runner, const gf_event *event) {
  if (runner->host.notify != NULL) {
    runner->host.notify(runner->host.context, event);
  }
}

/* An event about one entry, with its static inputs and bytes. */
static gf_event gf_entry_event(gf_event_kind kind, const gf_entry *entry) {
  gf_event event = {kind, "", 0.0, -1, 0, 0, NULL, 0};
  event.static_bytes = entry->static_inputs.bytes + entry->static_outputs.bytes;
  event.inputs = entry->static_inputs.tensors;
  event.input_count = entry->static_inputs.count;
  return event;
}

static void gf_runner_release_entry(void *context, gf_entry *entry) {
  gf_runner *runner = context;
  if (runner->evicting) {
    gf_event evicted = gf_entry_event(GF_EVENT_EVICTED, entry);
    gf_runner_notify(runner, &evicted);
  }
  if (entry->graph != NULL && runner->backend->release_graph != NULL) {
    runner->backend->release_graph(runner->backend->context, runner->backend_state, entry->graph);
    entry->graph = NULL;
  }
  if (entry->device_bytes > 0) {
    runner->graph_bytes -= entry->device_bytes;
    entry->device_bytes = 0;
  }
  runner->pool_bytes -= gf_pool_release(&entry->static_inputs, gf_runner_release_handle, runner);
  runner->pool_bytes -= gf_pool_release(&entry->static_outputs, gf_runner_release_handle, runner);
  gf_pool_release(&entry->keep_alive, gf_runner_release_handle, runner);
}

static void gf_runner_set_disabled(gf_runner *runner, const char *reason) {
  if (runner->enabled || runner->disabled_reason[0] == '\0') {
    snprintf(runner->disabled_reason, sizeof runner->disabled_reason, "%.500s",
             reason && reason[0] ? reason : "disabled");
    /* One line: a forward's message may carry a traceback after its first line. */
    runner->disabled_reason[strcspn(runner->disabled_reason, "\n")] = '\0';
  }
  runner->enabled = 0;
}

/* The hooks every host must fill. */
static int gf_host_is_complete(const gf_host *host) {
  return host != NULL && host->run_forward != NULL && host->release != NULL &&
         host->clone_static != NULL && host->empty_like != NULL && host->retain != NULL;
}

/* A backend that says it can capture must fill every device hook the protocol calls, and fold
 * copies with both folding hooks or neither; NULL when it does, else the missing hook's name. A
 * backend that refuses in graphs_supported needs no device hook. */
static const char *gf_backend_missing_device_hook(const gf_backend *backend) {
  const struct {
    const void *hook;
    const char *name;
  } required[] = {
      {(const void *)backend->sync_probe_begin, "sync_probe_begin"},
      {(const void *)backend->sync_probe_end, "sync_probe_end"},
      {(const void *)backend->warmup_begin, "warmup_begin"},
      {(const void *)backend->warmup_end, "warmup_end"},
      {(const void *)backend->capture_begin, "capture_begin"},
      {(const void *)backend->capture_end, "capture_end"},
      {(const void *)backend->copy_batch, "copy_batch"},
      {(const void *)backend->launch, "launch"},
  };
  for (size_t i = 0; i < sizeof required / sizeof required[0]; ++i) {
    if (required[i].hook == NULL) {
      return required[i].name;
    }
  }
  if ((backend->capture_copy_node == NULL) != (backend->launch_folded == NULL)) {
    return "capture_copy_node and launch_folded (both or neither)";
  }
  return NULL;
}

/* Whether a runner on this backend can capture at all; else it starts disabled with why. Only a
 * backend table that says yes but lacks a hook is an error. */
static gf_status gf_runner_check_support(gf_runner *runner, gf_error *err) {
  char why[GF_REASON_CAPACITY] = "";
  const gf_backend *backend = runner->backend;
  if (!runner->config.enabled) {
    gf_runner_set_disabled(runner, "disabled by the caller (enabled=False)");
    return GF_OK;
  }
  if (!backend->graphs_supported(backend->context, runner->config.device_type,
                                 runner->config.device_index, why, sizeof why)) {
    char reason[GF_REASON_CAPACITY + 64];
    snprintf(reason, sizeof reason, "graphs unavailable (backend %s): %s", backend->name,
             why[0] ? why : "no reason given");
    gf_runner_set_disabled(runner, reason);
    return GF_OK;
  }
  const char *missing = gf_backend_missing_device_hook(backend);
  if (missing != NULL) {
    return gf_error_set(err, GF_ERR_INVALID_ARGUMENT, "graphed: backend '%s' lacks the hook %s",
                        backend->name, missing);
  }
  if (backend->runner_create != NULL) {
    gf_error create_err = {0};
    if (backend->runner_create(backend->context, runner->config.device_index,
                               &runner->backend_state, &create_err) != GF_OK) {
      gf_runner_set_disabled(runner, create_err.message);
    }
  }
  return GF_OK;
}

gf_status gf_runner_create(const gf_runner_config *config, const gf_host *host,
                           const gf_backend *backend, gf_runner **out, gf_error *err) {
  *out = NULL;
  if (backend == NULL) {
    backend = gf_backend_current();
  }
  gf_runner *runner = NULL;
  gf_status status = GF_OK;
  if (!gf_host_is_complete(host)) {
    status = gf_error_set(err, GF_ERR_INVALID_ARGUMENT, "graphed: the runner's host is incomplete");
  } else if (backend->name == NULL || backend->graphs_supported == NULL) {
    status = gf_error_set(err, GF_ERR_INVALID_ARGUMENT,
                          "graphed: a backend table needs a name and graphs_supported");
  } else if (config->warmup_iters < 0) {
    status = gf_error_set(err, GF_ERR_INVALID_ARGUMENT,
                          "graphed: warmup_iters must be 0 or more, got %d", config->warmup_iters);
  } else if ((runner = calloc(1, sizeof *runner)) == NULL) {
    status = gf_error_set(err, GF_ERR_NO_MEMORY, "graphed: out of memory creating a runner");
  } else {
    runner->config = *config;
    runner->host = *host;
    runner->backend = backend;
    runner->enabled = 1;
    status =
        gf_cache_init(&runner->cache, config->max_entries, gf_runner_release_entry, runner, err);
    if (status == GF_OK) {
      runner->cache.hash_fn = config->hash_fn;
      status = gf_runner_check_support(runner, err);
    }
  }
  if (status != GF_OK) {
    /* The one cleanup exit: the runner owns the host's context from the start. */
    if (runner != NULL) {
      gf_runner_destroy(runner);
    } else if (host != NULL && host->destroy != NULL) {
      host->destroy(host->context);
    }
    return status;
  }
  *out = runner;
  return GF_OK;
}

void gf_runner_destroy(gf_runner *runner) {
  if (runner == NULL) {
    return;
  }
  if (runner->cache.buckets != NULL) {
    gf_cache_destroy(&runner->cache);
  }
  if (runner->backend_state != NULL && runner->backend->runner_destroy != NULL) {
    runner->backend->runner_destroy(runner->backend->context, runner->backend_state);
  }
  gf_signature_free(&runner->scratch_signature);
  free(runner->scratch_copies);
  if (runner->host.destroy != NULL) {
    runner->host.destroy(runner->host.context);
  }
  free(runner);
}

void gf_runner_disable(gf_runner *runner, const char *reason) {
  const int was_enabled = runner->enabled;
  gf_runner_set_disabled(runner, reason);
  gf_cache_clear(&runner->cache);
  if (was_enabled) {
    gf_event disabled = {GF_EVENT_DISABLED, runner->disabled_reason, 0.0, -1, 0, 0, NULL, 0};
    gf_runner_notify(runner, &disabled);
  }
}

static double gf_seconds_now(void) {
  struct timespec now;
  if (timespec_get(&now, TIME_UTC) == 0) {
    return 0.0;
  }
  return (double)now.tv_sec + (double)now.tv_nsec * 1e-9;
}

static int64_t gf_runner_device_bytes(const gf_runner *runner) {
  const gf_backend *backend = runner->backend;
  if (backend->device_bytes_in_use == NULL) {
    return -1;
  }
  return backend->device_bytes_in_use(backend->context, runner->backend_state);
}

/* Says what a capture cost, and once, when captures keep evicting (more than a few times
 * max_entries): a key that changes on every call, or a cache too small for the shapes in use. */
static void gf_runner_report_capture(gf_runner *runner, gf_entry *entry, double started,
                                     int64_t device_bytes_before) {
  gf_event captured = gf_entry_event(GF_EVENT_CAPTURED, entry);
  captured.seconds = gf_seconds_now() - started;
  const int64_t after = gf_runner_device_bytes(runner);
  captured.device_bytes = after >= 0 && device_bytes_before >= 0 ? after - device_bytes_before : -1;
  entry->device_bytes = captured.device_bytes;
  if (entry->device_bytes > 0) {
    runner->graph_bytes += entry->device_bytes;
  }
  gf_runner_notify(runner, &captured);
  if (!runner->churn_said && runner->cache.evictions > 0 &&
      runner->captures > GF_CHURN_FACTOR * runner->cache.max_entries) {
    runner->churn_said = 1;
    char message[256];
    snprintf(message, sizeof message,
             "%llu captures and %llu evictions with max_entries=%zu: calls keep making new keys "
             "(a value or shape that changes per call) or the cache is too small for the shapes "
             "in use",
             (unsigned long long)runner->captures, (unsigned long long)runner->cache.evictions,
             runner->cache.max_entries);
    gf_event churn = {GF_EVENT_CHURN, message, 0.0, -1, 0, runner->captures, NULL, 0};
    gf_runner_notify(runner, &churn);
  }
}

void gf_runner_reset(gf_runner *runner) {
  gf_cache_clear(&runner->cache);
  runner->sync_probe_done = 0;
}

void gf_runner_get_stats(const gf_runner *runner, gf_runner_stats *stats) {
  stats->graphs = runner->cache.count;
  stats->pinned = runner->cache.pinned_count;
  stats->captures = runner->captures;
  stats->replays = runner->replays;
  stats->evictions = runner->cache.evictions;
  stats->eager_calls = runner->eager_calls;
  stats->pool_bytes = runner->pool_bytes;
  stats->graph_bytes = runner->graph_bytes;
  stats->enabled = runner->enabled;
}

const char *gf_runner_disabled_reason(const gf_runner *runner) {
  return runner->enabled ? "" : runner->disabled_reason;
}

const char *gf_runner_backend_name(const gf_runner *runner) { return runner->backend->name; }

static void gf_runner_warn(gf_runner *runner, const char *message) {
  if (runner->host.warn != NULL) {
    runner->host.warn(runner->host.context, message);
  }
}

/* Adds a handle the host just made to a pool; on failure releases it, so no path leaks it. */
static gf_status gf_runner_adopt(gf_runner *runner, gf_pool *pool, gf_status made,
                                 const gf_tensor *tensor, gf_error *err) {
  if (made != GF_OK) {
    return made;
  }
  gf_status status = gf_pool_add(pool, tensor, err);
  if (status != GF_OK) {
    runner->host.release(runner->host.context, tensor->handle);
  }
  return status;
}

/* An eager run on the caller's own tensors: their in-place writes happen for real, and are
 * reported to a caller that asked (it may have passed temporary copies). */
/* A host that observes got the disable as an event; any other is warned. */
static void gf_runner_warn_disabled(gf_runner *runner, const char *reason) {
  if (runner->host.notify != NULL) {
    return;
  }
  char message[GF_REASON_CAPACITY + 64];
  snprintf(message, sizeof message, "graphed: runner disabled, calls now run eager: %s", reason);
  gf_runner_warn(runner, message);
}

static gf_status gf_runner_run_eager(gf_runner *runner, const gf_tensor *inputs, size_t count,
                                     const gf_call_options *options, gf_pool *results,
                                     gf_error *err) {
  runner->eager_calls++;
  return runner->host.run_forward(runner->host.context, GF_PHASE_EAGER, inputs, count, results,
                                  options->mutated_inputs, err);
}

static gf_status gf_runner_reserve_copies(gf_runner *runner, size_t count, gf_error *err) {
  if (count <= runner->scratch_copies_capacity) {
    return GF_OK;
  }
  gf_copy *grown = realloc(runner->scratch_copies, count * sizeof *grown);
  if (grown == NULL) {
    return gf_error_set(err, GF_ERR_NO_MEMORY, "graphed: out of memory for a copy batch");
  }
  runner->scratch_copies = grown;
  runner->scratch_copies_capacity = count;
  return GF_OK;
}

/* The input copies of a replay, one per input: an input already at its static buffer (same
 * address, sizes and strides) gets a zero-byte copy. */
static void gf_runner_input_copies(const gf_entry *entry, const gf_tensor *inputs, size_t count,
                                   gf_copy *copies) {
  for (size_t i = 0; i < count; ++i) {
    const gf_tensor *fixed = &entry->static_inputs.tensors[i];
    size_t bytes = gf_tensor_same_view(fixed, &inputs[i]) ? 0 : (size_t)gf_tensor_nbytes(fixed);
    copies[i] = (gf_copy){fixed->data, bytes ? inputs[i].data : fixed->data, bytes};
  }
}

/* The write-backs of a replay, one per input the forward writes in place: the static buffer's new
 * values into the caller's tensor (zero bytes when the caller passed the static buffer itself).
 * Marks those inputs in mutated when the caller asked. */
static void gf_runner_write_back_copies(const gf_entry *entry, const gf_tensor *inputs,
                                        gf_copy *copies, unsigned char *mutated,
                                        size_t input_count) {
  if (mutated != NULL) {
    memset(mutated, 0, input_count);
  }
  for (size_t m = 0; m < entry->mutated_count; ++m) {
    const size_t i = entry->mutated_inputs[m];
    const gf_tensor *fixed = &entry->static_inputs.tensors[i];
    size_t bytes = gf_tensor_same_view(fixed, &inputs[i]) ? 0 : (size_t)gf_tensor_nbytes(fixed);
    copies[m] = (gf_copy){bytes ? inputs[i].data : fixed->data, fixed->data, bytes};
    if (mutated != NULL) {
      mutated[i] = 1;
    }
  }
}

/* Appends the call's outputs to results (fresh tensors, or the static ones when asked) and
 * fills copies with the copies that fill them, one per output (zero bytes for static ones). */
static gf_status gf_runner_output_slots(gf_runner *runner, const gf_entry *entry,
                                        const gf_call_options *options, gf_pool *results,
                                        gf_copy *copies, gf_error *err) {
  const gf_pool *outputs = &entry->static_outputs;
  gf_status status = GF_OK;
  for (size_t i = 0; status == GF_OK && i < outputs->count; ++i) {
    const gf_tensor *fixed = &outputs->tensors[i];
    gf_tensor out = {0};
    if (options->static_outputs) {
      status = runner->host.retain(runner->host.context, fixed, &out, err);
      copies[i] = (gf_copy){fixed->data, fixed->data, 0};
    } else {
      status = runner->host.empty_like(runner->host.context, fixed, &out, err);
      copies[i] = (gf_copy){out.data, fixed->data, (size_t)gf_tensor_nbytes(fixed)};
    }
    status = gf_runner_adopt(runner, results, status, &out, err);
  }
  return status;
}

/* Runs the non-empty copies of a list as one batch. */
static gf_status gf_runner_copy_nonempty(gf_runner *runner, gf_copy *copies, size_t count,
                                         gf_error *err) {
  size_t kept = 0;
  for (size_t i = 0; i < count; ++i) {
    if (copies[i].bytes > 0) {
      copies[kept++] = copies[i];
    }
  }
  if (kept == 0) {
    return GF_OK;
  }
  return runner->backend->copy_batch(runner->backend->context, runner->backend_state, copies, kept,
                                     err);
}

/* The replay path: refresh the static inputs, launch, fill the outputs and write mutated inputs
 * back. When the copies were folded into the graph at capture this is one launch (the
 * write-backs ride in the output node's table); otherwise a batched copy on either side of it. */
static gf_status gf_runner_replay(gf_runner *runner, gf_entry *entry, const gf_tensor *inputs,
                                  size_t count, const gf_call_options *options, gf_pool *results,
                                  gf_error *err) {
  const size_t output_count = entry->static_outputs.count + entry->mutated_count;
  gf_status status = gf_runner_reserve_copies(runner, count + output_count, err);
  if (status != GF_OK) {
    return status;
  }
  gf_copy *input_copies = runner->scratch_copies;
  gf_copy *output_copies = runner->scratch_copies + count;
  gf_runner_input_copies(entry, inputs, count, input_copies);
  gf_runner_write_back_copies(entry, inputs, output_copies + entry->static_outputs.count,
                              options->mutated_inputs, count);
  status = gf_runner_output_slots(runner, entry, options, results, output_copies, err);
  const gf_backend *backend = runner->backend;
  int launched = 0;
  if (status == GF_OK && entry->folded) {
    status = backend->launch_folded(backend->context, runner->backend_state, entry->graph,
                                    input_copies, count, output_copies, output_count, err);
    launched = status == GF_OK;
    if (status == GF_ERR_NOT_FOUND) {
      entry->folded = 0; /* the nodes were not found: plain launches from now on */
      status = GF_OK;
    }
  }
  if (status == GF_OK && !launched) {
    status = gf_runner_copy_nonempty(runner, input_copies, count, err);
    if (status == GF_OK) {
      status = backend->launch(backend->context, runner->backend_state, entry->graph, err);
    }
    if (status == GF_OK) {
      status = gf_runner_copy_nonempty(runner, output_copies, output_count, err);
    }
  }
  if (status != GF_OK) {
    return status; /* gf_runner_call releases the outputs this call appended */
  }
  entry->replays++;
  runner->replays++;
  return GF_OK;
}

/* Records one of the graph's copy nodes (see gf_backend.h) with self-copies of the static
 * buffers, which replays rewrite: the inputs node copies into the static inputs; the outputs node
 * copies out of the static outputs and then out of the static inputs the forward writes in place
 * (the write-backs). *recorded is 0 when the backend does not fold. */
static gf_status gf_runner_capture_copy_node(gf_runner *runner, int role, const gf_entry *entry,
                                             int *recorded, gf_error *err) {
  *recorded = 0;
  const gf_backend *backend = runner->backend;
  if (backend->capture_copy_node == NULL || backend->launch_folded == NULL) {
    return GF_OK;
  }
  const gf_pool *buffers = role == GF_COPY_INPUTS ? &entry->static_inputs : &entry->static_outputs;
  const size_t write_backs = role == GF_COPY_INPUTS ? 0 : entry->mutated_count;
  const size_t count = buffers->count + write_backs;
  gf_status status = gf_runner_reserve_copies(runner, count, err);
  for (size_t i = 0; status == GF_OK && i < count; ++i) {
    const gf_tensor *buffer =
        i < buffers->count
            ? &buffers->tensors[i]
            : &entry->static_inputs.tensors[entry->mutated_inputs[i - buffers->count]];
    runner->scratch_copies[i] =
        (gf_copy){buffer->data, buffer->data, (size_t)gf_tensor_nbytes(buffer)};
  }
  if (status == GF_OK) {
    status = backend->capture_copy_node(backend->context, runner->backend_state, role,
                                        runner->scratch_copies, count, recorded, err);
  }
  return status;
}

/* Keeps the indices of the inputs the capture forward wrote in place. */
static gf_status gf_runner_keep_mutated(gf_entry *entry, const unsigned char *mutated, size_t count,
                                        gf_error *err) {
  size_t found = 0;
  for (size_t i = 0; i < count; ++i) {
    found += mutated[i] != 0;
  }
  if (found == 0) {
    return GF_OK;
  }
  entry->mutated_inputs = malloc(found * sizeof *entry->mutated_inputs);
  if (entry->mutated_inputs == NULL) {
    return gf_error_set(err, GF_ERR_NO_MEMORY, "graphed: out of memory for mutated inputs");
  }
  for (size_t i = 0; i < count; ++i) {
    if (mutated[i]) {
      entry->mutated_inputs[entry->mutated_count++] = i;
    }
  }
  return GF_OK;
}

static void gf_runner_discard_outputs(gf_runner *runner, gf_pool *outputs) {
  gf_pool_free(outputs, gf_runner_release_handle, runner);
}

/* With a process group, the ranks meet here: the MIN of every rank's status so far. A rank whose
 * own status is fine learns that another one failed `stage`. Called at the same points on every
 * rank (the eager forwards of a capture run only while every rank is fine), so that no rank runs
 * a live collective its peers never reach. Without a group it does nothing. */
static void gf_runner_agree_on_stage(gf_runner *runner, const char *stage, gf_status *status,
                                     gf_error *err) {
  if (runner->host.agree == NULL) {
    return;
  }
  int agreed = runner->host.agree(runner->host.context, *status == GF_OK);
  if (*status == GF_OK && agreed <= 0) {
    *status = gf_error_set(err, GF_ERR_CAPTURE,
                           agreed < 0 ? "graphed: the agreement across the process group failed "
                                        "(%s)"
                                      : "graphed: another rank of the process group failed %s",
                           stage);
  }
}

/* One eager forward before a capture: the sync probe when `probing`, else a warm-up. The probe's
 * backend records a synchronizing operator rather than failing on it, so the forward always runs
 * to its end and every rank's collectives stay aligned; the failure counts once it returns. */
static gf_status gf_runner_prepare_forward(gf_runner *runner, gf_entry *entry, int probing,
                                           gf_error *err) {
  const gf_backend *backend = runner->backend;
  gf_error probe_err = {0};
  gf_status probe_status = GF_OK;
  if (probing) {
    probe_status = backend->sync_probe_begin(backend->context, runner->backend_state, &probe_err);
  }
  gf_pool scratch = {0};
  gf_status status = runner->host.run_forward(
      runner->host.context, probing ? GF_PHASE_PROBE : GF_PHASE_WARMUP,
      entry->static_inputs.tensors, entry->static_inputs.count, &scratch, NULL, err);
  gf_runner_discard_outputs(runner, &scratch);
  if (probing && probe_status == GF_OK) {
    /* end only a probe that began */
    probe_status = backend->sync_probe_end(backend->context, runner->backend_state, &probe_err);
  }
  if (status == GF_OK && probe_status != GF_OK) {
    status = gf_error_set(err, probe_status, "%s", probe_err.message);
  }
  if (probing) {
    runner->sync_probe_done = status == GF_OK;
  }
  return status;
}

/* Runs the forwards that must not be recorded, on the side stream: the warm-ups. On the runner's
 * first capture the first of them is the sync probe, which finds synchronizing operators before
 * the capture does; it counts as a warm-up, and runs even when warmup_iters is 0. Later captures
 * run min(warmup_iters, 1) warm-ups. These forwards are live: with a process group the ranks
 * agree before the first (on everything up to it: static copies, the side stream) and after
 * each, and all stop at the first failure of any. `status` is the capture's so far. */
static gf_status gf_runner_prepare_capture(gf_runner *runner, gf_entry *entry, gf_status status,
                                           gf_error *err) {
  const gf_backend *backend = runner->backend;
  const int probe = !runner->sync_probe_done;
  int iterations = runner->config.warmup_iters;
  if (probe && iterations < 1) {
    iterations = 1;
  } else if (!probe && iterations > 1) {
    iterations = 1;
  }
  if (iterations == 0) {
    return status;
  }
  int on_side_stream = 0;
  if (status == GF_OK) {
    status = backend->warmup_begin(backend->context, runner->backend_state, err);
    on_side_stream = status == GF_OK;
  }
  gf_runner_agree_on_stage(runner, "before its warm-ups", &status, err);
  for (int i = 0; i < iterations && status == GF_OK; ++i) {
    const int probing = probe && i == 0;
    status = gf_runner_prepare_forward(runner, entry, probing, err);
    gf_runner_agree_on_stage(runner, probing ? "in its sync probe" : "in a warm-up", &status, err);
  }
  if (on_side_stream) {
    gf_error end_err = {0};
    gf_status end = backend->warmup_end(backend->context, runner->backend_state, &end_err);
    if (status == GF_OK && end != GF_OK) {
      status = gf_error_set(err, end, "%s", end_err.message);
    }
  }
  return status;
}

/* The capture protocol for the first call of a signature, up to but not including agreement. */
static gf_status gf_runner_capture(gf_runner *runner, gf_entry *entry, const gf_tensor *inputs,
                                   size_t count, const gf_tensor *keep_alive,
                                   size_t keep_alive_count, gf_error *err) {
  gf_status status = GF_OK;
  for (size_t i = 0; status == GF_OK && i < count; ++i) {
    gf_tensor fixed = {0};
    status = runner->host.clone_static(runner->host.context, &inputs[i], &fixed, err);
    status = gf_runner_adopt(runner, &entry->static_inputs, status, &fixed, err);
  }
  runner->pool_bytes += entry->static_inputs.bytes;
  for (size_t i = 0; status == GF_OK && i < keep_alive_count; ++i) {
    gf_tensor held = {0};
    status = runner->host.retain(runner->host.context, &keep_alive[i], &held, err);
    status = gf_runner_adopt(runner, &entry->keep_alive, status, &held, err);
  }
  status = gf_runner_prepare_capture(runner, entry, status, err);
  if (status != GF_OK) {
    return status;
  }
  const gf_backend *backend = runner->backend;
  status = backend->capture_begin(backend->context, runner->backend_state, err);
  if (status != GF_OK) {
    return status;
  }
  int folded_inputs = 0;
  int folded_outputs = 0;
  unsigned char *mutated = calloc(count ? count : 1, 1);
  if (mutated == NULL) {
    status = gf_error_set(err, GF_ERR_NO_MEMORY, "graphed: out of memory for a capture");
  }
  if (status == GF_OK) {
    status = gf_runner_capture_copy_node(runner, GF_COPY_INPUTS, entry, &folded_inputs, err);
  }
  if (status == GF_OK) {
    status = runner->host.run_forward(runner->host.context, GF_PHASE_CAPTURE,
                                      entry->static_inputs.tensors, entry->static_inputs.count,
                                      &entry->static_outputs, mutated, err);
  }
  runner->pool_bytes += entry->static_outputs.bytes;
  if (status == GF_OK) {
    status = gf_runner_keep_mutated(entry, mutated, count, err);
  }
  free(mutated);
  if (status == GF_OK && folded_inputs) {
    status = gf_runner_capture_copy_node(runner, GF_COPY_OUTPUTS, entry, &folded_outputs, err);
  }
  entry->folded = folded_inputs && folded_outputs;
  gf_error end_err = {0};
  gf_status end = backend->capture_end(backend->context, runner->backend_state, status == GF_OK,
                                       &entry->graph, &end_err);
  if (status == GF_OK && end != GF_OK) {
    status = gf_error_set(err, end, "%s", end_err.message);
  }
  if (status == GF_OK && entry->graph == NULL) {
    status = gf_error_set(err, GF_ERR_BACKEND, "graphed: the backend returned no graph");
  }
  return status;
}

static gf_status gf_runner_capture_and_replay(gf_runner *runner, const gf_tensor *inputs,
                                              size_t count, const gf_tensor *keep_alive,
                                              size_t keep_alive_count,
                                              const gf_call_options *options, gf_pool *results,
                                              gf_error *err) {
  const double started = gf_seconds_now();
  const int64_t device_bytes_before = gf_runner_device_bytes(runner);
  int grew_past_limit = 0;
  runner->evicting = 1;
  gf_cache_make_room(&runner->cache, &grew_past_limit);
  runner->evicting = 0;
  if (grew_past_limit) {
    char message[160];
    snprintf(message, sizeof message,
             "graphed: every resident graph is pinned, so the cache grows past max_entries=%zu "
             "(said once)",
             runner->cache.max_entries);
    gf_runner_warn(runner, message);
  }
  gf_entry *entry = gf_entry_create(&runner->scratch_signature, options->pin, err);
  if (entry == NULL) {
    return err->code;
  }
  gf_error capture_err = {0};
  gf_status status =
      gf_runner_capture(runner, entry, inputs, count, keep_alive, keep_alive_count, &capture_err);
  gf_runner_agree_on_stage(runner, "its capture", &status, &capture_err);
  if (status == GF_OK) {
    status = gf_cache_insert(&runner->cache, entry, &capture_err);
    if (status != GF_OK) {
      gf_runner_release_entry(runner, entry);
      gf_entry_destroy(entry);
    }
  } else {
    gf_runner_release_entry(runner, entry);
    gf_entry_destroy(entry);
  }
  if (status == GF_ERR_FORWARD && runner->host.agree == NULL) {
    /* The forward raised an error of its own: the caller gets it once, as from an eager call;
     * the runner stays enabled and the forward does not run again. With a process group it is a
     * capture failure like any other: every rank disabled together (below). */
    return gf_error_set(err, status, "%s", capture_err.message);
  }
  if (status != GF_OK) {
    char reason[GF_REASON_CAPACITY];
    snprintf(reason, sizeof reason, "capture failed: %.480s", capture_err.message);
    gf_runner_disable(runner, reason);
    gf_runner_warn_disabled(runner, reason);
    return gf_runner_run_eager(runner, inputs, count, options, results, err);
  }
  runner->captures++;
  gf_runner_report_capture(runner, entry, started, device_bytes_before);
  return gf_runner_replay(runner, entry, inputs, count, options, results, err);
}

gf_status gf_runner_call(gf_runner *runner, const void *key, size_t key_length,
                         const gf_tensor *inputs, size_t input_count, const gf_tensor *keep_alive,
                         size_t keep_alive_count, const gf_call_options *options, gf_pool *results,
                         gf_error *err) {
  static const gf_call_options defaults = {0, 0, NULL};
  if (options == NULL) {
    options = &defaults;
  }
  const size_t results_before = results->count;
  if (!runner->enabled) {
    return gf_runner_run_eager(runner, inputs, input_count, options, results, err);
  }
  if (runner->backend->outer_capture_active != NULL &&
      runner->backend->outer_capture_active(runner->backend->context, runner->backend_state)) {
    return gf_runner_run_eager(runner, inputs, input_count, options, results, err);
  }
  /* The signature first: it rejects an ndim outside [0, GF_MAX_DIMS] before the contiguity
   * check reads sizes[ndim - 1]. */
  gf_status status = gf_signature_build(&runner->scratch_signature, key, key_length, inputs,
                                        input_count, runner->cache.hash_fn, err);
  if (status != GF_OK) {
    return status;
  }
  for (size_t i = 0; i < input_count; ++i) {
    /* A graph reads its inputs from the runner's device: an input elsewhere would be copied by a
     * device kernel from an address it cannot read, or baked in as a capture-time value. */
    const int other_type = inputs[i].device_type != runner->config.device_type;
    const int other_index =
        runner->config.device_index >= 0 && inputs[i].device_index != runner->config.device_index;
    if (other_type || other_index) {
      gf_error_set(err, GF_ERR_INVALID_ARGUMENT,
                   "graphed: input tensor %zu is not on the runner's device (device %d:%d, the "
                   "runner's %d:%d); move it to the runner's device",
                   i, (int)inputs[i].device_type, (int)inputs[i].device_index,
                   runner->config.device_type, runner->config.device_index);
      if (err != NULL) {
        err->input_number = i + 1;
      }
      return GF_ERR_INVALID_ARGUMENT;
    }
    if (!gf_tensor_is_contiguous(&inputs[i])) {
      return gf_error_set(err, GF_ERR_INVALID_ARGUMENT,
                          "graphed: input tensor %zu reached the core non-contiguous; the caller "
                          "must pass contiguous views",
                          i);
    }
  }
  gf_entry *entry = gf_cache_lookup(&runner->cache, &runner->scratch_signature);
  if (entry == NULL) {
    status = gf_runner_capture_and_replay(runner, inputs, input_count, keep_alive, keep_alive_count,
                                          options, results, err);
  } else {
    status = gf_runner_replay(runner, entry, inputs, input_count, options, results, err);
  }
  if (status != GF_OK && status != GF_ERR_FORWARD && runner->enabled) {
    /* Only the replay side (and an entry that could not be made) gets here: a failed capture
     * disabled the runner already. */
    char reason[GF_REASON_CAPACITY];
    snprintf(reason, sizeof reason, "%s: %.460s",
             status == GF_ERR_NO_MEMORY ? "out of host memory for a replay" : "replay failed",
             err->message);
    gf_runner_disable(runner, reason);
    gf_runner_warn_disabled(runner, reason);
    gf_pool_truncate(results, results_before, gf_runner_release_handle, runner);
    return gf_runner_run_eager(runner, inputs, input_count, options, results, err);
  }
  return status;
}

void gf_runner_visit_entries(const gf_runner *runner, gf_entry_visit_fn visit, void *context) {
  for (const gf_entry *entry = runner->cache.newest; entry != NULL; entry = entry->lru_older) {
    gf_entry_info info = {0};
    info.key = gf_signature_key(&entry->signature, &info.key_length);
    info.inputs = entry->static_inputs.tensors;
    info.input_count = entry->static_inputs.count;
    info.replays = entry->replays;
    info.static_bytes = entry->static_inputs.bytes + entry->static_outputs.bytes;
    info.device_bytes = entry->device_bytes;
    info.pinned = entry->pinned;
    info.folded = entry->folded;
    info.mutated_count = entry->mutated_count;
    visit(context, &info);
  }
}

int64_t gf_runner_entry_replays(gf_runner *runner, const void *key, size_t key_length,
                                const gf_tensor *inputs, size_t input_count) {
  gf_signature probe = {0};
  int64_t replays = -1;
  if (gf_signature_build(&probe, key, key_length, inputs, input_count, runner->cache.hash_fn,
                         NULL) == GF_OK) {
    gf_entry *entry = gf_cache_find(&runner->cache, &probe);
    replays = entry != NULL ? (int64_t)entry->replays : -1;
  }
  gf_signature_free(&probe);
  return replays;
}
