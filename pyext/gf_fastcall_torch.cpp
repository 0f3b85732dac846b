// The libtorch side of the CPython entry point (see gf_fastcall_torch.h).
#include "gf_fastcall_torch.h"

#include "gf_torch_errors.h"

#include "gf_shim_call.h"
#include "gf_shim_host.h"
#include "gf_shim_interpreter_lock.h"
#include "gf_shim_registry.h"
#include "gf_shim_tensor.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/Device.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/Layout.h>
#include <torch/csrc/MemoryFormat.h>
#include <torch/csrc/Size.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/frontend/tracer.h>

#include <exception>
#include <new>
#include <optional>
#include <string>
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

extern "C" int gf_fastcall_torch_phase(const void *runner_call) {
  return runner_call != nullptr ? static_cast<const graphed::RunnerCall *>(runner_call)->phase
                                : GF_PHASE_EAGER;
}

namespace {

// Where a tensor's elements start, read from its TensorImpl without the checks of data_ptr()
// (a storage-less or symbolic tensor is "nowhere", which a later move away from still changes).
const void *data_address_of(const c10::TensorImpl *impl) {
  if (impl->has_symbolic_sizes_strides()) {
    return nullptr;
  }
  const c10::StorageImpl *storage = impl->unsafe_storage().unsafeGetStorageImpl();
  if (storage == nullptr) {
    return nullptr;
  }
  const char *data = static_cast<const char *>(storage->data_ptr().get());
  return data == nullptr ? nullptr
                         : data + impl->storage_offset() * static_cast<int64_t>(impl->itemsize());
}

} // namespace

extern "C" const void *gf_fastcall_torch_storage_on(PyObject *obj, int device_type) {
  try {
    const c10::TensorImpl *impl = THPVariable_Unpack(obj).unsafeGetTensorImpl();
    if ((device_type >= 0 && static_cast<int>(impl->device_type()) != device_type) ||
        !impl->has_storage()) {
      return nullptr;
    }
    return impl->unsafe_storage().unsafeGetStorageImpl();
  } catch (...) {
    return nullptr; // a tensor whose storage torch will not give: no storage to sort it by
  }
}

extern "C" void *gf_fastcall_torch_storage_weak(PyObject *obj, int device_type) {
  try {
    const c10::TensorImpl *impl = THPVariable_Unpack(obj).unsafeGetTensorImpl();
    if ((device_type >= 0 && static_cast<int>(impl->device_type()) != device_type) ||
        !impl->has_storage()) {
      return nullptr;
    }
    return new c10::weak_intrusive_ptr<c10::StorageImpl>(
        impl->unsafe_storage().getWeakStorageImpl());
  } catch (...) {
    return nullptr; // no storage torch will give, or no memory for the reference: not followed
  }
}

extern "C" const void *gf_fastcall_torch_storage_weak_alive(void *weak) {
  const auto *pointer = static_cast<const c10::weak_intrusive_ptr<c10::StorageImpl> *>(weak);
  return pointer->expired() ? nullptr : pointer->_unsafe_get_target();
}

extern "C" void gf_fastcall_torch_storage_weak_free(void *weak) {
  delete static_cast<c10::weak_intrusive_ptr<c10::StorageImpl> *>(weak);
}

extern "C" int gf_fastcall_torch_device_type(const char *name) {
  try {
    return static_cast<int>(c10::Device(std::string(name)).type());
  } catch (...) {
    return -1;
  }
}

extern "C" void gf_fastcall_torch_watch_tensor(PyObject *obj, gf_watched_tensor *out) {
  const c10::TensorImpl *impl = THPVariable_Unpack(obj).unsafeGetTensorImpl();
  *out = gf_watched_tensor{impl, nullptr, nullptr, 0};
  try {
    if (data_address_of(impl) != nullptr) {
      const c10::StorageImpl *storage = impl->unsafe_storage().unsafeGetStorageImpl();
      *out = gf_watched_tensor{impl, storage, storage->data_ptr().get(), impl->storage_offset()};
    }
  } catch (...) {
    // a tensor whose offset torch will not say: "nowhere", as data_address_of has it
  }
}

extern "C" int gf_fastcall_torch_tensors_moved(const gf_watched_tensor *tensors, size_t count) {
  try {
    for (size_t i = 0; i < count; ++i) {
      const gf_watched_tensor &watched = tensors[i];
      const auto *impl = static_cast<const c10::TensorImpl *>(watched.impl);
      if (watched.storage == nullptr) {
        // recorded "nowhere": only a move to somewhere changes it
        if (data_address_of(impl) != nullptr) {
          return 1;
        }
        continue;
      }
      const c10::StorageImpl *storage = impl->unsafe_storage().unsafeGetStorageImpl();
      if (storage != watched.storage || storage->data_ptr().get() != watched.data ||
          impl->storage_offset() != watched.offset) {
        return 1;
      }
    }
  } catch (...) {
    return 1; // the Python layer looks again, in its own words
  }
  return 0;
}

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

namespace {

// What a cache entry's user slot holds for the CPython entry: its (template, held) pair and how
// many calls it has served (verify mode reads that, see graphed._verify).
struct EntryUser {
  PyObject *template_and_held;
  uint64_t served;
};

// An entry's user, released with the entry, under the GIL; once the interpreter is gone its pair
// is left, as torch leaves the Python objects of tensors then.
void release_template(void *user) noexcept {
  auto *owned = static_cast<EntryUser *>(user);
  if (Py_IsInitialized()) {
    PyGILState_STATE state = PyGILState_Ensure();
    Py_DECREF(owned->template_and_held);
    PyGILState_Release(state);
  }
  delete owned;
}

} // namespace

extern "C" void gf_fastcall_torch_install_template_release(void) {
  graphed::set_entry_user_release(release_template);
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
  return graphed::lock_runner(slot, graphed::LockPolicy::release_interpreter_lock);
}

// Puts the call into its GraphedForward's call state (Note [The call in flight], gf_call_state.h)
// and, on exit, the outer call back. Built
// only while the runner's lock is held.
// The forward's exception recorded during the call is handed to call->error on exit.
class CallInFlight {
public:
  CallInFlight(gf_call_in_flight *call, graphed::RunnerSlot &slot)
      : call_(call), state_(call->state), outer_{state_->tree, state_->key, state_->held,
                                                 state_->error, state_->recorded},
        outer_runner_call_(state_->runner_call) {
    state_->runner_call = slot.call;
    call->error = nullptr;
    call->output_template = nullptr;
    state_->tree = Py_NewRef(call->tree);
    state_->key = Py_NewRef(call->key);
    state_->held = Py_NewRef(call->held);
    state_->error = Py_NewRef(Py_None);
    state_->recorded = nullptr;
  }
  ~CallInFlight() {
    PyObject *mine[] = {state_->tree, state_->key, state_->held, state_->recorded};
    PyObject *error = state_->error;
    state_->tree = outer_[0];
    state_->key = outer_[1];
    state_->held = outer_[2];
    state_->error = outer_[3];
    state_->recorded = outer_[4];
    state_->runner_call = outer_runner_call_;
    for (PyObject *object : mine) {
      Py_XDECREF(object);
    }
    if (error != Py_None) {
      call_->error = error; // the reference moves to the caller
    } else {
      Py_DECREF(error);
    }
  }
  CallInFlight(const CallInFlight &) = delete;
  CallInFlight &operator=(const CallInFlight &) = delete;

  // After a call that succeeded, still under the runner's lock: call->output_template from the
  // serving entry's slot (entry: see gf_served_entry), which a capture fills with
  // what its forward recorded and the call's held objects, or for an eager call (served NULL)
  // the template its own forward recorded. Stays NULL when there is none.
  // It also counts the call in the serving entry's user (state->served; 0 for an eager call and
  // for a capturing call answered from its last warm-up).
  void settle(const gf_served_entry &entry) noexcept {
    void **served = entry.user;
    PyObject *recorded = state_->recorded;
    state_->served = 0;
    call_->served = 0;
    if (served == nullptr) {
      call_->output_template = Py_XNewRef(recorded);
      return;
    }
    if (*served == nullptr && recorded != nullptr) {
      PyObject *pair = PyTuple_Pack(2, recorded, call_->held);
      auto *user = pair != nullptr ? new (std::nothrow) EntryUser{pair, 0} : nullptr;
      if (user == nullptr) {
        Py_XDECREF(pair);
      }
      *served = user;
    }
    if (*served != nullptr) {
      auto *user = static_cast<EntryUser *>(*served);
      // A capturing call answered from its warm-up is not counted: verify mode compares the
      // graph's first replay instead (Note [The first call from its last warm-up]).
      if (!entry.from_warm_up) {
        state_->served = ++user->served;
        call_->served = user->served;
      }
      call_->output_template = Py_NewRef(PyTuple_GET_ITEM(user->template_and_held, 0));
    }
  }

private:
  gf_call_in_flight *call_;
  gf_call_state *state_;
  PyObject *outer_[5]; // the references the state held, handed back on exit
  void *outer_runner_call_;
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

namespace {

// The fast path's side of call_runner: the call state set while the runner is held, and the
// outputs wrapped into a new list of tensor objects.
class FastCallParty final : public graphed::RunnerCallParty {
public:
  FastCallParty(gf_call_in_flight *call, graphed::RunnerSlot &slot) : call_(call), slot_(slot) {}
  ~FastCallParty() override { Py_XDECREF(list_); }
  FastCallParty(const FastCallParty &) = delete;
  FastCallParty &operator=(const FastCallParty &) = delete;

  void locked() noexcept override { in_flight_.emplace(call_, slot_); }
  void called(gf_status status) noexcept override {
    if (status == GF_OK) {
      in_flight_->settle(served_);
    }
    in_flight_.reset();
  }
  // Where the core says which entry served the call (gf_call_options.served).
  gf_served_entry *served() { return &served_; }
  void reserve(size_t count) override { list_ = PyList_New(static_cast<Py_ssize_t>(count)); }
  void add(at::Tensor output) override {
    if (list_ != nullptr) {
      PyList_SET_ITEM(list_, next_++, THPVariable_Wrap(std::move(output)));
    }
  }
  // The list (a new reference), or NULL when it could not be made.
  PyObject *take_list() { return std::exchange(list_, nullptr); }

private:
  gf_call_in_flight *call_;
  graphed::RunnerSlot &slot_;
  std::optional<CallInFlight> in_flight_;
  PyObject *list_ = nullptr;
  Py_ssize_t next_ = 0;
  gf_served_entry served_{};
};

} // namespace

extern "C" gf_status gf_fastcall_torch_call(int64_t runner_id, gf_call_in_flight *call,
                                            const void *key, size_t key_length, gf_tensor *inputs,
                                            size_t input_count, const gf_tensor *keep_alive,
                                            size_t keep_alive_count, int pin, int static_outputs,
                                            PyObject **outputs, gf_error *err) {
  *outputs = nullptr;
  try {
    std::shared_ptr<graphed::RunnerSlot> slot = graphed::find_runner(runner_id);
    FastCallParty party(call, *slot);
    // A key the core holds back comes back as GF_RUN_EAGER: GraphedForward runs it
    // (graphed._eager).
    gf_call_options options{pin, static_outputs, nullptr, party.served(), 1};
    gf_status status = graphed::call_runner(
        *slot, key, key_length, inputs, input_count, keep_alive, keep_alive_count, options,
        graphed::LockPolicy::release_interpreter_lock, party, err);
    if (status != GF_OK) {
      return status;
    }
    *outputs = party.take_list();
    if (*outputs == nullptr) {
      return gf_error_set(err, GF_ERR_NO_MEMORY, "graphed: out of memory for the outputs");
    }
    return GF_OK;
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
      CallInFlight in_flight(call, *slot);
      gf_served_entry served{};
      {
        // The operator takes the (recursive) runner lock again; the call state is already set,
        // and the kernel's call_runner says which entry served the call through `served`.
        graphed::ServedEntryWanted wanted(*slot, &served);
        results = forward_op.call(runner_id, key, input_tensors, held_tensors, pin != 0,
                                  static_outputs != 0);
      }
      in_flight.settle(served);
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

extern "C" gf_status gf_fastcall_torch_reset(int64_t runner_id, int restart_churn, int *at_limit,
                                             gf_error *err) {
  *at_limit = 0;
  try {
    std::shared_ptr<graphed::RunnerSlot> slot = graphed::find_runner(runner_id);
    std::unique_lock<std::recursive_mutex> guard = lock_runner(*slot);
    if (restart_churn) {
      gf_runner_reset(slot->runner);
    } else {
      *at_limit = gf_runner_drop_graphs(slot->runner);
    }
    return GF_OK;
  } catch (...) {
    return graphed::status_of_current_exception(err, nullptr);
  }
}

extern "C" gf_status gf_fastcall_torch_select_state(int64_t runner_id, uint64_t state,
                                                    int first_time, int *at_limit, gf_error *err) {
  *at_limit = 0;
  try {
    std::shared_ptr<graphed::RunnerSlot> slot = graphed::find_runner(runner_id);
    std::unique_lock<std::recursive_mutex> guard = lock_runner(*slot);
    *at_limit = gf_runner_select_state(slot->runner, state, first_time);
    return GF_OK;
  } catch (...) {
    return graphed::status_of_current_exception(err, nullptr);
  }
}

extern "C" gf_status gf_fastcall_torch_compare_later(int64_t runner_id, const gf_copy *pairs,
                                                     size_t count, uint8_t *verdict,
                                                     uint32_t *scratch, gf_error *err) {
  try {
    std::shared_ptr<graphed::RunnerSlot> slot = graphed::find_runner(runner_id);
    std::unique_lock<std::recursive_mutex> guard = lock_runner(*slot);
    c10::OptionalDeviceGuard on_its_device; // a runner on a device other than the current one
    if (slot->device.has_index()) {
      on_its_device.reset_device(slot->device);
    }
    return gf_runner_compare_later(slot->runner, pairs, count, verdict, scratch, err);
  } catch (...) {
    return graphed::status_of_current_exception(err, nullptr);
  }
}

extern "C" int gf_fastcall_torch_byte_pair(PyObject *left_object, PyObject *right_object,
                                           gf_copy *pair, int *device_type, int *device_index) {
  try {
    const at::Tensor &left = THPVariable_Unpack(left_object);
    const at::Tensor &right = THPVariable_Unpack(right_object);
    if (left.device() != right.device()) {
      return GF_BYTE_PAIR_ELSEWHERE; // compared where both can be read
    }
    if (left.scalar_type() != right.scalar_type() || left.sizes() != right.sizes()) {
      return GF_BYTE_PAIR_DIFFERS;
    }
    for (const at::Tensor *side : {&left, &right}) {
      // Bytes that are not the values as they read (a lazy conjugate or negation), or no bytes
      // of its own to read (another layout, a meta tensor, a wrapper without storage).
      if (side->layout() != c10::kStrided || side->is_conj() || side->is_neg() || side->is_meta() ||
          side->is_quantized() || !side->has_storage() || !side->is_contiguous()) {
        return GF_BYTE_PAIR_ELSEWHERE;
      }
    }
    *pair = gf_copy{left.data_ptr(), right.data_ptr(), left.nbytes()};
    *device_type = static_cast<int>(left.device().type());
    *device_index = left.device().index();
    return GF_BYTE_PAIR_SAME_SHAPE;
  } catch (...) {
    return GF_BYTE_PAIR_ELSEWHERE;
  }
}

extern "C" PyObject *gf_fastcall_torch_call_without_grad(PyObject *forward, PyObject *kwargs) {
  static PyObject *const no_args = PyTuple_New(0); // the empty tuple, immortal
  if (no_args == nullptr) {
    return PyErr_NoMemory();
  }
  try {
    c10::AutoGradMode no_grad(false);
    return PyObject_Call(forward, no_args, kwargs);
  } catch (...) {
    PyErr_SetString(PyExc_RuntimeError, "graphed: torch raised while setting grad mode");
    return nullptr;
  }
}

extern "C" int gf_fastcall_torch_is_tracing(void) {
  try {
    return torch::jit::tracer::isTracing() ? 1 : 0;
  } catch (...) {
    return 1; // unknown: the module is called as it is
  }
}

extern "C" int gf_fastcall_torch_synchronize(int device_type, int device_index) {
  if (device_type != static_cast<int>(c10::DeviceType::CUDA)) {
    return 0;
  }
  int status = 0;
  PyThreadState *saved = PyEval_SaveThread();
  try {
    at::detail::getCUDAHooks().deviceSynchronize(static_cast<c10::DeviceIndex>(device_index));
  } catch (...) {
    status = -1;
  }
  PyEval_RestoreThread(saved);
  return status;
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
  const graphed::ErrorKind kind = graphed::error_kind_of(status);
  PyObject *type = kind == graphed::ErrorKind::value  ? PyExc_ValueError
                   : kind == graphed::ErrorKind::type ? PyExc_TypeError
                                                      : PyExc_RuntimeError;
  PyErr_SetString(type, message);
  return nullptr;
}
