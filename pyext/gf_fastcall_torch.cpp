// The libtorch side of the CPython entry point (see gf_fastcall_torch.h).
#include "gf_fastcall_torch.h"

#include "gf_torch_errors.h"

#include "gf_shim_registry.h"
#include "gf_shim_tensor.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/python_variable.h>

#include <exception>
#include <vector>

extern "C" int gf_fastcall_torch_is_plain_tensor(PyObject *obj) {
  return THPVariable_CheckExact(obj) ? 1 : 0;
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

// Sets state[0] and state[1] for the call in flight and puts the previous values back on exit.
class CallInFlight {
public:
  explicit CallInFlight(const gf_fastcall_in_flight *call) : state_(call->state) {
    outer_kwargs_ = PyList_GET_ITEM(state_, 0);
    outer_key_ = PyList_GET_ITEM(state_, 1);
    Py_INCREF(outer_kwargs_);
    Py_INCREF(outer_key_);
    Py_INCREF(call->kwargs);
    PyList_SetItem(state_, 0, call->kwargs);
    Py_INCREF(call->key);
    PyList_SetItem(state_, 1, call->key);
  }
  ~CallInFlight() {
    PyList_SetItem(state_, 0, outer_kwargs_);
    PyList_SetItem(state_, 1, outer_key_);
  }
  CallInFlight(const CallInFlight &) = delete;
  CallInFlight &operator=(const CallInFlight &) = delete;

private:
  PyObject *state_;
  PyObject *outer_kwargs_;
  PyObject *outer_key_;
};

} // namespace

extern "C" gf_status gf_fastcall_torch_call(int64_t runner_id, const gf_fastcall_in_flight *call,
                                            const void *key, size_t key_length, gf_tensor *inputs,
                                            size_t input_count, const gf_tensor *keep_alive,
                                            size_t keep_alive_count, int pin, int static_outputs,
                                            PyObject **outputs, gf_error *err) {
  *outputs = nullptr;
  try {
    std::shared_ptr<graphed::RunnerSlot> slot = graphed::find_runner(runner_id);
    // Live inputs reach the core dense; the contiguous copies live until the call returns.
    std::vector<at::Tensor> dense;
    dense.reserve(input_count); // never reallocates below: handles point into it
    for (size_t i = 0; i < input_count; ++i) {
      // The walk described every tensor already; only a non-contiguous one (torch keeps
      // contiguity as a flag) is described again, as its contiguous copy.
      const at::Tensor &tensor = graphed::tensor_of_handle(inputs[i].handle);
      if (!tensor.is_contiguous()) {
        inputs[i] = graphed::describe_dense(tensor, dense);
      }
    }
    gf_call_options options{pin, static_outputs};
    gf_pool results{};
    gf_status status;
    {
      std::unique_lock<std::recursive_mutex> guard = lock_runner(*slot);
      CallInFlight in_flight(call);
      status = gf_runner_call(slot->runner, key, key_length, inputs, input_count, keep_alive,
                              keep_alive_count, &options, &results, err);
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
