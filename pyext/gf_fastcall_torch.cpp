// The libtorch side of the CPython entry point (see gf_fastcall_torch.h).
#include "gf_fastcall_torch.h"
#include "gf_walker.h"

#include "gf_torch_errors.h"

#include "gf_shim_host.h"
#include "gf_shim_interpreter_lock.h"
#include "gf_shim_registry.h"
#include "gf_shim_tensor.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/Device.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/Layout.h>
#include <torch/csrc/MemoryFormat.h>
#include <torch/csrc/Size.h>
#include <torch/csrc/autograd/python_variable.h>

#include <exception>
#include <utility>
#include <vector>

extern "C" int gf_fastcall_torch_is_plain_tensor(PyObject *obj) {
  return THPVariable_CheckExact(obj) ? 1 : 0;
}

extern "C" int gf_fastcall_torch_is_tensor(PyObject *obj) { return THPVariable_Check(obj) ? 1 : 0; }

extern "C" int gf_fastcall_torch_is_plain_leaf(PyObject *obj) {
  return THPDtype_Check(obj) || THPDevice_Check(obj) || THPSize_Check(obj) ||
                 THPLayout_Check(obj) || THPMemoryFormat_Check(obj)
             ? 1
             : 0;
}

extern "C" int gf_fastcall_torch_describe(PyObject *obj, gf_tensor *out, const char **why) {
  *why = nullptr;
  try {
    const at::Tensor &tensor = THPVariable_Unpack(obj);
    if ((*why = graphed::unsupported_tensor_reason(tensor)) != nullptr) {
      return GF_DESCRIBE_UNSUPPORTED;
    }
    if (tensor.dim() > GF_MAX_DIMS) {
      out->ndim = static_cast<int32_t>(tensor.dim());
      return GF_DESCRIBE_TOO_MANY_DIMS;
    }
    *out = graphed::describe_tensor(tensor, false);
    out->handle = const_cast<at::Tensor *>(&tensor);
    return GF_DESCRIBE_OK;
  } catch (...) {
    *why = "cannot be read by graphed (torch raised while describing it)";
    return GF_DESCRIBE_UNSUPPORTED;
  }
}

extern "C" int gf_fastcall_torch_shape_of(PyObject *obj, gf_tensor *out) {
  try {
    const at::Tensor &tensor = THPVariable_Unpack(obj);
    if (!tensor.defined() || tensor.dim() > GF_MAX_DIMS || tensor.is_nested()) {
      return -1;
    }
    *out = gf_tensor{};
    c10::SymIntArrayRef sizes = tensor.sym_sizes();
    for (size_t i = 0; i < sizes.size(); ++i) {
      std::optional<int64_t> size = sizes[i].maybe_as_int();
      if (!size.has_value()) {
        return -1;
      }
      out->sizes[i] = *size;
    }
    out->dtype = static_cast<int32_t>(tensor.scalar_type());
    out->device_type = static_cast<int32_t>(tensor.device().type());
    out->device_index = tensor.device().has_index() ? tensor.device().index() : -1;
    out->ndim = static_cast<int32_t>(sizes.size());
    return 0;
  } catch (...) {
    return -1;
  }
}

extern "C" const char *gf_fastcall_torch_unsupported_reason(PyObject *obj) {
  try {
    return graphed::unsupported_tensor_reason(THPVariable_Unpack(obj));
  } catch (...) {
    return "cannot be read by graphed (torch raised while describing it)";
  }
}

extern "C" void gf_fastcall_torch_mark_forward_error(void) { graphed::mark_forward_error(); }

namespace {

// Takes the GIL if this thread does not hold it, as torch does to release one Python object.
// Once the interpreter is gone, torch leaks such objects; the work then runs as it is.
void run_holding_gil(graphed::LockedWork work, void *context) noexcept {
  if (!Py_IsInitialized()) {
    work(context);
    return;
  }
  PyGILState_STATE state = PyGILState_Ensure();
  work(context);
  PyGILState_Release(state);
}

// Releases the GIL around work when this thread holds it (a wait on other threads).
void run_releasing_gil(graphed::LockedWork work, void *context) noexcept {
  if (!Py_IsInitialized() || PyGILState_Check() == 0) {
    work(context);
    return;
  }
  Py_BEGIN_ALLOW_THREADS work(context);
  Py_END_ALLOW_THREADS
}

} // namespace

extern "C" void gf_fastcall_torch_install_interpreter_lock(void) {
  graphed::set_interpreter_lock_runners(run_holding_gil, run_releasing_gil);
}

extern "C" PyObject *gf_fastcall_torch_object_of(const gf_tensor *tensor) {
  try {
    return THPVariable_Wrap(graphed::tensor_of_handle(tensor->handle));
  } catch (...) {
    PyErr_SetString(PyExc_RuntimeError, "graphed: cannot wrap a walked tensor");
    return nullptr;
  }
}

namespace {

// Takes the runner's lock; when another thread holds it, waits with the GIL released.
std::unique_lock<std::recursive_mutex> lock_runner(graphed::RunnerSlot &slot) {
  std::unique_lock<std::recursive_mutex> lock(slot.mutex, std::try_to_lock);
  if (!lock.owns_lock()) {
    Py_BEGIN_ALLOW_THREADS lock.lock();
    Py_END_ALLOW_THREADS
  }
  return lock;
}

// Puts the call into its GraphedForward's call state and, on exit, the outer call back. Built
// only while the runner's lock is held.
// The forward's exception recorded during the call is handed to call->error on exit.
class CallInFlight {
public:
  explicit CallInFlight(gf_call_in_flight *call)
      : call_(call), state_(call->state), outer_{state_->tree, state_->key, state_->shapes,
                                                 state_->held, state_->error} {
    call->error = nullptr;
    state_->tree = Py_NewRef(call->tree);
    state_->key = Py_NewRef(call->key);
    state_->shapes = Py_NewRef(call->shapes);
    state_->held = Py_NewRef(call->held);
    state_->error = Py_NewRef(Py_None);
  }
  ~CallInFlight() {
    PyObject *mine[] = {state_->tree, state_->key, state_->shapes, state_->held};
    PyObject *error = state_->error;
    state_->tree = outer_[0];
    state_->key = outer_[1];
    state_->shapes = outer_[2];
    state_->held = outer_[3];
    state_->error = outer_[4];
    for (PyObject *object : mine) {
      Py_DECREF(object);
    }
    if (error != Py_None) {
      call_->error = error; // the reference moves to the caller
    } else {
      Py_DECREF(error);
    }
  }
  CallInFlight(const CallInFlight &) = delete;
  CallInFlight &operator=(const CallInFlight &) = delete;

private:
  gf_call_in_flight *call_;
  gf_call_state *state_;
  PyObject *outer_[5]; // the references the state held, handed back on exit
};

// The tensors of a list, for the dispatcher: any tensor, subclasses included.
std::vector<at::Tensor> tensors_of_list(PyObject *list, const char *what) {
  std::vector<at::Tensor> tensors;
  Py_ssize_t count = PyList_GET_SIZE(list);
  tensors.reserve(static_cast<size_t>(count));
  for (Py_ssize_t i = 0; i < count; ++i) {
    PyObject *item = PyList_GET_ITEM(list, i);
    TORCH_CHECK_TYPE(THPVariable_Check(item),
                     graphed::format_message("graphed: %s item %zd is not a tensor", what, i));
    tensors.push_back(THPVariable_Unpack(item));
  }
  return tensors;
}

PyObject *list_of_tensors(std::vector<at::Tensor> &&tensors) {
  PyObject *list = PyList_New(static_cast<Py_ssize_t>(tensors.size()));
  for (size_t i = 0; list != nullptr && i < tensors.size(); ++i) {
    PyList_SET_ITEM(list, static_cast<Py_ssize_t>(i), THPVariable_Wrap(std::move(tensors[i])));
  }
  return list;
}

} // namespace

extern "C" gf_status gf_fastcall_torch_call(int64_t runner_id, gf_call_in_flight *call,
                                            const void *key, size_t key_length, gf_tensor *inputs,
                                            size_t input_count, const gf_tensor *keep_alive,
                                            size_t keep_alive_count, int pin, int static_outputs,
                                            PyObject **outputs, gf_error *err) {
  *outputs = nullptr;
  try {
    std::shared_ptr<graphed::RunnerSlot> slot = graphed::find_runner(runner_id);
    // Live inputs reach the core dense; the contiguous copies live until the call returns.
    std::vector<at::Tensor> dense;
    std::vector<graphed::DenseInput> densified;
    for (size_t i = 0; i < input_count; ++i) {
      // The walk described every tensor already; only one the core cannot read as it is (a
      // strided or lazily conjugated view; torch keeps both as flags) is described again, as its
      // dense copy, which a forward's in-place write is copied back from.
      const at::Tensor &tensor = graphed::tensor_of_handle(inputs[i].handle);
      if (graphed::needs_dense_copy(tensor)) {
        densified.push_back({i, &tensor});
        inputs[i] = graphed::describe_dense(tensor, dense, input_count);
      }
    }
    std::vector<unsigned char> mutated(densified.empty() ? 0 : input_count);
    gf_call_options options{pin, static_outputs, mutated.empty() ? nullptr : mutated.data()};
    gf_pool results{};
    gf_status status;
    {
      std::unique_lock<std::recursive_mutex> guard = lock_runner(*slot);
      CallInFlight in_flight(call);
      status = gf_runner_call(slot->runner, key, key_length, inputs, input_count, keep_alive,
                              keep_alive_count, &options, &results, err);
    }
    if (status == GF_OK && !mutated.empty()) {
      graphed::write_back_dense(densified, inputs, mutated.data());
    }
    PyObject *list = status == GF_OK ? PyList_New(static_cast<Py_ssize_t>(results.count)) : nullptr;
    for (size_t i = 0; i < results.count; ++i) {
      at::Tensor result = graphed::take_handle(results.tensors[i].handle);
      if (list != nullptr) {
        PyList_SET_ITEM(list, static_cast<Py_ssize_t>(i), THPVariable_Wrap(std::move(result)));
      }
    }
    gf_pool_free(&results, nullptr, nullptr);
    if (status == GF_OK && list == nullptr) {
      return gf_error_set(err, GF_ERR_NO_MEMORY, "graphed: out of memory for the outputs");
    }
    *outputs = list;
    return status;
  } catch (...) {
    return graphed::status_of_current_exception(err, nullptr);
  }
}

extern "C" gf_status gf_fastcall_torch_call_dispatched(int64_t runner_id, gf_call_in_flight *call,
                                                       PyObject *inputs, PyObject *keep_alive,
                                                       int pin, int static_outputs,
                                                       PyObject **outputs, gf_error *err) {
  *outputs = nullptr;
  try {
    static auto forward_op =
        c10::Dispatcher::singleton()
            .findSchemaOrThrow("graphed::forward", "")
            .typed<std::vector<at::Tensor>(int64_t, c10::string_view, at::TensorList,
                                           at::TensorList, bool, bool)>();
    std::vector<at::Tensor> input_tensors = tensors_of_list(inputs, "input");
    std::vector<at::Tensor> held_tensors = tensors_of_list(keep_alive, "keep_alive");
    c10::string_view key(PyBytes_AS_STRING(call->key),
                         static_cast<size_t>(PyBytes_GET_SIZE(call->key)));
    std::shared_ptr<graphed::RunnerSlot> slot = graphed::find_runner(runner_id);
    std::vector<at::Tensor> results;
    {
      std::unique_lock<std::recursive_mutex> guard = lock_runner(*slot);
      CallInFlight in_flight(call);
      // The operator takes the (recursive) runner lock again; the call state is already set.
      results = forward_op.call(runner_id, key, input_tensors, held_tensors, pin != 0,
                                static_outputs != 0);
    }
    PyObject *list = list_of_tensors(std::move(results));
    if (list == nullptr) {
      return gf_error_set(err, GF_ERR_NO_MEMORY, "graphed: out of memory for the outputs");
    }
    *outputs = list;
    return GF_OK;
  } catch (python_error &error) {
    error.restore(); // the forward's own exception, as torch.ops would raise it
    return gf_error_set(err, GF_ERR_BACKEND, "graphed: the forward raised");
  } catch (...) {
    return graphed::status_of_current_exception(err, nullptr);
  }
}

extern "C" gf_status gf_fastcall_torch_reset(int64_t runner_id, gf_call_state *state,
                                             gf_error *err) {
  try {
    std::shared_ptr<graphed::RunnerSlot> slot = graphed::find_runner(runner_id);
    std::unique_lock<std::recursive_mutex> guard = lock_runner(*slot);
    gf_runner_reset(slot->runner);
    PyDict_Clear(state->templates);
    return GF_OK;
  } catch (...) {
    return graphed::status_of_current_exception(err, nullptr);
  }
}

namespace {

// Whether the template of (key, shapes) belongs to the call in flight or to a resident entry.
bool template_is_live(gf_runner *runner, const gf_call_state *state, PyObject *key,
                      PyObject *shapes, std::vector<gf_tensor> &scratch) {
  if (PyObject_RichCompareBool(key, state->key, Py_EQ) == 1 &&
      PyObject_RichCompareBool(shapes, state->shapes, Py_EQ) == 1) {
    return true;
  }
  PyErr_Clear();
  if (!PyBytes_Check(key) || !PyBytes_Check(shapes)) {
    return false;
  }
  const auto *bytes = reinterpret_cast<const unsigned char *>(PyBytes_AS_STRING(shapes));
  const size_t length = static_cast<size_t>(PyBytes_GET_SIZE(shapes));
  scratch.resize(length / (4 * sizeof(int32_t)) + 1);
  Py_ssize_t count = gf_walk_parse_shapes(bytes, length, scratch.data(), scratch.size());
  return count >= 0 && gf_runner_entry_replays(runner, PyBytes_AS_STRING(key),
                                               static_cast<size_t>(PyBytes_GET_SIZE(key)),
                                               scratch.data(), static_cast<size_t>(count)) >= 0;
}

} // namespace

extern "C" gf_status gf_fastcall_torch_prune(int64_t runner_id, gf_call_state *state,
                                             gf_error *err) {
  try {
    std::shared_ptr<graphed::RunnerSlot> slot = graphed::find_runner(runner_id);
    std::unique_lock<std::recursive_mutex> guard = lock_runner(*slot);
    std::vector<gf_tensor> scratch;
    // Keys first, so no dict changes size while it is iterated.
    PyObject *keys = PyDict_Keys(state->templates);
    if (keys == nullptr) {
      PyErr_Clear();
      return gf_error_set(err, GF_ERR_NO_MEMORY, "graphed: out of memory pruning templates");
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(keys); ++i) {
      PyObject *key = PyList_GET_ITEM(keys, i);
      PyObject *by_shapes = PyDict_GetItem(state->templates, key);
      if (by_shapes == nullptr || !PyDict_Check(by_shapes)) {
        continue;
      }
      Py_INCREF(by_shapes);
      PyObject *all_shapes = PyDict_Keys(by_shapes);
      for (Py_ssize_t j = 0; all_shapes != nullptr && j < PyList_GET_SIZE(all_shapes); ++j) {
        PyObject *shapes = PyList_GET_ITEM(all_shapes, j);
        if (!template_is_live(slot->runner, state, key, shapes, scratch) &&
            PyDict_DelItem(by_shapes, shapes) != 0) {
          PyErr_Clear();
        }
      }
      Py_XDECREF(all_shapes);
      if (PyDict_GET_SIZE(by_shapes) == 0 && PyDict_DelItem(state->templates, key) != 0) {
        PyErr_Clear();
      }
      Py_DECREF(by_shapes);
    }
    Py_DECREF(keys);
    PyErr_Clear();
    return GF_OK;
  } catch (...) {
    return graphed::status_of_current_exception(err, nullptr);
  }
}

extern "C" void gf_fastcall_torch_word_input_error(int64_t runner_id, PyObject *tensor,
                                                   const char *subject, gf_error *err) {
  try {
    std::shared_ptr<graphed::RunnerSlot> slot = graphed::find_runner(runner_id);
    graphed::word_input_error(THPVariable_Unpack(tensor), subject, slot->device, err);
  } catch (...) {
    // The runner is gone: the core's message stays.
  }
}

extern "C" PyObject *gf_fastcall_torch_raise(gf_status status, const gf_error *err) {
  if (PyErr_Occurred()) {
    return nullptr;
  }
  const char *message = err->message[0] ? err->message : gf_status_name(status);
  PyObject *type = status == GF_ERR_INVALID_ARGUMENT ? PyExc_ValueError
                   : status == GF_ERR_TYPE           ? PyExc_TypeError
                                                     : PyExc_RuntimeError;
  PyErr_SetString(type, message);
  return nullptr;
}
