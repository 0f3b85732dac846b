/* Verify mode's sampled calls made in C (see gf_verify_sampled.c): the eager forward, the batched
 * comparison and the verdicts pending on the device, kept by a GraphedForward's CallState. */
#ifndef GF_VERIFY_SAMPLED_H
#define GF_VERIFY_SAMPLED_H

#include <Python.h>

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct gf_call_state;
typedef struct gf_verify_queue gf_verify_queue;

/* A queue for runner `runner_id`'s sampled calls: `forward` runs a call eagerly (with grad mode
 * off), `host` is pinned uint8 host memory of one verdict byte a slot, `scratch` int32 zeros of
 * two words a slot on the runner's device; NULL with a TypeError when they are not so. */
gf_verify_queue *gf_verify_queue_arm(int64_t runner_id, PyObject *forward, PyObject *host,
                                     PyObject *scratch);
/* Releases the queue and everything it holds (the outputs of pending verdicts too). */
void gf_verify_queue_free(gf_verify_queue *queue);
int gf_verify_queue_traverse(gf_verify_queue *queue, visitproc visit, void *arg);
/* How many verdicts wait to be read (while any does, every call a graph serves is handed to the
 * queue). */
int gf_verify_queue_pending(const gf_verify_queue *queue);

/* A sampled call (`sampled`, a SampledCall the entry made; stolen) handed to the state's queue
 * after the entry's call: reads the verdicts written since, and for a call due for comparison
 * after the first verify_first runs `kwargs` eagerly and queues the comparison. Returns the call's
 * result where that is all, else the SampledCall for the Python layer (graphed._verify) with
 * `expected` (eager's result, when it ran) or `differed` ((served, replayed, expected) of the
 * verdict that differed) filled in; NULL with an exception set. */
PyObject *gf_verify_sampled(struct gf_call_state *state, PyObject *kwargs, PyObject *sampled);

#ifdef __cplusplus
}
#endif

#endif /* GF_VERIFY_SAMPLED_H */
