/* Test doubles for the core suites, so the runner can be driven without torch or a device: a
 * recording backend (every hook appends an event to a shared log, can be told to fail, and replays
 * "graphs" that are plain lists of recorded host kernels) and a malloc host (float32 host buffers
 * with counted handles, a forward that computes out_j = (2 + j) * in0 + in1 + in2 + ..., a
 * configurable agreement result and recorded warnings). Both check the protocol the runner must
 * follow and count violations, so a test can assert that none happened. The backend's optional
 * folding hooks (copy nodes recorded into the graph, replays as one launch) are off unless a test
 * turns them on with gf_fake_backend_enable_folding. */
#ifndef GF_TEST_FAKES_H
#define GF_TEST_FAKES_H

#include "gf_backend.h"
#include "gf_host.h"
#include "gf_pool.h"
#include "gf_status.h"
#include "gf_tensor.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
  GF_FAKE_DTYPE_FLOAT32 = 6, /* torch's ScalarType::Float */
  GF_FAKE_DEVICE_TYPE = 1,   /* torch's DeviceType::CUDA; only compared, never used */
  GF_FAKE_EVENT_CAPACITY = 48,
  GF_FAKE_MAX_WARNINGS = 16,
  GF_FAKE_MAX_CLONES = 256,
  GF_FAKE_MAX_AGREEMENTS = 16,
  GF_FAKE_MAX_OUTPUTS = 4
};

/* ---- the shared event log ---------------------------------------------------------------- */

typedef struct gf_fake_log {
  char (*events)[GF_FAKE_EVENT_CAPACITY];
  size_t count;
  size_t capacity;
} gf_fake_log;

void gf_fake_log_push(gf_fake_log *log, const char *format, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
void gf_fake_log_clear(gf_fake_log *log);
void gf_fake_log_free(gf_fake_log *log);
/* How many events are exactly `event`. */
size_t gf_fake_log_count(const gf_fake_log *log, const char *event);
/* How many events start with `prefix`. */
size_t gf_fake_log_count_prefix(const gf_fake_log *log, const char *prefix);

/* ---- the recording backend --------------------------------------------------------------- */

typedef enum gf_fake_hook {
  GF_FAKE_HOOK_NONE = 0,
  GF_FAKE_HOOK_RUNNER_CREATE,
  GF_FAKE_HOOK_PROBE_BEGIN,
  GF_FAKE_HOOK_PROBE_END,
  GF_FAKE_HOOK_WARMUP_BEGIN,
  GF_FAKE_HOOK_WARMUP_END,
  GF_FAKE_HOOK_CAPTURE_BEGIN,
  GF_FAKE_HOOK_CAPTURE_END,
  GF_FAKE_HOOK_COPY_BATCH,
  GF_FAKE_HOOK_LAUNCH,
  GF_FAKE_HOOK_RELEASE_GRAPH,
  GF_FAKE_HOOK_CAPTURE_COPY_NODE,
  GF_FAKE_HOOK_LAUNCH_FOLDED,
  GF_FAKE_HOOK_GIVE_BACK_MEMORY,
  GF_FAKE_HOOK_COUNT
} gf_fake_hook;

/* The event name a hook logs ("probe_begin", ...; copy_batch logs "copy_batch(n)",
 * capture_copy_node "capture_copy_node(inputs,n)" or "(outputs,n)", launch_folded
 * "launch_folded(inputs,outputs)" with the two table lengths). */
const char *gf_fake_hook_name(gf_fake_hook hook);

/* A host computation recorded while capturing; launching the graph runs it again on the same
 * buffers, which is what a device graph does. A copy node (is_copy_node) is a recorded copy table
 * instead: launching runs its copies, and launch_folded rewrites the table first. */
typedef struct gf_fake_kernel {
  gf_tensor *inputs;
  size_t input_count;
  gf_tensor *outputs;
  size_t output_count;
  int mutate_input; /* -1, or the input the forward adds 1 to in place after computing */
  int is_copy_node;
  int copy_role;            /* GF_COPY_INPUTS or GF_COPY_OUTPUTS */
  gf_copy *copies;          /* the current table */
  gf_copy *recorded_copies; /* the table as recorded, which rewrites are checked against */
  size_t copy_count;
} gf_fake_kernel;

typedef struct gf_fake_graph gf_fake_graph;

typedef struct gf_fake_backend {
  gf_backend table; /* table.context points back at this struct */
  gf_fake_log *log;
  int supported;            /* graphs_supported answers this (default 1) */
  int outer_capture_active; /* outer_capture_active answers this (default 0) */
  gf_fake_hook fail_hook;   /* the hook that fails, GF_FAKE_HOOK_NONE for none */
  int fail_skip;            /* calls of fail_hook that still succeed before it fails */
  char fail_message[128];
  gf_status fail_code; /* what the failing hook returns (GF_ERR_BACKEND unless set) */
  uint64_t calls[GF_FAKE_HOOK_COUNT];
  size_t copies_total; /* copies across every copy_batch call */
  size_t last_batch_size;
  int capturing;
  int warming_up;
  int probing;
  gf_fake_graph *pending; /* the graph being captured */
  int64_t live_graphs;    /* made by capture_end minus released */
  void *state;            /* the token runner_create handed out, NULL before / after */
  void *runner_pool;      /* the memory pool runner_create was given (gf_runner_config.pool) */
  int64_t live_states;
  uint64_t protocol_errors; /* hooks called out of order or with a foreign state or graph */
  char last_protocol_error[160];
  /* Folding, set up by gf_fake_backend_enable_folding. */
  int fold;               /* the table has capture_copy_node and launch_folded */
  size_t fold_max_copies; /* capture_copy_node refuses (*recorded = 0) a longer table */
  int fold_hide_nodes;    /* graphs captured while set keep their copy nodes (plain launches run
                             them) but launch_folded cannot find them: GF_ERR_NOT_FOUND */
  size_t last_folded_count[2];    /* the last launch_folded's tables, by role: entries, */
  size_t last_folded_nonempty[2]; /* entries of more than zero bytes */
  size_t last_folded_bytes[2];    /* and bytes in all */
} gf_fake_backend;

void gf_fake_backend_init(gf_fake_backend *fake, gf_fake_log *log);
/* Makes `hook` fail (with GF_ERR_BACKEND and message) after `skip` more successful calls. */
void gf_fake_backend_fail(gf_fake_backend *fake, gf_fake_hook hook, int skip, const char *message);
/* Adds capture_copy_node and launch_folded to the table, taking tables of any length. */
void gf_fake_backend_enable_folding(gf_fake_backend *fake);
/* Records a kernel into the graph being captured; 0 when not capturing. */
int gf_fake_backend_record(gf_fake_backend *fake, const gf_tensor *inputs, size_t input_count,
                           const gf_tensor *outputs, size_t output_count, int mutate_input);

/* ---- the malloc host --------------------------------------------------------------------- */

typedef struct gf_fake_storage gf_fake_storage;

typedef struct gf_fake_host {
  gf_fake_log *log;
  gf_fake_backend *backend;        /* forwards run while it captures are recorded, not computed */
  int output_count;                /* outputs per forward (default 1) */
  int mutate_input;                /* -1 (default), or the input every forward adds 1 to in place */
  uint64_t phase_calls[4];         /* forwards run per gf_forward_phase */
  int observe;                     /* the host table has a notify hook (default 0) */
  uint64_t events[GF_EVENT_KINDS]; /* notify calls per gf_event_kind */
  gf_event last_event[GF_EVENT_KINDS]; /* the last event of each kind (message copied below) */
  char last_message[GF_EVENT_KINDS][GF_ERROR_MESSAGE_CAPACITY];
  uint64_t unknown_events; /* notify calls of a kind outside gf_event_kind */
  int fail_forward;        /* every forward fails */
  int fail_forward_while_capturing;
  uint64_t fail_forward_number; /* 0, or the forward (counted from 1) that fails */
  int forward_error_is_own;     /* the failing forward's report says its error is its own */
  int forward_out_of_memory;    /* the failing forward's report says the device ran out */
  int clone_out_of_memory;      /* clone_static fails with GF_ERR_DEVICE_MEMORY */
  int no_group;                 /* the host table has no agree hook (no process group) */
  int agree_forced;             /* 0: agree returns ok; else agree returns agree_value */
  int agree_value;
  uint64_t agree_forced_from; /* 0: agree_forced applies to every agreement, else from this one */
  uint64_t agree_calls;
  int last_agree_ok;
  /* Per agreement, in order: the forwards run before it and the ok this rank gave. */
  uint64_t forwards_at_agreement[GF_FAKE_MAX_AGREEMENTS];
  int ok_at_agreement[GF_FAKE_MAX_AGREEMENTS];
  uint64_t forward_calls;
  uint64_t clone_calls;
  uint64_t empty_calls;
  uint64_t retain_calls;
  gf_tensor clones[GF_FAKE_MAX_CLONES]; /* clone_static results, in order (first ones kept) */
  int64_t live_handles;                 /* owned references not yet released */
  uint64_t bad_releases;                /* releases of a handle that was already dead */
  uint64_t warn_count;
  char warnings[GF_FAKE_MAX_WARNINGS][GF_ERROR_MESSAGE_CAPACITY];
  int destroyed;             /* set by the destroy hook, which leaves the struct to the test */
  gf_fake_storage *storages; /* every storage ever made, freed by gf_fake_host_free */
} gf_fake_host;

void gf_fake_host_init(gf_fake_host *host, gf_fake_log *log, gf_fake_backend *backend);
/* The hook table to give gf_runner_create (context = host). */
gf_host gf_fake_host_table(gf_fake_host *host);
/* Frees every buffer the host ever made; call after the runner is gone. */
void gf_fake_host_free(gf_fake_host *host);

/* A contiguous float32 tensor owned by the host (counted in live_handles) holding values (may be
 * NULL: zeros). */
gf_tensor gf_fake_host_tensor(gf_fake_host *host, int ndim, const int64_t *sizes,
                              const float *values);
/* Releases every handle in pool (as the shim would) and empties it. */
void gf_fake_host_release_pool(gf_fake_host *host, gf_pool *pool);

/* A borrowed (handle NULL) contiguous float32 view of caller memory. */
gf_tensor gf_fake_view(float *data, int ndim, const int64_t *sizes);

/* The computation of the fake forward: outputs[j] = (2 + j) * in0 + sum_{k>=1} in_k, where an
 * input with fewer elements than in0 repeats cyclically. Outputs are shaped like in0. */
void gf_fake_forward_compute(const gf_tensor *inputs, size_t input_count, const gf_tensor *outputs,
                             size_t output_count);

/* The fake forward's in-place write: adds 1 to every element of inputs[mutate_input] (nothing
 * when mutate_input is -1 or out of range). */
void gf_fake_forward_mutate(const gf_tensor *inputs, size_t input_count, int mutate_input);

#ifdef __cplusplus
}
#endif

#endif /* GF_TEST_FAKES_H */
