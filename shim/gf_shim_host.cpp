// The libtorch implementation of the core's gf_host hooks (see gf_shim_host.h). Every hook catches
// what torch throws and turns it into a status: no exception crosses into the C core.
#include "gf_shim_host.h"

#include "gf_torch_errors.h"

#include "gf_shim_group.h"
#include "gf_shim_inventory.h"
#include "gf_shim_registry.h"
#include "gf_shim_tensor.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

namespace graphed {

namespace {

HostContext *host_context(void *context) { return static_cast<HostContext *>(context); }

// Process-wide order of the forwards hosts start (see RunnerCall::forward_order).
std::atomic<uint64_t> forwards_started{0};

// Sets the runner's phase and running thread for one forward and puts the outer ones back (the
// forward may call the same runner again, through the operator).
class ForwardScope {
public:
  ForwardScope(RunnerCall &call, gf_forward_phase phase)
      : call_(call), outer_phase_(call.phase),
        outer_thread_(call.forward_thread.load(std::memory_order_relaxed)),
        outer_order_(call.forward_order.load(std::memory_order_relaxed)) {
    call.phase = phase;
    call.forward_thread.store(std::this_thread::get_id(), std::memory_order_relaxed);
    call.forward_order.store(forwards_started.fetch_add(1, std::memory_order_relaxed) + 1,
                             std::memory_order_relaxed);
  }
  ~ForwardScope() {
    call_.phase = outer_phase_;
    call_.forward_thread.store(outer_thread_, std::memory_order_relaxed);
    call_.forward_order.store(outer_order_, std::memory_order_relaxed);
  }
  ForwardScope(const ForwardScope &) = delete;
  ForwardScope &operator=(const ForwardScope &) = delete;

private:
  RunnerCall &call_;
  gf_forward_phase outer_phase_;
  std::thread::id outer_thread_;
  uint64_t outer_order_;
};

gf_status host_clone_static(void *, const gf_tensor *live, gf_tensor *out, gf_error *err) {
  try {
    // live is a borrowed view whose handle the shim set to the caller's tensor.
    const at::Tensor &source = tensor_of_handle(live->handle);
    // A normal tensor even under inference_mode, so that its version counter tells which inputs
    // the forward writes in place (an inference tensor has none).
    c10::InferenceMode normal_tensors(false);
    at::Tensor fixed =
        at::empty(source.sizes(), source.options().memory_format(at::MemoryFormat::Contiguous));
    fixed.copy_(source);
    *out = describe_tensor(fixed, true);
    return GF_OK;
  } catch (...) {
    return status_of_current_exception(err, "graphed: making a static copy of an input failed");
  }
}

gf_status host_empty_like(void *, const gf_tensor *like, gf_tensor *out, gf_error *err) {
  try {
    const at::Tensor &model = tensor_of_handle(like->handle);
    at::Tensor fresh =
        at::empty(model.sizes(), model.options().memory_format(at::MemoryFormat::Contiguous));
    *out = describe_tensor(fresh, true);
    return GF_OK;
  } catch (...) {
    return status_of_current_exception(err, "graphed: allocating an output failed");
  }
}

gf_status host_retain(void *, const gf_tensor *tensor, gf_tensor *out, gf_error *err) {
  try {
    *out = describe_tensor(tensor_of_handle(tensor->handle), true);
    return GF_OK;
  } catch (...) {
    return status_of_current_exception(err, "graphed: holding a tensor failed");
  }
}

// The version of each input that has one; -1 for tensors that track none (inference tensors).
std::vector<int64_t> versions_of(const std::vector<at::Tensor> &tensors) {
  std::vector<int64_t> versions(tensors.size(), -1);
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!tensors[i].is_inference()) {
      versions[i] = static_cast<int64_t>(tensors[i]._version());
    }
  }
  return versions;
}

// The forward's results: through the direct hook where the runner has one, else its operator.
gf_status run_forward_once(HostContext &host, const std::vector<at::Tensor> &arguments,
                           std::vector<at::Tensor> &results, gf_forward_report *report,
                           gf_error *err) {
  if (host.direct.forward != nullptr) {
    return host.direct.forward(host.direct.context, arguments, results, report, err);
  }
  TORCH_CHECK(host.forward_op.has_value(), "graphed: the runner '", host.name,
              "' has no forward: it was made with no forward operator and none was attached");
  results = call_tensor_list_op(*host.forward_op, arguments);
  return GF_OK;
}

gf_status host_run_forward(void *context, gf_forward_phase phase, const gf_tensor *inputs,
                           size_t count, gf_pool *outputs, unsigned char *mutated,
                           gf_forward_report *report, gf_error *err) {
  HostContext *host = host_context(context);
  try {
    ForwardScope in_phase(host->call, phase);
    // graphed replays inference forwards: nothing it captures records autograd history.
    at::NoGradGuard no_grad;
    std::vector<at::Tensor> arguments;
    arguments.reserve(count);
    for (size_t i = 0; i < count; ++i) {
      arguments.push_back(tensor_of_handle(inputs[i].handle));
    }
    std::vector<int64_t> before;
    if (mutated != nullptr) {
      before = versions_of(arguments);
    }
    std::vector<at::Tensor> results;
    gf_status status = run_forward_once(*host, arguments, results, report, err);
    if (status != GF_OK) {
      return status; // the report says whose error it was; the core decides what it means
    }
    if (mutated != nullptr) {
      std::vector<int64_t> after = versions_of(arguments);
      for (size_t i = 0; i < count; ++i) {
        mutated[i] = before[i] != after[i] ? 1 : 0;
      }
    }
    for (at::Tensor &result : results) {
      // The replay path copies raw bytes, so static outputs must be dense.
      at::Tensor dense = result.is_contiguous() ? result : result.contiguous();
      gf_tensor described = describe_tensor(dense, true);
      status = gf_pool_add(outputs, &described, err);
      if (status != GF_OK) {
        release_handle(described.handle);
        return status;
      }
    }
    return GF_OK;
  } catch (...) {
    // The fact only: whose error it is (the caller's, or a capture failure with a group) is the
    // core's to decide (Note [The forward's own error], ops/gf_capture.c).
    std::string what = "graphed: the forward of '" + host->name + "' failed";
    return status_of_current_exception(err, what.c_str());
  }
}

int host_agree(void *context, int ok) {
  HostContext *host = host_context(context);
  try {
    if (host->group_name.has_value()) {
      return agree_over_group(*host->group_name, host->device, ok != 0) ? 1 : 0;
    }
    at::Tensor flag = at::full({1}, ok ? 1 : 0, at::TensorOptions().dtype(at::kInt));
    std::vector<c10::IValue> stack{flag};
    host->agree_op->callBoxed(stack);
    return stack.at(0).toTensor().item<int>() > 0 ? 1 : 0;
  } catch (...) {
    return -1;
  }
}

void host_release(void *, void *handle) { release_handle(handle); }

// Tells the runner's observer (its direct hook, else its operator, in kObserverSchema's order).
void tell_observer(const HostContext &host, const char *kind, const gf_event &event) {
  const std::string shapes = describe_shapes(event.inputs, event.input_count);
  if (host.direct.observe != nullptr) {
    host.direct.observe(host.direct.context, kind, event, shapes);
    return;
  }
  std::vector<c10::IValue> stack{std::string(kind),
                                 std::string(event.message != nullptr ? event.message : ""),
                                 event.seconds,
                                 event.device_bytes,
                                 event.reserved_bytes,
                                 event.static_bytes,
                                 static_cast<int64_t>(event.count),
                                 shapes};
  host.observer_op->callBoxed(stack);
}

// Whether the runner has an observer of either kind.
bool observed(const HostContext &host) {
  return host.direct.observe != nullptr || host.observer_op.has_value();
}

void host_notify(void *context, const gf_event *event) {
  HostContext *host = host_context(context);
  if (!observed(*host)) {
    return;
  }
  const char *kind = nullptr;
  switch (event->kind) {
  case GF_EVENT_CAPTURED:
    kind = "captured";
    break;
  case GF_EVENT_EVICTED:
    kind = "evicted";
    break;
  case GF_EVENT_DISABLED:
    kind = "disabled";
    break;
  case GF_EVENT_CHURN:
    kind = "churn";
    break;
  case GF_EVENT_THRASH:
    kind = "thrash";
    break;
  case GF_EVENT_STALE:
    kind = "stale";
    break;
  }
  if (kind == nullptr) {
    return; // a kind this shim does not know yet: said to no observer, never as another kind
  }
  try {
    tell_observer(*host, kind, *event);
  } catch (...) {
    // An observer that fails loses its log line; the call itself goes on.
  }
}

void host_warn(void *context, const char *message) {
  HostContext *host = host_context(context);
  if (!observed(*host)) {
    TORCH_WARN(message);
    return;
  }
  gf_event warning{};
  warning.kind = GF_EVENT_DISABLED; // not read: tell_observer is given the kind "warning"
  warning.message = message;
  warning.device_bytes = -1;
  warning.reserved_bytes = -1;
  try {
    tell_observer(*host, "warning", warning);
  } catch (...) {
    TORCH_WARN(message);
  }
}

std::atomic<EntryUserRelease> installed_user_release{nullptr};

void host_release_user(void *, void *user) {
  EntryUserRelease release = installed_user_release.load(std::memory_order_acquire);
  if (release != nullptr) {
    release(user);
  }
}

int host_externals_freed(void *, void *inventory, const char **which) {
  return externals_freed(*static_cast<const CaptureInventory *>(inventory), which);
}

void host_release_inventory(void *, void *inventory) {
  delete static_cast<CaptureInventory *>(inventory); // tensors only: no interpreter needed
}

void host_destroy(void *context) { delete host_context(context); }

} // namespace

const char *const kObserverSchema =
    "(str kind, str message, float seconds, int device_bytes, int reserved_bytes, "
    "int static_bytes, int count, str shapes) -> ()";

void attach_direct_hooks(RunnerSlot &slot, DirectHooks hooks) {
  std::lock_guard<std::recursive_mutex> guard(slot.mutex);
  HostContext &host = *slot.host;
  TORCH_CHECK_VALUE(!host.forward_op.has_value() && host.direct.forward == nullptr,
                    "graphed: the runner '", host.name, "' has a forward already");
  host.direct = hooks;
}

void set_entry_user_release(EntryUserRelease release) {
  installed_user_release.store(release, std::memory_order_release);
}

c10::OperatorHandle find_operator(const std::string &qualified_name, const char *role) {
  auto separator = qualified_name.find("::");
  TORCH_CHECK_VALUE(separator != std::string::npos && separator > 0, "graphed: the ", role,
                    " operator must be named 'namespace::name', got '", qualified_name, "'");
  auto op = c10::Dispatcher::singleton().findOp(c10::OperatorName(qualified_name, ""));
  TORCH_CHECK_VALUE(op.has_value(), "graphed: no operator '", qualified_name,
                    "' is registered to serve as the ", role,
                    "; register it (torch.library or TORCH_LIBRARY) before creating the runner");
  return *op;
}

std::vector<at::Tensor> call_tensor_list_op(const c10::OperatorHandle &op,
                                            const std::vector<at::Tensor> &inputs) {
  std::vector<c10::IValue> stack;
  stack.emplace_back(c10::List<at::Tensor>(inputs));
  op.callBoxed(stack);
  TORCH_CHECK(stack.size() == 1, "graphed: the forward operator must return one Tensor[]");
  return stack[0].toTensorVector();
}

gf_host make_torch_host(HostContext *context) {
  gf_host host{};
  host.context = context;
  host.clone_static = host_clone_static;
  host.empty_like = host_empty_like;
  host.retain = host_retain;
  host.run_forward = host_run_forward;
  host.agree = context->agrees() ? host_agree : nullptr; // no group: no agreement
  host.release = host_release;
  host.release_user = host_release_user;
  host.externals_freed = host_externals_freed;
  host.release_inventory = host_release_inventory;
  host.warn = host_warn;
  host.notify = host_notify;
  host.destroy = host_destroy;
  return host;
}

} // namespace graphed
