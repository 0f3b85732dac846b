/* The runner (see gf_runner.h): its lifecycle (create, with the checks of the host and backend
 * tables; destroy; the disable is gf_runner_release.c's, as a failed capture disables too), the
 * call that picks the replay path (gf_replay.c) for a hit or the capture protocol (gf_capture.c)
 * for a miss, and what stats and listings read. */
#include "gf_runner_internal.h"

#include "gf_backend_registry.h"

#include <stdio.h>
#include <stdlib.h>

/* The hooks every host must fill. */
static int gf_host_is_complete(const gf_host *host) {
  return host != NULL && host->run_forward != NULL && host->release != NULL &&
         host->clone_static != NULL && host->empty_like != NULL && host->retain != NULL;
}

/* A backend that says it can capture must fill every device hook the protocol has no default for
 * (gf_backend.h), and fold copies with both folding hooks or neither; NULL when it does, else the
 * missing hook's name. A backend that refuses in graphs_supported needs no device hook. */
static const char *gf_backend_missing_device_hook(const gf_backend *backend) {
  const struct {
    const void *hook;
    const char *name;
  } required[] = {
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
  if ((backend->caller_stream_begin == NULL) != (backend->caller_stream_end == NULL)) {
    return "caller_stream_begin and caller_stream_end (both or neither)";
  }
  return NULL;
}

/* The default of the optional begin/end hooks, as c10's DeviceGuardImplInterface gives its
 * optional methods one: nothing to switch, start or join. */
static gf_status gf_backend_nothing_to_do(void *context, void *state, gf_error *err) {
  (void)context;
  (void)state;
  (void)err;
  return GF_OK;
}

/* The runner's own copy of its backend's table, every optional begin/end hook left NULL filled
 * with the default, so that the protocol calls each hook without asking; NULL when out of memory.
 * The other optional hooks keep NULL, which means something there (gf_backend.h). */
static gf_backend *gf_backend_with_defaults(const gf_backend *backend) {
  gf_backend *table = malloc(sizeof *table);
  if (table == NULL) {
    return NULL;
  }
  *table = *backend;
  gf_status (**optional[])(void *, void *, gf_error *) = {
      &table->sync_probe_begin, &table->sync_probe_end, &table->warmup_begin,
      &table->warmup_end,       &table->capture_begin,
  };
  for (size_t i = 0; i < sizeof optional / sizeof optional[0]; ++i) {
    if (*optional[i] == NULL) {
      *optional[i] = gf_backend_nothing_to_do;
    }
  }
  return table;
}

/* Whether a runner on this backend can capture at all; else it starts disabled with why. Only a
 * backend table that says yes but lacks a hook is an error. */
static gf_status gf_runner_check_support(gf_runner *runner, gf_error *err) {
  char why[GF_REASON_CAPACITY] = "";
  const gf_backend *backend = runner->backend;
  if (!runner->config.enabled) {
    gf_runner_set_disabled(runner, GF_CAUSE_USER, "disabled by the caller (enabled=False)");
    return GF_OK;
  }
  if (!backend->graphs_supported(backend->context, runner->config.device_type,
                                 runner->config.device_index, why, sizeof why)) {
    char reason[GF_REASON_CAPACITY + 64];
    snprintf(reason, sizeof reason, "graphs unavailable (backend %s): %s", backend->name,
             why[0] ? why : "no reason given");
    gf_runner_set_disabled(runner, GF_CAUSE_UNAVAILABLE, reason);
    return GF_OK;
  }
  const char *missing = gf_backend_missing_device_hook(backend);
  if (missing != NULL) {
    return gf_error_set(err, GF_ERR_INVALID_ARGUMENT, "graphed: backend '%s' lacks the hook %s",
                        backend->name, missing);
  }
  if (backend->runner_create != NULL) {
    gf_error create_err = {0};
    if (backend->runner_create(backend->context, runner->config.device_index, runner->config.pool,
                               &runner->backend_state, &create_err) != GF_OK) {
      gf_runner_set_disabled(runner, GF_CAUSE_BACKEND, create_err.message);
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
  gf_backend *table = NULL;
  gf_status status = GF_OK;
  if (!gf_host_is_complete(host)) {
    status = gf_error_set(err, GF_ERR_INVALID_ARGUMENT, "graphed: the runner's host is incomplete");
  } else if (backend->name == NULL || backend->graphs_supported == NULL) {
    status = gf_error_set(err, GF_ERR_INVALID_ARGUMENT,
                          "graphed: a backend table needs a name and graphs_supported");
  } else if (config->warmup_iters < 0) {
    status = gf_error_set(err, GF_ERR_INVALID_ARGUMENT,
                          "graphed: warmup_iters must be 0 or more, got %d", config->warmup_iters);
  } else if (config->pool != NULL && backend->pool_create == NULL) {
    status = gf_error_set(
        err, GF_ERR_INVALID_ARGUMENT,
        "graphed: backend '%s' makes no memory pools, but the runner was given one", backend->name);
  } else if ((table = gf_backend_with_defaults(backend)) == NULL ||
             (runner = calloc(1, sizeof *runner)) == NULL) {
    free(table);
    status = gf_error_set(err, GF_ERR_NO_MEMORY, "graphed: out of memory creating a runner");
  } else {
    runner->config = *config;
    runner->churn.limit = config->churn_limit;
    runner->host = *host;
    runner->backend = table; /* the runner's copy, freed with it */
    runner->enabled = 1;
    runner->captures_at_drop = UINT64_MAX; /* a watch's first drop is counted */
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
  free((void *)runner->backend); /* the copy gf_runner_create made */
  free(runner);
}

/* Every graph and pool dropped; the runner stays enabled (the next call captures again, with the
 * sync probe again). */
static void gf_runner_clear_graphs(gf_runner *runner) {
  gf_cache_clear(&runner->cache);
  runner->sync_probe_done = 0;
  gf_backoff_clear(&runner->backoff); /* the memory it waited for is free now */
  gf_churn_graphs_dropped(&runner->churn);
}

/* One more drop a watch made (Note [Recaptures in a row]): counted where a capture came since the
 * last; 1 when that makes GF_STALE_LIMIT in a row with no replay between. */
static int gf_runner_count_watch_drop(gf_runner *runner) {
  if (runner->captures != runner->captures_at_drop) {
    runner->stale_in_a_row++;
  }
  runner->captures_at_drop = runner->captures;
  return runner->stale_in_a_row >= GF_STALE_LIMIT;
}

int gf_runner_drop_graphs(gf_runner *runner) {
  if (gf_runner_count_watch_drop(runner)) {
    return 1;
  }
  gf_runner_clear_graphs(runner);
  return 0;
}

int gf_runner_select_state(gf_runner *runner, uint64_t state, int first_time) {
  if (first_time && gf_runner_count_watch_drop(runner)) {
    return 1;
  }
  runner->state = state;
  if (first_time) {
    runner->sync_probe_done = 0; /* a new state may run other code: probed as a new runner is */
  }
  gf_churn_graphs_dropped(&runner->churn); /* a key met again in another state is no traffic */
  return 0;
}

void gf_runner_reset(gf_runner *runner) {
  gf_runner_clear_graphs(runner);
  gf_churn_restart(&runner->churn);
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
  stats->churn_eager_calls = runner->churn.eager_calls;
  stats->churn_guarding = runner->churn.guarding;
  stats->hits = runner->hits;
  stats->stale_drops = runner->stale_drops;
  const gf_backend *backend = runner->backend;
  stats->pool_reserved_bytes =
      backend->pool_bytes_reserved != NULL
          ? backend->pool_bytes_reserved(backend->context, runner->backend_state)
          : -1;
  /* Each buffer counted once for every holder but the newest: what sharing saved. A walk over the
   * entries, as stats is read rarely and keeps nothing on the call path. */
  stats->shared_input_bytes = 0;
  for (const gf_entry *entry = runner->cache.newest; entry != NULL; entry = entry->lru_older) {
    stats->externals += entry->externals;
    stats->staged_constants += entry->staged;
    for (size_t i = 0; i < entry->static_inputs.count; ++i) {
      if (gf_entry_input_holder(entry, i, entry->lru_newer, 1) != NULL) {
        stats->shared_input_bytes += gf_tensor_nbytes(&entry->static_inputs.tensors[i]);
      }
    }
  }
}

const char *gf_runner_disabled_reason(const gf_runner *runner) {
  return runner->enabled ? "" : runner->disabled_reason;
}

gf_disable_cause gf_runner_disabled_cause(const gf_runner *runner) {
  return runner->enabled ? GF_CAUSE_NONE : runner->disabled_cause;
}

const char *gf_runner_backend_name(const gf_runner *runner) { return runner->backend->name; }

gf_status gf_runner_compare_later(gf_runner *runner, const gf_copy *pairs, size_t count,
                                  uint8_t *verdict, uint32_t *scratch, gf_error *err) {
  const gf_backend *backend = runner->backend;
  /* A backend that makes per-runner state made none: the runner's device has no graphs. */
  const int stateless = backend->runner_create != NULL && runner->backend_state == NULL;
  if (backend->compare_later == NULL || stateless) {
    return gf_error_set(err, GF_ERR_NOT_FOUND, "graphed: the %s backend compares no outputs",
                        backend->name);
  }
  return backend->compare_later(backend->context, runner->backend_state, pairs, count, verdict,
                                scratch, err);
}

/* Whether the scratch signature's new key runs eager instead of capturing: held back since it ran
 * out of device memory (Note [Out of device memory while capturing], gf_capture.c), or by the
 * churn guard, *report saying whether the host is to be told of the guard now (gf_churn_admit).
 * A runner that agrees over a process group always captures, as its ranks must capture at the
 * same calls. */
static int gf_runner_holds_back_new_key(gf_runner *runner, int *report) {
  *report = 0;
  if (runner->host.agree != NULL) {
    return 0;
  }
  const gf_signature *signature = &runner->scratch_signature;
  const uint64_t key_hash = signature->hash;
  if (gf_backoff_holds(&runner->backoff, key_hash, gf_runner_calls(runner),
                       runner->cache.evictions)) {
    return 1;
  }
  return !gf_churn_admit(&runner->churn, key_hash, gf_signature_tensors_hash(signature), report);
}

/* A new key held back (gf_runner_holds_back_new_key) runs eager: by the caller, where it asked to
 * (GF_RUN_EAGER, counted here as the caller's one eager route expects), else here. The report
 * (gf_runner_report_churn), when one is due, comes first: a host that names what changed from call
 * to call says it once it has recorded this call too (graphed._observe). */
static gf_status gf_runner_run_held_back(gf_runner *runner, int report, const gf_tensor *inputs,
                                         size_t input_count, const gf_call_options *options,
                                         gf_pool *results, gf_error *err) {
  if (report) {
    gf_runner_report_churn(runner);
  }
  if (options->eager_by_caller) {
    runner->eager_calls++;
    return GF_RUN_EAGER;
  }
  return gf_runner_run_eager(runner, inputs, input_count, options, results, err);
}

/* Each input is on the runner's device and contiguous. A graph reads its inputs from the runner's
 * device: an input elsewhere would be copied by a device kernel from an address it cannot read,
 * or baked in as a capture-time value. Called once the signature is built, which has rejected an
 * ndim outside [0, GF_MAX_DIMS]: the contiguity check reads sizes[ndim - 1]. */
static gf_status gf_runner_check_inputs(const gf_runner *runner, const gf_tensor *inputs,
                                        size_t input_count, gf_error *err) {
  for (size_t i = 0; i < input_count; ++i) {
    const int other_type = inputs[i].device_type != runner->config.device_type;
    const int other_index =
        runner->config.device_index >= 0 && inputs[i].device_index != runner->config.device_index;
    if (other_type || other_index) {
      gf_error_set(err, GF_ERR_INVALID_ARGUMENT,
                   "graphed: input tensor %zu is not on the runner's device (device %d:%d, the "
                   "runner's %d:%d); move it to the runner's device",
                   i, (int)inputs[i].device_type, (int)inputs[i].device_index,
                   runner->config.device_type, runner->config.device_index);
      err->input_number = i + 1;
      return GF_ERR_INVALID_ARGUMENT;
    }
    if (!gf_tensor_is_contiguous(&inputs[i])) {
      return gf_error_set(err, GF_ERR_INVALID_ARGUMENT,
                          "graphed: input tensor %zu reached the core non-contiguous; the caller "
                          "must pass contiguous views",
                          i);
    }
  }
  return GF_OK;
}

/* Note [A graph's externals]
 * Q: A forward reads a tensor that is neither an input, a keep_alive tensor nor its module's state
 *    (a global, a plain object's attribute), and its graph replays that tensor's address. What
 *    if the program rebinds it and the old tensor is freed?
 * A: The host listed such tensors at the capture (gf_forward_report.inventory; graphed._inventory
 *    in Python) and holds each weakly. Before a replay the core asks the host whether one of them
 *    was freed or moved since; if so the entry is dropped (the host told, GF_EVENT_STALE, with the
 *    tensor named) and the key captured again, so the call reads what eager reads; the churn
 *    guard is not asked (a key seen before is no new traffic). GF_STALE_LIMIT drops in a row with
 *    no replay between, these and a watch's (Note [Recaptures in a row], gf_runner.h), disable the
 *    runner (cause recapture_limit): a tensor rebound at every call would cost a capture at every
 *    call. A tensor rebound while the old one lives on elsewhere cannot be seen this way (the
 *    graph reads the old one); docs/api.md says what to do. */

/* The entry of the call's key, or NULL: none, or one dropped because it would read freed memory
 * (Note [A graph's externals]; *dropped set to 1). */
static gf_entry *gf_runner_lookup_live(gf_runner *runner, int *dropped) {
  gf_entry *entry = gf_cache_lookup(&runner->cache, &runner->scratch_signature);
  const char *which = NULL;
  *dropped = 0;
  if (entry == NULL || entry->inventory == NULL || runner->host.externals_freed == NULL ||
      !runner->host.externals_freed(runner->host.context, entry->inventory, &which)) {
    if (entry != NULL) {
      runner->stale_in_a_row = 0; /* a replay between drops */
    }
    return entry;
  }
  *dropped = 1;
  runner->stale_drops++;
  runner->stale_in_a_row++;
  char named[200]; /* `which` goes with the inventory */
  snprintf(named, sizeof named, "%s", which != NULL ? which : "a tensor");
  char message[GF_REASON_CAPACITY];
  snprintf(message, sizeof message,
           "graphed: a graph was dropped and its key captured again: %s, which its capture read "
           "from outside the kwargs and the module, was freed since",
           named);
  gf_event stale = gf_entry_event(GF_EVENT_STALE, entry);
  stale.message = message;
  stale.count = runner->stale_drops;
  gf_runner_notify(runner, &stale);
  gf_cache_remove(&runner->cache, entry);
  if (runner->stale_in_a_row >= GF_STALE_LIMIT) {
    snprintf(message, sizeof message,
             "tensors the forward reads from outside its kwargs and module were freed before %d "
             "replays in a row (the last: %s), so every call would capture again: pass such "
             "tensors as kwargs or register them as buffers",
             GF_STALE_LIMIT, named);
    gf_runner_fail(runner, GF_CAUSE_RECAPTURE_LIMIT, message);
  }
  return NULL;
}

gf_status gf_runner_call(gf_runner *runner, const void *key, size_t key_length,
                         const gf_tensor *inputs, size_t input_count, const gf_tensor *keep_alive,
                         size_t keep_alive_count, const gf_call_options *options, gf_pool *results,
                         gf_error *err) {
  static const gf_call_options defaults = {0, 0, NULL, NULL, 0};
  if (options == NULL) {
    options = &defaults;
  }
  if (options->served != NULL) {
    options->served->user = NULL; /* until a replay serves the call (gf_replay.c) */
    options->served->from_warm_up = 0;
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
  if (status == GF_OK) {
    status = gf_signature_add_state(&runner->scratch_signature, runner->state, err);
  }
  if (status != GF_OK) {
    return status;
  }
  status = gf_runner_check_inputs(runner, inputs, input_count, err);
  if (status != GF_OK) {
    return status;
  }
  int dropped = 0;
  gf_entry *entry = gf_runner_lookup_live(runner, &dropped);
  if (!runner->enabled) { /* its externals kept being freed (Note [A graph's externals]) */
    return gf_runner_run_eager(runner, inputs, input_count, options, results, err);
  }
  if (entry == NULL) {
    int report = 0;
    if (!dropped && gf_runner_holds_back_new_key(runner, &report)) {
      return gf_runner_run_held_back(runner, report, inputs, input_count, options, results, err);
    }
    status = gf_runner_capture_and_replay(runner, inputs, input_count, keep_alive, keep_alive_count,
                                          options, results, err);
    if (status == GF_ERR_FORWARD) {
      gf_churn_forget(&runner->churn); /* a call that raised is no traffic */
    }
  } else {
    gf_churn_hit(&runner->churn);
    runner->hits++;
    status = gf_runner_replay(runner, entry, inputs, input_count, options, results, err);
  }
  if (status != GF_OK && status != GF_ERR_FORWARD && runner->enabled) {
    /* Only the replay side (and an entry that could not be made) gets here: a failed capture
     * disabled the runner already. */
    char reason[GF_REASON_CAPACITY];
    snprintf(reason, sizeof reason, "%s: %.460s",
             status == GF_ERR_NO_MEMORY ? "out of host memory for a replay" : "replay failed",
             err->message);
    gf_runner_fail(runner, GF_CAUSE_REPLAY_FAILED, reason);
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
    info.reserved_bytes = entry->reserved_bytes;
    info.capture_seconds = entry->capture_seconds;
    info.pinned = entry->pinned;
    info.folded = entry->folded;
    info.mutated_count = entry->mutated_count;
    info.shared_input_bytes = gf_runner_shared_input_bytes(runner, entry);
    info.externals = entry->externals;
    info.staged = entry->staged;
    visit(context, &info);
  }
}

int64_t gf_runner_entry_replays(gf_runner *runner, const void *key, size_t key_length,
                                const gf_tensor *inputs, size_t input_count) {
  gf_signature probe = {0};
  gf_error not_built = {0}; /* why a signature could not be built: then no entry has it */
  int64_t replays = -1;
  if (gf_signature_build(&probe, key, key_length, inputs, input_count, runner->cache.hash_fn,
                         &not_built) == GF_OK &&
      gf_signature_add_state(&probe, runner->state, &not_built) == GF_OK) {
    gf_entry *entry = gf_cache_find(&runner->cache, &probe);
    replays = entry != NULL ? (int64_t)entry->replays : -1;
  }
  gf_signature_free(&probe);
  return replays;
}
