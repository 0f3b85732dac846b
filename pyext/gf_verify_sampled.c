/* Verify mode's one engine: every call verify mode compares with eager, whichever entry served it
 * (`call` or `call_flat`) and whatever the device, goes through the queue here. For a call the due
 * rule samples (gf_call_state_due: the first verify_first of each graph, then one in
 * verify_every), the queue runs the forward eagerly, queues the comparison of the two outputs and
 * keeps both with the verdict's slot until the device has written it; each later call reads the
 * verdicts written since. A tensor or a flat tuple, list or dict of them, compared bitwise, is
 * compared here by bytes in one launch (gf_verify_compare.c); what bytes cannot tell (a
 * tolerance, a nested output, non-tensor leaves, tensors that are not contiguous or lie on several
 * devices) goes to the comparison the Python layer handed the queue when it armed it
 * (graphed._verify), which queues its verdict into the same slot or answers at once. The first
 * verify_first calls, and every call on a device that does not defer (the CPU), wait for their
 * verdict. A verdict that differed goes up as Differed, for the Python layer to say the difference
 * and disable.
 *
 * What it costs, a sampled call on an H100 host beyond its replay (at 1a3bc4a, docs/benchmarks.md):
 * 3 to 4.3 us more than an eager call, of which the comparison's launch is 1.3 (a ready graph,
 * backends/cuda/gf_cuda_compare_jobs.h). The same steps made in Python (the call handed up, the
 * eager run's context, the queue's bookkeeping) cost 19 us on top of the replay, 9 us more than
 * the eager forward. Every call not sampled costs a null test and the due rule. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include "gf_call_state.h"
#include "gf_fastcall_torch.h"
#include "gf_module_call.h"
#include "gf_tensor.h"
#include "gf_verify_compare.h"
#include "gf_verify_sampled.h"

#include <stdlib.h>

enum { GF_VERIFY_SLOTS_MOST = 32, GF_VERDICT_NOT_WRITTEN = 2, GF_NO_SLOT = -1 };
enum { GF_DEVICE_TYPE_CPU = 0 }; /* c10::DeviceType::CPU, as gf_tensor.device_type holds it */
/* Outputs pending verdicts may hold at once (both sides' bytes); one more waits for the device. */
static const size_t gf_verify_bytes_most = (size_t)256 << 20;

/* What a comparison came to. */
typedef enum gf_judged {
  GF_JUDGED_ERROR = -1, /* a Python exception is set */
  GF_JUDGED_QUEUED,     /* the device writes the verdict into the slot */
  GF_JUDGED_SAME,
  GF_JUDGED_DIFFERS,
} gf_judged;

typedef struct gf_pending_verdict {
  int slot;
  unsigned long long served;
  PyObject *replayed;
  PyObject *expected;
  size_t nbytes;
} gf_pending_verdict;

struct gf_verify_queue {
  gf_verify_arming arming; /* its objects held */
  volatile uint8_t *bytes;
  uint32_t *words;
  gf_tensor scratch_desc;
  int slots;
  gf_pending_verdict pending[GF_VERIFY_SLOTS_MOST]; /* a ring, oldest at head */
  int head;
  int count;
  size_t pending_bytes;
  int free_slots[GF_VERIFY_SLOTS_MOST];
  int free_count;
  /* gf_verify_sampled calls using the queue now (each may let other Python code run: the eager
   * forward, the Python comparison, a wait), and whether it was released meanwhile: the last of
   * them frees it then (gf_verify_queue_free). */
  int busy;
  int released;
};

static int gf_verify_arming_fits(const gf_verify_arming *arming, gf_tensor *host,
                                 gf_tensor *scratch) {
  return PyCallable_Check(arming->forward) && PyCallable_Check(arming->compare) &&
         gf_compare_describe(arming->host, host) == 0 &&
         gf_compare_describe(arming->scratch, scratch) == 0 && host->itemsize == 1 &&
         host->device_type == GF_DEVICE_TYPE_CPU && gf_tensor_is_contiguous(host) &&
         scratch->itemsize == 4 && gf_tensor_is_contiguous(scratch) && gf_tensor_numel(host) >= 1 &&
         gf_tensor_numel(scratch) >= 2 * gf_tensor_numel(host);
}

gf_verify_queue *gf_verify_queue_arm(const gf_verify_arming *arming) {
  gf_tensor host_desc;
  gf_tensor scratch_desc;
  if (!gf_verify_arming_fits(arming, &host_desc, &scratch_desc)) {
    PyErr_SetString(PyExc_TypeError,
                    "CallState.verify(runner_id, first, every, forward: callable, compare: "
                    "callable, host: uint8 tensor of N bytes, scratch: int32 tensor of 2N zeros, "
                    "bitwise, defer) or (None)");
    return NULL;
  }
  gf_verify_queue *queue = calloc(1, sizeof *queue);
  if (queue == NULL) {
    PyErr_NoMemory();
    return NULL;
  }
  queue->arming = *arming;
  Py_INCREF(arming->forward);
  Py_INCREF(arming->compare);
  Py_INCREF(arming->host);
  Py_INCREF(arming->scratch);
  queue->bytes = host_desc.data;
  queue->words = scratch_desc.data;
  queue->scratch_desc = scratch_desc;
  queue->scratch_desc.handle = NULL; /* borrowed while `scratch` lives */
  int64_t slots = gf_tensor_numel(&host_desc);
  queue->slots = slots < GF_VERIFY_SLOTS_MOST ? (int)slots : GF_VERIFY_SLOTS_MOST;
  for (int slot = queue->slots - 1; slot >= 0; --slot) {
    queue->free_slots[queue->free_count++] = slot;
  }
  return queue;
}

/* Drops the oldest pending verdict. Its slot is free again once the device has written its
 * verdict; a slot whose comparison may still run is retired (never used again: its kernel could
 * write a stale verdict into the next comparison's byte). The queue is whole before the outputs
 * are released (which may run other Python code). */
static void gf_verify_queue_pop(gf_verify_queue *queue) {
  gf_pending_verdict oldest = queue->pending[queue->head];
  if (queue->bytes[oldest.slot] != GF_VERDICT_NOT_WRITTEN) {
    queue->free_slots[queue->free_count++] = oldest.slot;
  }
  queue->pending_bytes -= oldest.nbytes;
  queue->head = (queue->head + 1) % GF_VERIFY_SLOTS_MOST;
  queue->count--;
  Py_XDECREF(oldest.replayed);
  Py_XDECREF(oldest.expected);
}

static void gf_verify_queue_clear(gf_verify_queue *queue) {
  while (queue->count > 0) {
    gf_verify_queue_pop(queue);
  }
}

/* 1 when the device may still write into the queue's memory: a pending verdict not written, or a
 * slot retired with its comparison unfinished. */
static int gf_verify_queue_running(const gf_verify_queue *queue) {
  for (int i = 0; i < queue->count; ++i) {
    const int slot = queue->pending[(queue->head + i) % GF_VERIFY_SLOTS_MOST].slot;
    if (queue->bytes[slot] == GF_VERDICT_NOT_WRITTEN) {
      return 1;
    }
  }
  return queue->free_count + queue->count < queue->slots;
}

static void gf_verify_queue_synchronize(const gf_verify_queue *queue) {
  gf_fastcall_torch_synchronize(queue->scratch_desc.device_type, queue->scratch_desc.device_index);
}

void gf_verify_queue_free(gf_verify_queue *queue) {
  if (queue == NULL) {
    return;
  }
  if (queue->busy > 0) { /* a call using it frees it when it is done */
    queue->released = 1;
    return;
  }
  if (gf_verify_queue_running(queue)) {
    /* Its kernels write the pinned bytes and the scratch released below, which torch's
     * allocators hand out again at once: they finish first. */
    gf_verify_queue_synchronize(queue);
  }
  gf_verify_queue_clear(queue);
  Py_CLEAR(queue->arming.forward);
  Py_CLEAR(queue->arming.compare);
  Py_CLEAR(queue->arming.host);
  Py_CLEAR(queue->arming.scratch);
  free(queue);
}

int gf_verify_queue_traverse(gf_verify_queue *queue, visitproc visit, void *arg) {
  if (queue == NULL) {
    return 0;
  }
  Py_VISIT(queue->arming.forward);
  Py_VISIT(queue->arming.compare);
  for (int i = 0; i < queue->count; ++i) {
    const gf_pending_verdict *pending = &queue->pending[(queue->head + i) % GF_VERIFY_SLOTS_MOST];
    Py_VISIT(pending->replayed);
    Py_VISIT(pending->expected);
  }
  return 0;
}

int gf_verify_queue_pending(const gf_verify_queue *queue) {
  return queue != NULL ? queue->count : 0;
}

/* Reads the verdicts the device has written, oldest first: 0 when none differed, else 1 with
 * *differed the one that did (its outputs new references), the queue then emptied (the runner is
 * about to be disabled). */
static int gf_verify_queue_read(gf_verify_queue *queue, gf_pending_verdict *differed) {
  while (queue->count > 0) {
    gf_pending_verdict *oldest = &queue->pending[queue->head];
    const uint8_t verdict = queue->bytes[oldest->slot];
    if (verdict == GF_VERDICT_NOT_WRITTEN) {
      return 0;
    }
    if (verdict != 0) {
      *differed = *oldest;
      Py_INCREF(differed->replayed);
      Py_INCREF(differed->expected);
      gf_verify_queue_clear(queue);
      return 1;
    }
    gf_verify_queue_pop(queue);
  }
  return 0;
}

/* Sampled faster than the device answers: waits for the device to finish what was queued (the
 * oldest verdict with it). The oldest verdict, if still not written then (its work failed on the
 * device, or the wait did), is dropped, its slot retired; another thread may have read it
 * meanwhile, as the wait lets other threads run. */
static void gf_verify_queue_wait(gf_verify_queue *queue) {
  if (queue->count == 0) {
    return;
  }
  const int slot = queue->pending[queue->head].slot;
  if (queue->bytes[slot] != GF_VERDICT_NOT_WRITTEN) {
    return;
  }
  gf_verify_queue_synchronize(queue);
  if (queue->count > 0 && queue->pending[queue->head].slot == slot &&
      queue->bytes[slot] == GF_VERDICT_NOT_WRITTEN) {
    gf_verify_queue_pop(queue);
  }
}

/* The outputs of both sides, in order, for a tensor, a tuple or list, or a dict under the same
 * keys in the same order (exact types): 0 with *got and *want the items (borrowed from `result`
 * and `expected`, or from `pair`, new lists of a dict's values that the caller releases when
 * *owned says so; whether each is a plain tensor, gf_verify_compare_queue looks), 1 for any other
 * structure or one that differs (the Python layer compares), -1 on error. */
static int gf_verify_output_tensors(PyObject *result, PyObject *expected, PyObject *pair[2],
                                    int *owned, PyObject *const **got, PyObject *const **want,
                                    Py_ssize_t *size) {
  if (Py_TYPE(result) != Py_TYPE(expected)) {
    return 1;
  }
  if (gf_fastcall_torch_is_plain_tensor(result)) {
    pair[0] = result;
    pair[1] = expected;
    *got = &pair[0];
    *want = &pair[1];
    *size = 1;
    return 0;
  }
  PyObject *values[2] = {result, expected};
  if (PyDict_CheckExact(result)) {
    Py_ssize_t at = 0;
    Py_ssize_t eager_at = 0;
    PyObject *key, *value, *eager_key, *eager_value;
    if (PyDict_GET_SIZE(result) != PyDict_GET_SIZE(expected)) {
      return 1;
    }
    while (PyDict_Next(result, &at, &key, &value) &&
           PyDict_Next(expected, &eager_at, &eager_key, &eager_value)) {
      int same = PyObject_RichCompareBool(key, eager_key, Py_EQ);
      if (same <= 0) {
        return same < 0 ? -1 : 1;
      }
    }
    *owned = 1; /* new lists of the values */
    for (int side = 0; side < 2; ++side) {
      pair[side] = PyDict_Values(values[side]);
      if (pair[side] == NULL) {
        return -1;
      }
    }
  } else if (PyTuple_CheckExact(result) || PyList_CheckExact(result)) {
    pair[0] = result; /* borrowed */
    pair[1] = expected;
  } else {
    return 1;
  }
  *size = PySequence_Fast_GET_SIZE(pair[0]);
  if (*size != PySequence_Fast_GET_SIZE(pair[1])) {
    return 1;
  }
  *got = PySequence_Fast_ITEMS(pair[0]);
  *want = PySequence_Fast_ITEMS(pair[1]);
  return 0; /* an item that is no plain tensor: gf_verify_compare_queue says so */
}

/* Compares a flat output's bytes in one launch into *slot's byte: GF_COMPARE_QUEUED (*nbytes one
 * side's bytes), GF_COMPARE_DIFFERS (a dtype or shape), GF_COMPARE_ELSEWHERE (the Python layer
 * compares; where the launch failed, *slot is retired, GF_NO_SLOT: its scratch may hold a count)
 * or GF_COMPARE_ERROR. */
static int gf_verify_queue_bytes(gf_verify_queue *queue, int *slot, PyObject *result,
                                 PyObject *expected, size_t *nbytes) {
  PyObject *pair[2] = {NULL, NULL};
  int owned = 0;
  PyObject *const *got = NULL;
  PyObject *const *want = NULL;
  Py_ssize_t size = 0;
  const int outcome = gf_verify_output_tensors(result, expected, pair, &owned, &got, &want, &size);
  int compared = outcome < 0 ? GF_COMPARE_ERROR : GF_COMPARE_ELSEWHERE;
  if (outcome == 0) {
    compared = gf_verify_compare_queue(queue->arming.runner_id, got, want, size,
                                       (uint8_t *)&queue->bytes[*slot], &queue->words[2 * *slot],
                                       &queue->scratch_desc, nbytes);
    if (compared == GF_COMPARE_ERROR) {
      PyErr_Clear();
      *slot = GF_NO_SLOT;
      compared = GF_COMPARE_ELSEWHERE;
    }
  }
  if (owned) {
    Py_XDECREF(pair[0]);
    Py_XDECREF(pair[1]);
  }
  return compared;
}

/* The Python layer's comparison (arming.compare) of what bytes cannot tell, into `slot`'s byte
 * (GF_NO_SLOT: at once): *nbytes what a queued one holds (both sides), *difference the phrase of
 * one that differs (a new str). */
static gf_judged gf_verify_queue_ask(gf_verify_queue *queue, int slot, PyObject *result,
                                     PyObject *expected, size_t *nbytes, PyObject **difference) {
  PyObject *where = slot == GF_NO_SLOT ? Py_NewRef(Py_None) : PyLong_FromLong(slot);
  PyObject *said = where != NULL ? PyObject_CallFunctionObjArgs(queue->arming.compare, result,
                                                                expected, where, NULL)
                                 : NULL;
  Py_XDECREF(where);
  if (said == NULL) {
    return GF_JUDGED_ERROR;
  }
  if (said == Py_None) {
    Py_DECREF(said);
    return GF_JUDGED_SAME;
  }
  if (PyUnicode_Check(said)) {
    *difference = said;
    return GF_JUDGED_DIFFERS;
  }
  *nbytes = PyLong_CheckExact(said) && slot != GF_NO_SLOT ? PyLong_AsSize_t(said) : (size_t)-1;
  Py_DECREF(said);
  if (*nbytes == (size_t)-1) {
    PyErr_Clear();
    PyErr_SetString(PyExc_TypeError, "verify's comparison returned neither None, a str nor the "
                                     "bytes it queued");
    return GF_JUDGED_ERROR;
  }
  return GF_JUDGED_QUEUED;
}

/* Compares a sampled call's outputs: queued (the queue holds both sides until the device writes
 * the verdict), the same, or differing (*difference a new str, or NULL where the bytes said so). */
static gf_judged gf_verify_queue_comparison(gf_verify_queue *queue, unsigned long long served,
                                            PyObject *result, PyObject *expected,
                                            PyObject **difference) {
  int slot = GF_NO_SLOT;
  if (queue->free_count > 0) {
    slot = queue->free_slots[--queue->free_count];
    queue->bytes[slot] = GF_VERDICT_NOT_WRITTEN;
  }
  size_t nbytes = 0;
  int compared = GF_COMPARE_ELSEWHERE;
  if (slot != GF_NO_SLOT && queue->arming.bitwise) {
    compared = gf_verify_queue_bytes(queue, &slot, result, expected, &nbytes);
    nbytes *= 2;
  }
  gf_judged judged = compared == GF_COMPARE_QUEUED    ? GF_JUDGED_QUEUED
                     : compared == GF_COMPARE_DIFFERS ? GF_JUDGED_DIFFERS
                                                      : GF_JUDGED_ERROR;
  if (compared == GF_COMPARE_ELSEWHERE) {
    judged = gf_verify_queue_ask(queue, slot, result, expected, &nbytes, difference);
  }
  if (judged != GF_JUDGED_QUEUED) {
    if (slot != GF_NO_SLOT) {
      queue->free_slots[queue->free_count++] = slot;
    }
    return judged;
  }
  gf_pending_verdict *pending =
      &queue->pending[(queue->head + queue->count) % GF_VERIFY_SLOTS_MOST];
  *pending = (gf_pending_verdict){slot, served, Py_NewRef(result), Py_NewRef(expected), nbytes};
  queue->count++;
  queue->pending_bytes += nbytes;
  return GF_JUDGED_QUEUED;
}

/* Differed(served, replayed, expected, difference, result), a struct sequence. */
static PyTypeObject *gf_differed_type;

static PyStructSequence_Field gf_differed_fields[] = {
    {"served", "the count of its graph's calls of the sampled call that differed"},
    {"replayed", "what the graph returned for it"},
    {"expected", "what eager returned for it"},
    {"difference", "where and by how much they differ, or None where the bytes said so"},
    {"result", "eager's result for the call now, or RUN_EAGER where it is still to run"},
    {NULL, NULL},
};

static PyStructSequence_Desc gf_differed_desc = {
    "_graphed_fastcall.Differed",
    "A sampled call whose output differed from eager's (graphed._verify reports it and disables "
    "the runner), and the answer to the call now.",
    gf_differed_fields,
    5,
};

/* Steals every object (difference may be NULL: None). */
static PyObject *gf_differed_new(unsigned long long served, PyObject *replayed, PyObject *expected,
                                 PyObject *difference, PyObject *result) {
  PyObject *items[5] = {PyLong_FromUnsignedLongLong(served), replayed, expected,
                        difference != NULL ? difference : Py_NewRef(Py_None), result};
  PyObject *differed = items[0] != NULL ? PyStructSequence_New(gf_differed_type) : NULL;
  for (int i = 0; i < 5; ++i) {
    if (differed != NULL) {
      PyStructSequence_SetItem(differed, i, items[i]);
    } else {
      Py_XDECREF(items[i]);
    }
  }
  return differed;
}

/* The answer to a call whose queue read a verdict that differed: eager's result for the call
 * (`expected`, stolen; NULL: RUN_EAGER, to run) goes with it; the graph's `result` is dropped. */
static PyObject *gf_verify_differed(gf_pending_verdict *differed, PyObject *result,
                                    PyObject *expected) {
  Py_DECREF(result);
  return gf_differed_new(differed->served, differed->replayed, differed->expected, NULL,
                         expected != NULL ? expected : Py_NewRef(gf_run_eager));
}

/* A sampled call's comparison, eager having run (`expected`; both stolen): see gf_verify_sampled.
 * `first`: the calls of each graph that wait for their verdict. */
static PyObject *gf_verify_sampled_compare(gf_verify_queue *queue, unsigned long long first,
                                           unsigned long long served, PyObject *result,
                                           PyObject *expected) {
  PyObject *difference = NULL;
  const gf_judged judged = gf_verify_queue_comparison(queue, served, result, expected, &difference);
  if (judged == GF_JUDGED_ERROR) {
    Py_DECREF(result);
    Py_DECREF(expected);
    return NULL;
  }
  if (judged == GF_JUDGED_DIFFERS) {
    return gf_differed_new(served, result, Py_NewRef(expected), difference, expected);
  }
  gf_pending_verdict differed;
  if (judged == GF_JUDGED_QUEUED && (!queue->arming.defer || served <= first)) {
    if (gf_verify_queue_running(queue)) {
      gf_verify_queue_synchronize(queue);
    }
    if (queue->released) { /* disabled meanwhile: eager answers */
      Py_DECREF(result);
      return expected;
    }
    if (gf_verify_queue_read(queue, &differed)) {
      return gf_verify_differed(&differed, result, expected);
    }
  }
  Py_DECREF(expected);
  return result;
}

/* The call, with the queue held busy: see gf_verify_sampled. */
static PyObject *gf_verify_sampled_busy(const gf_call_state *state, gf_verify_queue *queue,
                                        PyObject *kwargs, PyObject *result,
                                        unsigned long long served) {
  const unsigned long long first = state->verify_first;
  gf_pending_verdict differed;
  if (gf_verify_queue_read(queue, &differed)) {
    return gf_verify_differed(&differed, result, NULL);
  }
  if (!gf_call_state_due(state, served)) {
    return result; /* a verdict read, the call itself not sampled */
  }
  if (queue->count == GF_VERIFY_SLOTS_MOST || queue->pending_bytes > gf_verify_bytes_most) {
    gf_verify_queue_wait(queue);
    if (!queue->released && gf_verify_queue_read(queue, &differed)) {
      return gf_verify_differed(&differed, result, NULL);
    }
  }
  if (queue->released) { /* disabled meanwhile: the graph's answer stands */
    return result;
  }
  /* Its forward, where torch's call of the module would find nothing to do first. */
  PyObject *target = gf_module_call_target(queue->arming.forward);
  PyObject *expected = target != NULL ? gf_fastcall_torch_call_without_grad(target, kwargs) : NULL;
  Py_XDECREF(target);
  if (expected == NULL) {
    Py_DECREF(result);
    return NULL;
  }
  if (queue->released) { /* the forward disabled the runner: eager answers */
    Py_DECREF(result);
    return expected;
  }
  return gf_verify_sampled_compare(queue, first, served, result, expected);
}

PyObject *gf_verify_sampled(gf_call_state *state, PyObject *kwargs, PyObject *result,
                            unsigned long long served) {
  gf_verify_queue *queue = state->verify_queue;
  if (queue == NULL || (queue->count == 0 && !gf_call_state_due(state, served))) {
    return result; /* the call every other one is: nothing to read, not sampled */
  }
  /* Held busy across what may let other Python code run (the eager forward, the Python
   * comparison, a wait): a disable meanwhile (verify(None)) leaves the freeing to this call. */
  queue->busy++;
  PyObject *answer = gf_verify_sampled_busy(state, queue, kwargs, result, served);
  if (--queue->busy == 0 && queue->released) {
    gf_verify_queue_free(queue);
  }
  return answer;
}

int gf_verify_sampled_init(PyObject *module) {
  if (gf_differed_type == NULL) {
    gf_differed_type = PyStructSequence_NewType(&gf_differed_desc);
    if (gf_differed_type == NULL) {
      return -1;
    }
  }
  /* The slots of verdict bytes a queue uses at most, for the memory the Python layer gives it. */
  if (PyModule_AddIntConstant(module, "VERDICTS_PENDING_MOST", GF_VERIFY_SLOTS_MOST) != 0) {
    return -1;
  }
  return PyModule_AddObjectRef(module, "Differed", (PyObject *)gf_differed_type);
}
