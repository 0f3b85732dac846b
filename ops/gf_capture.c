/* The capture protocol of a runner (see gf_runner_internal.h): what the first call of a
 * signature does, in this order (the functions of each step in brackets; the file defines helpers
 * first, so gf_runner_capture_and_replay, which drives the whole, comes last).
 *   1. Room: LRU eviction, or growth past max_entries when every entry is pinned; a new entry
 *      (gf_runner_capture_and_replay).
 *   2. Static copies: each live input cloned, the keep-alive tensors retained
 *      (gf_runner_take_static_inputs); after the warm-ups, a clone that another entry holds a
 *      buffer of the same dtype and shape for becomes that buffer (gf_runner_share_static_inputs).
 *   3. Warm-ups on a side stream, the first of a runner's first capture under the sync probe; with
 *      a process group the ranks agree before them and after each (gf_runner_prepare_capture,
 *      gf_runner_prepare_forward, gf_runner_agree_on_stage).
 *   4. The capture: the input copy node, the forward, the inputs it wrote in place, the output
 *      copy node (gf_runner_capture, gf_runner_capture_copy_node, gf_runner_keep_mutated).
 *   5. Agreement on the capture, then insertion; any failure releases the entry and disables the
 *      runner, and the call runs eager (gf_runner_capture_and_replay; the release and the disable
 *      are gf_runner_release.c's gf_runner_release_entry and gf_runner_fail).
 *   6. The capture event (time, device memory in use and held), then this call's outputs: copies
 *      of its last warm-up's, made before the capture where nothing tells them from a replay's
 *      (Note [The first call from its last warm-up]; gf_runner_copy_warm_up_outputs,
 *      gf_runner_hand_over), else a replay (gf_runner_report_capture, gf_runner_replay in
 *      gf_replay.c).
 * Nothing here calls into gf_runner.c, which calls this file. */
#include "gf_runner_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double gf_seconds_now(void) {
  struct timespec now;
  if (timespec_get(&now, TIME_UTC) == 0) {
    return 0.0;
  }
  return (double)now.tv_sec + (double)now.tv_nsec * 1e-9;
}

/* What the device's memory stands at: in use (handed out) and held by the allocator. */
typedef struct gf_device_memory {
  int64_t in_use;
  int64_t reserved;
} gf_device_memory;

static gf_device_memory gf_runner_device_memory(const gf_runner *runner) {
  const gf_backend *backend = runner->backend;
  gf_device_memory now = {-1, -1};
  if (backend->device_bytes_in_use != NULL) {
    now.in_use = backend->device_bytes_in_use(backend->context, runner->backend_state);
  }
  if (backend->device_bytes_reserved != NULL) {
    now.reserved = backend->device_bytes_reserved(backend->context, runner->backend_state);
  }
  return now;
}

static int64_t gf_bytes_growth(int64_t before, int64_t after) {
  return before >= 0 && after >= 0 ? after - before : -1;
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
  char message[GF_ERROR_MESSAGE_CAPACITY + 320];
  snprintf(message, sizeof message,
           "graphed: out of device memory while capturing a new key; the call ran eager, the "
           "graphs already captured keep replaying, and the key runs eager for its next %llu "
           "calls of the runner, or until memory is freed (an eviction, reset()). Said once: %s",
           (unsigned long long)held, why);
  gf_runner_warn(runner, message);
}

enum {
  /* captures past this many times max_entries, with evictions, are told as churn where the churn
   * guard does not hold new keys back (churn_limit 0, or a runner with a process group) */
  GF_THRASH_FACTOR = 4
};

/* Tells the host, once, that captures keep evicting where the churn guard (gf_churn.h) is off:
 * keys that change on every call, or a cache too small for the shapes in use. */
static void gf_runner_report_thrash(gf_runner *runner) {
  const int guarded = runner->churn.limit > 0 && runner->host.agree == NULL;
  if (guarded || runner->thrash_said || runner->cache.evictions == 0 ||
      runner->captures <= GF_THRASH_FACTOR * runner->cache.max_entries) {
    return;
  }
  runner->thrash_said = 1;
  char message[256];
  snprintf(message, sizeof message,
           "%llu captures and %llu evictions with max_entries=%zu: calls keep making new keys "
           "(a value or shape that changes per call) or the cache is too small for the shapes in "
           "use",
           (unsigned long long)runner->captures, (unsigned long long)runner->cache.evictions,
           runner->cache.max_entries);
  gf_runner_tell_churn(runner, message);
}

/* Note [The first call from its last warm-up]
 * Q: The first call of a key runs its warm-ups, the capture and then a replay of the new graph.
 *    Why not give it what its last warm-up computed?
 * A: Where nothing can tell the two apart, it does: the call gets copies of the last warm-up's
 *    outputs and the replay is not run, which saves its device time on every new key (on an H200,
 *    2.8 ms of the 54 ms first call of the big benchmark DiT). The copies are made right after
 *    that warm-up, on the caller's stream and in the caller's memory (the backend's
 *    caller_stream_begin/end), so that the warm-up's outputs go back to the pool the capture then
 *    allocates from, as before. They stand for a replay only where a replay would compute the
 *    same and leave the same behind:
 *    - no input was written in place, by a warm-up or by the capture's forward: a replay copies
 *      the caller's values in again and writes the new ones back into the caller's tensors;
 *    - the host says the warm-up changed no other state (gf_host.last_forward_kept_state): a state
 *      tensor it wrote was put back after it, and a replay would write it again, as eager does;
 *    - the caller wants fresh outputs: static_outputs hands out the graph's own buffers, which
 *      only a replay fills;
 *    - there is no process group: the ranks' hosts may answer differently, and a rank that
 *      replays a graph holding a collective would wait for one that does not;
 *    - the capture's forward returned as many outputs, of the same dtypes and shapes.
 *    Otherwise, or where the backend has no such hooks, the call replays. Such a call counts a
 *    capture and no replay, its copies are left out of the capture's device memory, and verify
 *    mode compares the graph's first replay instead (gf_served_entry.from_warm_up). The copies
 *    live through the capture, one set of outputs in torch's ordinary pool that a replay would
 *    allocate after it; and the graph's first launch moves to the key's second call. */
typedef struct gf_warm_up_answer {
  int wanted;                  /* the call may be answered so (set before the warm-ups) */
  int inputs_written;          /* a forward before the capture wrote an input in place */
  int copied;                  /* the copies were made: `outputs` holds them all */
  gf_pool outputs;             /* the copies, owned */
  gf_device_memory copies_use; /* what making them added to the device memory in use and held */
} gf_warm_up_answer;

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

/* Copies, for its call, the outputs of the warm-up that just ran (Note [The first call from its
 * last warm-up]) where no forward before the capture wrote an input in place and its host says it
 * changed no other state; else leaves answer->outputs empty, as it does when the copies cannot be
 * made (the call then replays). Fails only where the side stream could not be made to wait for
 * the copies: the warm-up's outputs, which they read, are freed there next. */
static gf_status gf_runner_copy_warm_up_outputs(gf_runner *runner, const gf_pool *outputs,
                                                gf_warm_up_answer *answer, gf_error *err) {
  if (answer->inputs_written || !runner->host.last_forward_kept_state(runner->host.context)) {
    return GF_OK;
  }
  const gf_backend *backend = runner->backend;
  gf_error declined = {0}; /* a copy that cannot be made only means a replay */
  if (backend->caller_stream_begin(backend->context, runner->backend_state, &declined) != GF_OK) {
    return GF_OK;
  }
  const gf_device_memory before = gf_runner_device_memory(runner);
  gf_status status = gf_runner_reserve_copies(runner, outputs->count, &declined);
  for (size_t i = 0; status == GF_OK && i < outputs->count; ++i) {
    const gf_tensor *computed = &outputs->tensors[i];
    gf_tensor copy = {0};
    status = runner->host.empty_like(runner->host.context, computed, &copy, &declined);
    runner->scratch_copies[i] =
        (gf_copy){copy.data, computed->data, (size_t)gf_tensor_nbytes(computed)};
    status = gf_runner_adopt(runner, &answer->outputs, status, &copy, &declined);
  }
  if (status == GF_OK) {
    status = gf_runner_copy_nonempty(runner, runner->scratch_copies, outputs->count, &declined);
  }
  const gf_device_memory after = gf_runner_device_memory(runner);
  answer->copies_use.in_use = gf_bytes_growth(before.in_use, after.in_use);
  answer->copies_use.reserved = gf_bytes_growth(before.reserved, after.reserved);
  answer->copied = status == GF_OK;
  if (status != GF_OK) {
    gf_runner_discard_outputs(runner, &answer->outputs);
  }
  return backend->caller_stream_end(backend->context, runner->backend_state, err);
}

/* One eager forward before a capture: the sync probe when `probing`, else a warm-up. The probe's
 * backend records a synchronizing operator rather than failing on it, so the forward always runs
 * to its end and every rank's collectives stay aligned; the failure counts once it returns. When
 * `answer` is not NULL (the call may be answered from a warm-up) the inputs each forward writes in
 * place are noted, and the outputs of the `last` forward before the capture may answer the call
 * (gf_runner_copy_warm_up_outputs). */
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
  gf_status status =
      runner->host.run_forward(runner->host.context, probing ? GF_PHASE_PROBE : GF_PHASE_WARMUP,
                               entry->static_inputs.tensors, input_count, &scratch, mutated, err);
  if (status == GF_OK) {
    /* One aliasing warm-up is enough: a later one that aliases nothing does not undo it. */
    if (gf_pool_overlaps(&scratch, &entry->static_inputs)) {
      entry->inputs_shareable = GF_INPUTS_ALIASED;
    } else if (entry->inputs_shareable == GF_INPUTS_UNKNOWN) {
      entry->inputs_shareable = GF_INPUTS_SHAREABLE;
    }
  }
  if (answer != NULL) {
    for (size_t i = 0; i < input_count; ++i) {
      answer->inputs_written |= mutated == NULL || mutated[i]; /* unknown counts as written */
    }
  }
  if (status == GF_OK && answer != NULL && last) {
    status = gf_runner_copy_warm_up_outputs(runner, &scratch, answer, err);
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
 * each, and all stop at the first failure of any. `status` is the capture's so far. */
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
    status = gf_runner_prepare_forward(runner, entry, probing, answer->wanted ? answer : NULL,
                                       i == iterations - 1, err);
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

/* The capture protocol for the first call of a signature, up to but not including agreement. */
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

/* Whether the call may be answered from its last warm-up at all (Note [The first call from its
 * last warm-up]): asked before the warm-ups, so that none is kept for a call that replays. */
static int gf_runner_may_answer_from_warm_up(const gf_runner *runner,
                                             const gf_call_options *options) {
  const gf_backend *backend = runner->backend;
  return !options->static_outputs && runner->host.agree == NULL &&
         runner->host.last_forward_kept_state != NULL && backend->caller_stream_begin != NULL;
}

/* Whether the copies of the last warm-up's outputs stand for this entry's replay: they were made
 * (or the forward returns no tensor), the capture's forward wrote no input in place either, and it
 * returned tensors of the same number, dtypes, devices and shapes. */
static int gf_runner_warm_up_answers(const gf_entry *entry, const gf_warm_up_answer *answer) {
  const gf_pool *captured = &entry->static_outputs;
  if (!answer->copied || entry->mutated_count > 0 || answer->outputs.count != captured->count) {
    return 0;
  }
  for (size_t i = 0; i < captured->count; ++i) {
    if (!gf_tensor_same_shape(&answer->outputs.tensors[i], &captured->tensors[i])) {
      return 0;
    }
  }
  return 1;
}

/* Gives the call the copies of its last warm-up's outputs, in place of a replay of `entry`. */
static gf_status gf_runner_hand_over(gf_runner *runner, gf_entry *entry, gf_warm_up_answer *answer,
                                     size_t input_count, const gf_call_options *options,
                                     gf_pool *results, gf_error *err) {
  gf_status status = GF_OK;
  size_t moved = 0;
  for (; status == GF_OK && moved < answer->outputs.count; ++moved) {
    status = gf_pool_add(results, &answer->outputs.tensors[moved], err);
  }
  if (status != GF_OK) {
    moved--; /* the one that failed stays the answer's, to be released with the rest */
  }
  for (size_t i = moved; i < answer->outputs.count; ++i) {
    runner->host.release(runner->host.context, answer->outputs.tensors[i].handle);
  }
  answer->outputs.count = 0; /* the handles moved are the results' now */
  gf_pool_free(&answer->outputs, NULL, NULL);
  if (status != GF_OK) {
    return status; /* gf_runner_call releases the outputs this call appended */
  }
  if (options->mutated_inputs != NULL) {
    memset(options->mutated_inputs, 0, input_count);
  }
  if (options->served != NULL) {
    options->served->user = &entry->user;
    options->served->from_warm_up = 1;
  }
  return GF_OK;
}

gf_status gf_runner_capture_and_replay(gf_runner *runner, const gf_tensor *inputs, size_t count,
                                       const gf_tensor *keep_alive, size_t keep_alive_count,
                                       const gf_call_options *options, gf_pool *results,
                                       gf_error *err) {
  const double started = gf_seconds_now();
  const gf_device_memory memory_before = gf_runner_device_memory(runner);
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
  const uint64_t key_hash = entry->signature.hash;
  gf_error capture_err = {0};
  gf_warm_up_answer answer = {.wanted = gf_runner_may_answer_from_warm_up(runner, options)};
  gf_status status = gf_runner_capture(runner, entry, inputs, count, keep_alive, keep_alive_count,
                                       &answer, &capture_err);
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
  const int answered = status == GF_OK && gf_runner_warm_up_answers(entry, &answer);
  if (!answered) {
    gf_runner_discard_outputs(runner, &answer.outputs);
    answer.copies_use = (gf_device_memory){0, 0}; /* the capture's figures keep nothing out */
  }
  if (status == GF_ERR_DEVICE_MEMORY && runner->host.agree == NULL) {
    /* Note [Out of device memory while capturing]
     * Q: The device ran out of memory during the probe, a warm-up or the capture of a new key (the
     *    forward's allocations, the static buffers, the graph): what does the caller get?
     * A: What eager gives: the attempt's entry is released above (its static buffers and graph;
     *    the backend's capture end gave back what the graph pool had taken), and the call runs
     *    eager, which raises eager's own error if eager runs out too. The runner stays enabled,
     *    its graphs keep replaying, and the key is held back (gf_backoff.h) so that the next
     *    calls do not pay for the same failure; the first such failure is warned of, with torch's
     *    figures. With a process group it is a capture failure like any other (below), so that
     *    the ranks stay together. */
    gf_runner_hold_back(runner, key_hash, capture_err.message);
    return gf_runner_run_eager(runner, inputs, count, options, results, err);
  }
  if (status == GF_ERR_FORWARD && runner->host.agree == NULL) {
    /* Note [The forward's own error]
     * Q: The forward raised during the probe, a warm-up or the capture (a Python ValueError, a
     *    KeyboardInterrupt, an out-of-memory): is that a failed capture?
     * A: The host only reports the fact (GF_ERR_FORWARD: CallState.record_error(own=True) marked
     *    the runner's call, shim/gf_shim_host.cpp); the rule is here, once. Without agreement the
     *    caller gets the error once, as from an eager call; the runner stays enabled and the
     *    forward does not run again. With a process group it is a capture failure like any
     *    other: every rank disables together (below), and the eager run after it runs the forward
     *    again on every rank, so that its collectives pair with the peers'. */
    return gf_error_set(err, status, "%s", capture_err.message);
  }
  if (status != GF_OK) {
    char reason[GF_REASON_CAPACITY];
    snprintf(reason, sizeof reason, "capture failed: %.480s", capture_err.message);
    gf_runner_fail(runner, reason);
    return gf_runner_run_eager(runner, inputs, count, options, results, err);
  }
  runner->captures++;
  gf_runner_report_capture(runner, entry, started, memory_before, answer.copies_use);
  if (answered) {
    return gf_runner_hand_over(runner, entry, &answer, count, options, results, err);
  }
  return gf_runner_replay(runner, entry, inputs, count, options, results, err);
}
