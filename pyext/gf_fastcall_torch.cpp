// The libtorch side of the CPython entry point (see gf_fastcall_torch.h).
#include "gf_fastcall_torch.h"

#include "gf_torch_errors.h"

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

extern "C" int gf_fastcall_torch_describe(PyObject *obj, gf_tensor *out) {
  const at::Tensor &tensor = THPVariable_Unpack(obj);
  if (tensor.dim() > GF_MAX_DIMS) {
    return -1;
  }
  *out = graphed::describe_tensor(tensor, false);
  out->handle = const_cast<at::Tensor *>(&tensor);
  return 0;
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
class CallInFlight {
public:
  explicit CallInFlight(const gf_call_in_flight *call)
      : state_(call->state), outer_tree_(call->state->tree), outer_key_(call->state->key) {
    Py_INCREF(call->tree);
    Py_INCREF(call->key);
    state_->tree = call->tree;
    state_->key = call->key;
  }
  ~CallInFlight() {
    PyObject *tree = state_->tree;
    PyObject *key = state_->key;
    state_->tree = outer_tree_;
    state_->key = outer_key_;
    Py_DECREF(tree);
    Py_DECREF(key);
  }
  CallInFlight(const CallInFlight &) = delete;
  CallInFlight &operator=(const CallInFlight &) = delete;

private:
  gf_call_state *state_;
  PyObject *outer_tree_; // the references the state held, handed back on exit
  PyObject *outer_key_;
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

extern "C" gf_status gf_fastcall_torch_call(int64_t runner_id, const gf_call_in_flight *call,
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
    dense.reserve(input_count); // never reallocates below: handles point into it
    for (size_t i = 0; i < input_count; ++i) {
      // The walk described every tensor already; only one the core cannot read as it is (a
      // strided or lazily conjugated view; torch keeps both as flags) is described again, as its
      // dense copy, which a forward's in-place write is copied back from.
      const at::Tensor &tensor = graphed::tensor_of_handle(inputs[i].handle);
      if (graphed::needs_dense_copy(tensor)) {
        densified.push_back({i, &tensor});
        inputs[i] = graphed::describe_dense(tensor, dense);
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

extern "C" gf_status gf_fastcall_torch_call_dispatched(int64_t runner_id,
                                                       const gf_call_in_flight *call,
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
