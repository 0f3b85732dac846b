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

/* SampledCall(result, served, expected, differed), what both entries return for a call verify
 * mode compares with eager (graphed._verify); steals result and, where given, expected and
 * differed (NULL: None). NULL with an exception set. */
PyObject *gf_sampled_call_new(PyObject *result, unsigned long long served, PyObject *expected,
                              PyObject *differed);

/* A call a graph served (`result`, stolen; `served` its graph's count of calls), handed to the
 * state's queue after the call by either entry: reads the verdicts written since, and for a call
 * due for comparison after the first verify_first runs `kwargs` (the fast entry's dict; anything
 * else hands the call up) eagerly and queues the comparison.
 * Returns the call's result where that is all (every call not sampled), else a SampledCall for
 * the Python layer with `expected` (eager's result, when it ran) or `differed` ((served,
 * replayed, expected) of the verdict that differed) filled in; NULL with an exception set. */
PyObject *gf_verify_sampled(struct gf_call_state *state, PyObject *kwargs, PyObject *result,
                            unsigned long long served);

/* Adds the SampledCall type to the module: 0, or -1 with an exception set. */
int gf_verify_sampled_init(PyObject *module);

#ifdef __cplusplus
}
#endif

#endif /* GF_VERIFY_SAMPLED_H */
