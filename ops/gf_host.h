/* The host is the framework side of a runner: it owns tensors (clone, allocate, release), runs the
 * forward (and says what each run reports: gf_forward_report), and agrees across the process group.
 * The shim fills it from libtorch; the core tests fill it with plain malloc'd buffers. `context` is
 * per runner. */
#ifndef GF_HOST_H
#define GF_HOST_H

#include "gf_pool.h"
#include "gf_status.h"
#include "gf_tensor.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Why the host is asked to run the forward. The host may tell its forward (capture-aware code
 * takes its capture branch in the probe and warm-ups too, so they run what the capture records). */
typedef enum gf_forward_phase {
  GF_PHASE_EAGER = 0,   /* a call that runs eager: disabled runner, outer capture, fallback */
  GF_PHASE_PROBE = 1,   /* the first warm-up of a runner's first capture, under the sync probe */
  GF_PHASE_WARMUP = 2,  /* a warm-up on the side stream before a capture */
  GF_PHASE_CAPTURE = 3, /* the forward being recorded into a graph */
} gf_forward_phase;

/* What the runner tells its host about, for logs and metrics. */
typedef enum gf_event_kind {
  GF_EVENT_CAPTURED = 0, /* a key was captured: seconds, device_bytes, static_bytes, tensors */
  GF_EVENT_EVICTED = 1,  /* an entry was evicted to make room: static_bytes, tensors */
  GF_EVENT_DISABLED = 2, /* the runner is disabled for good: message */
  GF_EVENT_CHURN = 3,    /* the churn guard started (gf_churn.h), told before the call it started
                          * on runs: count captures so far, message */
  GF_EVENT_THRASH = 4,   /* unguarded, captures keep evicting (said once, after the capture that
                          * showed it): count captures so far, message */
  GF_EVENT_STALE = 5,    /* a graph was dropped before a replay because it would read memory
                          * freed since its capture (Note [A graph's externals], gf_runner.c):
                          * message names it, count stale drops so far, inputs the entry's */
} gf_event_kind;

enum { GF_EVENT_KINDS = 6 };

typedef struct gf_event {
  gf_event_kind kind;
  const char *message;     /* DISABLED, CHURN, THRASH, STALE: a sentence; else "" */
  double seconds;          /* CAPTURED: warm-ups, capture and instantiation, wall clock */
  int64_t device_bytes;    /* CAPTURED: device memory in use after minus before (-1: unknown) */
  int64_t reserved_bytes;  /* CAPTURED: device memory the allocator holds, after minus before */
  int64_t static_bytes;    /* CAPTURED, EVICTED: the entry's static inputs and outputs */
  uint64_t count;          /* CHURN, THRASH: captures so far; STALE: stale drops so far */
  const gf_tensor *inputs; /* CAPTURED, EVICTED, STALE: the entry's static inputs (shapes, dtypes)
                            */
  size_t input_count;
} gf_event;

/* What the forward's failure was, as the host judged it (Note [The forward's own error],
 * gf_capture.c). */
typedef enum gf_forward_error {
  GF_FORWARD_ERROR_NONE = 0,          /* no error, or a failure of the capture itself */
  GF_FORWARD_ERROR_OWN = 1,           /* an error of the forward's own (the caller's to get) */
  GF_FORWARD_ERROR_DEVICE_MEMORY = 2, /* the device ran out of memory while warming up or
                                       * capturing */
} gf_forward_error;

/* What one run of the forward reports besides its outputs: the one record a fact about a run
 * travels in from the host to the core. The core zeroes it before each run (gf_runner_run_forward,
 * gf_runner_internal.h); a host fills what it knows and leaves the rest zero, which always means
 * "nothing known" (a forward that never says it kept state replays). New facts go here as fields.
 */
typedef struct gf_forward_report {
  /* Set when run_forward fails: the core turns OWN into GF_ERR_FORWARD and DEVICE_MEMORY into
   * GF_ERR_DEVICE_MEMORY, whatever status the host returned. */
  gf_forward_error error;
  /* 1 when the host knows that this run changed no state besides its inputs and outputs (it put
   * nothing back after it and found nothing it could not put back). Only then may the first call
   * of a key be answered from its last warm-up (Note [The first call from its last warm-up],
   * gf_warm_up_answer.c). */
  int kept_state;
  /* CAPTURE only: the host's record of what the captured work reads that neither an input, an
   * output nor a keep_alive tensor holds (a tensor read from a global or a plain object, a host
   * constant staged for the capture), or NULL: nothing to watch. A capture that succeeds moves it
   * into its entry (gf_entry.inventory); the core releases it with release_inventory otherwise.
   * Before each replay the core asks externals_freed whether the graph would read memory that was
   * freed since (Note [A graph's externals], gf_runner.c). */
  void *inventory;
  size_t externals; /* with inventory: how many tensors it watches */
  size_t staged;    /* with inventory: how many host constants the capture staged */
} gf_forward_report;

typedef struct gf_host {
  void *context;
  /* A fresh contiguous tensor holding a copy of live (its handle owned by the caller). */
  gf_status (*clone_static)(void *context, const gf_tensor *live, gf_tensor *out, gf_error *err);
  /* A fresh contiguous uninitialised tensor shaped like `like` (its handle owned by the caller). */
  gf_status (*empty_like)(void *context, const gf_tensor *like, gf_tensor *out, gf_error *err);
  /* A new owning handle to the same tensor. */
  gf_status (*retain)(void *context, const gf_tensor *tensor, gf_tensor *out, gf_error *err);
  /* Runs the forward once on inputs, appending its outputs (owned handles) to outputs. When
   * mutated is not NULL it has count bytes, and the host sets mutated[i] to 1 for each input the
   * forward wrote in place (torch: its version counter moved), else 0. `report` (zeroed by the
   * core) receives what the run reports besides its outputs (gf_forward_report). */
  gf_status (*run_forward)(void *context, gf_forward_phase phase, const gf_tensor *inputs,
                           size_t count, gf_pool *outputs, unsigned char *mutated,
                           gf_forward_report *report, gf_error *err);
  /* The MIN of ok over the process group; negative on failure. NULL without a group: the runner
   * then neither agrees nor meets its peers before and after each warm-up. */
  int (*agree)(void *context, int ok);
  void (*release)(void *context, void *handle);
  void (*warn)(void *context, const char *message);
  /* Optional: releases an entry's user data (gf_entry.user, set by the caller through
   * gf_call_options.served) when the entry goes: evicted, dropped by reset or disable, or
   * with the runner. Without it user data is never released. */
  void (*release_user)(void *context, void *user);
  /* Optional, with release_inventory: 1 when the entry's inventory (gf_forward_report.inventory)
   * says the graph would read freed memory, with *which naming it (valid until the inventory is
   * released), else 0. Called before every replay of an entry that has one: it must cost no more
   * than a load or two per tensor the inventory watches. */
  int (*externals_freed)(void *context, void *inventory, const char **which);
  void (*release_inventory)(void *context, void *inventory);
  /* Optional: told of captures, evictions, churn and the disable (see gf_event). */
  void (*notify)(void *context, const gf_event *event);
  /* Called when the runner is destroyed: frees context. May be NULL. */
  void (*destroy)(void *context);
} gf_host;

#ifdef __cplusplus
}
#endif

#endif /* GF_HOST_H */
