/* What the runner's files share, and nothing any other folder may include: the runner struct,
 * the small helpers every part calls (inline, so that the replay path costs what it did when it
 * was one file), and the functions one part calls in another. gf_runner.c holds the lifecycle,
 * the call and the introspection; gf_replay.c the replay path; gf_capture.c the capture protocol;
 * gf_warm_up_answer.c the first call answered from its last warm-up (gf_warm_up_answer.h);
 * gf_churn_report.c what the runner tells its host of churn; gf_runner_release.c what the others
 * give back (an entry; every entry, on a failure). Calls between them only go down: gf_runner.c
 * calls gf_capture.c and gf_replay.c, gf_capture.c calls gf_warm_up_answer.c and gf_replay.c, and
 * any of them gf_churn_report.c and gf_runner_release.c, which call none of them; so each can be
 * read without the ones above it. Every function here that takes a gf_error requires one, as in
 * gf_runner.h. */
#ifndef GF_RUNNER_INTERNAL_H
#define GF_RUNNER_INTERNAL_H

#include "gf_backend.h"
#include "gf_backoff.h"
#include "gf_cache.h"
#include "gf_churn.h"
#include "gf_host.h"
#include "gf_pool.h"
#include "gf_runner.h"
#include "gf_status.h"
#include "gf_tensor.h"

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

/* Calls between the runner's files stay direct calls inside the library, as calls inside one file
 * were: hidden symbols need no PLT and are not exported. */
#if defined(__GNUC__)
#define GF_RUNNER_PRIVATE __attribute__((visibility("hidden")))
#else
#define GF_RUNNER_PRIVATE
#endif

enum { GF_REASON_CAPACITY = 512 };

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
  int evicting;           /* entries released now are evictions (told to the host as such) */
  gf_churn churn;         /* the churn guard (gf_churn.h) */
  gf_backoff backoff;     /* keys held back after running out of device memory (gf_backoff.h) */
  int device_memory_said; /* the first such failure is warned of; later ones are not */
  int thrash_said;        /* captures that keep evicting, unguarded, are told once */
  char disabled_reason[GF_REASON_CAPACITY];
  gf_disable_cause disabled_cause; /* beside disabled_reason: the same fact, for programs */
  uint64_t captures;
  uint64_t replays;
  uint64_t hits; /* calls served by a graph captured by an earlier call */
  uint64_t eager_calls;
  uint64_t state;            /* the state calls are keyed in (gf_runner_select_state) */
  uint64_t stale_drops;      /* entries dropped before a replay: an external was freed */
  unsigned stale_in_a_row;   /* such drops and a watch's, no replay between (gf_runner.h) */
  uint64_t captures_at_drop; /* `captures` at a watch's last drop (gf_runner_drop_graphs) */
  int64_t pool_bytes;
  int64_t graph_bytes;
};

/* The runner's calls so far (captured, replayed or eager): the clock of gf_backoff.h. */
static inline uint64_t gf_runner_calls(const gf_runner *runner) {
  return runner->captures + runner->replays + runner->eager_calls;
}

/* The pools' release callback: hands a handle back to the host. */
static inline void gf_runner_release_handle(void *context, void *handle) {
  gf_runner *runner = context;
  runner->host.release(runner->host.context, handle);
}

static inline void gf_runner_notify(const gf_runner *runner, const gf_event *event) {
  if (runner->host.notify != NULL) {
    runner->host.notify(runner->host.context, event);
  }
}

static inline void gf_runner_warn(gf_runner *runner, const char *message) {
  if (runner->host.warn != NULL) {
    runner->host.warn(runner->host.context, message);
  }
}

/* An event about one entry, with its static inputs and bytes. */
static inline gf_event gf_entry_event(gf_event_kind kind, const gf_entry *entry) {
  gf_event event = {.kind = kind, .message = "", .device_bytes = -1, .reserved_bytes = -1};
  event.static_bytes = entry->static_inputs.bytes + entry->static_outputs.bytes;
  event.inputs = entry->static_inputs.tensors;
  event.input_count = entry->static_inputs.count;
  return event;
}

/* What the device's memory stands at: in use (handed out) and held by the allocator. */
typedef struct gf_device_memory {
  int64_t in_use;
  int64_t reserved;
} gf_device_memory;

static inline gf_device_memory gf_runner_device_memory(const gf_runner *runner) {
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

static inline int64_t gf_bytes_growth(int64_t before, int64_t after) {
  return before >= 0 && after >= 0 ? after - before : -1;
}

/* The one rule of static inputs shared between a runner's entries (gf_capture.c's
 * gf_runner_share_static_inputs says why sharing is safe): `other` may hold `entry`'s static input
 * `index` when it is another entry, the inputs of both are shareable, and it has an input at that
 * position. Lending (gf_capture.c), the bytes an entry shares (its release, listings) and the
 * stats all ask it, so that they never disagree about which buffers are shared. */
static inline int gf_entries_may_share_input(const gf_entry *entry, const gf_entry *other,
                                             size_t index) {
  return other != entry && entry->inputs_shareable == GF_INPUTS_SHAREABLE &&
         other->inputs_shareable == GF_INPUTS_SHAREABLE && other->static_inputs.count > index;
}

/* The first entry from `from` on along the LRU list (toward older entries, or toward newer ones
 * when `toward_newer`) that holds `entry`'s static input `index` itself, the same buffer; NULL
 * when none. A walk over the entries: only captures, releases and introspection ask, never a
 * replay. */
static inline const gf_entry *gf_entry_input_holder(const gf_entry *entry, size_t index,
                                                    const gf_entry *from, int toward_newer) {
  for (const gf_entry *other = from; other != NULL;
       other = toward_newer ? other->lru_newer : other->lru_older) {
    if (gf_entries_may_share_input(entry, other, index) &&
        other->static_inputs.tensors[index].data == entry->static_inputs.tensors[index].data) {
      return other;
    }
  }
  return NULL;
}

/* Bytes of the entry's static inputs that another resident entry holds too. */
static inline int64_t gf_runner_shared_input_bytes(const gf_runner *runner, const gf_entry *entry) {
  int64_t shared = 0;
  for (size_t i = 0; i < entry->static_inputs.count; ++i) {
    if (gf_entry_input_holder(entry, i, runner->cache.newest, 0) != NULL) {
      shared += gf_tensor_nbytes(&entry->static_inputs.tensors[i]);
    }
  }
  return shared;
}

/* Adds a handle the host just made to a pool; on failure releases it, so no path leaks it. */
static inline gf_status gf_runner_adopt(gf_runner *runner, gf_pool *pool, gf_status made,
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

/* Releases every handle of a pool of outputs the call does not keep, and the pool. */
static inline void gf_runner_discard_outputs(gf_runner *runner, gf_pool *outputs) {
  gf_pool_free(outputs, gf_runner_release_handle, runner);
}

/* Grows the runner's scratch copy list to hold count copies. */
static inline gf_status gf_runner_reserve_copies(gf_runner *runner, size_t count, gf_error *err) {
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

/* Runs the non-empty copies of a list as one batch (the list is compacted in place). */
static inline gf_status gf_runner_copy_nonempty(gf_runner *runner, gf_copy *copies, size_t count,
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

/* Gives an inventory (gf_forward_report.inventory) back to the host that made it. */
static inline void gf_runner_release_inventory(gf_runner *runner, void *inventory) {
  if (inventory != NULL && runner->host.release_inventory != NULL) {
    runner->host.release_inventory(runner->host.context, inventory);
  }
}

/* Every run of the forward goes through here: the report zeroed before (gf_forward_report: zero
 * means nothing known) and read after, where a host's judgement of a failure becomes its status
 * (Note [The forward's own error], gf_capture.c, says what each means). `report` may be NULL when
 * the caller reads nothing of it. */
static inline gf_status gf_runner_run_forward(gf_runner *runner, gf_forward_phase phase,
                                              const gf_tensor *inputs, size_t count,
                                              gf_pool *outputs, unsigned char *mutated,
                                              gf_forward_report *report, gf_error *err) {
  gf_forward_report unread;
  gf_forward_report *filled = report != NULL ? report : &unread;
  *filled = (gf_forward_report){GF_FORWARD_ERROR_NONE, 0, NULL, 0, 0};
  gf_status status = runner->host.run_forward(runner->host.context, phase, inputs, count, outputs,
                                              mutated, filled, err);
  if (filled->inventory != NULL && (status != GF_OK || filled == &unread)) {
    gf_runner_release_inventory(runner, filled->inventory); /* nothing will watch it */
    filled->inventory = NULL;
  }
  if (status != GF_OK && filled->error == GF_FORWARD_ERROR_OWN) {
    status = err->code = GF_ERR_FORWARD;
  } else if (status != GF_OK && filled->error == GF_FORWARD_ERROR_DEVICE_MEMORY) {
    status = err->code = GF_ERR_DEVICE_MEMORY; /* the host's message, with its figures, stays */
  }
  if (status != GF_OK) {
    filled->kept_state = 0;
  }
  return status;
}

/* An eager run on the caller's own tensors: their in-place writes happen for real, and are
 * reported to a caller that asked (it may have passed temporary copies). */
static inline gf_status gf_runner_run_eager(gf_runner *runner, const gf_tensor *inputs,
                                            size_t count, const gf_call_options *options,
                                            gf_pool *results, gf_error *err) {
  runner->eager_calls++;
  return gf_runner_run_forward(runner, GF_PHASE_EAGER, inputs, count, results,
                               options->mutated_inputs, NULL, err);
}

/* gf_runner_release.c: the cache's release callback (evictions are told to the host); the
 * disabled state and its reason, the first one sticking, without dropping anything (a runner that
 * starts disabled has nothing to drop); and the failure that disables the runner for good and says
 * so once (an event to a host that observes, else a warning). gf_runner_disable (gf_runner.h) is
 * there too. */
GF_RUNNER_PRIVATE void gf_runner_release_entry(void *context, gf_entry *entry);
/* `text` into `out` (of `capacity` bytes, cut to fit): its first line (a forward's message may
 * carry a traceback after it), without the "graphed: " a message of the core or the host starts
 * with, at its start or after a ": ", so that graphed's name is said once, by whoever prints it
 * (gf_runner_release.c). */
GF_RUNNER_PRIVATE void gf_text_said_once(char *out, size_t capacity, const char *text);
GF_RUNNER_PRIVATE void gf_runner_set_disabled(gf_runner *runner, gf_disable_cause cause,
                                              const char *reason);
GF_RUNNER_PRIVATE void gf_runner_fail(gf_runner *runner, gf_disable_cause cause,
                                      const char *reason);

/* gf_churn_report.c: the two churn messages, each told once where it applies: the churn guard
 * holding new keys back (after the call that makes the report ran eager), and captures that keep
 * evicting where the guard is off (after a capture). */
GF_RUNNER_PRIVATE void gf_runner_report_churn(gf_runner *runner);
GF_RUNNER_PRIVATE void gf_runner_report_thrash(gf_runner *runner);

/* gf_replay.c: one replay of a captured entry for this call's inputs. */
GF_RUNNER_PRIVATE gf_status gf_runner_replay(gf_runner *runner, gf_entry *entry,
                                             const gf_tensor *inputs, size_t count,
                                             const gf_call_options *options, gf_pool *results,
                                             gf_error *err);

/* gf_capture.c: the first call of the signature in runner->scratch_signature: capture, then
 * replay; on a capture failure the runner is disabled and the call runs eager. */
GF_RUNNER_PRIVATE gf_status gf_runner_capture_and_replay(gf_runner *runner, const gf_tensor *inputs,
                                                         size_t count, const gf_tensor *keep_alive,
                                                         size_t keep_alive_count,
                                                         const gf_call_options *options,
                                                         gf_pool *results, gf_error *err);

#endif /* GF_RUNNER_INTERNAL_H */
