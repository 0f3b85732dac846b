/* The capture protocol of a runner (see gf_runner_internal.h): what the first call of a
 * signature does, in this order (the functions of each step in brackets; the file defines helpers
 * first, so gf_runner_capture_and_replay, which drives the whole, comes last).
 *   1. Room: LRU eviction, or growth past max_entries when every entry is pinned; a new entry
 *      (gf_runner_make_room, gf_runner_capture_and_replay).
 *   2. Static copies: each live input cloned, the keep-alive tensors retained
 *      (gf_runner_take_static_inputs); after the warm-ups, a clone that another entry holds a
 *      buffer of the same dtype and shape for becomes that buffer (gf_runner_share_static_inputs).
 *   3. Warm-ups on a side stream, the first of a runner's first capture under the sync probe; with
 *      a process group the ranks agree before them and after each (gf_runner_prepare_capture,
 *      gf_runner_prepare_forward, gf_runner_agree_on_stage).
 *   4. The capture: the input copy node, the forward, the inputs it wrote in place, the output
 *      copy node (gf_runner_capture, gf_runner_capture_copy_node, gf_runner_keep_mutated).
 *   5. Agreement on the capture, then insertion; any failure releases the entry and disables the
 *      runner, and the call runs eager, except where the device ran out of memory or the forward
 *      raised (gf_runner_capture_and_replay, gf_runner_capture_failed; the release and the
 *      disable are gf_runner_release.c's gf_runner_release_entry and gf_runner_fail).
 *   6. The capture event (time, device memory in use and held), then this call's outputs: copies
 *      of its last warm-up's, made before the capture where nothing tells them from a replay's,
 *      else a replay (gf_runner_report_capture, gf_runner_replay in gf_replay.c).
 * The copies of step 6 are gf_warm_up_answer.c's (Note [The first call from its last warm-up]):
 * the protocol asks it before the warm-ups (gf_runner_may_answer_from_warm_up), after each
 * forward before the capture (gf_warm_up_answer_note_forward), after the capture
 * (gf_warm_up_answer_settle) and for the hand-over (gf_runner_hand_over); a call it may not
 * answer passes no answer down (NULL). Nothing here calls into gf_runner.c, which calls this
 * file. */
#include "gf_warm_up_answer.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double gf_seconds_now(void) {
  struct timespec now;
  if (timespec_get(&now, TIME_UTC) == 0) {
    return 0.0;
  }
  return (double)now.tv_sec + (double)now.tv_nsec * 1e-9;
}

/* Holds back the key `key_hash` that ran out of device memory (gf_backoff.h) and warns of the
 * first such failure of the runner, with what the device said (`why`). */
static void gf_runner_hold_back(gf_runner *runner, uint64_t key_hash, const char *why) {
  const uint64_t calls = gf_runner_calls(runner);
  const uint64_t held = gf_backoff_hold(&runner->backoff, key_hash, calls, runner->cache.evictions);
  if (runner->device_memory_said) {
    return;
  }
  runner->device_memory_said = 1;
  char said[GF_ERROR_MESSAGE_CAPACITY];
  gf_text_said_once(said, sizeof said, why);
  char message[GF_ERROR_MESSAGE_CAPACITY + 320];
  snprintf(message, sizeof message,
           "graphed: out of device memory while capturing a new key; the call ran eager, the "
           "graphs already captured keep replaying, and the key runs eager for its next %llu "
           "calls of the runner, or until memory is freed (an eviction, reset()). Said once: %s",
           (unsigned long long)held, said);
  gf_runner_warn(runner, message);
}

/* Says what a capture cost; the copies a call is answered with are the call's, not the graph's. */
static void gf_runner_report_capture(gf_runner *runner, gf_entry *entry, double started,
                                     gf_device_memory before, gf_device_memory copies) {
  gf_event captured = gf_entry_event(GF_EVENT_CAPTURED, entry);
  captured.seconds = gf_seconds_now() - started;
  const gf_device_memory after = gf_runner_device_memory(runner);
  captured.device_bytes =
      gf_bytes_growth(before.in_use, after.in_use - (copies.in_use > 0 ? copies.in_use : 0));
  captured.reserved_bytes = gf_bytes_growth(
      before.reserved, after.reserved - (copies.reserved > 0 ? copies.reserved : 0));
  entry->device_bytes = captured.device_bytes;
  entry->reserved_bytes = captured.reserved_bytes;
  entry->capture_seconds = captured.seconds;
  if (entry->device_bytes > 0) {
    runner->graph_bytes += entry->device_bytes;
  }
  gf_runner_notify(runner, &captured);
  gf_runner_report_thrash(runner);
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
 * to its end and every rank's collectives stay aligned; the failure counts once it returns. When
 * `answer` is not NULL (the call may be answered from a warm-up) the inputs each forward writes in
 * place are noted, and the outputs of the `last` forward before the capture may answer the call
 * (gf_warm_up_answer_note_forward). */
static gf_status gf_runner_prepare_forward(gf_runner *runner, gf_entry *entry, int probing,
                                           gf_warm_up_answer *answer, int last, gf_error *err) {
  const gf_backend *backend = runner->backend;
  gf_error probe_err = {0};
  gf_status probe_status = GF_OK;
  if (probing) {
    probe_status = backend->sync_probe_begin(backend->context, runner->backend_state, &probe_err);
  }
  const size_t input_count = entry->static_inputs.count;
  unsigned char *mutated = answer != NULL ? calloc(input_count ? input_count : 1, 1) : NULL;
  gf_pool scratch = {0};
  gf_forward_report report;
  gf_status status = gf_runner_run_forward(runner, probing ? GF_PHASE_PROBE : GF_PHASE_WARMUP,
                                           entry->static_inputs.tensors, input_count, &scratch,
                                           mutated, &report, err);
  if (status == GF_OK) {
    /* One aliasing warm-up is enough: a later one that aliases nothing does not undo it. */
    if (gf_pool_overlaps(&scratch, &entry->static_inputs)) {
      entry->inputs_shareable = GF_INPUTS_ALIASED;
    } else if (entry->inputs_shareable == GF_INPUTS_UNKNOWN) {
      entry->inputs_shareable = GF_INPUTS_SHAREABLE;
    }
  }
  if (answer != NULL) {
    status = gf_warm_up_answer_note_forward(runner, answer, status, mutated, input_count,
                                            last ? &scratch : NULL, report.kept_state, err);
  }
  free(mutated);
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
 * each, and all stop at the first failure of any. `status` is the capture's so far; `answer` is
 * NULL unless the call may be answered from its last warm-up. */
static gf_status gf_runner_prepare_capture(gf_runner *runner, gf_entry *entry, gf_status status,
                                           gf_warm_up_answer *answer, gf_error *err) {
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
    status = gf_runner_prepare_forward(runner, entry, probing, answer, i == iterations - 1, err);
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

/* The static copies: a contiguous clone of each live input, which the graph will read, and a
 * retained handle to each keep-alive tensor (one the forward reads from outside its kwargs), so
 * that it lives as long as the graph. The entry's pools own them from here, also on failure. */
static gf_status gf_runner_take_static_inputs(gf_runner *runner, gf_entry *entry,
                                              const gf_tensor *inputs, size_t count,
                                              const gf_tensor *keep_alive, size_t keep_alive_count,
                                              gf_error *err) {
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
  return status;
}

/* The resident entry whose static input `index` can serve `entry`'s too: one that may share it
 * (gf_entries_may_share_input), holding a buffer of the same dtype, device and shape there. NULL
 * when none. */
static const gf_entry *gf_runner_input_lender(const gf_runner *runner, const gf_entry *entry,
                                              size_t index) {
  const gf_tensor *wanted = &entry->static_inputs.tensors[index];
  for (const gf_entry *lender = runner->cache.newest; lender != NULL; lender = lender->lru_older) {
    if (!gf_entries_may_share_input(entry, lender, index)) {
      continue;
    }
    if (gf_tensor_same_shape(&lender->static_inputs.tensors[index], wanted)) {
      return lender;
    }
  }
  return NULL;
}

/* Static inputs not duplicated: each static input of a new entry that another resident entry of
 * the runner holds a buffer of the same dtype and shape for, at the same position, becomes that
 * buffer (a reference of the entry's own), and the clone the warm-ups ran on is released. Safe
 * because the entries of one runner never replay at once (the shim serialises calls per runner;
 * on the device, replays follow one another on one stream, or wait for the last one) and every
 * replay copies all of its inputs in before its graph reads them: a buffer's values between
 * replays belong to no one. In-place writes are written back within the replay that made them.
 * Entries whose outputs alias their inputs (a forward that returns an input or a view of it) keep
 * their own buffers and lend none, so that static outputs (static_outputs=True) survive other
 * entries' replays as before; that is known only from a warm-up, so an entry captured without one
 * shares nothing. The clone's values go into the shared buffer first, so that the capture reads
 * this call's inputs, as it would have read the clone. */
static gf_status gf_runner_share_static_inputs(gf_runner *runner, gf_entry *entry, gf_error *err) {
  if (entry->inputs_shareable != GF_INPUTS_SHAREABLE) {
    return GF_OK;
  }
  const size_t count = entry->static_inputs.count;
  gf_status status = gf_runner_reserve_copies(runner, count, err);
  gf_tensor *borrowed = status == GF_OK ? calloc(count ? count : 1, sizeof *borrowed) : NULL;
  if (status == GF_OK && borrowed == NULL) {
    status = gf_error_set(err, GF_ERR_NO_MEMORY, "graphed: out of memory sharing static inputs");
  }
  size_t copies = 0;
  for (size_t i = 0; status == GF_OK && i < count; ++i) {
    const gf_entry *lender = gf_runner_input_lender(runner, entry, i);
    if (lender == NULL) {
      continue;
    }
    status = runner->host.retain(runner->host.context, &lender->static_inputs.tensors[i],
                                 &borrowed[i], err);
    if (status == GF_OK) {
      const gf_tensor *clone = &entry->static_inputs.tensors[i];
      runner->scratch_copies[copies++] =
          (gf_copy){borrowed[i].data, clone->data, (size_t)gf_tensor_nbytes(clone)};
    }
  }
  if (status == GF_OK && copies > 0) {
    const gf_backend *backend = runner->backend;
    status = backend->copy_batch(backend->context, runner->backend_state, runner->scratch_copies,
                                 copies, err);
  }
  for (size_t i = 0; borrowed != NULL && i < count; ++i) {
    if (borrowed[i].handle == NULL) {
      continue;
    }
    gf_tensor *slot = &entry->static_inputs.tensors[i];
    gf_tensor *released = status == GF_OK ? slot : &borrowed[i];
    runner->host.release(runner->host.context, released->handle);
    if (status == GF_OK) {
      runner->pool_bytes -= gf_tensor_nbytes(slot); /* the lender's buffer is counted already */
      *slot = borrowed[i];
    }
  }
  free(borrowed);
  return status;
}

/* The capture protocol for the first call of a signature, up to but not including agreement;
 * `answer` is NULL unless the call may be answered from its last warm-up. */
static gf_status gf_runner_capture(gf_runner *runner, gf_entry *entry, const gf_tensor *inputs,
                                   size_t count, const gf_tensor *keep_alive,
                                   size_t keep_alive_count, gf_warm_up_answer *answer,
                                   gf_error *err) {
  gf_status status =
      gf_runner_take_static_inputs(runner, entry, inputs, count, keep_alive, keep_alive_count, err);
  status = gf_runner_prepare_capture(runner, entry, status, answer, err);
  if (status == GF_OK) {
    status = gf_runner_share_static_inputs(runner, entry, err);
  }
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
    gf_forward_report report;
    status = gf_runner_run_forward(runner, GF_PHASE_CAPTURE, entry->static_inputs.tensors,
                                   entry->static_inputs.count, &entry->static_outputs, mutated,
                                   &report, err);
    entry->inventory = report.inventory; /* released with the entry, whatever happens next */
    entry->externals = report.externals;
    entry->staged = report.staged;
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

/* Room for a new entry: the LRU entry evicted (told to the host as an eviction), or, when every
 * entry is pinned, the cache grown past max_entries, which is warned of. */
static void gf_runner_make_room(gf_runner *runner) {
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
}

/* What a call whose capture failed with `status` (why: `capture_err`) gets, its entry released
 * first: eager's answer, its own error, or an eager run after the runner is disabled. */
static gf_status gf_runner_capture_failed(gf_runner *runner, gf_status status, uint64_t key_hash,
                                          const gf_error *capture_err, const gf_tensor *inputs,
                                          size_t count, const gf_call_options *options,
                                          gf_pool *results, gf_error *err) {
  if (status == GF_ERR_DEVICE_MEMORY && runner->host.agree == NULL) {
    /* Note [Out of device memory while capturing]
     * Q: The device ran out of memory during the probe, a warm-up or the capture of a new key (the
     *    forward's allocations, the static buffers, the graph): what does the caller get?
     * A: What eager gives: the attempt's entry is released first (its static buffers and graph;
     *    the backend's capture end gave back what the graph pool had taken), the backend gives
     *    the device what its graph pool keeps cached for no graph (give_back_memory: a pool
     *    holding no graph yet let the warm-ups allocate from it, and those blocks are no use to
     *    an eager run), and the call runs eager, which raises eager's own error if eager runs
     *    out too. A forward that fits eagerly so returns eager's result. The runner stays enabled,
     *    its graphs keep replaying, and the key is held back (gf_backoff.h) so that the next
     *    calls do not pay for the same failure; the first such failure is warned of, with torch's
     *    figures. With a process group it is a capture failure like any other (below), so that
     *    the ranks stay together. */
    gf_runner_hold_back(runner, key_hash, capture_err->message);
    const gf_backend *backend = runner->backend;
    if (backend->give_back_memory != NULL && runner->backend_state != NULL) {
      backend->give_back_memory(backend->context, runner->backend_state);
    }
    return gf_runner_run_eager(runner, inputs, count, options, results, err);
  }
  if (status == GF_ERR_FORWARD && runner->host.agree == NULL) {
    /* Note [The forward's own error]
     * Q: The forward raised during the probe, a warm-up or the capture (a Python ValueError, a
     *    KeyboardInterrupt, an out-of-memory): is that a failed capture?
     * A: The host only reports the fact (gf_forward_report.error, which gf_runner_run_forward
     *    turns into GF_ERR_FORWARD: CallState.record_error marked the run,
     *    pyext/gf_model_hooks.cpp); the rule is here, once. Without agreement the
     *    caller gets the error once, as from an eager call; the runner stays enabled and the
     *    forward does not run again. With a process group it is a capture failure like any
     *    other: every rank disables together (below), and the eager run after it runs the forward
     *    again on every rank, so that its collectives pair with the peers'. */
    return gf_error_set(err, status, "%s", capture_err->message);
  }
  char reason[GF_REASON_CAPACITY];
  snprintf(reason, sizeof reason, "capture failed: %.480s", capture_err->message);
  gf_runner_fail(runner, GF_CAUSE_CAPTURE_FAILED, reason);
  return gf_runner_run_eager(runner, inputs, count, options, results, err);
}

gf_status gf_runner_capture_and_replay(gf_runner *runner, const gf_tensor *inputs, size_t count,
                                       const gf_tensor *keep_alive, size_t keep_alive_count,
                                       const gf_call_options *options, gf_pool *results,
                                       gf_error *err) {
  const double started = gf_seconds_now();
  const gf_device_memory memory_before = gf_runner_device_memory(runner);
  gf_runner_make_room(runner);
  gf_entry *entry = gf_entry_create(&runner->scratch_signature, options->pin, err);
  if (entry == NULL) {
    return err->code;
  }
  const uint64_t key_hash = entry->signature.hash;
  gf_error capture_err = {0};
  gf_warm_up_answer answer = {.wanted = gf_runner_may_answer_from_warm_up(runner, options)};
  gf_status status = gf_runner_capture(runner, entry, inputs, count, keep_alive, keep_alive_count,
                                       answer.wanted ? &answer : NULL, &capture_err);
  gf_runner_agree_on_stage(runner, "its capture", &status, &capture_err);
  if (status == GF_OK) {
    status = gf_cache_insert(&runner->cache, entry, &capture_err);
  }
  if (status != GF_OK) {
    gf_runner_release_entry(runner, entry);
    gf_entry_destroy(entry);
  }
  const int answered = gf_warm_up_answer_settle(runner, status == GF_OK ? entry : NULL, &answer);
  if (status != GF_OK) {
    return gf_runner_capture_failed(runner, status, key_hash, &capture_err, inputs, count, options,
                                    results, err);
  }
  runner->captures++;
  gf_runner_report_capture(runner, entry, started, memory_before, answer.copies_use);
  if (answered) {
    return gf_runner_hand_over(runner, entry, &answer, count, options, results, err);
  }
  return gf_runner_replay(runner, entry, inputs, count, options, results, err);
}
