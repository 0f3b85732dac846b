/* Verify mode's sampled call in C: for a call sampled after the first `verify` ones, the entry runs
 * the forward eagerly, queues the bitwise comparison of every output pair in one launch
 * (gf_verify_compare.c), keeps the outputs with the verdict's slot until the device has written
 * it, and returns the graph's result; each later call reads the verdicts written since. Only a
 * verdict that differed, an output structure other than a tensor or a flat tuple, list or dict of
 * them, or a pair the bytes cannot tell goes to the Python layer (graphed._verify), which says
 * the difference and disables. Made in Python, the same steps (a SampledCall handed up, the eager
 * run's context, the queue's bookkeeping, the slot and the verdict's record) cost a sampled call
 * on an H100 host 19 us on top of the replay, 9 us more than the eager forward against a bound of
 * 5 (bench/targets.py). */
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

enum { GF_VERIFY_SLOTS_MOST = 32, GF_VERDICT_NOT_WRITTEN = 2 };
enum { GF_DEVICE_TYPE_CPU = 0 }; /* c10::DeviceType::CPU, as gf_tensor.device_type holds it */
/* Outputs pending verdicts may hold at once (both sides' bytes); one more waits for the device. */
static const size_t gf_verify_bytes_most = (size_t)256 << 20;

typedef struct gf_pending_verdict {
  int slot;
  unsigned long long served;
  PyObject *replayed;
  PyObject *expected;
  size_t nbytes;
} gf_pending_verdict;

struct gf_verify_queue {
  int64_t runner_id;
  PyObject *forward;
  PyObject *host;    /* pinned uint8, a verdict byte a slot */
  PyObject *scratch; /* int32 on the device, two words a slot */
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
   * forward, a wait, a contended lock), and whether it was released meanwhile: the last of them
   * frees it then (gf_verify_queue_free). */
  int busy;
  int released;
};

gf_verify_queue *gf_verify_queue_arm(int64_t runner_id, PyObject *forward, PyObject *host,
                                     PyObject *scratch) {
  gf_tensor host_desc;
  gf_tensor scratch_desc;
  if (!PyCallable_Check(forward) || gf_compare_describe(host, &host_desc) != 0 ||
      gf_compare_describe(scratch, &scratch_desc) != 0 || host_desc.itemsize != 1 ||
      host_desc.device_type != GF_DEVICE_TYPE_CPU || !gf_tensor_is_contiguous(&host_desc) ||
      scratch_desc.itemsize != 4 || !gf_tensor_is_contiguous(&scratch_desc) ||
      gf_tensor_numel(&host_desc) < 1 ||
      gf_tensor_numel(&scratch_desc) < 2 * gf_tensor_numel(&host_desc)) {
    PyErr_SetString(PyExc_TypeError,
                    "CallState.verify_natively(runner_id, forward: callable, host: uint8 "
                    "tensor of N bytes, scratch: int32 tensor of 2N zeros)");
    return NULL;
  }
  gf_verify_queue *queue = calloc(1, sizeof *queue);
  if (queue == NULL) {
    PyErr_NoMemory();
    return NULL;
  }
  queue->runner_id = runner_id;
  queue->forward = Py_NewRef(forward);
  queue->host = Py_NewRef(host);
  queue->scratch = Py_NewRef(scratch);
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
 * write a stale verdict into the next comparison's byte). */
static void gf_verify_queue_pop(gf_verify_queue *queue) {
  gf_pending_verdict *oldest = &queue->pending[queue->head];
  if (queue->bytes[oldest->slot] != GF_VERDICT_NOT_WRITTEN) {
    queue->free_slots[queue->free_count++] = oldest->slot;
  }
  queue->pending_bytes -= oldest->nbytes;
  Py_CLEAR(oldest->replayed);
  Py_CLEAR(oldest->expected);
  queue->head = (queue->head + 1) % GF_VERIFY_SLOTS_MOST;
  queue->count--;
}

static void gf_verify_queue_clear(gf_verify_queue *queue) {
  while (queue->count > 0) {
    gf_verify_queue_pop(queue);
  }
}

/* 1 when a comparison of the queue's may still run on the device. */
static int gf_verify_queue_running(const gf_verify_queue *queue) {
  for (int i = 0; i < queue->count; ++i) {
    const int slot = queue->pending[(queue->head + i) % GF_VERIFY_SLOTS_MOST].slot;
    if (queue->bytes[slot] == GF_VERDICT_NOT_WRITTEN) {
      return 1;
    }
  }
  return 0;
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
    gf_fastcall_torch_synchronize(queue->scratch_desc.device_type,
                                  queue->scratch_desc.device_index);
  }
  gf_verify_queue_clear(queue);
  Py_CLEAR(queue->forward);
  Py_CLEAR(queue->host);
  Py_CLEAR(queue->scratch);
  free(queue);
}

int gf_verify_queue_traverse(gf_verify_queue *queue, visitproc visit, void *arg) {
  if (queue == NULL) {
    return 0;
  }
  Py_VISIT(queue->forward);
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

/* Reads the verdicts the device has written, oldest first: NULL when none differed, else a new
 * (served, replayed, expected) of the one that did, the queue then emptied (the runner is about to
 * be disabled). */
static PyObject *gf_verify_queue_read(gf_verify_queue *queue) {
  while (queue->count > 0) {
    gf_pending_verdict *oldest = &queue->pending[queue->head];
    const uint8_t verdict = queue->bytes[oldest->slot];
    if (verdict == GF_VERDICT_NOT_WRITTEN) {
      return NULL;
    }
    if (verdict != 0) {
      PyObject *differed =
          Py_BuildValue("(KOO)", oldest->served, oldest->replayed, oldest->expected);
      if (differed == NULL) {
        PyErr_Clear(); /* out of memory: read again at the next call */
        return NULL;
      }
      gf_verify_queue_clear(queue); /* the runner is about to be disabled */
      return differed;
    }
    gf_verify_queue_pop(queue);
  }
  return NULL;
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
  gf_fastcall_torch_synchronize(queue->scratch_desc.device_type, queue->scratch_desc.device_index);
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

/* Queues the comparison of a sampled call's outputs: 1 queued (the queue holds both sides), 0
 * for the Python layer to compare, -1 on error. */
static int gf_verify_queue_comparison(gf_verify_queue *queue, unsigned long long served,
                                      PyObject *result, PyObject *expected) {
  PyObject *pair[2] = {NULL, NULL};
  int owned = 0;
  PyObject *const *got = NULL;
  PyObject *const *want = NULL;
  Py_ssize_t size = 0;
  int outcome = gf_verify_output_tensors(result, expected, pair, &owned, &got, &want, &size);
  if (outcome != 0 || queue->free_count == 0) {
    if (owned) {
      Py_XDECREF(pair[0]);
      Py_XDECREF(pair[1]);
    }
    return outcome < 0 ? -1 : 0;
  }
  const int slot = queue->free_slots[--queue->free_count];
  queue->bytes[slot] = GF_VERDICT_NOT_WRITTEN;
  size_t nbytes = 0;
  int queued =
      gf_verify_compare_queue(queue->runner_id, got, want, size, (uint8_t *)&queue->bytes[slot],
                              &queue->words[2 * slot], &queue->scratch_desc, &nbytes);
  if (owned) {
    Py_DECREF(pair[0]);
    Py_DECREF(pair[1]);
  }
  if (queued == GF_COMPARE_ERROR) {
    /* The launch failed: the slot's scratch may hold a count, so it is not used again; the
     * Python layer compares with torch operations. */
    PyErr_Clear();
    return 0;
  }
  if (queued != GF_COMPARE_QUEUED) {
    queue->free_slots[queue->free_count++] = slot;
    return 0;
  }
  gf_pending_verdict *pending =
      &queue->pending[(queue->head + queue->count) % GF_VERIFY_SLOTS_MOST];
  *pending = (gf_pending_verdict){slot, served, Py_NewRef(result), Py_NewRef(expected), 2 * nbytes};
  queue->count++;
  queue->pending_bytes += pending->nbytes;
  return 1;
}

/* SampledCall(result, served, expected, differed), a struct sequence. */
static PyTypeObject *gf_sampled_call_type;

static PyStructSequence_Field gf_sampled_call_fields[] = {
    {"result", "what the call returns"},
    {"served", "how many calls the graph that served it has served, this one included"},
    {"expected", "eager's result for the call when the entry ran it, or None"},
    {"differed", "(served, replayed, expected) of a sampled call whose verdict said it differed, "
                 "or None"},
    {NULL, NULL},
};

static PyStructSequence_Desc gf_sampled_call_desc = {
    "_graphed_fastcall.SampledCall",
    "A call verify mode compares with eager (graphed._verify): its result, the count of the "
    "graph's calls, and what the entry made of it already.",
    gf_sampled_call_fields,
    4,
};

PyObject *gf_sampled_call_new(PyObject *result, unsigned long long served, PyObject *expected,
                              PyObject *differed) {
  PyObject *sampled = PyStructSequence_New(gf_sampled_call_type);
  PyObject *count = PyLong_FromUnsignedLongLong(served);
  if (sampled == NULL || count == NULL) {
    Py_XDECREF(sampled);
    Py_XDECREF(count);
    Py_DECREF(result);
    Py_XDECREF(expected);
    Py_XDECREF(differed);
    return NULL;
  }
  PyStructSequence_SetItem(sampled, 0, result);
  PyStructSequence_SetItem(sampled, 1, count);
  PyStructSequence_SetItem(sampled, 2, expected != NULL ? expected : Py_NewRef(Py_None));
  PyStructSequence_SetItem(sampled, 3, differed != NULL ? differed : Py_NewRef(Py_None));
  return sampled;
}

/* The sampled call itself, with the queue held busy: see gf_verify_sampled. */
static PyObject *gf_verify_sampled_busy(gf_verify_queue *queue, PyObject *kwargs, PyObject *result,
                                        unsigned long long served) {
  if (queue->count == GF_VERIFY_SLOTS_MOST || queue->pending_bytes > gf_verify_bytes_most) {
    gf_verify_queue_wait(queue);
    PyObject *differed = queue->released ? NULL : gf_verify_queue_read(queue);
    if (differed != NULL || queue->released) {
      return gf_sampled_call_new(result, served, NULL, differed);
    }
  }
  PyObject *target =
      gf_module_call_target(queue->forward); /* its forward, where torch's call would */
  PyObject *expected = target != NULL ? gf_fastcall_torch_call_without_grad(target, kwargs) : NULL;
  Py_XDECREF(target);
  if (expected == NULL) {
    Py_DECREF(result);
    return NULL;
  }
  if (queue->released) { /* the forward disabled the runner: the Python layer says what now */
    return gf_sampled_call_new(result, served, expected, NULL);
  }
  int queued = gf_verify_queue_comparison(queue, served, result, expected);
  if (queued < 0) {
    Py_DECREF(expected);
    Py_DECREF(result);
    return NULL;
  }
  if (queued == 0) {
    return gf_sampled_call_new(result, served, expected, NULL);
  }
  Py_DECREF(expected);
  return result;
}

PyObject *gf_verify_sampled(gf_call_state *state, PyObject *kwargs, PyObject *result,
                            unsigned long long served) {
  gf_verify_queue *queue = state->verify_queue;
  if (queue == NULL) {
    return result;
  }
  PyObject *differed = gf_verify_queue_read(queue);
  if (differed != NULL) {
    return gf_sampled_call_new(result, served, NULL, differed);
  }
  if (!state->verify_pending && !gf_call_state_due(state, served)) {
    return result; /* the call every other one is: not sampled */
  }
  if (state->verify_pending || served <= state->verify_first || !PyDict_CheckExact(kwargs)) {
    /* the Python layer's own verdicts to read (its comparisons), a call it compares at once, or
     * one of the Python path (kwargs as a TreeSpec) */
    return gf_sampled_call_new(result, served, NULL, NULL);
  }
  /* Held busy across what may let other Python code run (the eager forward, a wait, a contended
   * runner lock): a disable meanwhile (verify_natively(None)) leaves the freeing to this call. */
  queue->busy++;
  PyObject *sampled = gf_verify_sampled_busy(queue, kwargs, result, served);
  if (--queue->busy == 0 && queue->released) {
    gf_verify_queue_free(queue);
  }
  return sampled;
}

int gf_verify_sampled_init(PyObject *module) {
  if (gf_sampled_call_type == NULL) {
    gf_sampled_call_type = PyStructSequence_NewType(&gf_sampled_call_desc);
    if (gf_sampled_call_type == NULL) {
      return -1;
    }
  }
  /* The queue's bounds and the byte a verdict holds until written, which the Python layer's own
   * queue (graphed._verify) keeps alike. */
  if (PyModule_AddIntConstant(module, "VERDICTS_PENDING_MOST", GF_VERIFY_SLOTS_MOST) != 0 ||
      PyModule_AddIntConstant(module, "VERDICT_BYTES_PENDING_MOST", (long)gf_verify_bytes_most) !=
          0 ||
      PyModule_AddIntConstant(module, "VERDICT_NOT_WRITTEN", GF_VERDICT_NOT_WRITTEN) != 0) {
    return -1;
  }
  return PyModule_AddObjectRef(module, "SampledCall", (PyObject *)gf_sampled_call_type);
}
