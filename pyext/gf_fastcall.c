/* graphed._native._graphed_fastcall: the CPython entry points of GraphedForward, in C. A torch.ops
 * call spends about 0.45 us per tensor parsing its arguments and a Python walk of the kwargs a few
 * more, while a graph launch costs about 3 us; `call` walks the kwargs with the CPython API
 * (pyext/gf_walker.c), builds the non-tensor key as bytes, describes each tensor in place and
 * enters the runner once.
 *
 * `call` takes plain kwargs: exact dict (str keys), list and tuple containers, exact tensors, and
 * None/bool/int/float/str leaves, with a variant of those leaf types. Anything else returns the
 * FALLBACK object; the Python layer then flattens the kwargs itself (graphed._tree.flatten_kwargs,
 * keys starting with 'V', never 'F') and enters through `call_flat`, which calls the
 * graphed::forward operator through the dispatcher so that FakeTensor and other modes see it.
 *
 * The walker is the truth for plain trees: the forward operator the core calls back (for probe,
 * warm-up, capture or eager runs) decodes plain kwargs from the key with `decode`, records a plain
 * result's template with `output_template`, and both entries rebuild a plain output in C; only
 * trees the walker does not take go through graphed._tree. `flatten` shows the walk to tests.
 *
 * The call in flight is a CallState (pyext/gf_call_state.h, Note [The call in flight]), one per
 * GraphedForward, which both entries set while they hold the runner's lock
 * (pyext/gf_fastcall_torch.cpp).
 * Each cache entry owns its output template: after a call that captured, the entry point stores
 * what the capture's forward recorded (with the call's held objects, and a count of the calls the
 * entry served: CallState.served) in the entry's user slot
 * (gf_call_options.served), a hit reads it back, and the core releases it with the entry
 * (evicted, reset, disabled, destroyed). An eager call uses the template its own forward recorded.
 * The entry is keyed by the whole signature (key and input shapes), so an output whose structure
 * depends on a shape (x.unbind(0)) gets one template per shape.
 *
 * Before anything else, `call` checks the state's watch of what the runner's graphs baked in
 * besides their inputs (pyext/gf_baked.h) and returns the CHANGED object when it fired: the Python
 * layer compares the module with what it recorded, recaptures or disables, and calls again. Every
 * GraphedForward call enters through `call` first (`call_flat` follows its FALLBACK), so the one
 * check serves both.
 *
 * A new key the core holds back (the churn guard's, but for a call after which the host is told of
 * it; an out-of-memory back-off's) comes back from `call` as the RUN_EAGER object, and
 * GraphedForward runs the module itself: through the core's forward operator such a call cost about
 * 60 us more than eager on the H200's host, most of a storm's overhead
 * (gf_call_options.eager_by_caller).
 *
 * The fast path holds a strong reference to each input tensor object for the whole call (the
 * walk's `objects`), and a forward the core runs gets kwargs decoded from the key bytes, never
 * read again from the caller's containers: a forward (or another thread) that replaces a tensor
 * in a dict the caller passed cannot free the memory the replay copies from, nor change what the
 * warm-ups and the capture see. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include "gf_baked.h"
#include "gf_call_state.h"
#include "gf_churn.h"
#include "gf_fastcall_torch.h"
#include "gf_host.h"
#include "gf_sync_warning.h"
#include "gf_tensor.h"
#include "gf_walker.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Reused across calls (the GIL serialises them); a call made from inside a forward that graphed
 * is capturing or running eagerly gets a walk of its own. */
static gf_walk gf_scratch;
static int gf_calls_in_flight;
static PyObject *gf_fallback;    /* returned when the fast path does not apply */
static PyObject *gf_reentered;   /* returned for a call from inside its own forward */
static PyObject *gf_changed;     /* returned when the state's watch fired (see gf_baked.h) */
static PyObject *gf_run_eager;   /* returned for a new key the core holds back (GF_RUN_EAGER) */
static PyObject *gf_placeholder; /* a tensor slot in an output template */
/* What both entries return for a call verify mode compares with eager: SampledCall(result,
 * served), a struct sequence (see gf_sampled_if_due). */
static PyTypeObject *gf_sampled_call_type;

/* The calls in flight on this thread, innermost first. A call of a CallState already in flight
 * here comes from inside that call's own forward (the forward calls its GraphedForward again):
 * both entries return REENTERED, and the Python layer runs the module eagerly, as the forward
 * would run without graphed; through the core it would capture inside its own capture. A
 * thread-local flag in Python did this for about 0.15 us a call (a 2-core x86 host). */
typedef struct gf_call_frame {
  const gf_call_state *state;
  struct gf_call_frame *outer;
} gf_call_frame;
static _Thread_local gf_call_frame *gf_frames_here;

static int gf_in_flight_here(const gf_call_state *state) {
  for (const gf_call_frame *frame = gf_frames_here; frame != NULL; frame = frame->outer) {
    if (frame->state == state) {
      return 1;
    }
  }
  return 0;
}

/* -- CallState --------------------------------------------------------------------------- */

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
  return 0;
}

static int gf_call_state_clear(gf_call_state *state) {
  Py_CLEAR(state->tree);
  Py_CLEAR(state->key);
  Py_CLEAR(state->held);
  Py_CLEAR(state->error);
  Py_CLEAR(state->recorded);
  Py_CLEAR(state->rebuild);
  Py_CLEAR(state->last_key);
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
 * 1 and 2 also mark the runner's call (RunnerCall), so that the host reports GF_ERR_FORWARD or
 * GF_ERR_DEVICE_MEMORY and the core decides what it means (Note [The forward's own error],
 * ops/gf_capture.c). */
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
  if (kind < 0 || kind > 2) {
    PyErr_Format(PyExc_ValueError, "CallState.record_error: kind must be 0, 1 or 2, got %ld", kind);
    return NULL;
  }
  /* Out of device memory while capturing is not handed to the caller (the call runs eager,
   * which raises its own if it runs out too), and not kept: its traceback holds the failed
   * attempt's frames and their tensors, which the eager run needs the memory of. */
  if (kind != 2 && state->tree != Py_None && state->error != NULL) {
    Py_SETREF(state->error, Py_NewRef(args[0]));
  }
  if (kind != 0) {
    gf_fastcall_torch_mark_forward_error(state->runner_call, (int)kind);
  }
  Py_RETURN_NONE;
}

/* record_kept_state(): the forward now running changed no state besides its inputs and outputs
 * (graphed._phases: nothing put back, nothing it could not put back), so that the core may answer
 * the capturing call from this warm-up (Note [The first call from its last warm-up],
 * ops/gf_warm_up_answer.c). Outside a call it marks nothing. */
static PyObject *gf_call_state_record_kept_state(gf_call_state *state, PyObject *unused) {
  (void)unused;
  gf_fastcall_torch_mark_kept_state(state->runner_call);
  Py_RETURN_NONE;
}

/* phase: why the core runs the forward of the call in flight (GF_PHASE_*; eager outside one). */
static PyObject *gf_call_state_phase(gf_call_state *state, void *unused) {
  (void)unused;
  return PyLong_FromLong(gf_fastcall_torch_phase(state->runner_call));
}

static PyGetSetDef gf_call_state_getset[] = {
    {"phase", (getter)gf_call_state_phase, NULL,
     "why the core runs the forward of the call in flight: PHASE_EAGER, PHASE_PROBE, "
     "PHASE_WARMUP or PHASE_CAPTURE (PHASE_EAGER outside a call)",
     NULL},
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

/* verify(first, every): the calls of each graph both entries return as SampledCall from now on
 * (see gf_sampled_if_due); verify(0, 0) none. */
static PyObject *gf_call_state_verify(gf_call_state *state, PyObject *const *args,
                                      Py_ssize_t nargs) {
  if (nargs != 2) {
    PyErr_SetString(PyExc_TypeError, "CallState.verify(first: int, every: int)");
    return NULL;
  }
  const unsigned long long first = PyLong_AsUnsignedLongLong(args[0]);
  if (first == (unsigned long long)-1 && PyErr_Occurred()) {
    return NULL;
  }
  const unsigned long long every = PyLong_AsUnsignedLongLong(args[1]);
  if (every == (unsigned long long)-1 && PyErr_Occurred()) {
    return NULL;
  }
  state->verify_first = first;
  state->verify_every = every;
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

static PyMethodDef gf_call_state_methods[] = {
    {"watch", (PyCFunction)(void (*)(void))gf_call_state_watch, METH_FASTCALL,
     "watch(dicts, tensors, sequences): checked before each call from now on; a call returns "
     "CHANGED when a dict was mutated, a list's or set's items changed or a tensor's data moved"},
    {"unwatch", (PyCFunction)gf_call_state_unwatch, METH_NOARGS, "unwatch(): no check"},
    {"verify", (PyCFunction)(void (*)(void))gf_call_state_verify, METH_FASTCALL,
     "verify(first, every): each graph's first `first` calls and then one in `every` are "
     "returned as SampledCall(result, served), for verify mode to compare with eager"},
    {"watch_fired", (PyCFunction)gf_call_state_watch_fired, METH_NOARGS,
     "watch_fired() -> bool: whether the next call would return CHANGED"},
    {"record_error", (PyCFunction)(void (*)(void))gf_call_state_record_error, METH_FASTCALL,
     "record_error(exception, kind): the forward's exception, re-raised to the caller of the "
     "call; kind 1 (its own error) or 2 (out of device memory while capturing) marks the "
     "runner's call"},
    {"record_kept_state", (PyCFunction)gf_call_state_record_kept_state, METH_NOARGS,
     "record_kept_state(): the forward now running changed no state besides its inputs and "
     "outputs, so its outputs may answer the capturing call"},
    {"record_template", (PyCFunction)gf_call_state_record_template, METH_O,
     "record_template(template): the output template of the forward's latest run in the call"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject gf_call_state_type = {
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

/* -- outputs ----------------------------------------------------------------------------- */

/* The walked result a plain template holds (borrowed), or NULL for any other template: a plain
 * template is a 1-tuple (output_template), which no other kind of template is (graphed._tree's
 * are TreeSpecs). */
static PyObject *gf_walked_of_template(PyObject *template) {
  return PyTuple_CheckExact(template) && PyTuple_GET_SIZE(template) == 1
             ? PyTuple_GET_ITEM(template, 0)
             : NULL;
}

/* The output of a call from its template (see gf_call_in_flight.output_template). */
static PyObject *gf_outputs_of_call(gf_call_state *state, PyObject *template, PyObject *outputs) {
  if (template == NULL) {
    PyErr_SetString(PyExc_RuntimeError,
                    "graphed: the call has no output template: its forward recorded none");
    return NULL;
  }
  PyObject *walked = gf_walked_of_template(template);
  if (walked != NULL) {
    return gf_walk_rebuild(walked, gf_placeholder, outputs);
  }
  return PyObject_CallFunctionObjArgs(state->rebuild, template, outputs, NULL);
}

/* -- call: the fast path ----------------------------------------------------------------- */

/* Describes the keep-alive tensors (rare: a small heap array) and enters the runner. */
static gf_status gf_fast_call_runner(gf_walk *walk, int64_t runner_id, gf_call_in_flight *call,
                                     PyObject *keep_alive, int pin, int static_outputs,
                                     PyObject **outputs, gf_error *err) {
  Py_ssize_t held_count = PyList_GET_SIZE(keep_alive);
  gf_tensor *held = NULL;
  if (held_count > 0) {
    held = calloc((size_t)held_count, sizeof *held);
    if (held == NULL) {
      return gf_error_set(err, GF_ERR_NO_MEMORY, "graphed: out of memory for keep_alive");
    }
  }
  for (Py_ssize_t i = 0; i < held_count; ++i) {
    PyObject *item = PyList_GET_ITEM(keep_alive, i);
    PyObject *type = PyExc_TypeError;
    char reason[GF_WALK_REASON_CAPACITY] = "is not a tensor";
    if (!gf_fastcall_torch_is_tensor(item) ||
        gf_tensor_refused(item, &held[i], &type, reason, sizeof reason)) {
      free(held);
      return gf_error_set(err, type == PyExc_ValueError ? GF_ERR_INVALID_ARGUMENT : GF_ERR_TYPE,
                          "graphed: keep_alive[%zd] %s", i, reason);
    }
  }
  gf_calls_in_flight++;
  gf_status status = gf_fastcall_torch_call(runner_id, call, walk->key, walk->key_length,
                                            walk->tensors, walk->tensor_count, held,
                                            (size_t)held_count, pin, static_outputs, outputs, err);
  gf_calls_in_flight--;
  free(held);
  return status;
}

/* Ends either entry: raises for a failed status (the forward's own exception when it recorded
 * one, with its type and traceback), else rebuilds the output from the call's template; releases
 * the call's references and the outputs either way. */
/* A call verify mode compares with eager (graphed._verify): one a graph served (served > 0, the
 * capturing call included) within the first verify_first of that graph, or one in verify_every
 * after them; returned as SampledCall(result, served), and every other call as its result, so
 * that a call not sampled costs the caller one type test. Steals `rebuilt`. */
static PyObject *gf_sampled_if_due(const gf_call_state *state, unsigned long long served,
                                   PyObject *rebuilt) {
  const unsigned long long first = state->verify_first;
  if (served == 0 || (served > first &&
                      (state->verify_every == 0 || (served - first) % state->verify_every != 0))) {
    return rebuilt;
  }
  PyObject *sampled = PyStructSequence_New(gf_sampled_call_type);
  PyObject *count = PyLong_FromUnsignedLongLong(served);
  if (sampled == NULL || count == NULL) {
    Py_XDECREF(sampled);
    Py_XDECREF(count);
    Py_DECREF(rebuilt);
    return NULL;
  }
  PyStructSequence_SetItem(sampled, 0, rebuilt);
  PyStructSequence_SetItem(sampled, 1, count);
  return sampled;
}

static PyObject *gf_finish_call(gf_status status, const gf_error *err, gf_call_in_flight *call,
                                PyObject *outputs) {
  PyObject *rebuilt = NULL;
  if (status == GF_RUN_EAGER) {
    rebuilt = Py_NewRef(gf_run_eager);
  } else if (status != GF_OK && call->error != NULL) {
    PyErr_Clear();
    PyObject *error = call->error;
    PyErr_Restore(Py_NewRef((PyObject *)Py_TYPE(error)), Py_NewRef(error),
                  PyException_GetTraceback(error));
  } else if (status != GF_OK) {
    gf_fastcall_torch_raise(status, err);
  } else {
    rebuilt = gf_outputs_of_call(call->state, call->output_template, outputs);
    if (rebuilt != NULL) {
      rebuilt = gf_sampled_if_due(call->state, call->served, rebuilt);
    }
  }
  Py_XDECREF(outputs);
  Py_XDECREF(call->error);
  Py_XDECREF(call->output_template);
  Py_DECREF(call->key);
  return rebuilt;
}

/* Names the input an error is about by its kwarg path, in torch's words (an error path only). */
static void gf_name_input(int64_t runner_id, PyObject *kwargs, PyObject *tensor, gf_error *err) {
  PyObject *path = gf_walk_path_of_tensor(kwargs, err->input_number - 1);
  const char *subject = path != NULL ? PyUnicode_AsUTF8(path) : NULL;
  if (subject != NULL) {
    gf_fastcall_torch_word_input_error(runner_id, tensor, subject, err);
  }
  PyErr_Clear(); /* without a path the core's message stays */
  Py_XDECREF(path);
}

/* The key of a walk as bytes: the state's latest key when the walk gives the same bytes, so that
 * a serving loop's repeated key is not allocated and copied again. Since the hit no longer looks
 * up templates by key (each entry holds its own), this saves only the allocation: about 50
 * instructions a call at 32 inputs (callgrind), against about 2,500 when the key was hashed. */
static PyObject *gf_key_of_walk(gf_call_state *state, const gf_walk *walk) {
  PyObject *last = state->last_key;
  if (last != NULL && (size_t)PyBytes_GET_SIZE(last) == walk->key_length &&
      memcmp(PyBytes_AS_STRING(last), walk->key, walk->key_length) == 0) {
    return Py_NewRef(last);
  }
  PyObject *key = PyBytes_FromStringAndSize((const char *)walk->key, (Py_ssize_t)walk->key_length);
  if (key != NULL) {
    Py_XSETREF(state->last_key, Py_NewRef(key));
  }
  return key;
}

static PyObject *gf_fast_call_walked(gf_walk *walk, int64_t runner_id, gf_call_state *state,
                                     PyObject *kwargs, PyObject *variant, PyObject *keep_alive,
                                     PyObject *held, int pin, int static_outputs) {
  gf_walk_result result = gf_walk_kwargs(walk, kwargs, variant);
  if (result == GF_WALK_ERROR) {
    return NULL;
  }
  if (result == GF_WALK_UNSUPPORTED || walk->tensor_count == 0) {
    gf_walk_release(walk);
    return Py_NewRef(gf_fallback);
  }
  PyObject *key = gf_key_of_walk(state, walk);
  if (key == NULL) {
    gf_walk_release(walk);
    return NULL;
  }
  gf_call_in_flight call = {state, kwargs, key, held, NULL, NULL, 0};
  PyObject *outputs = NULL;
  gf_error err = {0};
  gf_status status =
      gf_fast_call_runner(walk, runner_id, &call, keep_alive, pin, static_outputs, &outputs, &err);
  if (status != GF_OK && err.input_number > 0 && err.input_number <= walk->tensor_count) {
    gf_name_input(runner_id, kwargs, walk->objects[err.input_number - 1], &err);
  }
  gf_walk_release(walk); /* the inputs' references, held for the whole call */
  return gf_finish_call(status, &err, &call, outputs);
}

/* The options both entries share; 0, or -1 with a Python error. */
static int gf_parse_options(PyObject *runner, PyObject *pin_flag, PyObject *static_flag,
                            int64_t *runner_id, int *pin, int *static_outputs) {
  long long id = PyLong_AsLongLong(runner);
  if (id == -1 && PyErr_Occurred()) {
    return -1;
  }
  *runner_id = (int64_t)id;
  *pin = PyObject_IsTrue(pin_flag);
  *static_outputs = PyObject_IsTrue(static_flag);
  return *pin < 0 || *static_outputs < 0 ? -1 : 0;
}

/* call(runner_id, kwargs, variant, pin, static_outputs, state, keep_alive, held) -> output |
 * FALLBACK, keep_alive a list of tensors the entry holds for its life (may be empty), held a tuple
 * of other objects the call's output template holds. */
static PyObject *gf_fast_call(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  (void)self;
  if (nargs != 8 || !PyDict_CheckExact(args[1]) || Py_TYPE(args[5]) != &gf_call_state_type ||
      !PyList_CheckExact(args[6]) || !PyTuple_CheckExact(args[7])) {
    PyErr_SetString(PyExc_TypeError,
                    "_graphed_fastcall.call(runner_id, kwargs, variant, pin, static_outputs, "
                    "state, keep_alive: list, held: tuple)");
    return NULL;
  }
  int64_t runner_id = 0;
  int pin = 0;
  int static_outputs = 0;
  if (gf_parse_options(args[0], args[3], args[4], &runner_id, &pin, &static_outputs) != 0) {
    return NULL;
  }
  gf_call_state *state = (gf_call_state *)args[5];
  if (gf_in_flight_here(state)) {
    return Py_NewRef(gf_reentered);
  }
  if (state->baked != NULL && gf_baked_changed(state->baked)) {
    return Py_NewRef(gf_changed);
  }
  gf_call_frame frame = {state, gf_frames_here};
  gf_frames_here = &frame;
  gf_walk nested = {0};
  gf_walk *walk = gf_calls_in_flight == 0 ? &gf_scratch : &nested;
  PyObject *rebuilt = gf_fast_call_walked(walk, runner_id, state, args[1], args[2], args[6],
                                          args[7], pin, static_outputs);
  gf_walk_free(&nested);
  gf_frames_here = frame.outer;
  return rebuilt;
}

/* -- call_flat: the Python path ---------------------------------------------------------- */

/* call_flat(runner_id, state, key, tensors, spec, keep_alive, pin, static_outputs, held) ->
 * output, the kwargs already flattened by graphed._tree (key a str, tensors and keep_alive lists,
 * held a tuple). */
static PyObject *gf_flat_call(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  (void)self;
  if (nargs != 9 || Py_TYPE(args[1]) != &gf_call_state_type || !PyUnicode_CheckExact(args[2]) ||
      !PyList_CheckExact(args[3]) || !PyList_CheckExact(args[5]) || !PyTuple_CheckExact(args[8])) {
    PyErr_SetString(PyExc_TypeError,
                    "_graphed_fastcall.call_flat(runner_id, state, key, tensors, spec, "
                    "keep_alive, pin, static_outputs, held)");
    return NULL;
  }
  int64_t runner_id = 0;
  int pin = 0;
  int static_outputs = 0;
  if (gf_parse_options(args[0], args[6], args[7], &runner_id, &pin, &static_outputs) != 0) {
    return NULL;
  }
  gf_call_state *state = (gf_call_state *)args[1];
  if (gf_in_flight_here(state)) {
    return Py_NewRef(gf_reentered);
  }
  PyObject *key = PyUnicode_AsEncodedString(args[2], "utf-8", "surrogatepass");
  if (key == NULL) {
    return NULL;
  }
  gf_call_frame frame = {state, gf_frames_here};
  gf_frames_here = &frame;
  gf_call_in_flight call = {state, args[4], key, args[8], NULL, NULL, 0};
  PyObject *outputs = NULL;
  gf_error err = {0};
  gf_status status = gf_fastcall_torch_call_dispatched(runner_id, &call, args[3], args[5], pin,
                                                       static_outputs, &outputs, &err);
  PyObject *rebuilt = gf_finish_call(status, &err, &call, outputs);
  gf_frames_here = frame.outer;
  return rebuilt;
}

/* -- control under the runner's lock ----------------------------------------------------- */

/* reset(runner_id): the runner's graphs dropped under its lock (waiting with the GIL released);
 * the core releases each entry's output template with it. */
static PyObject *gf_reset(PyObject *self, PyObject *runner) {
  (void)self;
  long long id = PyLong_AsLongLong(runner);
  if (id == -1 && PyErr_Occurred()) {
    return NULL;
  }
  gf_error err = {0};
  gf_status status = gf_fastcall_torch_reset((int64_t)id, &err);
  if (status != GF_OK) {
    return gf_fastcall_torch_raise(status, &err);
  }
  Py_RETURN_NONE;
}

/* refusal(tensor) -> None | (exception type, reason): the check every path makes of a tensor
 * (gf_tensor_refused), for the Python path's walk and keep_alive. */
static PyObject *gf_refusal(PyObject *self, PyObject *tensor) {
  (void)self;
  if (!gf_fastcall_torch_is_tensor(tensor)) {
    PyErr_SetString(PyExc_TypeError, "_graphed_fastcall.refusal(tensor)");
    return NULL;
  }
  gf_tensor described;
  PyObject *type = NULL;
  char reason[GF_WALK_REASON_CAPACITY];
  if (!gf_tensor_refused(tensor, &described, &type, reason, sizeof reason)) {
    Py_RETURN_NONE;
  }
  return Py_BuildValue("(Os)", type, reason);
}

/* decode(key, tensors) -> the kwargs of a fast-path key with tensors in its tensor slots. */
static PyObject *gf_decode(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  (void)self;
  if (nargs != 2 || !PyBytes_Check(args[0]) || !PyList_CheckExact(args[1])) {
    PyErr_SetString(PyExc_TypeError, "_graphed_fastcall.decode(key: bytes, tensors: list)");
    return NULL;
  }
  return gf_walk_decode((const unsigned char *)PyBytes_AS_STRING(args[0]),
                        (size_t)PyBytes_GET_SIZE(args[0]), args[1]);
}

/* -- the walker, for the forward operator and for tests -------------------------------- */

/* flatten(kwargs, variant) -> (key bytes, [tensors]) | FALLBACK: what `call` would hand the core.
 */
static PyObject *gf_flatten(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  (void)self;
  if (nargs != 2 || !PyDict_CheckExact(args[0])) {
    PyErr_SetString(PyExc_TypeError, "_graphed_fastcall.flatten(kwargs: dict, variant)");
    return NULL;
  }
  gf_walk walk = {0};
  PyObject *flat = NULL;
  gf_walk_result result = gf_walk_kwargs(&walk, args[0], args[1]);
  if (result == GF_WALK_UNSUPPORTED) {
    flat = Py_NewRef(gf_fallback);
  } else if (result == GF_WALK_OK) {
    PyObject *tensors = PyList_New((Py_ssize_t)walk.tensor_count);
    for (size_t i = 0; tensors != NULL && i < walk.tensor_count; ++i) {
      PyObject *tensor = gf_fastcall_torch_object_of(&walk.tensors[i]);
      if (tensor == NULL) {
        Py_CLEAR(tensors);
        break;
      }
      PyList_SET_ITEM(tensors, (Py_ssize_t)i, tensor);
    }
    if (tensors != NULL) {
      flat = Py_BuildValue("(y#N)", (const char *)walk.key, (Py_ssize_t)walk.key_length, tensors);
    }
  }
  gf_walk_free(&walk);
  return flat;
}

/* output_template(result) -> (template, [tensors]) for a plain result, else None. */
static PyObject *gf_output_template(PyObject *self, PyObject *result) {
  (void)self;
  PyObject *template = NULL;
  PyObject *tensors = NULL;
  switch (gf_walk_output_template(result, gf_placeholder, &template, &tensors)) {
  case GF_WALK_OK:
    return Py_BuildValue("((N)N)", template, tensors);
  case GF_WALK_UNSUPPORTED:
    Py_RETURN_NONE;
  default:
    return NULL;
  }
}

/* rebuild(template, outputs) -> the output a plain template (from output_template) stands for. */
static PyObject *gf_rebuild(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  (void)self;
  PyObject *walked = nargs == 2 ? gf_walked_of_template(args[0]) : NULL;
  if (walked == NULL || !PyList_CheckExact(args[1])) {
    PyErr_SetString(PyExc_TypeError,
                    "_graphed_fastcall.rebuild(template: a plain template, outputs: list)");
    return NULL;
  }
  return gf_walk_rebuild(walked, gf_placeholder, args[1]);
}

/* walked_of(template) -> the walked result a plain template holds, or None for any other. */
static PyObject *gf_walked_of(PyObject *self, PyObject *template) {
  (void)self;
  PyObject *walked = gf_walked_of_template(template);
  return Py_NewRef(walked != NULL ? walked : Py_None);
}

/* note_swap(): counts a swap of two tensors' contents, after which every watch fires once. */
static PyObject *gf_note_swap(PyObject *self, PyObject *unused) {
  (void)self;
  (void)unused;
  gf_baked_note_swap();
  Py_RETURN_NONE;
}

static PyMethodDef gf_fastcall_methods[] = {
    {"call", (PyCFunction)(void (*)(void))gf_fast_call, METH_FASTCALL,
     "call(runner_id, kwargs, variant, pin, static_outputs, state, keep_alive, held) -> output, "
     "FALLBACK, REENTERED, CHANGED or RUN_EAGER"},
    {"call_flat", (PyCFunction)(void (*)(void))gf_flat_call, METH_FASTCALL,
     "call_flat(runner_id, state, key, tensors, spec, keep_alive, pin, static_outputs, held) -> "
     "output or REENTERED"},
    {"reset", (PyCFunction)gf_reset, METH_O,
     "reset(runner_id): drops the graphs (and their output templates) under the runner's lock"},
    {"refusal", gf_refusal, METH_O,
     "refusal(tensor) -> None when graphed takes it, else (TypeError or ValueError, the end of a "
     "sentence saying why)"},
    {"decode", (PyCFunction)(void (*)(void))gf_decode, METH_FASTCALL,
     "decode(key, tensors) -> the kwargs a fast-path key stands for"},
    {"flatten", (PyCFunction)(void (*)(void))gf_flatten, METH_FASTCALL,
     "flatten(kwargs, variant) -> (key bytes, [tensors]) or FALLBACK: the walk of `call`"},
    {"output_template", (PyCFunction)gf_output_template, METH_O,
     "output_template(result) -> (template, [tensors]) for a plain result, else None"},
    {"walked_of", gf_walked_of, METH_O,
     "walked_of(template) -> the walked result a plain template holds, or None for any other"},
    {"rebuild", (PyCFunction)(void (*)(void))gf_rebuild, METH_FASTCALL,
     "rebuild(template, outputs) -> the output a plain template stands for"},
    {"note_swap", gf_note_swap, METH_NOARGS,
     "note_swap(): counts a swap of two tensors' contents (torch.utils.swap_tensors), after which "
     "every watch fires once"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef gf_fastcall_module = {
    PyModuleDef_HEAD_INIT,
    "_graphed_fastcall",
    "The CPython entry points of GraphedForward and its walker of plain trees (see "
    "gf_fastcall.c).",
    -1,
    gf_fastcall_methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

static PyStructSequence_Field gf_sampled_call_fields[] = {
    {"result", "what the call returns"},
    {"served", "how many calls the graph that served it has served, this one included"},
    {NULL, NULL},
};

static PyStructSequence_Desc gf_sampled_call_desc = {
    "_graphed_fastcall.SampledCall",
    "A call verify mode compares with eager (graphed._verify): its result and the count of the "
    "graph's calls.",
    gf_sampled_call_fields,
    2,
};

PyMODINIT_FUNC PyInit__graphed_fastcall(void) {
  if (PyType_Ready(&gf_call_state_type) != 0) {
    return NULL;
  }
  if (gf_sampled_call_type == NULL) {
    gf_sampled_call_type = PyStructSequence_NewType(&gf_sampled_call_desc);
    if (gf_sampled_call_type == NULL) {
      return NULL;
    }
  }
  PyObject *module = PyModule_Create(&gf_fastcall_module);
  if (module == NULL) {
    return NULL;
  }
  gf_fallback = PyObject_CallNoArgs((PyObject *)&PyBaseObject_Type);
  gf_reentered = PyObject_CallNoArgs((PyObject *)&PyBaseObject_Type);
  gf_changed = PyObject_CallNoArgs((PyObject *)&PyBaseObject_Type);
  gf_run_eager = PyObject_CallNoArgs((PyObject *)&PyBaseObject_Type);
  gf_placeholder = PyObject_CallNoArgs((PyObject *)&PyBaseObject_Type);
  if (gf_fallback == NULL || gf_reentered == NULL || gf_changed == NULL || gf_run_eager == NULL ||
      gf_placeholder == NULL || gf_baked_init() != 0 ||
      PyModule_AddObjectRef(module, "CHANGED", gf_changed) != 0 ||
      PyModule_AddObjectRef(module, "RUN_EAGER", gf_run_eager) != 0 ||
      PyModule_AddObjectRef(module, "FALLBACK", gf_fallback) != 0 ||
      PyModule_AddObjectRef(module, "REENTERED", gf_reentered) != 0 ||
      PyModule_AddObjectRef(module, "PLACEHOLDER", gf_placeholder) != 0 ||
      PyModule_AddObjectRef(module, "CallState", (PyObject *)&gf_call_state_type) != 0 ||
      PyModule_AddObjectRef(module, "SampledCall", (PyObject *)gf_sampled_call_type) != 0 ||
      /* The core's numbers and the probe's warning text Python reads, named once in C
       * (graphed._forward, graphed._phases). */
      PyModule_AddIntConstant(module, "MAX_DIMS", GF_MAX_DIMS) != 0 ||
      PyModule_AddIntConstant(module, "CHURN_LIMIT", GF_CHURN_DEFAULT) != 0 ||
      PyModule_AddIntConstant(module, "PHASE_EAGER", GF_PHASE_EAGER) != 0 ||
      PyModule_AddIntConstant(module, "PHASE_PROBE", GF_PHASE_PROBE) != 0 ||
      PyModule_AddIntConstant(module, "PHASE_WARMUP", GF_PHASE_WARMUP) != 0 ||
      PyModule_AddIntConstant(module, "PHASE_CAPTURE", GF_PHASE_CAPTURE) != 0 ||
      PyModule_AddStringConstant(module, "SYNC_WARNING", GF_SYNC_WARNING) != 0) {
    Py_DECREF(module);
    return NULL;
  }
  gf_fastcall_torch_install_interpreter_lock();
  gf_fastcall_torch_install_template_release();
  return module;
}
