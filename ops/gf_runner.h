/* A runner replays captured graphs for one forward: it owns the signature cache, the static pools
 * and the capture protocol, and keeps the counters users see through stats. Any failure disables
 * it for good (with a reason) and later calls run eager. It is not thread-safe; the shim
 * serialises calls per runner. Every function that takes a gf_error requires one (never NULL):
 * a failure always has somewhere to say why.
 * Non-goals (docs/architecture.md): training (a graph is a forward without autograd, no backward);
 * dynamic shapes within one key (each set of dtypes, devices and shapes is a capture of its own);
 * concurrent replay of one runner (its calls take turns: its entries share static buffers);
 * a runner over two devices (one device, fixed at create; an input elsewhere is refused). */
#ifndef GF_RUNNER_H
#define GF_RUNNER_H

#include "gf_backend.h"
#include "gf_disable_cause.h"
#include "gf_host.h"
#include "gf_pool.h"
#include "gf_signature.h"
#include "gf_status.h"
#include "gf_tensor.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gf_runner_config {
  int device_type;  /* where the forward runs, as in gf_tensor */
  int device_index; /* -1: the current device */
  size_t max_entries;
  int warmup_iters;
  int enabled;        /* 0: every call runs eager, and stats say so */
  gf_hash_fn hash_fn; /* NULL: the default hash; tests force collisions with it */
  /* NULL: the runner's graphs get a memory pool of their own; else a pool the backend's
   * pool_create made on this device (gf_backend.h), read by gf_runner_create only: the backend's
   * runner state takes its own reference to it. */
  void *pool;
  /* The churn guard (gf_churn.h): new keys in a row, with no hit between, after which a new key
   * is captured only when it comes a second time; 0 (a zeroed config): never. Not applied to a
   * runner whose host agrees over a process group: every rank must capture at the same calls. */
  unsigned churn_limit;
} gf_runner_config;

typedef struct gf_runner_stats {
  uint64_t graphs;   /* resident entries */
  uint64_t pinned;   /* resident pinned entries */
  uint64_t captures; /* successful captures */
  uint64_t replays;
  uint64_t evictions;
  uint64_t eager_calls;
  int64_t pool_bytes; /* bytes held by static inputs and outputs of resident entries */
  int enabled;
  int64_t graph_bytes; /* device memory the resident entries' captures took (where known) */
  /* bytes of static inputs one entry shares with another (counted in pool_bytes once): what
   * sharing saved */
  int64_t shared_input_bytes;
  /* device memory the runner's graph pool holds now (the runners of one pool share it; -1 when the
   * backend cannot say) */
  int64_t pool_reserved_bytes;
  uint64_t churn_eager_calls; /* calls of new keys the churn guard ran eager (in eager_calls too) */
  int churn_guarding;         /* the churn guard holds new keys back now */
  uint64_t hits;              /* calls served by a graph an earlier call captured */
  /* graphs dropped before a replay because a tensor their capture read from outside the kwargs
   * and the module was freed since (Note [A graph's externals], gf_runner.c) */
  uint64_t stale_drops;
  uint64_t externals;        /* over the resident entries: tensors read from outside (watched) */
  uint64_t staged_constants; /* over the resident entries: host constants their captures staged */
} gf_runner_stats;

typedef struct gf_runner gf_runner;

/* Which cache entry served a call: `user` is that entry's user slot (gf_entry.user), for a hit or
 * for the entry the call captured (whose slot is NULL until the caller fills it), and NULL when the
 * call ran eager. The slot stays the entry's: the caller may read and fill it until it lets go of
 * the runner (the shim's runner lock); the core releases what it holds through
 * gf_host.release_user when the entry goes. */
typedef struct gf_served_entry {
  void **user;
  /* 1 when the capturing call was answered from its last warm-up, not by a replay (Note [The
   * first call from its last warm-up], ops/gf_warm_up_answer.c): verify mode then compares the
   * graph's first replay instead. */
  int from_warm_up;
} gf_served_entry;

/* Options of one call. */
typedef struct gf_call_options {
  int pin;            /* a new entry is never evicted */
  int static_outputs; /* return the static output buffers instead of fresh clones */
  /* NULL, or input_count bytes the call sets: 1 for each input the forward wrote in place. A
   * replay writes such inputs back into the caller's tensors itself; a caller that passed a
   * temporary copy of a tensor (a contiguous copy of a strided view) copies it back. */
  unsigned char *mutated_inputs;
  /* NULL, or where the call says which entry served it (see gf_served_entry). */
  gf_served_entry *served;
  /* 1: a new key held back (the churn guard's, gf_churn.h, or an out-of-memory back-off's,
   * gf_backoff.h) is not run here but returns GF_RUN_EAGER, counted as an eager call, for the
   * caller to run its forward eagerly without the host's forward (the host is told of a guard that
   * starts on it first). */
  int eager_by_caller;
} gf_call_options;

/* Makes a runner on backend (NULL: the one chosen at load). The runner takes host.context and
 * frees it through host.destroy. On failure *runner is NULL and host.destroy has been called.
 * An incomplete host table, a backend table that lacks a hook it needs (gf_backend.h), or a
 * config.pool for a backend that makes no pools, is GF_ERR_INVALID_ARGUMENT naming what is
 * wrong. */
gf_status gf_runner_create(const gf_runner_config *config, const gf_host *host,
                           const gf_backend *backend, gf_runner **runner, gf_error *err);
void gf_runner_destroy(gf_runner *runner);

/* One call: key identifies everything that is not a tensor. Appends the outputs (owned handles)
 * to results. Inputs the forward writes in place keep eager semantics: the capture finds them
 * (gf_host.run_forward's mutated), and every replay copies their new values back into the
 * caller's tensors, inside the same launch when the copies are folded. Returns non-OK only when the
 * forward itself failed eagerly or the input is bad; capture failures disable the runner and the
 * call still returns the eager result. */
gf_status gf_runner_call(gf_runner *runner, const void *key, size_t key_length,
                         const gf_tensor *inputs, size_t input_count, const gf_tensor *keep_alive,
                         size_t keep_alive_count, const gf_call_options *options, gf_pool *results,
                         gf_error *err);

/* Disables the runner for the rest of its life and drops every graph. The first cause and reason
 * stick. `reason` is for people; `cause` for programs (gf_disable_cause.h). */
void gf_runner_disable(gf_runner *runner, gf_disable_cause cause, const char *reason);

/* Note [Recaptures in a row]
 * Graphs dropped before a single replay, this many times in a row, disable the runner (cause
 * recapture_limit): what a graph read changed at every call, which would cost a capture at every
 * call. One count for both kinds of drop: an entry whose externals were freed (Note [A graph's
 * externals], gf_runner.c: the core disables), and the graphs a host's watch drops, or a state new
 * to them it selects, because what they read changed (gf_runner_drop_graphs,
 * gf_runner_select_state: the host disables, with a reason naming what changed). A watch's drop
 * after no capture since its last costs none and is not counted; a replay of an earlier graph
 * starts the count over. CUDAGraph Trees cap the same case at 128
 * (cudagraph_unexpected_rerecord_limit, conservatively large); graphed's captures run in the
 * caller's call, so it stops sooner: 8 captures each thrown away before a single replay is no
 * adapter rotation (which replays between switches) and no lazy setup (which settles at once). */
enum { GF_STALE_LIMIT = 8 };

/* Which state of what its graphs read besides the call (a module's adapters and values, as the
 * host tells its states apart) the runner's calls are made in from now on; 0, the first, until
 * changed. Entries are keyed by it too (gf_signature_add_state): the graphs of every state stay
 * resident, within max_entries (least recently used first), and a call in a state seen before
 * replays its graph, where dropping them (gf_runner_drop_graphs) would capture again. A state
 * selected for the first time is probed for synchronizations again, as after a drop; either way
 * the churn guard's run of new keys starts over (gf_churn_graphs_dropped). A state selected for
 * the first time counts as a drop (Note [Recaptures in a row]): returns 1, having selected
 * nothing, when it would be the GF_STALE_LIMIT-th in a row (the caller then disables the runner);
 * else 0. */
int gf_runner_select_state(gf_runner *runner, uint64_t state, int first_time);

/* Drops every graph and pool; the runner stays enabled (the next call captures again, with the
 * sync probe again). */
void gf_runner_reset(gf_runner *runner);

/* Drops every graph and pool as gf_runner_reset does, but a churn guard that started stays (the
 * run of new keys starts over, gf_churn_graphs_dropped): what a watch that saw the graphs' state
 * change calls, which is no sign of new traffic. A module that changes at every call meets
 * GF_STALE_LIMIT instead (Note [Recaptures in a row]): returns 1, having dropped nothing, when this
 * drop would be the GF_STALE_LIMIT-th in a row (the caller then disables the runner); else 0. */
int gf_runner_drop_graphs(gf_runner *runner);

void gf_runner_get_stats(const gf_runner *runner, gf_runner_stats *stats);

/* "" while enabled, else why not. */
const char *gf_runner_disabled_reason(const gf_runner *runner);

/* GF_CAUSE_NONE while enabled, else the code of why not (gf_disable_cause.h). */
gf_disable_cause gf_runner_disabled_cause(const gf_runner *runner);

/* The name of the runner's backend. */
const char *gf_runner_backend_name(const gf_runner *runner);

/* Verify mode's comparison of a sampled call, queued on the runner's device without waiting
 * (gf_backend.compare_later, whose arguments these are): GF_ERR_NOT_FOUND, having queued nothing,
 * where the backend cannot (no such hook, or the runner has no device state: no graph yet). */
gf_status gf_runner_compare_later(gf_runner *runner, const gf_copy *pairs, size_t count,
                                  uint8_t *verdict, uint32_t *scratch, gf_error *err);

/* What a resident entry is, for listings. */
typedef struct gf_entry_info {
  const unsigned char *key; /* the caller's key bytes */
  size_t key_length;
  const gf_tensor *inputs; /* its static inputs: dtypes and shapes */
  size_t input_count;
  uint64_t replays;
  int64_t static_bytes;   /* its static inputs and outputs */
  int64_t device_bytes;   /* what its capture took on the device, -1 when unknown */
  int64_t reserved_bytes; /* what its capture added to the device memory held, -1 when unknown */
  double capture_seconds; /* how long its capture took, warm-ups and probe included */
  int pinned;
  int folded;                 /* a replay is one launch */
  size_t mutated_count;       /* inputs it writes back */
  int64_t shared_input_bytes; /* its static inputs that another resident entry holds too */
  size_t externals;           /* tensors its capture read from outside kwargs and module */
  size_t staged;              /* host constants its capture staged */
} gf_entry_info;

typedef void (*gf_entry_visit_fn)(void *context, const gf_entry_info *info);

/* Calls visit for each resident entry, most recently used first. */
void gf_runner_visit_entries(const gf_runner *runner, gf_entry_visit_fn visit, void *context);

/* Replays counted by the entry that this key and these inputs would hit; -1 when absent. */
int64_t gf_runner_entry_replays(gf_runner *runner, const void *key, size_t key_length,
                                const gf_tensor *inputs, size_t input_count);

#ifdef __cplusplus
}
#endif

#endif /* GF_RUNNER_H */
