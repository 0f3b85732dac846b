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
 * The call in flight is a CallState (pyext/gf_call_state.h), one per GraphedForward, which both
 * entries set while they hold the runner's lock (pyext/gf_fastcall_torch.cpp):
 *   tree       the kwargs dict (`call`) or TreeSpec (`call_flat`) of the call in flight, or None
 *   key        the key of that call, as bytes
 *   shapes     the dtype, device and shape of each of its inputs, as bytes (gf_walk_shapes)
 *   held       its non-tensor keep_alive objects (a tuple)
 *   error      the exception its forward raised, recorded by the forward operator, or None
 *   templates  dict: key bytes -> {shapes bytes -> (output template, held)}, recorded by the
 *              forward operator: a 1-tuple template (the result with PLACEHOLDER in each tensor
 *              slot) for a plain result, which this module rebuilds, or anything else, rebuilt
 *              by calling
 *   rebuild    (given to the constructor) rebuild(template, outputs).
 * Templates are keyed by the whole signature (key and shapes), as the core keys its graphs, so an
 * output whose structure depends on a shape (x.unbind(0)) gets one template per shape; they go
 * with the graphs: reset clears both under the runner's lock, and `prune` drops the templates of
 * entries the cache no longer holds.
 *
 * The fast path holds a strong reference to each input tensor object for the whole call (the
 * walk's `objects`), and a forward the core runs gets kwargs decoded from the key bytes, never
 * read again from the caller's containers: a forward (or another thread) that replaces a tensor
 * in a dict the caller passed cannot free the memory the replay copies from, nor change what the
 * warm-ups and the capture see. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include "gf_call_state.h"
#include "gf_fastcall_torch.h"
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
static PyObject *gf_placeholder; /* a tensor slot in an output template */

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
  state->shapes = PyBytes_FromStringAndSize(NULL, 0);
  state->held = PyTuple_New(0);
  state->error = Py_NewRef(Py_None);
  state->templates = PyDict_New();
  state->rebuild = Py_NewRef(rebuild);
  if (state->key == NULL || state->shapes == NULL || state->held == NULL ||
      state->templates == NULL) {
    Py_DECREF(state);
    return NULL;
  }
  return (PyObject *)state;
}

static int gf_call_state_traverse(gf_call_state *state, visitproc visit, void *arg) {
  Py_VISIT(state->tree);
  Py_VISIT(state->key);
  Py_VISIT(state->shapes);
  Py_VISIT(state->held);
  Py_VISIT(state->error);
  Py_VISIT(state->templates);
  Py_VISIT(state->rebuild);
  Py_VISIT(state->last_key);
  return 0;
}

static int gf_call_state_clear(gf_call_state *state) {
  Py_CLEAR(state->tree);
  Py_CLEAR(state->key);
  Py_CLEAR(state->shapes);
  Py_CLEAR(state->held);
  Py_CLEAR(state->error);
  Py_CLEAR(state->templates);
  Py_CLEAR(state->rebuild);
  Py_CLEAR(state->last_key);
  return 0;
}

static void gf_call_state_dealloc(gf_call_state *state) {
  PyObject_GC_UnTrack(state);
  gf_call_state_clear(state);
  Py_TYPE(state)->tp_free((PyObject *)state);
}

static PyMemberDef gf_call_state_members[] = {
    {"tree", T_OBJECT, offsetof(gf_call_state, tree), READONLY,
     "the kwargs dict or TreeSpec of the call in flight, or None"},
    {"key", T_OBJECT, offsetof(gf_call_state, key), READONLY,
     "the key of the call in flight, as bytes"},
    {"shapes", T_OBJECT, offsetof(gf_call_state, shapes), READONLY,
     "the dtype, device and shape of each input of the call in flight, as bytes"},
    {"held", T_OBJECT, offsetof(gf_call_state, held), READONLY,
     "the non-tensor keep_alive objects of the call in flight"},
    {"error", T_OBJECT, offsetof(gf_call_state, error), READONLY,
     "the exception the forward raised during the call in flight, or None"},
    {"templates", T_OBJECT, offsetof(gf_call_state, templates), READONLY,
     "dict: key bytes -> {shapes bytes -> (output template, held)}"},
    {NULL, 0, 0, 0, NULL},
};

/* record_error(exception): the forward's exception, handed to the caller of the call in flight
 * (outside a call it is ignored). */
static PyObject *gf_call_state_record_error(gf_call_state *state, PyObject *error) {
  if (state->tree != Py_None && state->error != NULL) {
    Py_SETREF(state->error, Py_NewRef(error));
  }
  Py_RETURN_NONE;
}

/* set_shapes(bytes): the input shapes of the call in flight, when its entry point left them to be
 * computed by the forward that needs them (see gf_shapes_if_needed). */
static PyObject *gf_call_state_set_shapes(gf_call_state *state, PyObject *shapes) {
  if (!PyBytes_CheckExact(shapes)) {
    PyErr_SetString(PyExc_TypeError, "CallState.set_shapes(bytes)");
    return NULL;
  }
  if (state->shapes != NULL) {
    Py_SETREF(state->shapes, Py_NewRef(shapes));
  }
  Py_RETURN_NONE;
}

static PyMethodDef gf_call_state_methods[] = {
    {"record_error", (PyCFunction)gf_call_state_record_error, METH_O,
     "record_error(exception): the forward's exception, re-raised to the caller of the call"},
    {"set_shapes", (PyCFunction)gf_call_state_set_shapes, METH_O,
     "set_shapes(bytes): the input shapes of the call in flight, computed by its forward"},
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
    .tp_methods = gf_call_state_methods,
};

/* -- outputs ----------------------------------------------------------------------------- */

/* The output of a call from its recorded template. */
static PyObject *gf_outputs_of_call(gf_call_state *state, PyObject *key, PyObject *shapes,
                                    PyObject *outputs) {
  PyObject *by_shapes = PyDict_GetItemWithError(state->templates, key);
  PyObject *entry = NULL;
  if (by_shapes != NULL && PyDict_CheckExact(by_shapes)) {
    Py_ssize_t position = 0;
    PyObject *only_shapes = NULL;
    if (shapes == Py_None && PyDict_GET_SIZE(by_shapes) == 1) {
      PyDict_Next(by_shapes, &position, &only_shapes, &entry); /* the key's one template */
    } else {
      entry = PyDict_GetItemWithError(by_shapes, shapes);
    }
  }
  if (entry == NULL || !PyTuple_CheckExact(entry) || PyTuple_GET_SIZE(entry) != 2) {
    if (!PyErr_Occurred()) {
      PyErr_SetString(PyExc_RuntimeError,
                      "graphed: no output template for this call (a graph outlived its template; "
                      "please report this; reset() recovers)");
    }
    return NULL;
  }
  PyObject *template = PyTuple_GET_ITEM(entry, 0);
  if (PyTuple_CheckExact(template) && PyTuple_GET_SIZE(template) == 1) {
    return gf_walk_rebuild(PyTuple_GET_ITEM(template, 0), gf_placeholder, outputs);
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
    const char *why = "is not a tensor";
    int described = gf_fastcall_torch_is_tensor(item)
                        ? gf_fastcall_torch_describe(item, &held[i], &why)
                        : GF_DESCRIBE_UNSUPPORTED;
    if (described != GF_DESCRIBE_OK) {
      int ndim = (int)held[i].ndim;
      free(held);
      if (described == GF_DESCRIBE_TOO_MANY_DIMS) {
        return gf_error_set(err, GF_ERR_INVALID_ARGUMENT,
                            "graphed: keep_alive[%zd] has %d dimensions; at most %d are supported",
                            i, ndim, (int)GF_MAX_DIMS);
      }
      return gf_error_set(err, GF_ERR_TYPE, "graphed: keep_alive[%zd] %s", i, why);
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
static PyObject *gf_finish_call(gf_status status, const gf_error *err, gf_call_in_flight *call,
                                PyObject *outputs) {
  PyObject *rebuilt = NULL;
  if (status != GF_OK && call->error != NULL) {
    PyErr_Clear();
    PyObject *error = call->error;
    PyErr_Restore(Py_NewRef((PyObject *)Py_TYPE(error)), Py_NewRef(error),
                  PyException_GetTraceback(error));
  } else if (status != GF_OK) {
    gf_fastcall_torch_raise(status, err);
  } else {
    rebuilt = gf_outputs_of_call(call->state, call->key, call->shapes, outputs);
  }
  Py_XDECREF(outputs);
  Py_XDECREF(call->error);
  Py_DECREF(call->key);
  Py_XDECREF(call->shapes);
  return rebuilt;
}

/* The shapes bytes of the call's inputs, or None when they are not needed: the key has exactly
 * one output template, which is then the call's (a hit replays an entry whose template was kept,
 * and a forward that records another for new shapes makes two). Building and hashing the shapes
 * on every hit was a per-tensor host cost (about 0.7 us a call at 64 inputs on an H200 host). */
static PyObject *gf_shapes_if_needed(gf_call_state *state, PyObject *key, const gf_walk *walk) {
  PyObject *by_shapes = PyDict_GetItemWithError(state->templates, key);
  if (by_shapes != NULL && PyDict_CheckExact(by_shapes) && PyDict_GET_SIZE(by_shapes) == 1) {
    return Py_NewRef(Py_None);
  }
  if (PyErr_Occurred()) {
    return NULL;
  }
  return gf_walk_shapes(walk->tensors, walk->tensor_count);
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
 * a serving loop's repeated key is neither copied nor hashed again for the template lookups
 * (hashing a new 780-byte key at 64 inputs was about 2,500 instructions a call). */
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
  PyObject *shapes = key != NULL ? gf_shapes_if_needed(state, key, walk) : NULL;
  if (shapes == NULL) {
    Py_XDECREF(key);
    gf_walk_release(walk);
    return NULL;
  }
  gf_call_in_flight call = {state, kwargs, key, shapes, held, NULL};
  PyObject *outputs = NULL;
  gf_error err = {0};
  gf_status status =
      gf_fast_call_runner(walk, runner_id, &call, keep_alive, pin, static_outputs, &outputs, &err);
  if (call.shapes == Py_None && status == GF_OK) {
    /* A forward of this call may have recorded a second template for the key. */
    PyObject *needed = gf_shapes_if_needed(state, key, walk);
    if (needed == NULL) {
      status = gf_error_set(&err, GF_ERR_NO_MEMORY, "graphed: out of memory for the shapes");
    } else {
      Py_SETREF(call.shapes, needed);
    }
  }
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

/* The shapes bytes of a list of tensors (subclasses included); b"?" when one has symbolic sizes,
 * so that such calls share one template per key, as before shapes were part of it. */
static PyObject *gf_shapes_of_list(PyObject *tensors) {
  Py_ssize_t count = PyList_GET_SIZE(tensors);
  gf_tensor *shapes = calloc((size_t)(count > 0 ? count : 1), sizeof *shapes);
  if (shapes == NULL) {
    return PyErr_NoMemory();
  }
  PyObject *bytes = NULL;
  for (Py_ssize_t i = 0; i < count; ++i) {
    PyObject *item = PyList_GET_ITEM(tensors, i);
    if (!gf_fastcall_torch_is_tensor(item) || gf_fastcall_torch_shape_of(item, &shapes[i]) != 0) {
      bytes = PyBytes_FromString("?");
      break;
    }
  }
  if (bytes == NULL && !PyErr_Occurred()) {
    bytes = gf_walk_shapes(shapes, (size_t)count);
  }
  free(shapes);
  return bytes;
}

static PyObject *gf_shapes_of_list_checked(PyObject *self, PyObject *tensors) {
  (void)self;
  if (!PyList_CheckExact(tensors)) {
    PyErr_SetString(PyExc_TypeError, "_graphed_fastcall.shapes_of(tensors: list)");
    return NULL;
  }
  return gf_shapes_of_list(tensors);
}

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
  PyObject *shapes = key != NULL ? gf_shapes_of_list(args[3]) : NULL;
  if (shapes == NULL) {
    Py_XDECREF(key);
    return NULL;
  }
  gf_call_frame frame = {state, gf_frames_here};
  gf_frames_here = &frame;
  gf_call_in_flight call = {state, args[4], key, shapes, args[8], NULL};
  PyObject *outputs = NULL;
  gf_error err = {0};
  gf_status status = gf_fastcall_torch_call_dispatched(runner_id, &call, args[3], args[5], pin,
                                                       static_outputs, &outputs, &err);
  PyObject *rebuilt = gf_finish_call(status, &err, &call, outputs);
  gf_frames_here = frame.outer;
  return rebuilt;
}

/* -- control under the runner's lock ----------------------------------------------------- */

static PyObject *gf_state_op(PyObject *const *args, Py_ssize_t nargs, const char *usage,
                             gf_status (*op)(int64_t, gf_call_state *, gf_error *)) {
  if (nargs != 2 || Py_TYPE(args[1]) != &gf_call_state_type) {
    PyErr_SetString(PyExc_TypeError, usage);
    return NULL;
  }
  long long id = PyLong_AsLongLong(args[0]);
  if (id == -1 && PyErr_Occurred()) {
    return NULL;
  }
  gf_error err = {0};
  gf_status status = op((int64_t)id, (gf_call_state *)args[1], &err);
  if (status != GF_OK) {
    return gf_fastcall_torch_raise(status, &err);
  }
  Py_RETURN_NONE;
}

/* reset(runner_id, state): the runner's graphs and the state's templates, dropped together. */
static PyObject *gf_reset(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  (void)self;
  return gf_state_op(args, nargs, "_graphed_fastcall.reset(runner_id, state)",
                     gf_fastcall_torch_reset);
}

/* prune(runner_id, state): drops the templates of entries the cache no longer holds. */
static PyObject *gf_prune(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  (void)self;
  return gf_state_op(args, nargs, "_graphed_fastcall.prune(runner_id, state)",
                     gf_fastcall_torch_prune);
}

/* mark_forward_error(): the forward running in this thread raised an error of its own. */
static PyObject *gf_mark_forward_error(PyObject *self, PyObject *unused) {
  (void)self;
  (void)unused;
  gf_fastcall_torch_mark_forward_error();
  Py_RETURN_NONE;
}

/* unsupported_reason(tensor) -> str | None: why the core cannot take this tensor. */
static PyObject *gf_unsupported_reason(PyObject *self, PyObject *tensor) {
  (void)self;
  if (!gf_fastcall_torch_is_tensor(tensor)) {
    PyErr_SetString(PyExc_TypeError, "_graphed_fastcall.unsupported_reason(tensor)");
    return NULL;
  }
  const char *why = gf_fastcall_torch_unsupported_reason(tensor);
  if (why == NULL) {
    Py_RETURN_NONE;
  }
  return PyUnicode_FromString(why);
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
  if (nargs != 2 || !PyTuple_CheckExact(args[0]) || PyTuple_GET_SIZE(args[0]) != 1 ||
      !PyList_CheckExact(args[1])) {
    PyErr_SetString(PyExc_TypeError, "_graphed_fastcall.rebuild(template: 1-tuple, outputs: list)");
    return NULL;
  }
  return gf_walk_rebuild(PyTuple_GET_ITEM(args[0], 0), gf_placeholder, args[1]);
}

static PyMethodDef gf_fastcall_methods[] = {
    {"call", (PyCFunction)(void (*)(void))gf_fast_call, METH_FASTCALL,
     "call(runner_id, kwargs, variant, pin, static_outputs, state, keep_alive, held) -> output, "
     "FALLBACK or REENTERED"},
    {"call_flat", (PyCFunction)(void (*)(void))gf_flat_call, METH_FASTCALL,
     "call_flat(runner_id, state, key, tensors, spec, keep_alive, pin, static_outputs, held) -> "
     "output or REENTERED"},
    {"reset", (PyCFunction)(void (*)(void))gf_reset, METH_FASTCALL,
     "reset(runner_id, state): drops the graphs and the templates under the runner's lock"},
    {"prune", (PyCFunction)(void (*)(void))gf_prune, METH_FASTCALL,
     "prune(runner_id, state): drops the templates of entries the cache no longer holds"},
    {"shapes_of", (PyCFunction)gf_shapes_of_list_checked, METH_O,
     "shapes_of(tensors: list) -> bytes: the shapes key of a call's input tensors"},
    {"mark_forward_error", gf_mark_forward_error, METH_NOARGS,
     "mark_forward_error(): the running forward raised an error of its own"},
    {"unsupported_reason", gf_unsupported_reason, METH_O,
     "unsupported_reason(tensor) -> why the core cannot take it, or None"},
    {"decode", (PyCFunction)(void (*)(void))gf_decode, METH_FASTCALL,
     "decode(key, tensors) -> the kwargs a fast-path key stands for"},
    {"flatten", (PyCFunction)(void (*)(void))gf_flatten, METH_FASTCALL,
     "flatten(kwargs, variant) -> (key bytes, [tensors]) or FALLBACK: the walk of `call`"},
    {"output_template", (PyCFunction)gf_output_template, METH_O,
     "output_template(result) -> (template, [tensors]) for a plain result, else None"},
    {"rebuild", (PyCFunction)(void (*)(void))gf_rebuild, METH_FASTCALL,
     "rebuild(template, outputs) -> the output a plain template stands for"},
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

PyMODINIT_FUNC PyInit__graphed_fastcall(void) {
  if (PyType_Ready(&gf_call_state_type) != 0) {
    return NULL;
  }
  PyObject *module = PyModule_Create(&gf_fastcall_module);
  if (module == NULL) {
    return NULL;
  }
  gf_fallback = PyObject_CallNoArgs((PyObject *)&PyBaseObject_Type);
  gf_reentered = PyObject_CallNoArgs((PyObject *)&PyBaseObject_Type);
  gf_placeholder = PyObject_CallNoArgs((PyObject *)&PyBaseObject_Type);
  if (gf_fallback == NULL || gf_reentered == NULL || gf_placeholder == NULL ||
      PyModule_AddObjectRef(module, "FALLBACK", gf_fallback) != 0 ||
      PyModule_AddObjectRef(module, "REENTERED", gf_reentered) != 0 ||
      PyModule_AddObjectRef(module, "PLACEHOLDER", gf_placeholder) != 0 ||
      PyModule_AddObjectRef(module, "CallState", (PyObject *)&gf_call_state_type) != 0) {
    Py_DECREF(module);
    return NULL;
  }
  gf_fastcall_torch_install_interpreter_lock();
  return module;
}
