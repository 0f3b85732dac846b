/* The call in flight of one GraphedForward, as the forward operator the core calls back reads it
 * (graphed._native._graphed_fastcall.CallState). See Note [The call in flight] below. */
#ifndef GF_CALL_STATE_H
#define GF_CALL_STATE_H

#include <Python.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Note [The call in flight]
 *
 * Q: Where does the state of one GraphedForward call live while it runs?
 * A: Per runner, under the runner's recursive lock (shim/gf_shim_registry.h), which serialises a
 *    runner's calls: in this CallState (one per GraphedForward, so one per runner) and in the
 *    runner's RunnerCall (shim/gf_shim_host.h), which the shim's host reaches without Python.
 *    Each field is written by the one piece named here, and a nested call (the forward calling
 *    another runner, or the same one through the operator) saves and puts back what it changes.
 *
 * CallState (this struct), set by CallInFlight (pyext/gf_fastcall_torch.cpp) for the length of a
 * core call, under the lock, by both entries (`call`, `call_flat`):
 *   tree       the kwargs dict of a fast-path call (the walker's; never read again: the forward's
 *              kwargs are decoded from `key`), the TreeSpec of a Python-path call, or None outside
 * a call. key        bytes, the key of the call in flight (b"" outside a call). held       the
 * non-tensor keep_alive objects of the call in flight (a tuple). error      the exception the
 * forward raised during the call (record_error, from the forward operator, graphed._forward), or
 * None; handed to the caller on exit. recorded   the output template the forward recorded last in
 * the call (record_template; NULL before it ran): a plain result's is a 1-tuple (the result with
 * PLACEHOLDER in each tensor slot), rebuilt in C; any other is rebuilt by calling `rebuild`.
 *   runner_call  the runner's RunnerCall while a call is in flight (NULL outside one): what
 *              CallState.phase reads.
 *   served     written by CallInFlight::settle: how many calls the serving entry has served, that
 *              one included (0 when it ran eager); both entries hand it to the verify queue after
 *              the call, which decides whether it is one verify mode compares with eager.
 * Set once or by their own methods, outside the lock's protocol:
 *   verify_first, verify_every, verify_queue  set by CallState.verify (graphed._verify): the
 *              calls of each graph compared with eager, the first N and then one in K (0: none;
 *              gf_call_state_due, the one due rule), and the queue that makes those comparisons
 *              and holds their verdicts for both entries (pyext/gf_verify_sampled.h), or NULL.
 *   rebuild    callable(template, outputs), given to the constructor.
 *   last_key   bytes, the key of the latest fast-path call (NULL before one), reused by the next
 *              call whose walk gives the same bytes (gf_fastcall.c).
 *   run_error, run_kept_state, run_inventory  what the forward now running reports
 *              (gf_forward_report,
 *              ops/gf_host.h): written by record_error (kind 1 or 2) and record_kept_state while
 *              it runs, zeroed before and read after each run by the direct forward
 *              (pyext/gf_model_hooks.cpp), which copies them into the run's report; an outer
 *              run's are put back after a nested one.
 *   baked      the watch of what the runner's graphs read besides their inputs (pyext/gf_baked.h),
 *              or NULL; armed by the Python layer's Watch (graphed._watch), checked by `call`
 *              before anything else (it returns CHANGED when it fires; `call_flat` is reached only
 *              through `call`'s FALLBACK, so the one check serves both).
 *
 * RunnerCall (shim/gf_shim_host.h), one per runner:
 *   phase                 written by host_run_forward around each forward it runs (eager, probe,
 *                         warm-up, capture); read by CallState.phase and graphed::forward_phase.
 *   served_request        written by the dispatched entry around its graphed::forward call; taken
 *                         by call_runner (shim/gf_shim_call.cpp) under the lock.
 *   forward_thread/order  written by host_run_forward; read by forward_phase() without a runner.
 *
 * The serving entry's user slot (gf_entry.user, an EntryUser in pyext/gf_fastcall_torch.cpp) holds
 * what outlives a call: the entry's output template with the held objects, and its `served` count;
 * the core tells which entry served through a gf_served_entry (ops/gf_runner.h).
 *
 * Per thread, on purpose, each because what it holds is a fact about the thread's stack (another
 * thread's call is a call of its own), and nothing else:
 *   - in C, only the re-entry frames (gf_frames_here in gf_fastcall.c);
 *   - in Python, graphed._reentry.ReentryDepth, the one re-entry guard, one per owner:
 *     GraphedForward's _forwards_here (a disabled runner's call from inside its own forward runs
 *     eagerly), Regions' `here` (a region called inside its tree's own run) and graph_pipeline's
 *     `_inside` (the pipeline's module called from inside its own GraphedForward);
 *   - graphed._phases' `_local`: what is_current_stream_capturing answers on the thread whose
 *     forward the core captures, and the sync warnings of this thread's probe;
 *   - graphed._inventory's `_calling`: the torch function this thread's InventoryMode called
 *     last, which the sync probe's message names;
 *   - graphed._generation's `_in_flight`: the cache of the generate() step this thread runs,
 *     which a replay cannot carry through the graph's kwargs.
 * The Python layer keeps the rest of what a call needs on one per-runner object
 * (graphed._phases).
 *
 * Q: Why is a runner's lock enough, when ATen's CUDAGraph gave up a thread-local stack because
 *    stream capture can span threads (autograd)?
 * A: graphed captures inference forwards under no_grad, which never hand work to autograd's
 *    threads; and the state is keyed by runner, not by thread, so a forward that did continue on
 *    another thread would find it (waiting for the lock, which its caller holds, is the failure
 *    mode, not a wrong read). */
typedef struct gf_call_state {
  // clang-format off
  PyObject_HEAD
  PyObject *tree;
  // clang-format on
  PyObject *key;
  PyObject *held;
  PyObject *error;
  PyObject *recorded;
  PyObject *rebuild;
  PyObject *last_key;
  void *runner_call; /* a graphed::RunnerCall (shim/gf_shim_host.h) */
  unsigned long long served;
  unsigned long long verify_first;
  unsigned long long verify_every;
  struct gf_baked *baked;
  int run_error;      /* a gf_forward_error */
  int run_kept_state; /* 1: the run now in flight changed no state besides its inputs and outputs */
  PyObject *run_inventory; /* NULL, or (externals, names, staged) the capture now running read */
  struct gf_verify_queue *verify_queue; /* verify mode's queue (gf_verify_sampled.h), or NULL */
} gf_call_state;

/* 1 when call `served` of a graph (served > 0) is one verify mode compares with eager: within the
 * first verify_first, or one in verify_every after them. */
static inline int gf_call_state_due(const gf_call_state *state, unsigned long long served) {
  const unsigned long long first = state->verify_first;
  return served <= first ||
         (state->verify_every != 0 && (served - first) % state->verify_every == 0);
}

/* The CallState type (gf_call_state.c). */
extern PyTypeObject gf_call_state_type;

#ifdef __cplusplus
}
#endif

#endif /* GF_CALL_STATE_H */
