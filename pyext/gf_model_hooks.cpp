// A GraphedForward's forward and observer as direct hooks of its runner's host (see
// gf_model_hooks.h and the Note below).
//
// Note [The direct forward]
// Q: How does the core run a GraphedForward's module for its probe, warm-ups, capture and eager
//    runs, and how does it learn what such a run did besides its outputs?
// A: The shim's host calls the callable GraphedForward gave (graphed._forward's _run_module,
//    bound weakly to its owner) through these hooks, under the interpreter's lock, with the
//    inputs as a list of tensors. Before, the host called a per-instance operator
//    (graphed_models::opN) through the dispatcher, which cost a boxed call and a Python kernel
//    per forward and registered two operators per instance (its observer too) that torch never
//    frees; now nothing is registered, and both hooks go with the runner. What a run reports
//    besides its outputs travels in one record, gf_forward_report (ops/gf_host.h): the Python
//    layer leaves its facts on the CallState while the forward runs (record_error's kind,
//    record_kept_state, record_inventory), and the hook copies them into the report when the run
//    returns (an inventory made into the shim's CaptureInventory, which holds no Python). A fact
//    added later is a CallState field, a line here and a field of the report: three files.
//    graphed.Runner and the C++ tests keep an operator host (a forward they registered).
#include "gf_model_hooks.h"

#include "gf_shim_host.h"
#include "gf_shim_inventory.h"
#include "gf_shim_registry.h"
#include "gf_torch_errors.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/python_variable.h>

#include <memory>
#include <new>
#include <string>
#include <vector>

namespace {

// Whether Python may be called: not before it starts nor once it finalizes (a daemon thread that
// takes the GIL then is ended in place, which a noexcept hook cannot unwind through).
bool interpreter_usable() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsInitialized() && !Py_IsFinalizing();
#else
  return Py_IsInitialized() && !_Py_IsFinalizing();
#endif
}

// What the hooks hold: strong references, released with the runner.
struct ModelHooks {
  PyObject *forward = nullptr;
  PyObject *observer = nullptr; // NULL: none
  gf_call_state *state = nullptr;
  std::string name; // the runner's, for messages
};

// The Python error now set, as the host reports a forward's failure; clears it. The exception
// itself reaches the caller through CallState.error, where the forward recorded it.
gf_status forward_failure(const ModelHooks &hooks, gf_error *err) {
  PyObject *type = nullptr;
  PyObject *value = nullptr;
  PyObject *traceback = nullptr;
  PyErr_Fetch(&type, &value, &traceback);
  PyErr_NormalizeException(&type, &value, &traceback);
  PyObject *text = value != nullptr ? PyObject_Str(value) : nullptr;
  const char *what = text != nullptr ? PyUnicode_AsUTF8(text) : nullptr;
  if (what == nullptr) {
    PyErr_Clear();
    what = "a Python error that cannot be printed";
  }
  gf_status status = gf_error_set(err, GF_ERR_BACKEND, "graphed: the forward of '%s' failed: %s",
                                  hooks.name.c_str(), what);
  Py_XDECREF(text);
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(traceback);
  return status;
}

// The tensors of the forward's result (a list or tuple of tensors), appended to outputs.
gf_status tensors_of_result(const ModelHooks &hooks, PyObject *result,
                            std::vector<at::Tensor> &outputs, gf_error *err) {
  PyObject *sequence = PySequence_Fast(result, "");
  if (sequence == nullptr) {
    PyErr_Clear();
    return gf_error_set(err, GF_ERR_TYPE,
                        "graphed: the forward of '%s' must return a list of tensors",
                        hooks.name.c_str());
  }
  const Py_ssize_t count = PySequence_Fast_GET_SIZE(sequence);
  PyObject **items = PySequence_Fast_ITEMS(sequence);
  outputs.reserve(static_cast<size_t>(count));
  for (Py_ssize_t i = 0; i < count; ++i) {
    if (!THPVariable_Check(items[i])) {
      Py_DECREF(sequence);
      return gf_error_set(err, GF_ERR_TYPE,
                          "graphed: output %zd of the forward of '%s' is no tensor", i,
                          hooks.name.c_str());
    }
    outputs.push_back(THPVariable_Unpack(items[i]));
  }
  Py_DECREF(sequence);
  return GF_OK;
}

// A strong reference, released at scope exit (whatever leaves it: a return or a C++ exception).
struct OwnedObject {
  PyObject *object = nullptr;
  OwnedObject() = default;
  explicit OwnedObject(PyObject *owned) : object(owned) {}
  OwnedObject(const OwnedObject &) = delete;
  OwnedObject &operator=(const OwnedObject &) = delete;
  ~OwnedObject() { Py_XDECREF(object); }
};

// The facts of the run now in flight on a CallState, zeroed for one run and put back after it
// (a forward cannot run its own runner's forward again, its call returns REENTERED, but an outer
// run's facts are put back all the same), at scope exit whatever leaves it.
class RunFacts {
public:
  explicit RunFacts(gf_call_state *state)
      : state_(state), outer_error_(state->run_error), outer_kept_state_(state->run_kept_state),
        outer_inventory_(state->run_inventory) {
    state_->run_error = GF_FORWARD_ERROR_NONE;
    state_->run_kept_state = 0;
    state_->run_inventory = nullptr;
  }
  RunFacts(const RunFacts &) = delete;
  RunFacts &operator=(const RunFacts &) = delete;
  ~RunFacts() {
    state_->run_error = outer_error_;
    state_->run_kept_state = outer_kept_state_;
    Py_XSETREF(state_->run_inventory, outer_inventory_);
  }

private:
  gf_call_state *state_;
  int outer_error_;
  int outer_kept_state_;
  PyObject *outer_inventory_; // owned while this run's replaces it
};

// The shim's CaptureInventory of what a capture recorded (CallState.record_inventory's lists,
// checked there), or nullptr when it recorded nothing; a C++ exception for a list item of the
// wrong type (the caller turns it into a status).
graphed::CaptureInventory *inventory_of(PyObject *recorded) {
  if (recorded == nullptr) {
    return nullptr;
  }
  PyObject *externals = PyTuple_GET_ITEM(recorded, 0);
  PyObject *names = PyTuple_GET_ITEM(recorded, 1);
  PyObject *staged = PyTuple_GET_ITEM(recorded, 2);
  auto inventory = std::make_unique<graphed::CaptureInventory>();
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(externals); ++i) {
    PyObject *tensor = PyList_GET_ITEM(externals, i);
    PyObject *name = PyList_GET_ITEM(names, i);
    TORCH_CHECK_TYPE(THPVariable_Check(tensor) && PyUnicode_Check(name),
                     "graphed: record_inventory's externals are tensors, each with a str name");
    const char *text = PyUnicode_AsUTF8(name);
    if (text == nullptr) {
      PyErr_Clear();
      text = "a tensor";
    }
    const c10::Storage &storage = THPVariable_Unpack(tensor).storage();
    inventory->externals.push_back({storage.getWeakStorageImpl(), storage.data(), text});
  }
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(staged); ++i) {
    PyObject *tensor = PyList_GET_ITEM(staged, i);
    TORCH_CHECK_TYPE(THPVariable_Check(tensor), "graphed: record_inventory's staged are tensors");
    inventory->staged.push_back(THPVariable_Unpack(tensor));
  }
  return inventory->externals.empty() && inventory->staged.empty() ? nullptr : inventory.release();
}

// One run, holding the interpreter's lock.
gf_status run_forward_holding_gil(const ModelHooks &hooks, const std::vector<at::Tensor> &inputs,
                                  std::vector<at::Tensor> &outputs, gf_forward_report *report,
                                  gf_error *err) {
  gf_call_state *state = hooks.state;
  RunFacts facts(state);
  OwnedObject list(PyList_New(static_cast<Py_ssize_t>(inputs.size())));
  for (size_t i = 0; list.object != nullptr && i < inputs.size(); ++i) {
    PyObject *tensor = THPVariable_Wrap(inputs[i]);
    if (tensor == nullptr) {
      Py_CLEAR(list.object);
      break;
    }
    PyList_SET_ITEM(list.object, static_cast<Py_ssize_t>(i), tensor);
  }
  OwnedObject result(list.object != nullptr ? PyObject_CallOneArg(hooks.forward, list.object)
                                            : nullptr);
  if (result.object == nullptr) {
    gf_status status = forward_failure(hooks, err);
    report->error = static_cast<gf_forward_error>(state->run_error);
    return status;
  }
  gf_status status = tensors_of_result(hooks, result.object, outputs, err);
  report->kept_state = status == GF_OK && state->run_kept_state != 0;
  if (status == GF_OK) {
    graphed::CaptureInventory *inventory = inventory_of(state->run_inventory);
    report->inventory = inventory;
    report->externals = inventory != nullptr ? inventory->externals.size() : 0;
    report->staged = inventory != nullptr ? inventory->staged.size() : 0;
  }
  return status;
}

gf_status run_model_forward(void *context, const std::vector<at::Tensor> &inputs,
                            std::vector<at::Tensor> &outputs, gf_forward_report *report,
                            gf_error *err) noexcept {
  const auto &hooks = *static_cast<const ModelHooks *>(context);
  if (!interpreter_usable()) {
    return gf_error_set(err, GF_ERR_BACKEND, "graphed: the interpreter of '%s' is gone",
                        hooks.name.c_str());
  }
  PyGILState_STATE gil = PyGILState_Ensure();
  gf_status status;
  try {
    status = run_forward_holding_gil(hooks, inputs, outputs, report, err);
  } catch (...) {
    status = graphed::status_of_current_exception(err, "graphed: running the forward failed");
  }
  PyGILState_Release(gil);
  return status;
}

// A string for Python from text the core wrote (bytes it cannot decode replaced).
PyObject *text_of(const char *text) {
  const char *bytes = text != nullptr ? text : "";
  return PyUnicode_DecodeUTF8(bytes, static_cast<Py_ssize_t>(std::char_traits<char>::length(bytes)),
                              "replace");
}

void observe_model(void *context, const char *kind, const gf_event &event,
                   const std::string &shapes) noexcept {
  const auto &hooks = *static_cast<const ModelHooks *>(context);
  if (hooks.observer == nullptr || !interpreter_usable()) {
    return;
  }
  PyGILState_STATE gil = PyGILState_Ensure();
  PyObject *result = PyObject_CallFunction(
      hooks.observer, "NNdLLLLN", text_of(kind), text_of(event.message), event.seconds,
      static_cast<long long>(event.device_bytes), static_cast<long long>(event.reserved_bytes),
      static_cast<long long>(event.static_bytes), static_cast<long long>(event.count),
      text_of(shapes.c_str()));
  if (result == nullptr) {
    PyErr_Clear(); // an observer that fails loses its log line; the call itself goes on
  }
  Py_XDECREF(result);
  PyGILState_Release(gil);
}

// Frees the hooks with the runner; once the interpreter is gone their objects are left, as torch
// leaves the Python objects of tensors then.
void release_model_hooks(void *context) noexcept {
  auto *hooks = static_cast<ModelHooks *>(context);
  if (interpreter_usable()) {
    PyGILState_STATE gil = PyGILState_Ensure();
    Py_XDECREF(hooks->forward);
    Py_XDECREF(hooks->observer);
    Py_XDECREF(reinterpret_cast<PyObject *>(hooks->state));
    PyGILState_Release(gil);
  }
  delete hooks;
}

} // namespace

extern "C" gf_status gf_model_hooks_attach(int64_t runner_id, gf_call_state *state,
                                           PyObject *forward, PyObject *observer, gf_error *err) {
  try {
    std::shared_ptr<graphed::RunnerSlot> slot = graphed::find_runner(runner_id);
    std::unique_ptr<ModelHooks, void (*)(void *) noexcept> hooks(new ModelHooks,
                                                                 release_model_hooks);
    hooks->name = slot->name;
    hooks->forward = Py_NewRef(forward);
    hooks->observer = observer != Py_None ? Py_NewRef(observer) : nullptr;
    hooks->state =
        reinterpret_cast<gf_call_state *>(Py_NewRef(reinterpret_cast<PyObject *>(state)));
    graphed::DirectHooks direct;
    direct.context = hooks.get();
    direct.forward = run_model_forward;
    // No observer: the shim warns through TORCH_WARN, as for a runner with no observer at all.
    direct.observe = hooks->observer != nullptr ? observe_model : nullptr;
    direct.release = release_model_hooks;
    graphed::attach_direct_hooks(*slot, direct); // a refusal leaves them here, released below
    hooks.release();                             // the runner's from here on
    return GF_OK;
  } catch (...) {
    return graphed::status_of_current_exception(err, nullptr);
  }
}
