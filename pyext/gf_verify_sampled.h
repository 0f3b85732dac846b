/* Verify mode's one engine (see gf_verify_sampled.c): every sampled call's eager run and
 * comparison, and the verdicts pending on the device, kept by a GraphedForward's CallState. */
#ifndef GF_VERIFY_SAMPLED_H
#define GF_VERIFY_SAMPLED_H

#include <Python.h>

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct gf_call_state;
typedef struct gf_verify_queue gf_verify_queue;

/* What the Python layer (graphed._verify) hands the queue when it arms it. */
typedef struct gf_verify_arming {
  int64_t runner_id;
  PyObject *forward; /* runs a call eagerly: forward(**kwargs), called with grad mode off */
  PyObject *compare; /* compare(replayed, expected, slot or None), where bytes cannot tell: None
                      * (the same), a str (the difference) or True (queued: the device writes the
                      * slot's verdict byte) */
  PyObject *host;    /* uint8 host memory (pinned where the device writes it), a verdict byte a
                      * slot */
  PyObject *scratch; /* int32 zeros on the runner's device, two words a slot */
  int bitwise;       /* the bytes decide (no tolerance): a flat output is compared here */
  int defer;         /* a sampled call's verdict is read at a later call, not waited for */
} gf_verify_arming;

/* A queue of the runner's sampled calls; NULL with a TypeError when the arming is not as above. */
gf_verify_queue *gf_verify_queue_arm(const gf_verify_arming *arming);
/* Releases the queue and everything it holds (the outputs of pending verdicts too), once the
 * device has stopped writing its verdicts. */
void gf_verify_queue_free(gf_verify_queue *queue);
int gf_verify_queue_traverse(gf_verify_queue *queue, visitproc visit, void *arg);
/* How many verdicts wait to be read. */
int gf_verify_queue_pending(const gf_verify_queue *queue);

/* The RUN_EAGER object of the entries (gf_fastcall.c), which a Differed's `result` is where the
 * call's own eager run is still to be made. */
extern PyObject *gf_run_eager;

/* A call a graph served (`result`, stolen; `served` > 0 its graph's count of calls), handed to the
 * state's queue after the call by either entry, with the call's kwargs (a dict): reads the
 * verdicts written since; for a call the due rule samples (gf_call_state_due), runs `kwargs`
 * eagerly and queues the comparison, waiting for its verdict within the first verify_first calls
 * or where the device does not defer. Returns the call's result where nothing differed, else
 * Differed(served, replayed, expected, difference, result) for the Python layer to report and
 * disable; NULL with an exception set. */
PyObject *gf_verify_sampled(struct gf_call_state *state, PyObject *kwargs, PyObject *result,
                            unsigned long long served);

/* Adds the Differed type and the queue's bound to the module: 0, or -1 with an exception set. */
int gf_verify_sampled_init(PyObject *module);

#ifdef __cplusplus
}
#endif

#endif /* GF_VERIFY_SAMPLED_H */
