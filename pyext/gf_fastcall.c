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
 * A new key the core holds back (the churn guard's or an out-of-memory back-off's) comes back from
 * `call` as the RUN_EAGER object, and GraphedForward runs the module itself through its one eager
 * route (graphed._eager): through the core's forward such a call cost about 60 us more than eager
 * on the H200's host, most of a storm's overhead (gf_call_options.eager_by_caller).
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
#include "gf_inventory_reads.h"
#include "gf_model_hooks.h"
#include "gf_runner.h"
#include "gf_sync_warning.h"
#include "gf_tensor.h"
#include "gf_verify_compare.h"
#include "gf_verify_sampled.h"
#include "gf_walker.h"
#include "gf_walker_module.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Reused across calls (the GIL serialises them); a call made from inside a forward that graphed
 * is capturing or running eagerly gets a walk of its own. */
static gf_walk gf_scratch;
static int gf_calls_in_flight;
static PyObject *gf_reentered; /* returned for a call from inside its own forward */
static PyObject *gf_changed;   /* returned when the state's watch fired (see gf_baked.h) */
PyObject *gf_run_eager;        /* returned for a new key the core holds back (GF_RUN_EAGER) */
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

/* -- outputs ----------------------------------------------------------------------------- */

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
 * one, with its type and traceback), else rebuilds the output from the call's template, *served
 * the count of calls of the graph that served it (0: eager); releases the call's references and
 * the outputs either way. */
static PyObject *gf_finish_call(gf_status status, const gf_error *err, gf_call_in_flight *call,
                                PyObject *outputs, unsigned long long *served) {
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
    *served = call->served; /* for the verify queue (gf_verify_sampled.h) */
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
                                     PyObject *held, int pin, int static_outputs,
                                     unsigned long long *served) {
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
  return gf_finish_call(status, &err, &call, outputs, served);
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

/* Note [What the entries return]
 * Q: What can `call` and `call_flat` return, and who handles each?
 * A: Six kinds, each a distinct object so that GraphedForward.__call__ tells them apart by
 *    identity or type (graphed._forward), in this order of checks:
 *    - the call's output (fresh tensors in the structure the forward returned): a replay, a
 *      capture, or an eager run the core made (a capture that failed, an outer capture);
 *    - FALLBACK (`call` only): the kwargs are not a plain tree the walker takes; the caller
 *      flattens them with graphed._tree and enters through `call_flat`;
 *    - CHANGED (`call` only): the watch fired before anything ran (gf_baked.h); the caller lets
 *      graphed._watch's Watch compare and calls again;
 *    - RUN_EAGER (`call` only): a new key the core holds back, counted as an eager call; the
 *      caller runs it through its one eager route (graphed._eager, HELD_BACK);
 *    - REENTERED: the call comes from inside this runner's own forward on this thread; the caller
 *      runs it eagerly (graphed._eager, REENTERED);
 *    - Differed: a call verify mode compared with eager, or an earlier one whose verdict was
 *      read now, differed (pyext/gf_verify_sampled.h); graphed._verify reports it, disables the
 *      runner and answers with eager's result.
 *    An error is raised as a Python exception: the forward's own, or graphed's naming the kwarg
 *    path. */

/* call(runner_id, kwargs, variant, pin, static_outputs, state, keep_alive, held) -> one of Note
 * [What the entries return], keep_alive a list of tensors the entry holds for its life (may be
 * empty), held a tuple of other objects the call's output template holds. */
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
  unsigned long long served = 0;
  PyObject *rebuilt = gf_fast_call_walked(walk, runner_id, state, args[1], args[2], args[6],
                                          args[7], pin, static_outputs, &served);
  gf_walk_free(&nested);
  gf_frames_here = frame.outer;
  if (rebuilt != NULL && served != 0) {
    return gf_verify_sampled(state, args[1], rebuilt, served);
  }
  return rebuilt;
}

/* -- call_flat: the Python path ---------------------------------------------------------- */

/* call_flat(runner_id, state, key, tensors, spec, keep_alive, pin, static_outputs, held, kwargs)
 * -> the output, REENTERED or a Differed (Note [What the entries return]), the kwargs already
 * flattened by graphed._tree (key a str, tensors and keep_alive lists, held a tuple; kwargs
 * themselves for verify mode's eager run). */
static PyObject *gf_flat_call(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  (void)self;
  if (nargs != 10 || Py_TYPE(args[1]) != &gf_call_state_type || !PyUnicode_CheckExact(args[2]) ||
      !PyList_CheckExact(args[3]) || !PyList_CheckExact(args[5]) || !PyTuple_CheckExact(args[8]) ||
      !PyDict_Check(args[9])) {
    PyErr_SetString(PyExc_TypeError,
                    "_graphed_fastcall.call_flat(runner_id, state, key, tensors, spec, "
                    "keep_alive, pin, static_outputs, held, kwargs: dict)");
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
  unsigned long long served = 0;
  PyObject *rebuilt = gf_finish_call(status, &err, &call, outputs, &served);
  gf_frames_here = frame.outer;
  if (rebuilt != NULL && served != 0) {
    return gf_verify_sampled(state, args[9], rebuilt, served);
  }
  return rebuilt;
}

/* -- control under the runner's lock ----------------------------------------------------- */

/* reset(runner_id): the runner's graphs dropped under its lock (waiting with the GIL released);
 * the core releases each entry's output template with it. */
static PyObject *gf_reset(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  (void)self;
  if (nargs != 2) {
    PyErr_SetString(PyExc_TypeError, "reset(runner_id, restart_churn)");
    return NULL;
  }
  long long id = PyLong_AsLongLong(args[0]);
  if (id == -1 && PyErr_Occurred()) {
    return NULL;
  }
  const int restart_churn = PyObject_IsTrue(args[1]);
  if (restart_churn < 0) {
    return NULL;
  }
  gf_error err = {0};
  int at_limit = 0;
  gf_status status = gf_fastcall_torch_reset((int64_t)id, restart_churn, &at_limit, &err);
  if (status != GF_OK) {
    return gf_fastcall_torch_raise(status, &err);
  }
  return PyBool_FromLong(at_limit);
}

/* select_state(runner_id, state, first_time) -> at_limit: graphed._watch's States
 * (gf_runner_select_state). */
static PyObject *gf_select_state(PyObject *self, PyObject *args) {
  (void)self;
  long long id = 0;
  unsigned long long state = 0;
  int first_time = 0;
  gf_error err = {0};
  if (!PyArg_ParseTuple(args, "LKp:select_state", &id, &state, &first_time)) {
    return NULL;
  }
  int at_limit = 0;
  gf_status status =
      gf_fastcall_torch_select_state((int64_t)id, state, first_time, &at_limit, &err);
  return status == GF_OK ? PyBool_FromLong(at_limit) : gf_fastcall_torch_raise(status, &err);
}

/* attach(runner_id, state, forward, observer): gives a runner made with no forward operator its
 * forward and its observer as direct hooks (Note [The direct forward], gf_model_hooks.cpp). */
static PyObject *gf_attach(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  (void)self;
  if (nargs != 4 || Py_TYPE(args[1]) != &gf_call_state_type || !PyCallable_Check(args[2]) ||
      (args[3] != Py_None && !PyCallable_Check(args[3]))) {
    PyErr_SetString(PyExc_TypeError, "attach(runner_id, state: CallState, forward: callable, "
                                     "observer: callable or None)");
    return NULL;
  }
  long long id = PyLong_AsLongLong(args[0]);
  if (id == -1 && PyErr_Occurred()) {
    return NULL;
  }
  gf_error err = {0};
  gf_status status =
      gf_model_hooks_attach((int64_t)id, (gf_call_state *)args[1], args[2], args[3], &err);
  if (status != GF_OK) {
    return gf_fastcall_torch_raise(status, &err);
  }
  Py_RETURN_NONE;
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
    {"attach", (PyCFunction)(void (*)(void))gf_attach, METH_FASTCALL,
     "attach(runner_id, state, forward, observer): the runner's forward and observer as direct "
     "hooks (a runner made with no forward operator)"},
    {"select_state", (PyCFunction)gf_select_state, METH_VARARGS,
     "select_state(runner_id, state, first_time): the state of what the graphs read its calls "
     "are keyed in from now on; the graphs of other states stay resident. True, having selected "
     "nothing, where a state new to them would be the last of RECAPTURE_LIMIT drops in a row"},
    {"reset", (PyCFunction)(void (*)(void))gf_reset, METH_FASTCALL,
     "reset(runner_id, restart_churn): drops the graphs (and their output templates) under the "
     "runner's lock; the churn guard starts afresh only when restart_churn. Without it (a "
     "watch's drop), True, having dropped nothing, where it would be the last of "
     "RECAPTURE_LIMIT drops in a row"},
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

PyMODINIT_FUNC PyInit__graphed_fastcall(void) {
  if (PyType_Ready(&gf_call_state_type) != 0) {
    return NULL;
  }
  PyObject *module = PyModule_Create(&gf_fastcall_module);
  if (module == NULL) {
    return NULL;
  }
  gf_reentered = PyObject_CallNoArgs((PyObject *)&PyBaseObject_Type);
  gf_changed = PyObject_CallNoArgs((PyObject *)&PyBaseObject_Type);
  gf_run_eager = PyObject_CallNoArgs((PyObject *)&PyBaseObject_Type);
  if (gf_walker_module_init(module) != 0 || gf_verify_compare_init(module) != 0 ||
      gf_verify_sampled_init(module) != 0 || gf_inventory_reads_init(module) != 0 ||
      gf_reentered == NULL || gf_changed == NULL || gf_run_eager == NULL || gf_baked_init() != 0 ||
      PyModule_AddObjectRef(module, "CHANGED", gf_changed) != 0 ||
      PyModule_AddObjectRef(module, "RUN_EAGER", gf_run_eager) != 0 ||
      PyModule_AddObjectRef(module, "REENTERED", gf_reentered) != 0 ||
      PyModule_AddObjectRef(module, "CallState", (PyObject *)&gf_call_state_type) != 0 ||
      /* The core's numbers and the probe's warning text Python reads, named once in C
       * (graphed._forward, graphed._phases). */
      PyModule_AddIntConstant(module, "MAX_DIMS", GF_MAX_DIMS) != 0 ||
      PyModule_AddIntConstant(module, "CHURN_LIMIT", GF_CHURN_DEFAULT) != 0 ||
      PyModule_AddIntConstant(module, "RECAPTURE_LIMIT", GF_STALE_LIMIT) != 0 ||
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
