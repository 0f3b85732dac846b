/* graphed._native._graphed_fastcall.CallState: the call in flight of one GraphedForward, the
 * object both entry points (gf_fastcall.c) set while they hold the runner's lock and the forward
 * the core runs reads and writes (Note [The call in flight], gf_call_state.h). A type of its own,
 * apart from the entry points that use it. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include "gf_baked.h"
#include "gf_call_state.h"
#include "gf_fastcall_torch.h"
#include "gf_host.h"
#include "gf_verify_sampled.h"

static PyObject *gf_call_state_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
  PyObject *rebuild = NULL;
  static char *names[] = {"rebuild", NULL};
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O:CallState", names, &rebuild)) {
    return NULL;
  }
  if (!PyCallable_Check(rebuild)) {
    PyErr_SetString(PyExc_TypeError, "CallState(rebuild): rebuild must be callable");
    return NULL;
  }
  gf_call_state *state = (gf_call_state *)type->tp_alloc(type, 0);
  if (state == NULL) {
    return NULL;
  }
  state->tree = Py_NewRef(Py_None);
  state->key = PyBytes_FromStringAndSize(NULL, 0);
  state->held = PyTuple_New(0);
  state->error = Py_NewRef(Py_None);
  state->rebuild = Py_NewRef(rebuild);
  if (state->key == NULL || state->held == NULL) {
    Py_DECREF(state);
    return NULL;
  }
  return (PyObject *)state;
}

static int gf_call_state_traverse(gf_call_state *state, visitproc visit, void *arg) {
  Py_VISIT(state->tree);
  Py_VISIT(state->key);
  Py_VISIT(state->held);
  Py_VISIT(state->error);
  Py_VISIT(state->recorded);
  Py_VISIT(state->rebuild);
  Py_VISIT(state->last_key);
  Py_VISIT(state->run_inventory);
  return gf_verify_queue_traverse(state->verify_queue, visit, arg);
}

static int gf_call_state_clear(gf_call_state *state) {
  Py_CLEAR(state->tree);
  Py_CLEAR(state->key);
  Py_CLEAR(state->held);
  Py_CLEAR(state->error);
  Py_CLEAR(state->recorded);
  Py_CLEAR(state->rebuild);
  Py_CLEAR(state->last_key);
  Py_CLEAR(state->run_inventory);
  gf_verify_queue *queue = state->verify_queue;
  state->verify_queue = NULL;
  gf_verify_queue_free(queue);
  return 0;
}

static void gf_call_state_dealloc(gf_call_state *state) {
  PyObject_GC_UnTrack(state);
  gf_call_state_clear(state);
  gf_baked_free(state->baked);
  Py_TYPE(state)->tp_free((PyObject *)state);
}

static PyMemberDef gf_call_state_members[] = {
    {"tree", T_OBJECT, offsetof(gf_call_state, tree), READONLY,
     "the kwargs dict or TreeSpec of the call in flight, or None"},
    {"key", T_OBJECT, offsetof(gf_call_state, key), READONLY,
     "the key of the call in flight, as bytes"},
    {"held", T_OBJECT, offsetof(gf_call_state, held), READONLY,
     "the non-tensor keep_alive objects of the call in flight"},
    {"error", T_OBJECT, offsetof(gf_call_state, error), READONLY,
     "the exception the forward raised during the call in flight, or None"},
    {"served", T_ULONGLONG, offsetof(gf_call_state, served), READONLY,
     "how many calls the entry that served the latest call has served (0: it ran eager)"},
    {NULL, 0, 0, 0, NULL},
};

/* record_error(exception, kind): the forward's exception, handed to the caller of the call in
 * flight (outside a call it is not kept). `kind` says what it was: 0 a failure of the capture, 1 an
 * error of the forward's own, 2 the device out of memory while the runner warmed up or captured;
 * the run's report carries 1 and 2 to the core (gf_forward_report.error, read by
 * pyext/gf_model_hooks.cpp when the forward returns), which decides what it means (Note [The
 * forward's own error], ops/gf_capture.c). */
static PyObject *gf_call_state_record_error(gf_call_state *state, PyObject *const *args,
                                            Py_ssize_t nargs) {
  if (nargs != 2) {
    PyErr_SetString(PyExc_TypeError, "CallState.record_error(exception, kind)");
    return NULL;
  }
  const long kind = PyLong_AsLong(args[1]);
  if (kind == -1 && PyErr_Occurred()) {
    return NULL;
  }
  if (kind < GF_FORWARD_ERROR_NONE || kind > GF_FORWARD_ERROR_DEVICE_MEMORY) {
    PyErr_Format(PyExc_ValueError, "CallState.record_error: kind must be 0, 1 or 2, got %ld", kind);
    return NULL;
  }
  /* Out of device memory while capturing is not handed to the caller (the call runs eager,
   * which raises its own if it runs out too), and not kept: its traceback holds the failed
   * attempt's frames and their tensors, which the eager run needs the memory of. */
  if (kind != GF_FORWARD_ERROR_DEVICE_MEMORY && state->tree != Py_None && state->error != NULL) {
    Py_SETREF(state->error, Py_NewRef(args[0]));
  }
  state->run_error = (int)kind;
  Py_RETURN_NONE;
}

/* record_kept_state(): the forward now running changed no state besides its inputs and outputs
 * (graphed._phases: nothing put back, nothing it could not put back), so that the core may answer
 * the capturing call from this warm-up (gf_forward_report.kept_state; Note [The first call from
 * its last warm-up], ops/gf_warm_up_answer.c). Read when the run returns; outside a run it says
 * nothing. */
static PyObject *gf_call_state_record_kept_state(gf_call_state *state, PyObject *unused) {
  (void)unused;
  state->run_kept_state = 1;
  Py_RETURN_NONE;
}

/* record_inventory(externals, names, staged): what the capture now running read besides its
 * inputs, outputs and module state (graphed._inventory): the external tensors, a name for each,
 * and the pinned host buffers its staged copies read. The direct forward makes the run's
 * gf_forward_report.inventory of them when the run returns (pyext/gf_model_hooks.cpp). */
static PyObject *gf_call_state_record_inventory(gf_call_state *state, PyObject *const *args,
                                                Py_ssize_t nargs) {
  if (nargs != 3 || !PyList_Check(args[0]) || !PyList_Check(args[1]) || !PyList_Check(args[2]) ||
      PyList_GET_SIZE(args[0]) != PyList_GET_SIZE(args[1])) {
    PyErr_SetString(PyExc_TypeError, "CallState.record_inventory(externals: list[Tensor], "
                                     "names: list[str] (one per external), staged: list[Tensor])");
    return NULL;
  }
  PyObject *inventory = PyTuple_Pack(3, args[0], args[1], args[2]);
  if (inventory == NULL) {
    return NULL;
  }
  Py_XSETREF(state->run_inventory, inventory);
  Py_RETURN_NONE;
}

/* phase: why the core runs the forward of the call in flight (GF_PHASE_*; eager outside one). */
static PyObject *gf_call_state_phase(gf_call_state *state, void *unused) {
  (void)unused;
  return PyLong_FromLong(gf_fastcall_torch_phase(state->runner_call));
}

/* verdicts_pending: how many sampled calls' verdicts the queue holds unread. */
static PyObject *gf_call_state_verdicts_pending(gf_call_state *state, void *unused) {
  (void)unused;
  return PyLong_FromLong(gf_verify_queue_pending(state->verify_queue));
}

static PyGetSetDef gf_call_state_getset[] = {
    {"phase", (getter)gf_call_state_phase, NULL,
     "why the core runs the forward of the call in flight: PHASE_EAGER, PHASE_PROBE, "
     "PHASE_WARMUP or PHASE_CAPTURE (PHASE_EAGER outside a call)",
     NULL},
    {"verdicts_pending", (getter)gf_call_state_verdicts_pending, NULL,
     "how many sampled calls' verdicts the queue holds unread (verify)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

/* record_template(template): the output template of the forward's latest run in the call in
 * flight (outside a call it is not kept). */
static PyObject *gf_call_state_record_template(gf_call_state *state, PyObject *template) {
  if (state->tree != Py_None) {
    Py_XSETREF(state->recorded, Py_NewRef(template));
  }
  Py_RETURN_NONE;
}

/* watch(dicts, tensors, sequences): what the runner's graphs baked in, from now on checked before
 * each call of either entry (see gf_baked.h); replaces the previous watch. */
static PyObject *gf_call_state_watch(gf_call_state *state, PyObject *const *args,
                                     Py_ssize_t nargs) {
  if (nargs != 3 || !PyList_Check(args[0]) || !PyList_Check(args[1]) || !PyList_Check(args[2])) {
    PyErr_SetString(PyExc_TypeError,
                    "CallState.watch(dicts: list, tensors: list, sequences: list)");
    return NULL;
  }
  gf_baked *baked = gf_baked_arm(args[0], args[1], args[2]);
  if (baked == NULL) {
    return NULL;
  }
  gf_baked_free(state->baked);
  state->baked = baked;
  Py_RETURN_NONE;
}

/* verify(runner_id, first, every, forward, compare, host, scratch, bitwise, defer): each graph's
 * first `first` calls and then one in `every` compared with eager from now on, by the queue of
 * gf_verify_sampled.h (the arming's fields, in its order); verify(None) none, the verdicts
 * pending dropped. */
static PyObject *gf_call_state_verify(gf_call_state *state, PyObject *const *args,
                                      Py_ssize_t nargs) {
  gf_verify_queue *queue = NULL;
  unsigned long long first = 0;
  unsigned long long every = 0;
  if (nargs == 9) {
    const long long runner_id = PyLong_AsLongLong(args[0]);
    if (runner_id == -1 && PyErr_Occurred()) {
      return NULL;
    }
    first = PyLong_AsUnsignedLongLong(args[1]);
    every = PyErr_Occurred() ? 0 : PyLong_AsUnsignedLongLong(args[2]);
    const int bitwise = PyErr_Occurred() ? -1 : PyObject_IsTrue(args[7]);
    const int defer = bitwise < 0 ? -1 : PyObject_IsTrue(args[8]);
    if (defer < 0) {
      return NULL;
    }
    const gf_verify_arming arming = {
        (int64_t)runner_id, args[3], args[4], args[5], args[6], bitwise, defer};
    queue = gf_verify_queue_arm(&arming);
    if (queue == NULL) {
      return NULL;
    }
  } else if (nargs != 1 || args[0] != Py_None) {
    PyErr_SetString(PyExc_TypeError, "CallState.verify(runner_id, first, every, forward, "
                                     "compare, host, scratch, bitwise, defer) or (None)");
    return NULL;
  }
  gf_verify_queue *previous = state->verify_queue;
  state->verify_first = first;
  state->verify_every = every;
  state->verify_queue = queue;
  gf_verify_queue_free(previous);
  Py_RETURN_NONE;
}

/* unwatch(): no check before calls (a disabled runner replays nothing). */
static PyObject *gf_call_state_unwatch(gf_call_state *state, PyObject *unused) {
  (void)unused;
  gf_baked_free(state->baked);
  state->baked = NULL;
  Py_RETURN_NONE;
}

/* watch_fired() -> bool: what the entries' check says now (False without a watch). */
static PyObject *gf_call_state_watch_fired(gf_call_state *state, PyObject *unused) {
  (void)unused;
  return PyBool_FromLong(state->baked != NULL && gf_baked_changed(state->baked));
}

static PyObject *gf_call_state_watch_changes(gf_call_state *state, PyObject *unused) {
  (void)unused;
  if (state->baked == NULL) {
    Py_RETURN_NONE;
  }
  return gf_baked_changes(state->baked);
}

static PyMethodDef gf_call_state_methods[] = {
    {"watch", (PyCFunction)(void (*)(void))gf_call_state_watch, METH_FASTCALL,
     "watch(dicts, tensors, sequences): checked before each call from now on; a call returns "
     "CHANGED when a dict was mutated, a list's or set's items changed or a tensor's data moved"},
    {"unwatch", (PyCFunction)gf_call_state_unwatch, METH_NOARGS, "unwatch(): no check"},
    {"verify", (PyCFunction)(void (*)(void))gf_call_state_verify, METH_FASTCALL,
     "verify(runner_id, first, every, forward, compare, host, scratch, bitwise, defer) or (None): "
     "each graph's first `first` calls and then one in `every` compared with eager by the "
     "extension's queue; a difference comes back as Differed"},
    {"watch_fired", (PyCFunction)gf_call_state_watch_fired, METH_NOARGS,
     "watch_fired() -> bool: whether the next call would return CHANGED"},
    {"watch_changes", (PyCFunction)gf_call_state_watch_changes, METH_NOARGS,
     "watch_changes() -> list | None: the watched dicts, lists, sets and tensors that changed "
     "since armed, or None when that cannot be told (nothing watched, a swap, too many "
     "mutations)"},
    {"record_error", (PyCFunction)(void (*)(void))gf_call_state_record_error, METH_FASTCALL,
     "record_error(exception, kind): the forward's exception, re-raised to the caller of the "
     "call; kind 1 (its own error) or 2 (out of device memory while capturing) goes into the "
     "run's report"},
    {"record_kept_state", (PyCFunction)gf_call_state_record_kept_state, METH_NOARGS,
     "record_kept_state(): the forward now running changed no state besides its inputs and "
     "outputs, so its outputs may answer the capturing call"},
    {"record_inventory", (PyCFunction)(void (*)(void))gf_call_state_record_inventory, METH_FASTCALL,
     "record_inventory(externals, names, staged): what the capture now running read from outside "
     "its inputs and module (weakly watched before each replay) and the pinned buffers it staged"},
    {"record_template", (PyCFunction)gf_call_state_record_template, METH_O,
     "record_template(template): the output template of the forward's latest run in the call"},
    {NULL, NULL, 0, NULL},
};

PyTypeObject gf_call_state_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "_graphed_fastcall.CallState",
    .tp_basicsize = sizeof(gf_call_state),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "CallState(rebuild): the call in flight of one GraphedForward (see gf_fastcall.c).",
    .tp_new = gf_call_state_new,
    .tp_dealloc = (destructor)gf_call_state_dealloc,
    .tp_traverse = (traverseproc)gf_call_state_traverse,
    .tp_clear = (inquiry)gf_call_state_clear,
    .tp_members = gf_call_state_members,
    .tp_getset = gf_call_state_getset,
    .tp_methods = gf_call_state_methods,
};
